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
//!
//! Under the interleaved schedule the units are split into `S·V` chunks
//! (chunk `c` runs on stage `c mod S`). A stage's time is the sum of its
//! `V` non-adjacent chunks', which a contiguous dynamic programme cannot
//! bound, so the objective is the predicted step time itself (the
//! schedule replayed under the chunks' times), minimised over the
//! programme's candidates (the smallest-`Σ` split for each `t_max`) and
//! the uniform split, then improved by moving one unit at a time across a
//! chunk boundary while that shortens the step: not always the exhaustive
//! optimum, never worse than uniform. Each chunk must fit `budget / V`, so that a stage's `V` chunks
//! fit the budget together (sufficient, not necessary: a split whose
//! chunks share a stage unevenly may be rejected although it fits).

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
    /// The schedule (how many microbatches each stage holds, and how many
    /// chunks the units are split into: [`Schedule::chunks`]).
    pub schedule: Schedule,
    /// Bytes per device a stage may use.
    pub memory_budget: Option<u64>,
}

/// A split with its predictions.
#[derive(Clone, Debug, PartialEq)]
pub struct StageSplit {
    /// Units per chunk, in chunk order (a chunk is a stage without
    /// interleaving).
    pub counts: Vec<usize>,
    /// Per chunk: forward and backward time of one microbatch.
    pub times: Vec<(f64, f64)>,
    /// Per chunk: predicted peak bytes per device.
    pub memory: Vec<u64>,
    /// Predicted step time: the makespan of the schedule under `times`.
    pub step_time: f64,
    /// Predicted bubble fraction under `times`.
    pub bubble: f64,
    /// The objective: `Σ T_s + (M−1)·max T_s`; under interleaving the
    /// predicted step time.
    pub objective: f64,
}

