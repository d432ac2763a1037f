//! `weft lower FILE --mesh data=2,model=4 [--func NAME]`: propagate
//! shardings and partition one function, then print the program every
//! device runs and a summary of its communication and memory per device.
//!
//! The mesh may also come from the file itself, in a comment on its first
//! line (`// mesh: x=2,y=2`), so an example program carries the mesh it was
//! written for; `--mesh` wins when both are given.
//!
//! `weft lower CONFIG.toml` lowers a training config's whole step as
//! `weft train` compiles it (a config with `[pipeline]`: its stage plan).
//!
//! The compile is `weft_compiler::pipeline`'s list of passes:
//! `--dump-after PASS` (or `all`) writes the program's text after that pass
//! to stderr, or to `DIR/NN-PASS.txt` with `--dump-dir DIR` (alone, it dumps
//! after every pass); `--time-passes` prints each pass's wall time.

use super::check::load;
use super::run::pick_function;
use crate::diagnostics::render_ir_error;
use crate::error::{read_to_string, Error, Result};
use std::path::Path;
use std::path::PathBuf;
use weft_compiler::pipeline::{format_pass_times, PassTimes, Pipeline, Program};
use weft_compiler::sharding::{Mesh, PropagateOptions};
use weft_compiler::CompilerError;

/// `weft lower`'s dump and timing flags.
#[derive(Clone, Debug, Default)]
pub struct LowerOptions {
    /// Dump the program after this pass (`all`: after every pass).
    pub dump_after: Option<String>,
    /// Write dumps to `DIR/NN-PASS.txt` instead of stderr.
    pub dump_dir: Option<PathBuf>,
    /// Print each pass's wall time to stderr.
    pub time_passes: bool,
    /// After the summary, every reshard propagation inserted and why.
    pub explain: bool,
}

/// What a lowering produced besides the printed program: the dumps asked
/// for (pass, text) and the time of every pass.
#[derive(Debug, Default)]
pub struct Lowered {
    /// The device program and the summary.
    pub text: String,
    /// `(position, pass, program text)` after each pass asked for, in
    /// order; the position counts passes from `inline` (0).
    pub dumps: Vec<(usize, String, String)>,
    /// Every pass's wall time.
    pub times: PassTimes,
}

/// The mesh named in a `// mesh: ...` comment on the first line, if any.
pub fn mesh_comment(source: &str) -> Option<&str> {
    source.lines().next()?.trim().strip_prefix("//")?.trim().strip_prefix("mesh:").map(str::trim)
}

/// What lowering a program can fail with: a problem in the text (rendered
/// with its position by the caller) or in the compilation.
pub enum LowerError {
    /// The program does not parse or verify.
    Ir(weft_ir::IrError),
    /// No mesh, or no such function.
    Usage(Error),
    /// Propagation or partitioning failed.
    Compiler(Box<CompilerError>),
}

/// Parses `source`, picks the function, lowers it on the mesh (`mesh`, or
/// the file's mesh comment) and returns the device program followed by the
/// summary.
pub fn lower_source(source: &str, mesh: Option<&str>, func: Option<&str>) -> Result<String, LowerError> {
    Ok(lower_source_with(source, mesh, func, &LowerOptions::default())?.text)
}

/// [`lower_source`] with dumps and timings.
pub fn lower_source_with(
    source: &str,
    mesh: Option<&str>,
    func: Option<&str>,
    opts: &LowerOptions,
) -> Result<Lowered, LowerError> {
    let m = load(source).map_err(LowerError::Ir)?;
    let spec = mesh.or_else(|| mesh_comment(source)).ok_or_else(|| {
        LowerError::Usage(Error::Usage(
            "no mesh: pass --mesh (e.g. --mesh data=2,model=4) or start the file with \
                                        `// mesh: data=2,model=4`"
                .into(),
        ))
    })?;
    let mesh = Mesh::parse(spec).map_err(|e| LowerError::Compiler(Box::new(e)))?;
    let f = pick_function(&m, func).map_err(LowerError::Usage)?;
    let pipeline = Pipeline::standard(&mesh, &PropagateOptions::default());
    let compiler = |e| LowerError::Compiler(Box::new(e));
    let want = match (&opts.dump_after, &opts.dump_dir) {
        (Some(p), _) => {
            pipeline.check_pass_name(p).map_err(|e| LowerError::Usage(Error::Usage(format!("--dump-after: {e}"))))?;
            Some(p.clone())
        }
        (None, Some(_)) => Some("all".to_string()),
        (None, None) => None,
    };
    let mut dumps = Vec::new();
    let mut position = 0;
    let mut exchanges = Vec::new();
    let mut after = |pass: &str, p: &Program| {
        if want.as_deref().is_some_and(|w| w == "all" || w == pass) {
            dumps.push((position, pass.to_string(), p.text()));
        }
        if let (true, Program::Sharded(sf)) = (opts.explain, p) {
            exchanges = sf.reshard_lines();
        }
        position += 1;
    };
    let (p, times) = pipeline.run(&m, &f.name, &mut after).map_err(compiler)?;
    let pf = p.into_partitioned().map_err(compiler)?;
    let text = listing(&pf, "summary", opts.explain.then_some(&exchanges[..]));
    Ok(Lowered { text, dumps, times })
}

