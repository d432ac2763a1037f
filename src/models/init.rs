//! Initial parameters by rule (`[model.init]`): each parameter takes the
//! first rule whose pattern matches its name. A parameter's values are a
//! pure function of (seed, its name): they do not depend on the mesh, the
//! process count, or which other parameters the model has, so adding a
//! layer leaves every other layer's initial values as they were.

use super::rules::Rules;
use super::{filled, normal_init};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use weft_ir::prng::Key;
use weft_ir::tensor::HostTensor;
use weft_ir::TensorType;

/// How one parameter is initialised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InitFn {
    /// Normal(0, std²).
    Normal(f64),
    /// Uniform in [lo, hi).
    Uniform(f64, f64),
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Every element `v`.
    Constant(f64),
    /// Normal with std 1/√(dimension 0) (LeCun's fan-in for an `[in, out]`
    /// weight).
    FanIn,
}

impl fmt::Display for InitFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            InitFn::Normal(s) => write!(f, "normal({s})"),
            InitFn::Uniform(lo, hi) => write!(f, "uniform({lo}, {hi})"),
            InitFn::Zeros => f.write_str("zeros"),
            InitFn::Ones => f.write_str("ones"),
            InitFn::Constant(v) => write!(f, "constant({v})"),
            InitFn::FanIn => f.write_str("fan_in"),
        }
    }
}

impl FromStr for InitFn {
    type Err = String;

    fn from_str(s: &str) -> Result<InitFn, String> {
        let expected = "expected normal(STD), uniform(LO, HI), zeros, ones, constant(V) or fan_in";
        let s = s.trim();
        let (name, args) = match s.split_once('(') {
            Some((n, rest)) => {
                let inner = rest.strip_suffix(')').ok_or_else(|| format!("`{s}`: a missing `)`; {expected}"))?;
                let args: Result<Vec<f64>, _> = inner.split(',').map(|a| a.trim().parse::<f64>()).collect();
                let args = args.map_err(|_| format!("`{s}`: the arguments must be numbers; {expected}"))?;
                (n.trim(), args)
            }
            None => (s, Vec::new()),
        };
        if args.iter().any(|a| !a.is_finite()) {
            return Err(format!("`{s}`: the arguments must be finite"));
        }
        let f = match (name, args.as_slice()) {
            ("normal", &[std]) if std >= 0.0 => InitFn::Normal(std),
            ("normal", &[_]) => return Err(format!("`{s}`: the standard deviation must be at least 0")),
            ("uniform", &[lo, hi]) if lo < hi => InitFn::Uniform(lo, hi),
            ("uniform", &[_, _]) => return Err(format!("`{s}`: uniform(LO, HI) needs LO < HI")),
            ("constant", &[v]) => InitFn::Constant(v),
            ("zeros", []) => InitFn::Zeros,
            ("ones", []) => InitFn::Ones,
            ("fan_in", []) => InitFn::FanIn,
            _ => return Err(format!("`{s}`: {expected}")),
        };
        Ok(f)
    }
}

/// The key of one named leaf: the seed folded with a tag and the first 64
/// bits of SHA-256 of the name.
pub fn name_key(seed: u64, tag: u32, name: &str) -> Key {
    let h = Sha256::digest(name.as_bytes());
    let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    Key::from_seed(seed).fold_in(tag).fold_in(word(0)).fold_in(word(4))
}

/// The tag of initial-parameter keys.
const INIT_TAG: u32 = 0x1417;

impl InitFn {
    /// The initial value of a leaf of type `ty` drawn from `key`.
    pub fn sample(&self, key: Key, ty: &TensorType) -> Result<HostTensor, String> {
        if !ty.dtype.is_float() {
            return Err(format!("initialises floats, but the parameter is {ty}"));
        }
        let shape = &ty.shape;
        let n: usize = shape.iter().product();
        let f32s = match *self {
            InitFn::Normal(std) => normal_init(key, shape, std),
            InitFn::FanIn => {
                let fan_in = *shape.first().ok_or("fan_in needs a parameter of rank at least 1")?;
                normal_init(key, shape, 1.0 / (fan_in.max(1) as f64).sqrt())
            }
            InitFn::Uniform(lo, hi) => {
                let u = key.uniform_f32(n);
                let v = u.iter().map(|&x| (lo + (hi - lo) * x as f64) as f32).collect();
                HostTensor::from_f32(shape, v).map_err(|e| e.to_string())?
            }
            InitFn::Zeros => filled(shape, 0.0),
            InitFn::Ones => filled(shape, 1.0),
            InitFn::Constant(v) => filled(shape, v as f32),
        };
        if ty.dtype == weft_ir::DType::F32 {
            return Ok(f32s);
        }
        HostTensor::from_values(ty, &f32s.to_f64_vec()).map_err(|e| e.to_string())
    }
}

