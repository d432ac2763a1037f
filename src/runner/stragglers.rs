//! Stragglers: which process the others wait for.
//!
//! In a step of several processes the fastest ones finish their compute
//! and then wait in the collectives for the slowest: a step is as slow as
//! its slowest process. Each process measures its step's wall time and
//! the time it spent in exchanges with the others
//! ([`weft_runtime::process::TimedGroup`]); the difference is its compute.
//! The step boundary ([`super::boundary`]) brings every process's pair to
//! all of them, and process 0 keeps them: per step, the process with the
//! longest compute is the one the others waited for; per process, the
//! median and 99th percentile of both times go to `run.json`; and a
//! process whose compute exceeds `ratio` times the median of the others'
//! for `steps` steps in a row (`[stragglers]`) is named in a warning, once
//! per such streak. A difference under [`MIN_GAP_MS`] never counts: it is
//! scheduling noise, not a slow process.
//!
//! The waiting time counts exchanges between processes (the host path of
//! the collectives, and the runner's own exchanges); collectives that a
//! GPU library runs on the devices (NCCL) are compute here.

use serde::{Deserialize, Serialize};

/// A compute excess (over the others' median) below this is not a
/// straggler, whatever the ratio: milliseconds.
pub const MIN_GAP_MS: f64 = 1.0;

/// One process's times of one step, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTime {
    /// The step's wall time less the waiting.
    pub compute_ms: f64,
    /// Time spent in exchanges with the other processes.
    pub wait_ms: f64,
}

impl StepTime {
    /// A step of `step_secs` seconds of which `waited_secs` were spent
    /// waiting for other processes.
    pub fn of(step_secs: f64, waited_secs: f64) -> StepTime {
        StepTime { compute_ms: (step_secs - waited_secs).max(0.0) * 1e3, wait_ms: waited_secs * 1e3 }
    }
}

/// `[stragglers]`: when a slow process is named in a warning.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StragglerSection {
    /// A process this many times slower (in compute) than the median of
    /// the others is slow.
    #[serde(default = "d_ratio")]
    pub ratio: f64,
    /// Steps in a row a process must be slow to be warned about.
    #[serde(default = "d_steps")]
    pub steps: u64,
}

fn d_ratio() -> f64 {
    1.5
}

fn d_steps() -> u64 {
    20
}

impl Default for StragglerSection {
    fn default() -> Self {
        StragglerSection { ratio: d_ratio(), steps: d_steps() }
    }
}

