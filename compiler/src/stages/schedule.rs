//! Pipeline schedules: the order of forward and backward tasks on each
//! stage, and a clock that replays that order under task durations.
//!
//! A schedule is only an order per stage; dependencies are fixed by the
//! data flow: F(s, m) needs F(s−1, m) (its input activation), B(s, m) needs
//! F(s, m) and B(s+1, m) (its output's cotangent). [`simulate`] starts every
//! task as soon as its stage is free and its inputs exist, which is what the
//! pipeline driver does with real tasks, so the unit-cost trace is the
//! driver's trace with every task taking its unit time.
//!
//! - **GPipe**: every forward (microbatch order), then every backward
//!   (microbatch order). A stage holds all M microbatches' activations.
//! - **1F1B** (PipeDream-Flush): stage s runs `min(S−s−1, M)` warm-up
//!   forwards, then alternates one forward and one backward, then drains
//!   the remaining backwards. A stage holds at most `S − s` microbatches.
//!
//! - **Interleaved 1F1B** (Megatron-LM's virtual stages, Narayanan et al.,
//!   2021): the model is cut into `S·V` chunks and stage `s` holds the `V`
//!   non-adjacent chunks `s, s+S, s+2S, …`. A stage runs its chunks' tasks in
//!   groups of `S` microbatches per chunk (forwards through its chunks in
//!   order, backwards in reverse), with `2·(S−s−1) + (V−1)·S` warm-up
//!   forwards, then one forward and one backward, then the rest of the
//!   backwards. A microbatch crosses every stage `V` times, so each hop is
//!   `1/V` of a stage's work and the fill and drain shrink by `V`.
//!
//! Every schedule runs the backwards of each chunk in microbatch order, so
//! gradients are accumulated `g0 + g1 + …` as in the unpipelined
//! accumulating step. With equal task costs per chunk, GPipe and 1F1B have
//! the bubble `(S−1)/(M+S−1)` and interleaved 1F1B `(S−1)/(V·M+S−1)`.
//!
//! Without interleaving a chunk is a stage (`V = 1`, chunk `s` on stage
//! `s`); the words below say *chunk* where the two differ.

use crate::CompilerError;
use std::fmt;
use std::str::FromStr;

/// Which pipeline schedule.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// All forwards, then all backwards (Huang et al., 2019).
    GPipe,
    /// One forward, one backward in the steady state (Narayanan et al., 2021).
    OneFOneB,
    /// 1F1B over `virtual_stages` chunks per stage (Megatron-LM's
    /// interleaved schedule).
    Interleaved {
        /// Chunks per stage, `V ≥ 2`.
        virtual_stages: usize,
    },
}

impl Schedule {
    /// The schedules with one chunk per stage.
    pub const ALL: [Schedule; 2] = [Schedule::GPipe, Schedule::OneFOneB];