/// Rules from `(pattern, init function)` text pairs, in order (as
/// `[model.init]` and [`crate::Trainer::init`] write them); a function
/// that does not parse is an error naming its pattern.
pub fn parse_rules<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Rules<InitFn>, String> {
    let rules: Result<Vec<(String, InitFn)>, String> = pairs
        .into_iter()
        .map(|(pat, f)| Ok((pat.to_string(), f.parse().map_err(|e| format!("\"{pat}\": {e}"))?)))
        .collect();
    Ok(Rules::new(rules?))
}

/// The initial parameters `params` (name, type) by `rules` from `seed`.
/// A parameter no rule covers, or a rule that covers no parameter, is an
/// error that names them.
pub fn init_by_rules(
    rules: &Rules<InitFn>,
    params: &[(String, TensorType)],
    seed: u64,
) -> Result<BTreeMap<String, HostTensor>, String> {
    let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    let unmatched = rules.unmatched(&names);
    if !unmatched.is_empty() {
        return Err(format!(
            "[model.init] pattern{} {} match{} no parameter (the parameters: {})",
            if unmatched.len() == 1 { "" } else { "s" },
            unmatched.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", "),
            if unmatched.len() == 1 { "es" } else { "" },
            shown(&names)
        ));
    }
    let uncovered: Vec<&str> = names.iter().copied().filter(|n| rules.first(n).is_none()).collect();
    if !uncovered.is_empty() {
        return Err(format!(
            "no [model.init] rule covers {} (add a pattern such as `\"params.*\" = \"normal(0.02)\"`, or init_from)",
            shown(&uncovered)
        ));
    }
    params
        .iter()
        .map(|(name, ty)| {
            let rule = rules.first(name).expect("every name is covered");
            let t = rule
                .value
                .sample(name_key(seed, INIT_TAG, name), ty)
                .map_err(|e| format!("[model.init] `{}` = \"{}\" on {name}: {e}", rule.pattern, rule.value))?;
            Ok((name.clone(), t))
        })
        .collect()
}

/// Names for a message: all of them up to eight, else the first eight and
/// how many more.
pub(crate) fn shown(names: &[&str]) -> String {
    let mut s = names.iter().take(8).copied().collect::<Vec<_>>().join(", ");
    if names.len() > 8 {
        s += &format!(" and {} more", names.len() - 8);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::DType;

    #[test]
    fn init_functions_parse_and_print() {
        for s in ["normal(0.02)", "uniform(-0.5, 0.5)", "zeros", "ones", "constant(0.25)", "fan_in"] {
            assert_eq!(s.parse::<InitFn>().unwrap().to_string(), s);
        }
        for bad in ["normal", "normal(-1)", "uniform(1, 0)", "gaussian(1)", "zeros(1)", "normal(nan)", "normal(0.1"] {
            assert!(bad.parse::<InitFn>().is_err(), "{bad}");
        }
    }

    #[test]
    fn values_depend_on_seed_and_name_only() {
        let ty = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
        let rules = Rules::new([("params.*.b".to_string(), InitFn::Zeros), ("params.*".to_string(), InitFn::FanIn)]);
        let two = [("params.a.w".to_string(), ty(&[4, 3])), ("params.a.b".to_string(), ty(&[3]))];
        let three = [two[0].clone(), ("params.z.w".to_string(), ty(&[100, 2])), two[1].clone()];
        let a = init_by_rules(&rules, &two, 7).unwrap();
        let b = init_by_rules(&rules, &three, 7).unwrap();
        assert!(a["params.a.w"].bitwise_eq(&b["params.a.w"]), "another parameter changes nothing");
        assert!(!a["params.a.w"].bitwise_eq(&init_by_rules(&rules, &two, 8).unwrap()["params.a.w"]));
        assert_eq!(a["params.a.b"].to_f64_vec(), vec![0.0; 3]);
        // fan_in: std 1/sqrt(100) over 200 draws.
        let w = b["params.z.w"].to_f64_vec();
        let std = (w.iter().map(|x| x * x).sum::<f64>() / w.len() as f64).sqrt();
        assert!((std - 0.1).abs() < 0.02, "{std}");
        let e = init_by_rules(&Rules::new([("params.a.*".to_string(), InitFn::Ones)]), &three, 0).unwrap_err();
        assert!(e.contains("params.z.w"), "{e}");
        let e = init_by_rules(&Rules::new([("params.q*".to_string(), InitFn::Ones)]), &two, 0).unwrap_err();
        assert!(e.contains("`params.q*`") && e.contains("match"), "{e}");
    }
}
