//! Choosing which layers go on which stage.
//!
//! The model is a sequence of units (an embedding, the blocks, a head; see
//! [`super::graph`]), each with a predicted forward and backward time, the
//! bytes of state it keeps (parameters, gradient accumulators, optimizer
//! slots), the bytes of activations one microbatch produces inside it, and
//! the bytes a stage starting at it must stash per microbatch in flight
//! (its input activations). A split puts contiguous runs of units on the
//! stages, in order.
//!
//! The default split is Alpa's inter-operator formulation: minimise
//! `Σ_s T_s + (M−1)·max_s T_s` (a pipeline's step time: one microbatch
//! through every stage plus M−1 more through the slowest) subject to every
//! stage's memory fitting the per-device budget. For every candidate
//! `t_max` (each contiguous run's time) a dynamic programme finds the
//! smallest `Σ T_s` with every stage at most `t_max`; the best
//! `Σ + (M−1)·t_max` over the candidates is optimal. Ties go to the
//! smaller `t_max`, then to the lexicographically smallest split, so the
//! choice is deterministic.

use super::schedule::{simulate, Phase, Schedule};
use crate::CompilerError;

/// Predicted costs of one unit for one microbatch.
#[derive(Clone, Debug, PartialEq)]
pub struct UnitProfile {
    /// The unit's name (e.g. `params.h.3`).
    pub name: String,
    /// Forward time (cost-model seconds).
    pub forward: f64,
    /// Backward time (recomputed forward plus the gradient).
    pub backward: f64,
    /// Bytes of state: parameters, their gradient accumulators and
    /// optimizer slots.
    pub state_bytes: u64,
    /// Bytes of the activations the unit produces for one microbatch.
    pub activation_bytes: u64,
    /// Bytes a stage starting at this unit receives (and stashes) per
    /// microbatch: the activations crossing into it, and the batch inputs.
    pub input_bytes: u64,
}

/// What to optimise for.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitProblem {
    /// The units, in order.
    pub units: Vec<UnitProfile>,
    /// Stages.
    pub stages: usize,
    /// Microbatches per step.
    pub microbatches: usize,
    /// The schedule (how many microbatches each stage holds).
    pub schedule: Schedule,
    /// Bytes per device a stage may use.
    pub memory_budget: Option<u64>,
}

/// A split with its predictions.
#[derive(Clone, Debug, PartialEq)]
pub struct StageSplit {
    /// Units per stage, in stage order.
    pub counts: Vec<usize>,
    /// Per stage: forward and backward time of one microbatch.
    pub times: Vec<(f64, f64)>,
    /// Per stage: predicted peak bytes per device.
    pub memory: Vec<u64>,
    /// Predicted step time: the makespan of the schedule under `times`.
    pub step_time: f64,
    /// Predicted bubble fraction under `times`.
    pub bubble: f64,
    /// `Σ T_s + (M−1)·max T_s`, the objective.
    pub objective: f64,
}

impl StageSplit {
    /// The first unit of each stage and one past its last.
    pub fn ranges(&self) -> Vec<std::ops::Range<usize>> {
        let mut at = 0;
        self.counts
            .iter()
            .map(|&c| {
                at += c;
                at - c..at
            })
            .collect()
    }
}

impl SplitProblem {
    fn check(&self) -> Result<(), CompilerError> {
        if self.stages == 0 || self.microbatches == 0 {
            return Err(CompilerError::PipelineConfig {
                message: format!(
                    "stages ({}) and microbatches ({}) must be at least 1",
                    self.stages, self.microbatches
                ),
            });
        }
        if self.stages > self.units.len() {
            let names: Vec<&str> = self.units.iter().map(|u| u.name.as_str()).collect();
            return Err(CompilerError::PipelineStagesExceedLayers {
                stages: self.stages,
                layers: self.units.len(),
                names: names.join(", "),
            });
        }
        Ok(())
    }

    /// Microbatches stage `s` holds at once.
    pub fn in_flight(&self, s: usize) -> usize {
        match self.schedule {
            Schedule::GPipe => self.microbatches,
            Schedule::OneFOneB => (self.stages - s).min(self.microbatches),
        }
    }

    fn time(&self, r: std::ops::Range<usize>) -> f64 {
        self.units[r].iter().map(|u| u.forward + u.backward).sum()
    }

    /// Predicted peak bytes per device of units `r` placed on stage `s`.
    pub fn memory(&self, s: usize, r: std::ops::Range<usize>) -> u64 {
        let u = &self.units[r.clone()];
        let state: u64 = u.iter().map(|u| u.state_bytes).sum();
        let act: u64 = u.iter().map(|u| u.activation_bytes).sum();
        state + self.in_flight(s) as u64 * self.units[r.start].input_bytes + act
    }