    /// The names used in configs.
    pub const NAMES: [&'static str; 3] = ["gpipe", "1f1b", "interleaved"];

    /// The name used in configs: `gpipe`, `1f1b`, `interleaved`.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved { .. } => "interleaved",
        }
    }

    /// The schedule named `name` (`pipeline.schedule`) with `virtual_stages`
    /// chunks per stage (`pipeline.virtual_stages`): at least 2 with
    /// `interleaved`, 1 with the others.
    pub fn named(name: &str, virtual_stages: usize) -> Result<Schedule, CompilerError> {
        let s = match name {
            "gpipe" => Schedule::GPipe,
            "1f1b" => Schedule::OneFOneB,
            "interleaved" => Schedule::Interleaved { virtual_stages },
            _ => {
                return Err(CompilerError::PipelineConfig {
                    message: format!("unknown pipeline schedule `{name}` (expected `gpipe`, `1f1b` or `interleaved`)"),
                })
            }
        };
        match (s, virtual_stages) {
            (Schedule::Interleaved { .. }, v) if v < 2 => Err(CompilerError::PipelineConfig {
                message: format!(
                    "schedule `interleaved` needs virtual_stages ≥ 2 chunks per stage, given {v} (with one chunk \
                     per stage use `1f1b`)"
                ),
            }),
            (Schedule::GPipe | Schedule::OneFOneB, v) if v != 1 => Err(CompilerError::PipelineConfig {
                message: format!(
                    "virtual_stages = {v} needs schedule = \"interleaved\" (`{name}` runs one chunk per stage)"
                ),
            }),
            _ => Ok(s),
        }
    }

    /// Chunks per stage: `V` when interleaved, else 1.
    pub fn virtual_stages(self) -> usize {
        match self {
            Schedule::Interleaved { virtual_stages } => virtual_stages,
            _ => 1,
        }
    }

    /// The chunks the model is cut into on `stages` stages: `S·V`.
    pub fn chunks(self, stages: usize) -> usize {
        stages * self.virtual_stages()
    }

    /// The stage that runs chunk `chunk` of `stages`: `chunk mod S`.
    pub fn stage_of(self, stages: usize, chunk: usize) -> usize {
        chunk % stages.max(1)
    }

    /// Whether the schedule runs `micro` microbatches on `stages` stages:
    /// the interleaved schedule takes the microbatches in groups of `S`
    /// (as Megatron-LM's), so `M` must be a multiple of `S`.
    pub fn check(self, stages: usize, micro: usize) -> Result<(), CompilerError> {
        if let Schedule::Interleaved { virtual_stages } = self {
            if virtual_stages < 2 {
                return Schedule::named("interleaved", virtual_stages).map(|_| ());
            }
            if stages == 0 || micro % stages != 0 {
                return Err(CompilerError::PipelineConfig {
                    message: format!(
                        "the interleaved schedule runs microbatches in groups of one per stage: microbatches \
                         ({micro}) must be a multiple of the stages ({stages})"
                    ),
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Interleaved { virtual_stages } => write!(f, "interleaved (V={virtual_stages})"),
            _ => f.write_str(self.name()),
        }
    }
}

impl FromStr for Schedule {
    type Err = CompilerError;
    /// A name of [`Schedule::NAMES`]; `interleaved` with 2 chunks per stage.
    fn from_str(s: &str) -> Result<Schedule, CompilerError> {
        Schedule::named(s, if s == "interleaved" { 2 } else { 1 })
    }
}

/// Forward or backward.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// The stage's forward on one microbatch.
    Forward,
    /// The stage's backward on one microbatch (recomputing its forward).
    Backward,
}

impl Phase {
    /// `F` or `B`.
    pub fn letter(self) -> char {
        match self {
            Phase::Forward => 'F',
            Phase::Backward => 'B',
        }
    }
}

/// One task of a stage: a phase of a chunk on a microbatch.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Task {
    /// The phase.
    pub phase: Phase,
    /// The microbatch.
    pub micro: usize,
    /// The chunk of the model (`0..S·V`; the stage itself when `V = 1`).
    pub chunk: usize,
}

/// The tasks of stage `s` of `stages`, with `micro` microbatches, in the
/// order the schedule runs them. The interleaved schedule needs
/// [`Schedule::check`] to hold.
pub fn stage_order(schedule: Schedule, stages: usize, micro: usize, s: usize) -> Vec<Task> {
    let f = |m| Task { phase: Phase::Forward, micro: m, chunk: s };
    let b = |m| Task { phase: Phase::Backward, micro: m, chunk: s };
    match schedule {
        Schedule::GPipe => (0..micro).map(f).chain((0..micro).map(b)).collect(),
        Schedule::OneFOneB => {
            let warm = (stages - s - 1).min(micro);
            let mut out: Vec<Task> = (0..warm).map(f).collect();
            for i in 0..micro - warm {
                out.push(f(warm + i));
                out.push(b(i));
            }
            out.extend((micro - warm..micro).map(b));
            out
        }
        Schedule::Interleaved { virtual_stages: v } => {
            // Megatron-LM's order: the k-th forward of a stage is chunk
            // (k / S) mod V (the k-th backward the same chunks in reverse)
            // on microbatch (k / (S·V))·S + k mod S.
            let group = stages * v;
            let nth = |k: usize, phase: Phase| {
                let local = (k % group) / stages;
                let local = if phase == Phase::Forward { local } else { v - 1 - local };
                Task { phase, micro: (k / group) * stages + k % stages, chunk: local * stages + s }
            };
            let total = micro * v;
            let warm = (2 * (stages - s - 1) + (v - 1) * stages).min(total);
            let mut out: Vec<Task> = (0..warm).map(|k| nth(k, Phase::Forward)).collect();
            for i in 0..total - warm {
                out.push(nth(warm + i, Phase::Forward));
                out.push(nth(i, Phase::Backward));
            }
            out.extend((total - warm..total).map(|k| nth(k, Phase::Backward)));
            out
        }
    }
}

/// The most microbatch stashes (of any of its chunks) stage `s` holds at
/// once under `order` (forwards run but whose backward has not).
pub fn max_in_flight(order: &[Task]) -> usize {
    let (mut live, mut peak) = (0usize, 0usize);
    for t in order {
        match t.phase {
            Phase::Forward => {
                live += 1;
                peak = peak.max(live);
            }
            Phase::Backward => live = live.saturating_sub(1),
        }
    }
    peak
}

/// One task as it ran: stage, task, start and end on some clock.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    /// The stage.
    pub stage: usize,
    /// The task.
    pub task: Task,
    /// Start time.
    pub start: f64,
    /// End time.
    pub end: f64,
}