/// The program every device runs, the summary under `heading`, and with
/// `exchanges` the `--explain` section: every reshard propagation inserted
/// (the source of every exchange but a max/min reduction's all-reduce),
/// with the collectives that carry it out and why it is needed.
fn listing(pf: &weft_compiler::partition::PartitionedFunction, heading: &str, exchanges: Option<&[String]>) -> String {
    use std::fmt::Write;
    let mut text = weft_ir::device::print_program(&pf.program);
    let _ = write!(text, "\n{heading}:\n{}", pf.report());
    if let Some(lines) = exchanges {
        let _ = writeln!(text, "\nexchanges ({} reshards inserted by propagation):", lines.len());
        for l in lines {
            let _ = writeln!(text, "  {l}");
        }
    }
    text
}

/// The training step of config `c` on its mesh (default: one device),
/// compiled as `weft train` compiles it: the program every device runs and
/// the summary (collectives by kind with their bytes per device and step,
/// peak memory, parameter and optimizer bytes).
fn lower_config(c: &crate::runner::RunConfig, explain: bool) -> Result<String> {
    let (pf, exchanges) = crate::runner::compile_config(c, explain)?;
    Ok(listing(&pf, "summary (one training step)", explain.then_some(&exchanges[..])))
}

/// Writes the dumps to `dir` (`NN-PASS.txt`, NN the pass's position) or to
/// stderr, and the pass times to stderr.
fn report(l: &Lowered, opts: &LowerOptions) -> Result<()> {
    for (n, pass, text) in &l.dumps {
        match &opts.dump_dir {
            Some(dir) => {
                let io = |source| Error::Io { path: dir.clone(), source };
                std::fs::create_dir_all(dir).map_err(io)?;
                let path = dir.join(format!("{n:02}-{pass}.txt"));
                std::fs::write(&path, text).map_err(|source| Error::Io { path: path.clone(), source })?;
            }
            None => eprint!("// after {pass}:\n{text}\n"),
        }
    }
    if opts.time_passes {
        eprint!("{}", format_pass_times(&l.times, "pass "));
    }
    Ok(())
}

/// Runs `weft lower`; returns the exit code.
pub fn lower(file: &Path, mesh: Option<&str>, func: Option<&str>, opts: &LowerOptions) -> Result<i32> {
    let source = read_to_string(file)?;
    let path = file.display().to_string();
    if file.extension().is_some_and(|e| e == "toml") {
        let mut c = crate::runner::RunConfig::load(file)?;
        if let Some(m) = mesh {
            c.mesh = Some(m.to_string());
        }
        if c.pipeline.is_some() {
            // A training config with `[pipeline]`: the stage plan (split,
            // each stage's predicted time and memory, the predicted bubble).
            println!("{}", crate::runner::stages::plan_report(&c)?.text());
        } else {
            // Any other training config: its training step, compiled as
            // `weft train` compiles it, and what each device runs.
            print!("{}", lower_config(&c, opts.explain)?);
        }
        return Ok(0);
    }
    match lower_source_with(&source, mesh, func, opts) {
        Ok(l) => {
            report(&l, opts)?;
            print!("{}", l.text);
            Ok(0)
        }
        Err(LowerError::Ir(e)) => {
            eprint!("{}", render_ir_error(&path, &source, &e));
            Ok(1)
        }
        Err(LowerError::Usage(e)) => Err(e),
        Err(LowerError::Compiler(e)) => {
            eprintln!("{path}: error: {e}");
            Ok(1)
        }
    }
}
