//! `weft plot METRICS.jsonl... -o loss.svg`: loss curves, several runs on
//! one chart (plotters, SVG).

use crate::error::{Error, Result};
use crate::runner::read_metrics;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Draws `metric` against step for every file onto an SVG at `out`.
pub fn plot(files: &[PathBuf], out: &Path, metric: &str, log_y: bool) -> Result<i32> {
    let mut series = Vec::new();
    for f in files {
        let pts: Vec<(f64, f64)> =
            read_metrics(f)?.into_iter().filter_map(|(s, m)| m.get(metric).map(|&v| (s as f64, v))).collect();
        if pts.is_empty() {
            return Err(Error::Usage(format!("{}: no `{metric}` values", f.display())));
        }
        let label = f.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        series.push((label, pts));
    }
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (_, pts) in &series {
        for &(x, y) in pts {
            let y = if log_y { y.max(1e-30).log10() } else { y };
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
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
            let data = pts.iter().map(|&(x, y)| (x, if log_y { y.max(1e-30).log10() } else { y }));
            chart
                .draw_series(LineSeries::new(data, color.stroke_width(2)))?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| Error::Usage(format!("plotting to {}: {e}", out.display())))?;
    println!("wrote {}", out.display());
    Ok(0)
}
