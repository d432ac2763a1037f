//! Metrics files: one JSON object per step (`{"step": 3, "loss": 0.25, ...}`).

use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use weft_compiler::train::Metrics;

/// Appends metrics to a JSONL file.
pub struct MetricsWriter {
    path: PathBuf,
    file: std::fs::File,
}

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), source }
}

impl MetricsWriter {
    /// Opens `path` for appending (truncating it unless `append`).
    pub fn open(path: &Path, append: bool) -> Result<MetricsWriter> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(path)
            .map_err(|e| io(path, e))?;
        Ok(MetricsWriter { path: path.to_path_buf(), file })
    }

    /// Opens `path` to continue a run resumed at `from_step`: lines of
    /// steps at or after it (written after the checkpoint the run resumes
    /// from) are dropped, so the file ends up as an uninterrupted run's.
    pub fn open_resume(path: &Path, from_step: u64) -> Result<MetricsWriter> {
        let keep: Vec<String> = match std::fs::read_to_string(path) {
            Ok(text) => text
                .lines()
                .filter(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .ok()
                        .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
                        .is_some_and(|s| s < from_step)
                })
                .map(|l| l.to_string())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(path, e)),
        };
        // Replace the file atomically: a kill during the rewrite must not
        // lose the lines being kept. The directory may not exist yet (a
        // resumed run given a new --metrics path).
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        }
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(".tmp");
        let tmp = path.with_file_name(tmp_name);
        {
            let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
            for l in &keep {
                writeln!(f, "{l}").map_err(|e| io(&tmp, e))?;
            }
            f.sync_all().map_err(|e| io(&tmp, e))?;
        }
        std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
        MetricsWriter::open(path, true)
    }

    /// Writes one step's metrics as a line.
    pub fn write(&mut self, step: u64, m: &Metrics) -> Result<()> {
        let mut obj = serde_json::Map::new();
        obj.insert("step".into(), serde_json::json!(step));
        for (k, v) in m {
            // Non-finite values are written as strings ("NaN"), which JSON
            // cannot carry as numbers.
            let val =
                serde_json::Number::from_f64(*v).map(serde_json::Value::Number).unwrap_or_else(|| v.to_string().into());
            obj.insert(k.clone(), val);
        }
        let line = serde_json::Value::Object(obj).to_string();
        writeln!(self.file, "{line}").map_err(|e| io(&self.path, e))?;
        self.file.flush().map_err(|e| io(&self.path, e))
    }
}

/// Reads a metrics file: `(step, metrics)` per line.
pub fn read_metrics(path: &Path) -> Result<Vec<(u64, Metrics)>> {
    let text = std::fs::read_to_string(path).map_err(|e| io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |m: &str| Error::Usage(format!("{}:{}: {m}", path.display(), i + 1));
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
        let obj = v.as_object().ok_or_else(|| bad("not a JSON object"))?;
        let step = obj.get("step").and_then(|s| s.as_u64()).ok_or_else(|| bad("no integer `step`"))?;
        let mut m = Metrics::new();
        for (k, v) in obj {
            if k == "step" {
                continue;
            }
            let x = match v {
                serde_json::Value::Number(n) => n.as_f64(),
                serde_json::Value::String(s) => s.parse().ok(),
                _ => None,
            };
            if let Some(x) = x {
                m.insert(k.clone(), x);
            }
        }
        out.push((step, m));
    }
    Ok(out)
}

/// The file named `what` (`run.json`, `pipeline.json`) that belongs to the
/// run whose metrics go to `metrics`: beside it, named after it
/// (`runs/a.jsonl` → `runs/a.run.json`), so two runs whose metrics share a
/// directory keep their own; for the conventional `metrics.jsonl`, plain
/// `run.json`.
pub fn beside_metrics(metrics: &std::path::Path, what: &str) -> std::path::PathBuf {
    match metrics.file_stem().and_then(|s| s.to_str()) {
        Some(stem) if stem != "metrics" => metrics.with_file_name(format!("{stem}.{what}")),
        _ => metrics.with_file_name(what),
    }
}

#[cfg(test)]
mod beside_tests {
    use super::beside_metrics;
    use std::path::{Path, PathBuf};

    #[test]
    fn each_metrics_file_has_its_own_run_json() {
        assert_eq!(beside_metrics(Path::new("runs/metrics.jsonl"), "run.json"), PathBuf::from("runs/run.json"));
        assert_eq!(beside_metrics(Path::new("runs/a.jsonl"), "run.json"), PathBuf::from("runs/a.run.json"));
        assert_eq!(beside_metrics(Path::new("b.jsonl"), "pipeline.json"), PathBuf::from("b.pipeline.json"));
    }
}
