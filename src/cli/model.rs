//! `weft model CONFIG -o model.weft`: a config's model as a program to
//! edit — the module (its loss function takes one micro-batch), and beside
//! it (`model.toml`) the same config training that program: `[model]
//! program`, its initialisation as `[model.init]` rules, integer input
//! ranges as `[model.inputs]`, and under `tp`/`fsdp_tp` the model's
//! tensor-parallel rules as `[shardings]`.

use crate::error::{Error, Result};
use crate::models::Init;
use crate::runner::RunConfig;
use crate::strategy::Strategy;
use std::path::Path;

/// Writes the program to `out` and its config beside it; returns the exit
/// code.
pub fn model(config: &Path, out: &Path) -> Result<i32> {
    if out.extension().is_some_and(|e| e == "toml") {
        return Err(Error::Usage(format!(
            "-o {}: the program's config is written beside it as NAME.toml; give the program a name such as model.weft",
            out.display()
        )));
    }
    let c = RunConfig::load(config)?;
    crate::runner::validate::validate(&c)?;
    let model = c.model.model()?;
    let k = c.step_micro_batches();
    let module = model.arch.module(k)?;
    let mut program = format!(
        "// The model of {} ({}), as a program: `weft train {}` trains it.\n",
        config.display(),
        model.label,
        out.with_extension("toml").display()
    );
    if k > 1 {
        program += &format!("// Its batch inputs are one of {k} micro-batches of a step.\n");
    }
    program += &weft_ir::text::print_module(&module);
    write(out, &program)?;

    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut tables = String::from("[model]\n");
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    tables += &format!("program = {}\n", quote(&name));
    if model.loss != "loss" {
        tables += &format!("loss = {}\n", quote(&model.loss));
    }
    let init = match &model.init {
        Init::Rules(r) => Some(r.iter().map(|r| (r.pattern.clone(), r.value.to_string())).collect::<Vec<_>>()),
        Init::Seeded(_) => None,
        Init::File(p) => {
            // Resolved against the original config's directory: absolute,
            // so that the new config finds it too.
            let p = std::fs::canonicalize(p).map_err(|source| Error::Io { path: p.clone(), source })?;
            tables += &format!("init_from = {}\n", quote(&p.display().to_string()));
            None
        }
    };
    if !model.int_max.is_empty() {
        tables += "\n[model.inputs]\n";
        for (n, m) in &model.int_max {
            tables += &format!("{} = {{ max = {m} }}\n", quote(n));
        }
    }
    let rules = match (init, &model.init) {
        (Some(r), _) => Some(r),
        (None, Init::Seeded(_)) => {
            tables += "\n# The built-in model's initialisation as rules: the same distributions, drawn by name\n\
                       # (not the same values).\n";
            Some(model.arch.init_rules().into_iter().map(|(p, f)| (p, f.to_string())).collect())
        }
        (None, _) => None,
    };
    if let Some(rules) = rules {
        tables += "[model.init]\n";
        for (p, f) in rules {
            tables += &format!("{} = {}\n", quote(&p), quote(&f));
        }
    }
    let strategy: Strategy = c.strategy.as_deref().unwrap_or("none").parse().map_err(Error::Usage)?;
    let tp = matches!(strategy, Strategy::TensorParallel | Strategy::FsdpTp);
    // The model's rules that name parameters or values this module has (a
    // dense GPT has no expert weights).
    let f = model.loss_fn(&module)?;
    let mut names: Vec<String> = (0..f.params.len()).map(|i| f.param_name(i)).collect();
    names.extend(crate::strategy::named_values(&module).into_iter().map(|(_, _, n)| n));
    let has = |r: &&crate::models::rules::Rule<weft_ir::TensorSharding>| names.iter().any(|n| r.matches(n));
    let expert_mesh = c
        .mesh
        .as_deref()
        .and_then(|m| weft_compiler::sharding::Mesh::parse(m).ok())
        .is_some_and(|m| m.axes().iter().any(|a| a.name == "expert"));
    // A pattern the config's own [shardings] gives is written once, as the
    // config's (TOML keys are unique).
    let own =
        |r: &&crate::models::rules::Rule<weft_ir::TensorSharding>| !c.shardings.iter().any(|(p, _)| p == &r.pattern);
    let expert: Vec<_> = model.expert_rules.iter().filter(has).filter(own).collect();
    let tp_rules: Vec<_> = model.tp_rules.iter().filter(has).filter(own).collect();
    if !tp_rules.is_empty() || !expert.is_empty() || !c.shardings.is_empty() {
        tables += "\n# The model's expert-parallel and tensor-parallel rules (they apply under every strategy as\n\
                   # [shardings]; the first match wins, where the built-in model combines them).\n";
        tables += "[shardings]\n";
        for (p, s) in &c.shardings {
            tables += &format!("{} = {}\n", quote(p), quote(s));
        }
        for (on, r) in expert.iter().map(|r| (expert_mesh, r)).chain(tp_rules.iter().map(|r| (tp, r))) {
            let line = format!("{} = {}\n", quote(&r.pattern), quote(&r.value.to_string()));
            tables += &if on { line } else { format!("# {line}") };
        }
    }
    let mut rest = toml::Table::try_from(&c).map_err(|e| Error::Usage(format!("{}: {e}", config.display())))?;
    rest.remove("model");
    rest.remove("shardings");
    let toml_path = out.with_extension("toml");
    let text = format!(
        "# {} as a program model (written by `weft model {}`).\n{}\n{tables}",
        config.display(),
        config.display(),
        toml::to_string(&rest).map_err(|e| Error::Usage(e.to_string()))?
    );
    write(&toml_path, &text)?;
    println!("wrote {} and {}", out.display(), toml_path.display());
    Ok(0)
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}