    fn fits(&self, s: usize, r: std::ops::Range<usize>) -> bool {
        self.memory_budget.is_none_or(|b| self.memory(s, r) <= b)
    }

    /// The predictions for `counts`.
    pub fn evaluate(&self, counts: &[usize]) -> Result<StageSplit, CompilerError> {
        self.check()?;
        // A checked sum: counts near 2^64 must not wrap round to the layer count.
        let total = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c));
        if counts.len() != self.stages || counts.contains(&0) || total != Some(self.units.len()) {
            return Err(CompilerError::PipelineConfig {
                message: format!(
                    "the split {counts:?} must give each of the {} stages at least one layer and cover all {} layers",
                    self.stages,
                    self.units.len()
                ),
            });
        }
        let mut at = 0;
        let (mut times, mut memory) = (Vec::new(), Vec::new());
        for (s, &c) in counts.iter().enumerate() {
            let r = at..at + c;
            at += c;
            let f: f64 = self.units[r.clone()].iter().map(|u| u.forward).sum();
            let b: f64 = self.units[r.clone()].iter().map(|u| u.backward).sum();
            times.push((f, b));
            memory.push(self.memory(s, r));
        }
        let trace = simulate(self.schedule, self.stages, self.microbatches, &|s, p| match p {
            Phase::Forward => times[s].0,
            Phase::Backward => times[s].1,
        })?;
        let sum: f64 = times.iter().map(|(f, b)| f + b).sum();
        let max = times.iter().map(|(f, b)| f + b).fold(0.0, f64::max);
        Ok(StageSplit {
            counts: counts.to_vec(),
            times,
            memory,
            step_time: trace.makespan(),
            bubble: trace.bubble(),
            objective: sum + (self.microbatches as f64 - 1.0) * max,
        })
    }

    /// As equal as possible: the first `L mod S` stages get one more layer.
    pub fn uniform(&self) -> Result<StageSplit, CompilerError> {
        self.check()?;
        let (l, s) = (self.units.len(), self.stages);
        let counts: Vec<usize> = (0..s).map(|i| l / s + usize::from(i < l % s)).collect();
        self.evaluate(&counts)
    }

    /// The cost-optimal split under the memory budget (see the module docs).
    pub fn best(&self) -> Result<StageSplit, CompilerError> {
        self.check()?;
        let l = self.units.len();
        let mut candidates: Vec<f64> =
            (0..l).flat_map(|i| (i + 1..=l).map(move |j| (i, j))).map(|(i, j)| self.time(i..j)).collect();
        candidates.sort_by(f64::total_cmp);
        candidates.dedup();
        let mut best: Option<(f64, f64, Vec<usize>)> = None;
        for &t_max in &candidates {
            if let Some((_, bt, _)) = &best {
                // Σ ≥ t_max, so objectives only grow past the best's bound.
                if t_max * self.microbatches as f64 > best.as_ref().map_or(f64::INFINITY, |b| b.0) && t_max > *bt {
                    break;
                }
            }
            let Some((sum, counts)) = self.min_sum(t_max) else { continue };
            let obj = sum + (self.microbatches as f64 - 1.0) * t_max;
            if best.as_ref().is_none_or(|b| obj < b.0) {
                best = Some((obj, t_max, counts));
            }
        }
        match best {
            Some((_, _, counts)) => self.evaluate(&counts),
            None => Err(self.infeasible()),
        }
    }

    /// The smallest `Σ T_s` over splits whose stages each take at most
    /// `t_max` and fit the budget, with the split.
    fn min_sum(&self, t_max: f64) -> Option<(f64, Vec<usize>)> {
        best_split(
            self.units.len(),
            self.stages,
            0.0,
            |k, r| {
                let t = self.time(r.clone());
                (t <= t_max && self.fits(k, r)).then_some(t)
            },
            |a, b| a + b,
        )
    }

    /// The error for a budget no split meets: the split with the smallest
    /// largest-stage memory, and that memory.
    fn infeasible(&self) -> CompilerError {
        let (l, stages) = (self.units.len(), self.stages);
        let (minimum, counts) =
            best_split(l, stages, 0u64, |k, r| Some(self.memory(k, r)), u64::max).expect("stages <= layers");
        CompilerError::PipelineMemoryInfeasible {
            stages,
            layers: l,
            budget: self.memory_budget.unwrap_or(0),
            minimum,
            split: format!("{counts:?} layers per stage"),
        }
    }
}

