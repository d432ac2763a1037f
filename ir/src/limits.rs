//! The memory limit that user-given sizes are checked against before
//! anything of that size is allocated.
//!
//! The limit is, in order of precedence: an explicit value (a command-line
//! flag or config key, passed in by the caller), the environment variable
//! `WEFT_MEMORY_LIMIT` (`16GiB`, `512MiB`, `1e9`, `4000000000`), or the
//! machine's memory (`MemTotal` in `/proc/meminfo`). Where none is known
//! (no `/proc/meminfo`), nothing is checked.

use crate::IrError;
use std::fmt;

/// The environment variable that overrides the machine's memory as the limit.
pub const MEMORY_LIMIT_ENV: &str = "WEFT_MEMORY_LIMIT";

/// Where a memory limit comes from (for error messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitSource {
    /// Given explicitly, e.g. `--memory-limit` (the text names where).
    Explicit(String),
    /// The `WEFT_MEMORY_LIMIT` environment variable.
    Env,
    /// The machine's memory (`MemTotal` in `/proc/meminfo`).
    Machine,
}

impl fmt::Display for LimitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitSource::Explicit(w) => f.write_str(w),
            LimitSource::Env => write!(f, "{MEMORY_LIMIT_ENV}"),
            LimitSource::Machine => f.write_str("the machine's memory, MemTotal in /proc/meminfo"),
        }
    }
}

/// A memory limit in bytes and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    /// The limit in bytes.
    pub bytes: u64,
    /// Where it comes from.
    pub source: LimitSource,
}

impl MemoryLimit {
    /// The limit from `WEFT_MEMORY_LIMIT`, else the machine's memory, else
    /// `None`. A malformed `WEFT_MEMORY_LIMIT` is an error.
    pub fn detect() -> Result<Option<MemoryLimit>, IrError> {
        if let Some(text) = std::env::var_os(MEMORY_LIMIT_ENV) {
            let text = text.to_string_lossy();
            let bytes = parse_bytes(&text).map_err(|message| IrError::Input {
                name: MEMORY_LIMIT_ENV.into(),
                message: format!("`{text}`: {message}"),
            })?;
            return Ok(Some(MemoryLimit { bytes, source: LimitSource::Env }));
        }
        Ok(machine_memory().map(|bytes| MemoryLimit { bytes, source: LimitSource::Machine }))
    }

    /// An explicit limit (`text` like `16GiB`), where `what` names the flag
    /// or key it came from; `None` falls back to [`MemoryLimit::detect`].
    pub fn resolve(text: Option<&str>, what: &str) -> Result<Option<MemoryLimit>, IrError> {
        match text {
            Some(t) => {
                let bytes = parse_bytes(t)
                    .map_err(|message| IrError::Input { name: what.into(), message: format!("`{t}`: {message}") })?;
                Ok(Some(MemoryLimit { bytes, source: LimitSource::Explicit(what.into()) }))
            }
            None => MemoryLimit::detect(),
        }
    }

    /// An error unless `need` bytes fit: `what` says what needs them.
    pub fn check(&self, what: &str, need: u64) -> Result<(), IrError> {
        if need <= self.bytes {
            return Ok(());
        }
        Err(IrError::TooLarge {
            what: what.to_string(),
            need,
            limit: self.bytes,
            limit_source: self.source.to_string(),
        })
    }
}

/// The machine's memory in bytes (`MemTotal` in `/proc/meminfo`), if known.
pub fn machine_memory() -> Option<u64> {
    // MemTotal does not change while a process runs: read it once, not on
    // every interpreter an oracle test builds.
    static MEM_TOTAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *MEM_TOTAL.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// Parses a size in bytes, the one size grammar of every flag and key
/// (`--memory-limit`, `--memory-budget`, `WEFT_MEMORY_LIMIT`): a
/// non-negative number with an optional unit (`B`, `KB`/`MB`/`GB`/`TB` =
/// powers of 1000, also `K`/`M`/`G`/`T`; `KiB`/`MiB`/`GiB`/`TiB` = powers of
/// 1024), e.g. `16GiB`, `1.5e9`, `512 MiB`. Case and spaces between number
/// and unit are ignored; fractions of a byte round to the nearest.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    if ["nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"].contains(&lower.as_str()) {
        return Err(format!("`{t}` is not a size: a finite number of bytes ≥ 1, with an optional unit (`2GiB`)"));
    }
    // `1e9` uses `e` as exponent; a unit never starts with `e`.
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("unknown unit `{}` (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", unit.trim())),
    };
    if num.trim().is_empty() {
        return Err(format!("`{t}` has no number before its unit (`2GiB`)"));
    }
    let v: f64 = num.trim().parse().map_err(|_| format!("`{}` is not a number", num.trim()))?;
    let bytes = v * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(format!("must be a size between 1 byte and {} bytes", u64::MAX));
    }
    Ok(bytes.round() as u64)
}

/// Bytes as `1.5 GiB`.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_reject_nonsense() {
        assert_eq!(parse_bytes("16GiB"), Ok(16 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5e9"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("2KB"), Ok(2000));
        for bad in ["nan", "NaN", "inf", "-inf", "Infinity"] {
            assert!(parse_bytes(bad).unwrap_err().contains("is not a size"), "{bad}");
        }
        assert!(parse_bytes("GiB").unwrap_err().contains("no number"));
        assert!(parse_bytes("-1GiB").is_err());
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("1e30").is_err());
        assert!(parse_bytes("3 parsecs").unwrap_err().contains("unknown unit"));
        let limit = MemoryLimit { bytes: 100, source: LimitSource::Env };
        assert!(limit.check("x", 100).is_ok());
        let e = limit.check("the tensor %c", 101).unwrap_err().to_string();
        assert!(e.contains("101") && e.contains("100") && e.contains("WEFT_MEMORY_LIMIT"), "{e}");
        assert!(machine_memory().is_none_or(|m| m > 0));
    }
}