/// A schedule trace: every task of every stage with its times.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// The number of stages (devices along the stage axis; each runs its
    /// chunks' tasks).
    pub stages: usize,
    /// The clock: `unit` (the cost model's unit clock) or `seconds`.
    pub clock: String,
    /// The events, in the order they were recorded.
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// The time from the first start to the last end.
    pub fn makespan(&self) -> f64 {
        let start = self.events.iter().map(|e| e.start).fold(f64::INFINITY, f64::min);
        let end = self.events.iter().map(|e| e.end).fold(f64::NEG_INFINITY, f64::max);
        if self.events.is_empty() {
            0.0
        } else {
            end - start
        }
    }

    /// The fraction of stage-time spent idle: `1 − busy / (S × makespan)`.
    pub fn bubble(&self) -> f64 {
        let span = self.makespan();
        if span <= 0.0 {
            return 0.0;
        }
        let busy: f64 = self.events.iter().map(|e| e.end - e.start).sum();
        1.0 - busy / (self.stages as f64 * span)
    }

    /// The trace as JSON: `{"clock": .., "stages": S, "makespan": ..,
    /// "bubble": .., "events": [{"stage", "chunk", "phase", "micro", "start", "end"}]}`.
    pub fn to_json(&self) -> String {
        let events: Vec<String> = self
            .events
            .iter()
            .map(|e| {
                format!(
                    "{{\"stage\":{},\"chunk\":{},\"phase\":\"{}\",\"micro\":{},\"start\":{},\"end\":{}}}",
                    e.stage,
                    e.task.chunk,
                    e.task.phase.letter(),
                    e.task.micro,
                    json_num(e.start),
                    json_num(e.end)
                )
            })
            .collect();
        format!(
            "{{\"clock\":\"{}\",\"stages\":{},\"makespan\":{},\"bubble\":{},\"events\":[{}]}}",
            self.clock,
            self.stages,
            json_num(self.makespan()),
            json_num(self.bubble()),
            events.join(",")
        )
    }
}

fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

/// Replays the schedule with task durations `cost(chunk, phase)`: each
/// stage runs its tasks in order, each as soon as the stage is free and its
/// input exists (F(c, m) needs F(c−1, m); B(c, m) needs F(c, m) and
/// B(c+1, m)). The clock starts at 0. A schedule that cannot run
/// (deadlocks, or fails [`Schedule::check`]) is an error.
pub fn simulate(
    schedule: Schedule,
    stages: usize,
    micro: usize,
    cost: &dyn Fn(usize, Phase) -> f64,
) -> Result<Trace, CompilerError> {
    schedule.check(stages, micro)?;
    let chunks = schedule.chunks(stages);
    let orders: Vec<Vec<Task>> = (0..stages).map(|s| stage_order(schedule, stages, micro, s)).collect();
    // done[chunk][phase][m] = end time.
    let mut done = vec![[vec![None::<f64>; micro], vec![None::<f64>; micro]]; chunks];
    let mut next = vec![0usize; stages];
    let mut free = vec![0.0f64; stages];
    let mut events = Vec::with_capacity(chunks * micro * 2);
    let total = chunks * micro * 2;
    while events.len() < total {
        let mut progressed = false;
        for s in 0..stages {
            while next[s] < orders[s].len() {
                let t = orders[s][next[s]];
                let c = t.chunk;
                let dep = match t.phase {
                    Phase::Forward if c == 0 => Some(0.0),
                    Phase::Forward => done[c - 1][0][t.micro],
                    Phase::Backward => {
                        let own = done[c][0][t.micro];
                        let after = if c + 1 == chunks { Some(0.0) } else { done[c + 1][1][t.micro] };
                        own.zip(after).map(|(a, b)| a.max(b))
                    }
                };
                let Some(ready) = dep else { break };
                let start = free[s].max(ready);
                let end = start + cost(c, t.phase);
                done[c][t.phase as usize][t.micro] = Some(end);
                free[s] = end;
                events.push(TraceEvent { stage: s, task: t, start, end });
                next[s] += 1;
                progressed = true;
            }
        }
        if !progressed {
            return Err(CompilerError::Internal {
                stage: "pipeline schedule".into(),
                message: format!("the {schedule} schedule deadlocks with {stages} stages and {micro} microbatches"),
            });
        }
    }
    Ok(Trace { stages, clock: "unit".into(), events })
}

