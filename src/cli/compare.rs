//! `weft compare-strategies CONFIG [--mesh M] [--steps N] [--rounds R]`:
//! trains one config under every strategy (the named ones and `auto`) and
//! prints the cost model's predicted step time next to the measured one,
//! with the rank correlation of the two.
//!
//! The auto-sharder can only pick well what its cost model ranks well; this
//! is the check. The measured time of a strategy is the smallest of its
//! rounds' steady-state step times (each the median of the steps after the
//! first): the rounds run the strategies interleaved, so a burst of other
//! load on the machine slows one round of each, not every round of one.
//! Nothing is written: no checkpoints, no metrics file.

use crate::error::{Error, Result};
use crate::runner::{prepare, report, run_session, validate, Overrides, RunConfig};
use crate::strategy::Strategy;
use std::path::PathBuf;
use weft_compiler::autoshard::{spearman, StepPrediction};

/// What to compare.
#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// The experiment config.
    pub config: PathBuf,
    /// Device mesh, e.g. `data=2,model=4` (default: the config's).
    #[arg(long)]
    pub mesh: Option<String>,
    /// Steps per run (the first is not timed).
    #[arg(long, default_value_t = 6)]
    pub steps: u64,
    /// Runs of each strategy, interleaved; the fastest counts.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Comma-separated strategies (default: every one).
    #[arg(long)]
    pub strategies: Option<String>,
    /// Execution backend (default: the config's, else cpu).
    #[arg(long)]
    pub backend: Option<String>,
    /// Worker threads for a runtime backend.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Per-device memory budget for `auto`, e.g. `2GiB`.
    #[arg(long)]
    pub memory_budget: Option<String>,
}

/// One strategy's row.
struct Row {
    name: &'static str,
    predicted: StepPrediction,
    measured: Vec<f64>,
}

/// Runs the comparison and prints the table. Returns the exit code.
pub fn compare(args: &CompareArgs) -> Result<i32> {
    if args.steps < 2 || args.rounds == 0 {
        return Err(Error::Usage("compare-strategies needs --steps of at least 2 and --rounds of at least 1".into()));
    }
    let base = RunConfig::load(&args.config)?;
    let strategies: Vec<Strategy> = match &args.strategies {
        Some(list) => list.split(',').map(|s| s.trim().parse().map_err(Error::Usage)).collect::<Result<_>>()?,
        None => {
            // `tp` and `fsdp_tp` split layers by the model's tensor-parallel
            // rules or `[shardings]`: a model with neither leaves them out.
            let tp = !base.shardings.is_empty() || !base.model.model()?.tp_rules.is_empty();
            let all = Strategy::ALL.into_iter();
            let list: Vec<Strategy> =
                all.filter(|s| tp || !matches!(s, Strategy::TensorParallel | Strategy::FsdpTp)).collect();
            if !tp {
                println!(
                    "the model has no tensor-parallel rules and the config no [shardings]: tp and fsdp_tp left out"
                );
            }
            list
        }
    };
    let overrides = |s: Strategy| Overrides {
        steps: Some(args.steps),
        mesh: args.mesh.clone(),
        strategy: Some(s.name().to_string()),
        backend: args.backend.clone(),
        threads: args.threads,
        memory_budget: if s == Strategy::Auto { args.memory_budget.clone() } else { None },
        quiet: true,
        ..Overrides::default()
    };
    let config = |s: Strategy| {
        let mut c = overrides(s).apply(base.clone());
        c.checkpoint = None;
        c.metrics = None;
        c
    };
    let backend = crate::runner::Backend::of(&config(Strategy::None))?;
    let mut rows = Vec::new();
    for &s in &strategies {
        let c = config(s);
        let mesh = validate::validate(&c)?;
        let axes: Vec<&str> = mesh.axes().iter().map(|a| a.name.as_str()).collect();
        let predicted = report::predict(&prepare(&c, &axes, &overrides(s))?, &mesh, backend, None)?;
        rows.push(Row { name: s.name(), predicted, measured: Vec::new() });
    }
    let mesh = validate::validate(&config(Strategy::None))?;
    println!(
        "weft compare-strategies: {} on mesh {mesh}, backend {backend}, {} steps x {} rounds per strategy",
        args.config.display(),
        args.steps,
        args.rounds
    );
    for round in 0..args.rounds {
        for (row, &s) in rows.iter_mut().zip(&strategies) {
            let summary = run_session(&config(s), &overrides(s), &mut |_| {})?;
            let t = summary.steady_step_secs().ok_or_else(|| Error::Usage("a run timed no step".into()))?;
            eprintln!("round {}: {} {}", round + 1, row.name, report::ms(t));
            row.measured.push(t);
        }
    }
    print!("{}", table(&rows));
    Ok(0)
}

/// The table (per device: the FLOPs of GEMMs, the bytes other ops stream),
/// the rank correlation, and auto against the best named strategy.
fn table(rows: &[Row]) -> String {
    let best = |r: &Row| r.measured.iter().copied().fold(f64::INFINITY, f64::min);
    let mut out = String::from(
        "| strategy | predicted | compute | communication | GEMM GFLOP | streamed MiB | measured (min) | measured (all rounds) \
         | measured / predicted |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let all: Vec<String> = r.measured.iter().map(|&t| format!("{:.1}", t * 1e3)).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {:.1} | {} | {} ms | {:.2} |\n",
            r.name,
            report::ms(r.predicted.total),
            report::ms(r.predicted.compute),
            report::ms(r.predicted.communication),
            r.predicted.dot_flops / 1e9,
            r.predicted.streamed_bytes / (1 << 20) as f64,
            report::ms(best(r)),
            all.join(" / "),
            best(r) / r.predicted.total
        ));
    }
    let predicted: Vec<f64> = rows.iter().map(|r| r.predicted.total).collect();
    let measured: Vec<f64> = rows.iter().map(best).collect();
    match spearman(&predicted, &measured) {
        Some(rho) => out.push_str(&format!(
            "Spearman rank correlation, predicted vs measured ({} strategies): {rho:.3}\n",
            rows.len()
        )),
        None => out.push_str("Spearman rank correlation: undefined (fewer than two strategies, or a tie in all)\n"),
    }
    // A model off by the same factor everywhere still ranks right.
    let ratios: Vec<f64> = rows.iter().map(|r| best(r) / r.predicted.total).collect();
    let (lo, hi) = ratios.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    out.push_str(&format!("measured / predicted from {lo:.2} to {hi:.2}\n"));
    let auto = rows.iter().find(|r| r.name == Strategy::Auto.name());
    let named = rows.iter().filter(|r| r.name != Strategy::Auto.name()).min_by(|a, b| best(a).total_cmp(&best(b)));
    if let (Some(a), Some(n)) = (auto, named) {
        out.push_str(&format!(
            "auto {} against the best named strategy, {} {}: {:+.1}%\n",
            report::ms(best(a)),
            n.name,
            report::ms(best(n)),
            (best(a) / best(n) - 1.0) * 100.0
        ));
    }
    out
}
