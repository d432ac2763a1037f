//! `weft plot METRICS.jsonl... -o loss.svg`: loss curves, several runs on
//! one chart (plotters, SVG). `weft plot pipeline.json -o timeline.svg`
//! draws a pipeline's schedule traces instead (one row per stage, a box per
//! forward or backward task labelled with its microbatch; the unit clock
//! above, the executor's clock below). `weft plot run.json -o split.svg`
//! draws where each device's steady-state step went (`timings.devices`):
//! compute, exposed communication and idle as one bar per device, and the
//! communication hidden behind compute as a thinner bar under it.

use crate::error::{Error, Result};
use crate::runner::read_metrics;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Draws each of `metrics` against step for every file onto an SVG at
/// `out`. No metrics named: `loss`, plus `val_loss` for files that have it.
pub fn plot(files: &[PathBuf], out: &Path, metrics: &[String], log_y: bool) -> Result<i32> {
    if let [f] = files {
        if f.extension().is_some_and(|e| e == "json") {
            let text = crate::error::read_to_string(f)?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::Usage(format!("{}: not JSON ({e})", f.display())))?;
            if v.get("timings").is_some() {
                return plot_devices(f, &v, out);
            }
            return plot_timeline(f, &v, out);
        }
    }
    let mut series = Vec::new();
    let named = !metrics.is_empty();
    let wanted: Vec<String> = if named { metrics.to_vec() } else { vec!["loss".into(), "val_loss".into()] };
    let mut drawn: Vec<String> = Vec::new();
    for f in files {
        let rows = read_metrics(f)?;
        for metric in &wanted {
            let pts: Vec<(f64, f64)> =
                rows.iter().filter_map(|(s, m)| m.get(metric).map(|&v| (*s as f64, v))).collect();
            if pts.is_empty() {
                if !named && metric == "val_loss" {
                    continue;
                }
                return Err(Error::Usage(format!("{}: no `{metric}` values", f.display())));
            }
            let stem = f.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
            let label = if wanted.len() == 1 { stem } else { format!("{stem} {metric}") };
            series.push((label, pts));
            if !drawn.contains(metric) {
                drawn.push(metric.clone());
            }
        }
    }
    let metric = drawn.join(", ");
    let metric = metric.as_str();
    // The axes span the finite values only: a run that diverged writes
    // `inf`/`NaN`, which no axis can hold. Those points are drawn as
    // crosses on the top edge, a marked divergence.
    let scale = |y: f64| if log_y { y.max(1e-30).log10() } else { y };
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (_, pts) in &series {
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            let y = scale(y);
            if y.is_finite() {
                y0 = y0.min(y);
                y1 = y1.max(y);
            }
        }
    }
    if y0 > y1 {
        return Err(Error::Usage(format!(
            "no finite `{metric}` values to plot (the run diverged from its first step)"
        )));
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let diverged: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().filter(|p| !scale(p.1).is_finite()).map(|&(x, _)| (x, y1)))
        .collect();
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(out, (800, 500)).into_drawing_area();
        root.fill(&WHITE)?;
        let caption = if log_y { format!("log10 {metric}") } else { metric.to_string() };
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        chart.configure_mesh().x_desc("step").draw()?;
        for (i, (label, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let data = pts.iter().map(|&(x, y)| (x, scale(y))).filter(|p| p.1.is_finite());
            chart
                .draw_series(LineSeries::new(data, color.stroke_width(2)))?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
        }
        if !diverged.is_empty() {
            chart
                .draw_series(diverged.iter().map(|&p| Cross::new(p, 6, RED.stroke_width(2))))?
                .label("non-finite (diverged)")
                .legend(|(x, y)| Cross::new((x + 8, y), 5, RED.stroke_width(2)));
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| Error::Usage(format!("plotting to {}: {e}", out.display())))?;
    println!("wrote {}", out.display());
    Ok(0)
}

/// Draws a `run.json`'s per-device split of the steady-state step.
fn plot_devices(file: &Path, v: &serde_json::Value, out: &Path) -> Result<i32> {
    let bad = |why: &str| Error::Usage(format!("{}: no per-device times ({why})", file.display()));
    let devices = v["timings"]["devices"]["devices"].as_array().ok_or_else(|| bad("`timings.devices`"))?;
    let steps = v["timings"]["devices"]["steps"].as_u64().unwrap_or(0);
    let ms = |d: &serde_json::Value, k: &str| d[k].as_f64().map(|s| s * 1e3);
    let rows: Vec<[f64; 4]> = devices
        .iter()
        .map(|d| {
            let exposed = ms(d, "exposed_communication_s").or_else(|| ms(d, "communication_s"));
            Some([ms(d, "compute_s")?, exposed?, ms(d, "idle_s")?, ms(d, "hidden_communication_s").unwrap_or(0.0)])
        })
        .collect::<Option<_>>()
        .ok_or_else(|| bad("a device without compute, communication and idle seconds"))?;
    if rows.is_empty() {
        return Err(bad("the run timed no steps on devices"));
    }
    let end = rows.iter().map(|r| (r[0] + r[1] + r[2]).max(r[3])).fold(0.0f64, f64::max).max(1e-9);
    let n = rows.len();
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(out, (900, 120 + 40 * n as u32)).into_drawing_area();
        root.fill(&WHITE)?;
        let caption = format!("where each device's step went (mean of {steps} steps)");
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..end * 1.05, -0.5..(n as f64 - 0.5))?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("ms")
            .y_labels(n)
            .y_label_formatter(&|y| format!("device {}", y.round() as i64))
            .draw()?;
        let parts = [
            ("compute", RGBColor(70, 130, 200)),
            ("communication, exposed", RGBColor(230, 140, 50)),
            ("idle", RGBColor(200, 200, 200)),
        ];
        for (k, (name, color)) in parts.iter().enumerate() {
            let color = *color;
            chart
                .draw_series(rows.iter().enumerate().map(|(d, r)| {
                    let from: f64 = r[..k].iter().sum();
                    let y = d as f64;
                    Rectangle::new([(from, y - 0.3), (from + r[k], y + 0.2)], color.filled())
                }))?
                .label(*name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
        }
        let hidden = RGBColor(140, 80, 160);
        chart
            .draw_series(rows.iter().enumerate().map(|(d, r)| {
                let y = d as f64;
                Rectangle::new([(0.0, y + 0.25), (r[3], y + 0.4)], hidden.filled())
            }))?
            .label("communication in flight behind compute")
            .legend(move |(x, y)| Rectangle::new([(x, y - 2), (x + 14, y + 2)], hidden.filled()));
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| Error::Usage(format!("plotting to {}: {e}", out.display())))?;
    println!("wrote {}", out.display());
    Ok(0)
}