/// The bubble with equal task costs per chunk: `(S−1)/(M+S−1)` for GPipe
/// and 1F1B, `(S−1)/(V·M+S−1)` for interleaved 1F1B.
pub fn ideal_bubble(schedule: Schedule, stages: usize, micro: usize) -> f64 {
    let vm = (schedule.virtual_stages() * micro) as f64;
    (stages as f64 - 1.0) / (vm + stages as f64 - 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_cost_bubble_is_the_textbook_fraction_for_both_schedules() {
        for schedule in Schedule::ALL {
            for s in 1..=6 {
                for m in [1, 2, 3, 4, 8, 16] {
                    for (f, b) in [(1.0, 1.0), (1.0, 2.0)] {
                        let t = simulate(schedule, s, m, &|_, p| if p == Phase::Forward { f } else { b }).unwrap();
                        assert_eq!(t.events.len(), 2 * s * m);
                        let want = ideal_bubble(schedule, s, m);
                        assert!(
                            (t.bubble() - want).abs() < 1e-12,
                            "{schedule} S={s} M={m} F={f} B={b}: {} vs {want}",
                            t.bubble()
                        );
                        assert_eq!(t.makespan(), (f + b) * (m + s - 1) as f64, "{schedule} S={s} M={m}");
                    }
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_holds_at_most_s_minus_stage_microbatches() {
        for s in 1..=5 {
            for m in [1, 4, 8, 16] {
                for st in 0..s {
                    let o1 = stage_order(Schedule::OneFOneB, s, m, st);
                    let og = stage_order(Schedule::GPipe, s, m, st);
                    assert_eq!(max_in_flight(&o1), (s - st).min(m), "1f1b S={s} M={m} stage {st}");
                    assert_eq!(max_in_flight(&og), m, "gpipe S={s} M={m} stage {st}");
                    // Backwards in microbatch order (accumulation order).
                    let bs: Vec<usize> = o1.iter().filter(|t| t.phase == Phase::Backward).map(|t| t.micro).collect();
                    assert_eq!(bs, (0..m).collect::<Vec<_>>());
                }
            }
        }
    }

    #[test]
    fn unequal_stage_costs_make_the_slowest_stage_dominate() {
        // Stage 1 twice as slow: makespan = sum of other stages' one-microbatch
        // costs plus M x the slowest (F + B).
        let t = simulate(Schedule::GPipe, 3, 8, &|s, _| if s == 1 { 2.0 } else { 1.0 }).unwrap();
        assert!(t.bubble() > ideal_bubble(Schedule::GPipe, 3, 8));
        assert!(t.to_json().starts_with("{\"clock\":\"unit\",\"stages\":3"));
        assert!("zero".parse::<Schedule>().is_err());
        assert_eq!("1f1b".parse::<Schedule>().unwrap(), Schedule::OneFOneB);
    }

    #[test]
    fn interleaved_bubble_is_the_megatron_fraction() {
        for v in 2..=4 {
            let schedule = Schedule::Interleaved { virtual_stages: v };
            for s in 1..=5 {
                for m in [s, 2 * s, 4 * s] {
                    for (f, b) in [(1.0, 1.0), (1.0, 2.0)] {
                        let t = simulate(schedule, s, m, &|_, p| if p == Phase::Forward { f } else { b }).unwrap();
                        assert_eq!(t.events.len(), 2 * s * v * m);
                        let want = ideal_bubble(schedule, s, m);
                        assert!((t.bubble() - want).abs() < 1e-12, "V={v} S={s} M={m}: {} vs {want}", t.bubble());
                        assert_eq!(t.makespan(), (f + b) * (v * m + s - 1) as f64, "V={v} S={s} M={m}");
                        if s > 1 {
                            let cost = |_: usize, p: Phase| if p == Phase::Forward { f } else { b };
                            let one = simulate(Schedule::OneFOneB, s, m, &cost).unwrap();
                            assert!(t.bubble() < one.bubble(), "V={v} S={s} M={m}: not below 1F1B's");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn interleaved_stages_run_their_own_chunks_with_backwards_in_microbatch_order() {
        let (s_n, v, m) = (3, 2, 6);
        let schedule = Schedule::Interleaved { virtual_stages: v };
        for s in 0..s_n {
            let order = stage_order(schedule, s_n, m, s);
            assert_eq!(order.len(), 2 * v * m);
            for c in (0..s_n * v).filter(|c| c % s_n == s) {
                let of = |p: Phase| -> Vec<usize> {
                    order.iter().filter(|t| t.chunk == c && t.phase == p).map(|t| t.micro).collect()
                };
                assert_eq!(of(Phase::Forward), (0..m).collect::<Vec<_>>(), "stage {s} chunk {c}");
                assert_eq!(of(Phase::Backward), (0..m).collect::<Vec<_>>(), "stage {s} chunk {c}");
            }
            assert!(order.iter().all(|t| t.chunk % s_n == s));
        }
        // Named errors: V < 2, V with another schedule, M not a multiple of S.
        assert!(Schedule::named("interleaved", 1).is_err());
        assert!(Schedule::named("1f1b", 2).is_err());
        assert!(Schedule::named("zero", 1).is_err());
        assert!(simulate(schedule, 4, 6, &|_, _| 1.0).is_err());
        assert_eq!(schedule.to_string(), "interleaved (V=2)");
    }
}