impl StageSplit {
    /// The first unit of each chunk and one past its last.
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
        self.schedule.check(self.stages, self.microbatches)?;
        if self.chunks() > self.units.len() {
            let names: Vec<&str> = self.units.iter().map(|u| u.name.as_str()).collect();
            return Err(CompilerError::PipelineStagesExceedLayers {
                stages: self.chunks(),
                pieces: self.pieces(),
                layers: self.units.len(),
                names: names.join(", "),
            });
        }
        Ok(())
    }

    /// What the units are split into, in words: `stages`, or `chunks (S
    /// stages × V virtual stages)`.
    fn pieces(&self) -> String {
        match self.schedule.virtual_stages() {
            1 => "stages".into(),
            v => format!("chunks ({} stages × {v} virtual stages)", self.stages),
        }
    }

    /// The chunks the units are split into (`S·V`).
    pub fn chunks(&self) -> usize {
        self.schedule.chunks(self.stages)
    }

    /// Microbatches of chunk `c` its stage holds at once.
    pub fn in_flight(&self, c: usize) -> usize {
        match self.schedule {
            Schedule::GPipe => self.microbatches,
            Schedule::OneFOneB => (self.stages - c).min(self.microbatches),
            Schedule::Interleaved { .. } => {
                let s = self.schedule.stage_of(self.stages, c);
                let order = super::schedule::stage_order(self.schedule, self.stages, self.microbatches, s);
                let own: Vec<_> = order.into_iter().filter(|t| t.chunk == c).collect();
                super::schedule::max_in_flight(&own)
            }
        }
    }

    fn time(&self, r: std::ops::Range<usize>) -> f64 {
        self.units[r].iter().map(|u| u.forward + u.backward).sum()
    }

    /// Predicted peak bytes per device of units `r` placed in chunk `c`.
    pub fn memory(&self, c: usize, r: std::ops::Range<usize>) -> u64 {
        self.memory_with(self.in_flight(c), r)
    }

    /// [`SplitProblem::memory`] of a chunk holding `in_flight` microbatches.
    fn memory_with(&self, in_flight: usize, r: std::ops::Range<usize>) -> u64 {
        let u = &self.units[r.clone()];
        let state: u64 = u.iter().map(|u| u.state_bytes).sum();
        let act: u64 = u.iter().map(|u| u.activation_bytes).sum();
        state + in_flight as u64 * self.units[r.start].input_bytes + act
    }

    /// What the searches ask of every range and chunk, computed once: each
    /// range's time (summed as [`SplitProblem::time`] sums it) and each
    /// chunk's microbatches in flight.
    fn tables(&self) -> Tables {
        let l = self.units.len();
        let time = (0..=l).map(|i| (0..=l).map(|j| if j > i { self.time(i..j) } else { 0.0 }).collect()).collect();
        Tables { time, in_flight: (0..self.chunks()).map(|c| self.in_flight(c)).collect() }
    }

    /// A chunk's share of the budget: all of it, `1/V` when interleaved.
    fn chunk_budget(&self) -> Option<u64> {
        self.memory_budget.map(|b| b / self.schedule.virtual_stages() as u64)
    }

    fn fits(&self, t: &Tables, c: usize, r: std::ops::Range<usize>) -> bool {
        self.chunk_budget().is_none_or(|b| self.memory_with(t.in_flight[c], r) <= b)
    }

    /// The predictions for `counts`.
    pub fn evaluate(&self, counts: &[usize]) -> Result<StageSplit, CompilerError> {
        self.check()?;
        // A checked sum: counts near 2^64 must not wrap round to the layer count.
        let total = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c));
        if counts.len() != self.chunks() || counts.contains(&0) || total != Some(self.units.len()) {
            let what = if self.chunks() == self.stages { "stages" } else { "chunks (stages × virtual_stages)" };
            return Err(CompilerError::PipelineConfig {
                message: format!(
                    "the split {counts:?} must give each of the {} {what} at least one layer and cover all {} layers",
                    self.chunks(),
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
        let trace = simulate(self.schedule, self.stages, self.microbatches, &|c, p| match p {
            Phase::Forward => times[c].0,
            Phase::Backward => times[c].1,
        })?;
        let sum: f64 = times.iter().map(|(f, b)| f + b).sum();
        let max = times.iter().map(|(f, b)| f + b).fold(0.0, f64::max);
        Ok(StageSplit {
            counts: counts.to_vec(),
            times,
            memory,
            step_time: trace.makespan(),
            bubble: trace.bubble(),
            objective: if self.schedule.virtual_stages() > 1 {
                trace.makespan()
            } else {
                sum + (self.microbatches as f64 - 1.0) * max
            },
        })
    }

    /// As equal as possible: the first `L mod C` chunks get one more layer.
    pub fn uniform(&self) -> Result<StageSplit, CompilerError> {
        self.check()?;
        let (l, s) = (self.units.len(), self.chunks());
        let counts: Vec<usize> = (0..s).map(|i| l / s + usize::from(i < l % s)).collect();
        self.evaluate(&counts)
    }

    /// The cost-optimal split under the memory budget (see the module docs).
    pub fn best(&self) -> Result<StageSplit, CompilerError> {
        self.check()?;
        let l = self.units.len();
        let tables = self.tables();
        let mut candidates: Vec<f64> =
            (0..l).flat_map(|i| (i + 1..=l).map(move |j| (i, j))).map(|(i, j)| tables.time[i][j]).collect();
        candidates.sort_by(f64::total_cmp);
        candidates.dedup();
        if self.schedule.virtual_stages() > 1 {
            return self.best_interleaved(&candidates, &tables);
        }
        let mut best: Option<(f64, f64, Vec<usize>)> = None;
        for &t_max in &candidates {
            if let Some((_, bt, _)) = &best {
                // Σ ≥ t_max, so objectives only grow past the best's bound.
                if t_max * self.microbatches as f64 > best.as_ref().map_or(f64::INFINITY, |b| b.0) && t_max > *bt {
                    break;
                }
            }
            let Some((sum, counts)) = self.min_sum(t_max, &tables) else { continue };
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

    /// [`SplitProblem::best`] under interleaving: the split with the
    /// shortest predicted step among the dynamic programme's (one per
    /// `t_max` of `candidates`) and the uniform split, where they fit the
    /// budget (ties: the first found), then single-unit moves across a
    /// boundary while one shortens the step (the best move each time).
    fn best_interleaved(&self, candidates: &[f64], tables: &Tables) -> Result<StageSplit, CompilerError> {
        let mut best: Option<StageSplit> = None;
        let uniform = self.uniform()?;
        let fits = |sp: &StageSplit| {
            let b = self.chunk_budget();
            sp.memory.iter().all(|&m| b.is_none_or(|b| m <= b))
        };
        // Splits the programme finds for several `t_max` are evaluated once.
        let mut seen = std::collections::HashSet::new();
        let from_dp = (candidates.iter())
            .filter_map(|&t| self.min_sum(t, tables))
            .filter(|(_, counts)| seen.insert(counts.clone()))
            .map(|(_, counts)| self.evaluate(&counts));
        for split in from_dp.chain(std::iter::once(Ok(uniform))) {
            let split = split?;
            if fits(&split) && best.as_ref().is_none_or(|b| split.step_time < b.step_time) {
                best = Some(split);
            }
        }
        let mut best = best.ok_or_else(|| self.infeasible())?;
        // Then moves of one unit across one chunk boundary while the best
        // move shortens the step (each move strictly shortens it, so this
        // ends; the count bounds it anyway).
        for _ in 0..self.units.len() * self.chunks() {
            let mut improved: Option<StageSplit> = None;
            for i in 0..best.counts.len() - 1 {
                for (from, to) in [(i, i + 1), (i + 1, i)] {
                    if best.counts[from] < 2 {
                        continue;
                    }
                    let mut counts = best.counts.clone();
                    counts[from] -= 1;
                    counts[to] += 1;
                    let split = self.evaluate(&counts)?;
                    let beats = improved.as_ref().map_or(best.step_time, |b| b.step_time);
                    if fits(&split) && split.step_time < beats {
                        improved = Some(split);
                    }
                }
            }
            match improved {
                Some(split) => best = split,
                None => break,
            }
        }
        Ok(best)
    }

    /// The smallest `Σ T_s` over splits whose stages each take at most
    /// `t_max` and fit the budget, with the split.
    fn min_sum(&self, t_max: f64, tables: &Tables) -> Option<(f64, Vec<usize>)> {
        best_split(
            self.units.len(),
            self.chunks(),
            0.0,
            |k, r| {
                let t = tables.time[r.start][r.end];
                (t <= t_max && self.fits(tables, k, r)).then_some(t)
            },
            |a, b| a + b,
        )
    }

    /// The error for a budget no split meets: the split with the smallest
    /// largest-chunk memory, and that memory (times `V`: the stage's share).
    fn infeasible(&self) -> CompilerError {
        let (l, stages) = (self.units.len(), self.chunks());
        let (minimum, counts) =
            best_split(l, stages, 0u64, |k, r| Some(self.memory(k, r)), u64::max).expect("stages <= layers");
        CompilerError::PipelineMemoryInfeasible {
            stages,
            pieces: self.pieces(),
            layers: l,
            budget: self.memory_budget.unwrap_or(0),
            minimum: minimum * self.schedule.virtual_stages() as u64,
            split: format!("{counts:?} layers per {}", if stages == self.stages { "stage" } else { "chunk" }),
        }
    }
}

/// Per-range times and per-chunk microbatches in flight
/// ([`SplitProblem::tables`]).
struct Tables {
    /// `time[i][j]`: units `i..j`'s forward and backward time.
    time: Vec<Vec<f64>>,
    /// Per chunk: the microbatches its stage holds at once.
    in_flight: Vec<usize>,
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
    fn interleaved_splits_cut_chunks_and_weigh_the_busiest_stage() {
        let ts = [4.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 5.0];
        for (s, m) in [(2, 2), (2, 8), (3, 6)] {
            let mut p = problem(&ts, s, m);
            p.schedule = Schedule::Interleaved { virtual_stages: 2 };
            let best = p.best().unwrap();
            assert_eq!(best.counts.len(), 2 * s);
            let brute = all_splits(ts.len(), 2 * s)
                .into_iter()
                .map(|c| p.evaluate(&c).unwrap().objective)
                .fold(f64::INFINITY, f64::min);
            // The step-time objective: never worse than uniform, and here
            // within 5% of the exhaustive optimum.
            assert_eq!(best.objective, best.step_time);
            assert!(best.step_time <= p.uniform().unwrap().step_time, "S={s} M={m}");
            assert!(best.step_time <= brute * 1.05, "S={s} M={m}: {} vs exhaustive {brute}", best.step_time);
            eprintln!(
                "S={s} M={m}: {} vs exhaustive {brute}, uniform {}",
                best.step_time,
                p.uniform().unwrap().step_time
            );
        }
        // Each chunk fits half the budget; 4 chunks of one MLP each here.
        let mut p = problem(&[1.0, 1.0, 1.0, 1.0], 2, 4);
        p.schedule = Schedule::Interleaved { virtual_stages: 2 };
        assert!(p.evaluate(&[1, 1, 1]).is_err());
        p.memory_budget = Some(2000);
        assert!(matches!(p.best(), Err(CompilerError::PipelineMemoryInfeasible { .. })));
        p.memory_budget = Some(2 * p.evaluate(&[1, 1, 1, 1]).unwrap().memory.iter().max().unwrap());
        assert_eq!(p.best().unwrap().counts, vec![1, 1, 1, 1]);
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
