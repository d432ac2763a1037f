//! `weft run FILE --inputs IN.safetensors --output OUT.safetensors`.

use super::check::load_or_report;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use weft_ir::tensor::{read_safetensors, write_safetensors, HostTensor};

/// Picks the function to run: the one named, else `main`, else the only one.
pub fn pick_function<'m>(m: &'m weft_ir::Module, name: Option<&str>) -> Result<&'m weft_ir::Function> {
    let names = || m.functions.iter().map(|f| format!("@{}", f.name)).collect::<Vec<_>>().join(", ");
    match name {
        Some(n) => {
            m.function(n).ok_or_else(|| Error::Usage(format!("no function @{n} in the module (it has {})", names())))
        }
        None => match (m.function("main"), m.functions.as_slice()) {
            (Some(f), _) => Ok(f),
            (None, [f]) => Ok(f),
            (None, []) => Err(Error::Usage("the module has no functions".into())),
            (None, _) => {
                Err(Error::Usage(format!("the module has several functions ({}); choose one with --func", names())))
            }
        },
    }
}

/// The peak of live bytes of `f` under its instruction order (parameters
/// from the start, results to the end), saturating: what interpreting it
/// needs at least.
pub fn peak_live_bytes(f: &weft_ir::Function) -> u64 {
    let bytes = |v: weft_ir::ValueId| f.ty(v).size_bytes() as u64;
    let end = f.insts.len();
    let mut last_use: Vec<Option<usize>> = vec![None; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for o in &inst.operands {
            last_use[o.index()] = Some(i);
        }
    }
    for r in &f.results {
        last_use[r.index()] = Some(end);
    }
    let mut freed_at: Vec<u64> = vec![0; end + 1];
    let mut live = 0u64;
    for &p in &f.params {
        live = live.saturating_add(bytes(p));
        let at = last_use[p.index()].unwrap_or(0);
        freed_at[at] = freed_at[at].saturating_add(bytes(p));
    }
    let mut peak = live;
    for (i, inst) in f.insts.iter().enumerate() {
        for &r in &inst.results {
            live = live.saturating_add(bytes(r));
            let at = last_use[r.index()].unwrap_or(i);
            freed_at[at] = freed_at[at].saturating_add(bytes(r));
        }
        peak = peak.max(live);
        live = live.saturating_sub(freed_at[i]);
    }
    peak
}

/// Runs the chosen function on the inputs and writes or prints the results.
/// `memory_limit` (`16GiB`) overrides `WEFT_MEMORY_LIMIT` and the machine's
/// memory as the limit the program's peak of live bytes must fit.
pub fn run(
    file: &Path,
    inputs: Option<&Path>,
    output: Option<&Path>,
    func: Option<&str>,
    memory_limit: Option<&str>,
) -> Result<i32> {
    let limit = weft_ir::limits::MemoryLimit::resolve(memory_limit, "--memory-limit")
        .map_err(|e| Error::Usage(e.to_string()))?;
    let Some((m, _source)) = load_or_report(file)? else { return Ok(1) };
    let f = pick_function(&m, func)?;
    // Bounded inlining (an error for exponential call graphs), then the
    // program's peak against the limit, before reading inputs or running.
    let flat = weft_compiler::inline_calls(&m, &f.name)?;
    if let Some(limit) = &limit {
        limit.check(&format!("@{} (peak of live tensors)", f.name), peak_live_bytes(&flat))?;
    }
    let args: BTreeMap<String, HostTensor> = match inputs {
        Some(p) => read_safetensors(p)?,
        None => BTreeMap::new(),
    };
    // `load_or_report` verified the module; the limit is the one resolved
    // above (the flag over WEFT_MEMORY_LIMIT), not detected again.
    let interp = weft_ir::interp::Interpreter::from_verified(&m).with_memory_limit(limit);
    let results = interp.run_named(&f.name, &args)?;
    let mut named = BTreeMap::new();
    for (i, (&v, t)) in f.results.iter().zip(results).enumerate() {
        let name = f.value(v).name.clone().unwrap_or_else(|| format!("out{i}"));
        // Two results may be the same value; keep every position.
        let name = if named.contains_key(&name) { format!("out{i}") } else { name };
        named.insert(name, t);
    }
    for (name, t) in &named {
        println!("{name}: {t}");
    }
    if let Some(out) = output {
        write_safetensors(out, &named)?;
        println!("wrote {} tensor{} to {}", named.len(), if named.len() == 1 { "" } else { "s" }, out.display());
    }
    Ok(0)
}
