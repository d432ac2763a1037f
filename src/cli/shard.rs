//! `weft shard FILE --mesh data=2,model=4 [--explain %v] [--show %v]`.

use super::check::load_or_report;
use super::run::pick_function;
use crate::error::{Error, Result};
use std::path::Path;
use weft_compiler::sharding::{fmt_sharding, propagate, Mesh, PropagateOptions};
use weft_ir::ValueId;

/// What `weft shard` should print besides the annotated program.
#[derive(Debug, Default)]
pub struct ShardArgs {
    /// The function (default: `main` or the only one).
    pub func: Option<String>,
    /// Values whose sharding chain to explain (`%3`, `%h1`).
    pub explain: Vec<String>,
    /// Values whose device grid to draw.
    pub show: Vec<String>,
    /// Choose shardings for open values by auto-sharding.
    pub auto: bool,
    /// Per-device memory budget for `--auto` (`2GiB`, `512MiB`, `1e9`).
    pub memory_budget: Option<String>,
}

/// `weft shard --auto`: the plan report, and for `--explain` the
/// alternatives considered with their costs.
fn auto(f: &weft_ir::Function, mesh: &Mesh, args: &ShardArgs) -> Result<i32> {
    use weft_compiler::autoshard::{auto_shard, parse_memory_budget, AutoShardOptions};
    let memory_budget = match &args.memory_budget {
        Some(b) => Some(parse_memory_budget(b).map_err(|e| Error::Usage(format!("--memory-budget: {e}")))?),
        None => None,
    };
    let opts = AutoShardOptions { memory_budget, ..Default::default() };
    let plan = match auto_shard(f, mesh, &opts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(1);
        }
    };
    println!("// mesh: {mesh}");
    print!("{}", plan.report());
    println!("search time: {}", plan.timings());
    for v in &args.explain {
        let id = find_value(f, v)?;
        println!();
        print!("{}", plan.explain_text(id));
    }
    Ok(0)
}

/// Resolves `%name` or `%N` (or without the `%`) to a value of `f`.
pub fn find_value(f: &weft_ir::Function, text: &str) -> Result<ValueId> {
    let t = text.trim_start_matches('%');
    if let Some(v) = f.value_by_name(t) {
        return Ok(v);
    }
    if let Ok(n) = t.parse::<u32>() {
        if (n as usize) < f.values.len() {
            return Ok(ValueId(n));
        }
    }
    Err(Error::Usage(format!("@{} has no value `%{t}`", f.name)))
}

/// Propagates shardings over the chosen function and prints the result.
pub fn shard(file: &Path, mesh: &str, args: &ShardArgs) -> Result<i32> {
    let Some((m, _source)) = load_or_report(file)? else { return Ok(1) };
    let mesh = Mesh::parse(mesh).map_err(|e| Error::Usage(format!("--mesh: {e}")))?;
    let f = pick_function(&m, args.func.as_deref())?;
    let flat = weft_compiler::inline_calls(&m, &f.name)?;
    if args.auto {
        return auto(&flat, &mesh, args);
    }
    let sf = match propagate(&flat, &mesh, &PropagateOptions::default()) {
        Ok(sf) => sf,
        Err(e) => {
            eprintln!("{}:{e}", file.display());
            return Ok(1);
        }
    };
    println!("// mesh: {mesh}");
    print!("{}", weft_ir::text::print_function(&sf.function));
    if !sf.reshards.is_empty() {
        println!("\n// {} reshard{} inserted:", sf.reshards.len(), if sf.reshards.len() == 1 { "" } else { "s" });
        for line in sf.reshard_lines() {
            println!("//   {line}");
        }
    }
    for n in &sf.notes {
        println!("// note: {n}");
    }
    if !sf.stats.converged {
        println!("// warning: propagation stopped at its visit limit before reaching a fixed point");
    }
    for v in &args.explain {
        let id = find_value(&sf.source, v)?;
        println!("\n// why {} is {}:", sf.source.value_ref(id), fmt_sharding(sf.sharding(id)));
        for line in sf.explain_text(id).lines() {
            println!("//   {line}");
        }
    }
    for v in &args.show {
        let id = find_value(&sf.source, v)?;
        println!("\n// {} {} {}:", sf.source.value_ref(id), sf.source.ty(id), fmt_sharding(sf.sharding(id)));
        print!("{}", sf.render(id)?);
    }
    Ok(0)
}