/// The split of `units` units into `stages` non-empty contiguous stages
/// that minimises the stage costs combined with `combine` (a sum, or a
/// max), by dynamic programming over (stages used, units covered); `cost(k,
/// range)` is stage `k`'s cost, `None` where the stage is not allowed.
/// Returns the best value and the units per stage.
fn best_split<T: Copy + PartialOrd>(
    units: usize,
    stages: usize,
    zero: T,
    cost: impl Fn(usize, std::ops::Range<usize>) -> Option<T>,
    combine: impl Fn(T, T) -> T,
) -> Option<(T, Vec<usize>)> {
    // dp[k][j]: the best k stages covering units 0..j, and where the last starts.
    let mut dp = vec![vec![None::<(T, usize)>; units + 1]; stages + 1];
    dp[0][0] = Some((zero, 0));
    for k in 1..=stages {
        for j in k..=units {
            for i in (k - 1)..j {
                let Some((prev, _)) = dp[k - 1][i] else { continue };
                let Some(c) = cost(k - 1, i..j) else { continue };
                let v = combine(prev, c);
                if dp[k][j].is_none_or(|(b, _)| v < b) {
                    dp[k][j] = Some((v, i));
                }
            }
        }
    }
    let (best, _) = dp[stages][units]?;
    let mut counts = vec![0; stages];
    let mut j = units;
    for k in (1..=stages).rev() {
        let (_, i) = dp[k][j].expect("reachable");
        counts[k - 1] = j - i;
        j = i;
    }
    Some((best, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(name: &str, t: f64, state: u64) -> UnitProfile {
        UnitProfile {
            name: name.into(),
            forward: t,
            backward: 3.0 * t,
            state_bytes: state,
            activation_bytes: 10,
            input_bytes: 100,
        }
    }

    fn problem(ts: &[f64], stages: usize, m: usize) -> SplitProblem {
        SplitProblem {
            units: ts.iter().enumerate().map(|(i, &t)| unit(&format!("u{i}"), t, 1000)).collect(),
            stages,
            microbatches: m,
            schedule: Schedule::OneFOneB,
            memory_budget: None,
        }
    }

    /// Every split of `l` units into `s` non-empty runs.
    fn all_splits(l: usize, s: usize) -> Vec<Vec<usize>> {
        if s == 1 {
            return vec![vec![l]];
        }
        (1..=l - (s - 1))
            .flat_map(|c| {
                all_splits(l - c, s - 1).into_iter().map(move |mut r| {
                    r.insert(0, c);
                    r
                })
            })
            .collect()
    }

    #[test]
    fn the_dynamic_programme_finds_the_exhaustive_optimum() {
        let ts = [4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 5.0];
        for s in 1..=5 {
            for m in [1, 4, 16] {
                let p = problem(&ts, s, m);
                let best = p.best().unwrap();
                let brute = all_splits(ts.len(), s)
                    .into_iter()
                    .map(|c| p.evaluate(&c).unwrap().objective)
                    .fold(f64::INFINITY, f64::min);
                assert_eq!(best.objective, brute, "S={s} M={m}: {:?}", best.counts);
                assert!(best.objective <= p.uniform().unwrap().objective);
            }
        }
        // Heavy ends: the cost split gives the heavy units stages of their own.
        let p = problem(&ts, 4, 8);
        let (best, uni) = (p.best().unwrap(), p.uniform().unwrap());
        assert!(best.step_time < uni.step_time, "{best:?} vs {uni:?}");
        assert_eq!(best.counts.first(), Some(&1));
        assert_eq!(best.counts.last(), Some(&1));
    }

    #[test]
    fn bad_splits_are_named_errors() {
        let p = problem(&[1.0, 1.0], 3, 4);
        assert!(matches!(p.best(), Err(CompilerError::PipelineStagesExceedLayers { stages: 3, layers: 2, .. })));
        let p = problem(&[1.0, 1.0, 1.0], 2, 4);
        assert!(matches!(p.evaluate(&[3, 0]), Err(CompilerError::PipelineConfig { .. })));
        assert!(matches!(p.evaluate(&[1, 1]), Err(CompilerError::PipelineConfig { .. })));
        // Counts whose sum wraps round past 2^64 to the layer count.
        let wraps = [usize::MAX / 2 + 1, usize::MAX / 2 + 4]; // 2^63 + (2^63 + 3)
        assert_eq!(wraps[0].wrapping_add(wraps[1]), 3, "wraps to the layer count");
        assert!(matches!(p.evaluate(&wraps), Err(CompilerError::PipelineConfig { .. })));
        let mut p = problem(&[1.0, 1.0, 1.0, 1.0], 2, 4);
        // Each stage needs its units' state (1000 each) + 2 x 100 stash + activations.
        p.memory_budget = Some(1500);
        let e = p.best().unwrap_err();
        assert!(matches!(e, CompilerError::PipelineMemoryInfeasible { minimum: 2220, .. }), "{e}");
        p.memory_budget = Some(2220);
        assert_eq!(p.best().unwrap().counts, vec![2, 2]);
    }
}