/// One task box of a trace: stage, phase letter and label, microbatch,
/// start, end. The label names the chunk when it is not the stage
/// (interleaved: `F3/c2` is chunk 2's forward on microbatch 3).
type TaskBox = (usize, String, String, f64, f64);

fn read_trace(v: &serde_json::Value) -> Option<(String, usize, Vec<TaskBox>)> {
    let clock = v.get("clock")?.as_str()?.to_string();
    let stages = v.get("stages")?.as_u64()? as usize;
    let events = v.get("events")?.as_array()?;
    let boxes = events
        .iter()
        .map(|e| {
            let stage = e.get("stage")?.as_u64()? as usize;
            let phase = e.get("phase")?.as_str()?.to_string();
            let micro = e.get("micro")?.as_u64()?;
            // Traces written before interleaving have no chunk.
            let chunk = e.get("chunk").and_then(|c| c.as_u64()).unwrap_or(stage as u64);
            let label =
                if chunk == stage as u64 { format!("{phase}{micro}") } else { format!("{phase}{micro}/c{chunk}") };
            Some((stage, phase, label, e.get("start")?.as_f64()?, e.get("end")?.as_f64()?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((clock, stages, boxes))
}

/// Draws the traces of a `pipeline.json` (`weft train` with `[pipeline]`).
fn plot_timeline(file: &Path, v: &serde_json::Value, out: &Path) -> Result<i32> {
    let bad = |why: &str| Error::Usage(format!("{}: not a pipeline trace ({why})", file.display()));
    let mut traces = Vec::new();
    for key in ["unit_trace", "measured_trace"] {
        match v.get(key) {
            Some(t) if !t.is_null() => traces.push((key, read_trace(t).ok_or_else(|| bad(key))?)),
            _ => {}
        }
    }
    if traces.is_empty() {
        return Err(bad("no `unit_trace` or `measured_trace`"));
    }
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(out, (1000, 260 * traces.len() as u32)).into_drawing_area();
        root.fill(&WHITE)?;
        let areas = root.split_evenly((traces.len(), 1));
        for (area, (key, (clock, stages, boxes))) in areas.iter().zip(&traces) {
            let end = boxes.iter().map(|b| b.4).fold(0.0f64, f64::max).max(1e-12);
            let busy: f64 = boxes.iter().map(|b| b.4 - b.3).sum();
            let bubble = 1.0 - busy / (*stages as f64 * end);
            let unit = if clock == "seconds" { "ms" } else { "unit" };
            let k = if clock == "seconds" { 1e3 } else { 1.0 };
            let caption = format!("{key}: {stages} stages, bubble {bubble:.3} ({unit})");
            let mut chart = ChartBuilder::on(area)
                .caption(caption, ("sans-serif", 18))
                .margin(10)
                .x_label_area_size(30)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..end * k, -0.5..(*stages as f64 - 0.5))?;
            chart
                .configure_mesh()
                .disable_mesh()
                .x_desc(unit)
                .y_labels(*stages)
                .y_label_formatter(&|y| format!("stage {}", y.round() as i64))
                .draw()?;
            let forward = RGBColor(70, 130, 200);
            let backward = RGBColor(230, 140, 50);
            chart.draw_series(boxes.iter().map(|(s, p, _, a, b)| {
                let y = *s as f64;
                let color = if p == "F" { forward } else { backward };
                Rectangle::new([(a * k, y - 0.35), (b * k, y + 0.35)], color.filled())
            }))?;
            chart.draw_series(boxes.iter().map(|(s, _, _, a, b)| {
                Rectangle::new([(a * k, *s as f64 - 0.35), (b * k, *s as f64 + 0.35)], WHITE.stroke_width(1))
            }))?;
            chart.draw_series(boxes.iter().map(|(s, _, label, a, b)| {
                let x = (a + b) / 2.0 * k;
                Text::new(label.clone(), (x, *s as f64), ("sans-serif", 11).into_font().color(&WHITE))
            }))?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| Error::Usage(format!("plotting to {}: {e}", out.display())))?;
    println!("wrote {}", out.display());
    Ok(0)
}
