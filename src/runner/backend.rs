//! The backend a run executes on: parsed once, from the config's
//! `backend` (or `--backend`), and handed on as this type — the executor,
//! the machine model of the cost model, the pipeline stages, the
//! evaluator and `run.json` all read the same value.

use super::RunConfig;
use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;
use weft_runtime::BackendKind;

/// Where a run executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The unsharded reference interpreter, one device (`interp`).
    Interp,
    /// The reference device-program simulator, every device in one thread
    /// (`sim`).
    Sim,
    /// Runtime devices (`cpu`, `cpu-ref`, `wgpu`, `cuda`).
    Runtime(BackendKind),
}

impl Backend {
    /// Every backend's name, as configs and flags write them.
    pub const NAMES: [&'static str; 6] = ["cpu", "cpu-ref", "wgpu", "cuda", "sim", "interp"];

    /// The backend of a config without one: the fast CPU devices.
    pub const DEFAULT: Backend = Backend::Runtime(BackendKind::Cpu);

    /// The backend of a config (its `backend`, else [`Backend::DEFAULT`]).
    pub fn of(c: &RunConfig) -> Result<Backend> {
        c.backend.as_deref().map_or(Ok(Backend::DEFAULT), str::parse)
    }

    /// The name configs and flags use.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Interp => "interp",
            Backend::Sim => "sim",
            Backend::Runtime(k) => k.name(),
        }
    }

    /// Whether its devices are the host's cores (they share them: the
    /// cost model's machine model divides the cores among the devices).
    pub fn on_host(self) -> bool {
        matches!(self, Backend::Interp | Backend::Sim | Backend::Runtime(BackendKind::Cpu | BackendKind::CpuRef))
    }

    /// Whether it runs in one process only (the oracles).
    pub fn one_process(self) -> bool {
        matches!(self, Backend::Interp | Backend::Sim)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;

    fn from_str(s: &str) -> Result<Backend> {
        Ok(match s {
            "interp" => Backend::Interp,
            "sim" => Backend::Sim,
            other => Backend::Runtime(other.parse()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in Backend::NAMES {
            assert_eq!(n.parse::<Backend>().unwrap().name(), n);
        }
        assert!("tpu".parse::<Backend>().is_err());
        assert!("cpu".parse::<Backend>().unwrap().on_host() && !"wgpu".parse::<Backend>().unwrap().on_host());
    }
}
