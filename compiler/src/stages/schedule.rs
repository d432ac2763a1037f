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
//! Both run the backwards of a stage in microbatch order, so gradients are
//! accumulated `g0 + g1 + …` as in the unpipelined accumulating step. With
//! equal task costs, both have the bubble `(S−1)/(M+S−1)`.

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
}

impl Schedule {
    /// Both schedules.
    pub const ALL: [Schedule; 2] = [Schedule::GPipe, Schedule::OneFOneB];

    /// The name used in configs: `gpipe`, `1f1b`.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Schedule {
    type Err = CompilerError;
    fn from_str(s: &str) -> Result<Schedule, CompilerError> {
        Schedule::ALL.into_iter().find(|x| x.name() == s).ok_or_else(|| CompilerError::PipelineConfig {
            message: format!("unknown pipeline schedule `{s}` (expected `gpipe` or `1f1b`)"),
        })
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

/// One task of a stage: a phase on a microbatch.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Task {
    /// The phase.
    pub phase: Phase,
    /// The microbatch.
    pub micro: usize,
}

/// The tasks of stage `s` of `stages`, with `micro` microbatches, in the
/// order the schedule runs them.
pub fn stage_order(schedule: Schedule, stages: usize, micro: usize, s: usize) -> Vec<Task> {
    let f = |m| Task { phase: Phase::Forward, micro: m };
    let b = |m| Task { phase: Phase::Backward, micro: m };
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
    }
}

/// The most microbatches whose activations stage `s` holds at once under
/// `order` (forwards run but whose backward has not).
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
    /// The number of stages.
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
    /// "bubble": .., "events": [{"stage", "phase", "micro", "start", "end"}]}`.
    pub fn to_json(&self) -> String {
        let events: Vec<String> = self
            .events
            .iter()
            .map(|e| {
                format!(
                    "{{\"stage\":{},\"phase\":\"{}\",\"micro\":{},\"start\":{},\"end\":{}}}",
                    e.stage,
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

/// Replays the schedule with task durations `cost(stage, phase)`: each
/// stage runs its tasks in order, each as soon as the stage is free and its
/// input exists. The clock starts at 0.
pub fn simulate(
    schedule: Schedule,
    stages: usize,
    micro: usize,
    cost: &dyn Fn(usize, Phase) -> f64,
) -> Result<Trace, CompilerError> {
    let orders: Vec<Vec<Task>> = (0..stages).map(|s| stage_order(schedule, stages, micro, s)).collect();
    // done[s][phase][m] = end time.
    let mut done = vec![[vec![None::<f64>; micro], vec![None::<f64>; micro]]; stages];
    let mut next = vec![0usize; stages];
    let mut free = vec![0.0f64; stages];
    let mut events = Vec::with_capacity(stages * micro * 2);
    let total = stages * micro * 2;
    while events.len() < total {
        let mut progressed = false;
        for s in 0..stages {
            while next[s] < orders[s].len() {
                let t = orders[s][next[s]];
                let dep = match t.phase {
                    Phase::Forward if s == 0 => Some(0.0),
                    Phase::Forward => done[s - 1][0][t.micro],
                    Phase::Backward => {
                        let own = done[s][0][t.micro];
                        let after = if s + 1 == stages { Some(0.0) } else { done[s + 1][1][t.micro] };
                        own.zip(after).map(|(a, b)| a.max(b))
                    }
                };
                let Some(ready) = dep else { break };
                let start = free[s].max(ready);
                let end = start + cost(s, t.phase);
                done[s][t.phase as usize][t.micro] = Some(end);
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

/// `(S−1)/(M+S−1)`: the bubble of GPipe and 1F1B with equal task costs.
pub fn ideal_bubble(stages: usize, micro: usize) -> f64 {
    (stages as f64 - 1.0) / (micro as f64 + stages as f64 - 1.0)
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
                        let want = ideal_bubble(s, m);
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
        assert!(t.bubble() > ideal_bubble(3, 8));
        assert!(t.to_json().starts_with("{\"clock\":\"unit\",\"stages\":3"));
        assert!("zero".parse::<Schedule>().is_err());
        assert_eq!("1f1b".parse::<Schedule>().unwrap(), Schedule::OneFOneB);
    }
}
