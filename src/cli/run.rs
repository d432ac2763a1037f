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

/// Runs the chosen function on the inputs and writes or prints the results.
pub fn run(file: &Path, inputs: Option<&Path>, output: Option<&Path>, func: Option<&str>) -> Result<i32> {
    let Some((m, _source)) = load_or_report(file)? else { return Ok(1) };
    let f = pick_function(&m, func)?;
    let args: BTreeMap<String, HostTensor> = match inputs {
        Some(p) => read_safetensors(p)?,
        None => BTreeMap::new(),
    };
    let results = weft_ir::interp::run_named(&m, &f.name, &args)?;
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