/// Process 0's record of every process's step times.
#[derive(Clone, Debug)]
pub struct Stragglers {
    rule: StragglerSection,
    /// Per process, its times of every recorded step.
    times: Vec<Vec<StepTime>>,
    /// Per process, the steps in which the others waited for it.
    slowest: Vec<u64>,
    /// Per process, the slow steps in a row up to the last one recorded.
    streak: Vec<u64>,
    /// The warnings given, in order.
    warnings: Vec<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The `q`-quantile (nearest rank) of `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return 0.0;
    }
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

impl Stragglers {
    /// A record of `processes` processes under `rule`.
    pub fn new(processes: usize, rule: StragglerSection) -> Stragglers {
        Stragglers {
            rule,
            times: vec![Vec::new(); processes],
            slowest: vec![0; processes],
            streak: vec![0; processes],
            warnings: Vec::new(),
        }
    }

    /// Records the times of step `step` (numbered from 0, as the metrics
    /// file does; in rank order); returns the warning of a process that
    /// has just been slow for `steps` steps in a row.
    /// `host(q)` names process `q`'s host.
    pub fn record(&mut self, step: u64, times: &[StepTime], host: impl Fn(usize) -> String) -> Option<String> {
        if times.len() != self.times.len() || times.len() < 2 {
            return None;
        }
        for (q, t) in times.iter().enumerate() {
            self.times[q].push(*t);
        }
        let compute: Vec<f64> = times.iter().map(|t| t.compute_ms).collect();
        // The first of the longest: ties go to the lower rank.
        let slowest = (0..compute.len()).fold(0, |m, q| if compute[q] > compute[m] { q } else { m });
        let others = |q: usize| median(compute.iter().enumerate().filter(|&(r, _)| r != q).map(|(_, &c)| c).collect());
        if compute[slowest] - others(slowest) >= MIN_GAP_MS {
            self.slowest[slowest] += 1;
        }
        let mut warning = None;
        for q in 0..compute.len() {
            let rest = others(q);
            let slow = compute[q] > self.rule.ratio * rest && compute[q] - rest >= MIN_GAP_MS;
            self.streak[q] = if slow { self.streak[q] + 1 } else { 0 };
            if slow && self.streak[q] == self.rule.steps {
                let n = self.rule.steps as usize;
                let recent = |r: usize| median(self.times[r].iter().rev().take(n).map(|t| t.compute_ms).collect());
                let rest: Vec<f64> = (0..compute.len()).filter(|&r| r != q).map(recent).collect();
                let (mine, theirs) = (recent(q), median(rest));
                // Steps as the metrics file numbers them (from 0).
                let w = format!(
                    "process {q} (host {}) is a straggler: its compute took {:.1}× the others' in steps {}–{step} \
                     (median {mine:.2} ms against {theirs:.2} ms); the others wait for it in every collective",
                    host(q),
                    mine / theirs.max(1e-9),
                    step + 1 - self.rule.steps,
                );
                self.warnings.push(w.clone());
                warning.get_or_insert(w);
            }
        }
        warning
    }

    /// Process `q`'s compute and waiting times of every recorded step.
    fn series(&self, q: usize) -> (Vec<f64>, Vec<f64>) {
        self.times[q].iter().map(|t| (t.compute_ms, t.wait_ms)).unzip()
    }

    /// The line a run ends with: the process the others waited for most
    /// often, if any step had a straggler; `None` for one process.
    pub fn summary(&self, host: impl Fn(usize) -> String) -> Option<String> {
        let steps = self.times.first().map_or(0, Vec::len);
        if self.times.len() < 2 || steps == 0 {
            return None;
        }
        let q = (0..self.slowest.len()).fold(0, |m, q| if self.slowest[q] > self.slowest[m] { q } else { m });
        let per: Vec<String> = (0..self.times.len())
            .map(|r| {
                let (c, w) = self.series(r);
                format!("{r}: compute {:.2} ms, wait {:.2} ms", quantile(&c, 0.5), quantile(&w, 0.5))
            })
            .collect();
        let waited = match self.slowest[q] {
            0 => "no process was slower than the others by 1 ms or more".to_string(),
            n => format!("the others waited for process {q} (host {}) in {n} of {steps} steps", host(q)),
        };
        Some(format!("processes: {waited}; medians per process {}", per.join("; ")))
    }

    /// The record as `run.json` keeps it: per process, its host, the
    /// steps the others waited for it, and the median and 99th percentile
    /// of its compute and waiting times; the warnings given.
    pub fn json(&self, host: impl Fn(usize) -> String) -> serde_json::Value {
        let processes: Vec<serde_json::Value> = (0..self.times.len())
            .map(|q| {
                let (c, w) = self.series(q);
                serde_json::json!({
                    "rank": q,
                    "host": host(q),
                    "steps": c.len(),
                    "slowest_steps": self.slowest[q],
                    "compute_ms": { "p50": quantile(&c, 0.5), "p99": quantile(&c, 0.99) },
                    "wait_ms": { "p50": quantile(&w, 0.5), "p99": quantile(&w, 0.99) },
                })
            })
            .collect();
        serde_json::json!({
            "ratio": self.rule.ratio,
            "steps": self.rule.steps,
            "processes": processes,
            "warnings": self.warnings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(compute_ms: f64, wait_ms: f64) -> StepTime {
        StepTime { compute_ms, wait_ms }
    }

    #[test]
    fn a_process_slow_for_steps_in_a_row_is_warned_about_once() {
        let mut s = Stragglers::new(3, StragglerSection { ratio: 1.5, steps: 3 });
        let host = |q: usize| format!("h{q}");
        // Steps 0-1: process 2 slow; step 2: not; steps 3-6: slow again.
        let slow = [t(10.0, 20.0), t(11.0, 19.0), t(30.0, 0.1)];
        let even = [t(10.0, 1.0), t(10.5, 0.5), t(10.2, 0.8)];
        assert_eq!(s.record(0, &slow, host), None);
        assert_eq!(s.record(1, &slow, host), None);
        assert_eq!(s.record(2, &even, host), None, "the streak is broken");
        assert_eq!(s.record(3, &slow, host), None);
        assert_eq!(s.record(4, &slow, host), None);
        let w = s.record(5, &slow, host).expect("three slow steps in a row");
        assert!(w.starts_with("process 2 (host h2) is a straggler"), "{w}");
        assert!(w.contains("2.9×") && w.contains("against 10.50 ms") && w.contains("in steps 3–5"), "{w}");
        assert_eq!(s.record(6, &slow, host), None, "once per streak");
        let j = s.json(host);
        assert_eq!(j["processes"][2]["slowest_steps"], 6);
        assert_eq!(j["processes"][2]["compute_ms"]["p50"], 30.0);
        assert_eq!(j["processes"][0]["wait_ms"]["p99"], 20.0);
        assert_eq!(j["warnings"].as_array().unwrap().len(), 1);
        let line = s.summary(host).unwrap();
        assert!(line.contains("waited for process 2 (host h2) in 6 of 7 steps"), "{line}");
    }

    #[test]
    fn noise_under_the_gap_and_one_process_are_no_stragglers() {
        let mut s = Stragglers::new(2, StragglerSection { ratio: 1.1, steps: 1 });
        let host = |q: usize| format!("h{q}");
        // 0.5 ms against 0.2 ms: 2.5 times, but under MIN_GAP_MS.
        assert_eq!(s.record(0, &[t(0.2, 0.3), t(0.5, 0.0)], host), None);
        assert!(s.summary(host).unwrap().contains("no process was slower"));
        let mut one = Stragglers::new(1, StragglerSection::default());
        assert_eq!(one.record(0, &[t(5.0, 0.0)], host), None);
        assert_eq!(one.summary(host), None);
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((quantile(&v, 0.5), quantile(&v, 0.99), quantile(&v, 1.0)), (50.0, 99.0, 100.0));
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        let st = StepTime::of(0.010, 0.004);
        assert!((st.compute_ms - 6.0).abs() < 1e-9 && (st.wait_ms - 4.0).abs() < 1e-9, "{st:?}");
        assert_eq!(StepTime::of(0.001, 0.002).compute_ms, 0.0, "never negative");
    }
}
