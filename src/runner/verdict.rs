//! Where a step's time goes, per device: compute, communication, idle.
//!
//! Every step the executable measures, per device of this process, the
//! wall time of its lane's run and the time in the device's own ops,
//! fused chains and transfers (compute) and in its collectives
//! (communication) ([`weft_runtime::DeviceTime`]; always on, two clock
//! reads per segment of ops and per collective). The rest is idle: the
//! lane driving its other devices (more devices than threads), or waiting.
//! Collectives do not overlap compute yet, so all communication is
//! exposed. The run averages the steps after the first (which pays
//! one-time costs), prints one line and keeps per-device means in
//! `run.json`. A device is compute-, communication- or idle-bound by
//! whichever of the three took most of its step; the line names the
//! verdict of most devices.
//!
//! On a GPU the times are the host's: kernels run asynchronously, so the
//! waits at transfers and collectives absorb device time (`--trace-sync`
//! gives device times for a traced step).

use weft_runtime::DeviceTime;

/// The sums of the steps recorded so far, per device.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Per device: wall, compute, exposed and hidden communication
    /// seconds, summed.
    sums: Vec<[f64; 4]>,
    /// Steps recorded.
    steps: u64,
}

/// What bounds a device's step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Its own ops took most of the step.
    Compute,
    /// Its collectives took most of it.
    Communication,
    /// It waited most of it (for its lane's other devices, or the host).
    Idle,
}

impl Bound {
    /// `compute`, `communication`, `idle`.
    pub fn name(self) -> &'static str {
        match self {
            Bound::Compute => "compute",
            Bound::Communication => "communication",
            Bound::Idle => "idle",
        }
    }
}

impl Verdict {
    /// Adds one step's times (the same devices every step).
    pub fn record(&mut self, times: &[DeviceTime]) {
        if self.sums.len() != times.len() {
            self.sums = vec![[0.0; 4]; times.len()];
            self.steps = 0;
        }
        for (s, t) in self.sums.iter_mut().zip(times) {
            s[0] += t.wall.as_secs_f64();
            s[1] += t.compute.as_secs_f64();
            s[2] += t.communication.as_secs_f64();
            s[3] += t.hidden.min(t.wall.saturating_sub(t.communication)).as_secs_f64();
        }
        self.steps += 1;
    }

    /// Per device, the mean compute, exposed communication, idle and
    /// hidden communication seconds of a step, and what bounds it (of the
    /// first three).
    pub fn per_device(&self) -> Vec<([f64; 4], Bound)> {
        let n = self.steps.max(1) as f64;
        self.sums
            .iter()
            .map(|[wall, compute, comm, hidden]| {
                let (c, m) = (compute / n, comm / n);
                let idle = (wall / n - c - m).max(0.0);
                let bound = if c >= m && c >= idle {
                    Bound::Compute
                } else if m >= idle {
                    Bound::Communication
                } else {
                    Bound::Idle
                };
                ([c, m, idle, hidden / n], bound)
            })
            .collect()
    }

    /// `per device (mean of 9 steps): compute 5.10 ms, communication 1.20
    /// ms exposed (3.10 ms more in flight behind compute), idle 0.40 ms;
    /// compute-bound (8 of 8 devices)`; `None` before any step.
    pub fn line(&self) -> Option<String> {
        let per = self.per_device();
        if self.steps == 0 || per.is_empty() {
            return None;
        }
        let mean = |k: usize| per.iter().map(|(t, _)| t[k]).sum::<f64>() / per.len() as f64 * 1e3;
        let count = |b: Bound| per.iter().filter(|(_, x)| *x == b).count();
        let most = [Bound::Compute, Bound::Communication, Bound::Idle].into_iter().fold(Bound::Compute, |m, b| {
            if count(b) > count(m) {
                b
            } else {
                m
            }
        });
        let hidden = match mean(3) {
            h if h > 0.0 => format!(" ({h:.2} ms more in flight behind compute)"),
            _ => String::new(),
        };
        Some(format!(
            "per device (mean of {} steps): compute {:.2} ms, communication {:.2} ms exposed{hidden}, idle {:.2} \
             ms; {}-bound ({} of {} devices)",
            self.steps,
            mean(0),
            mean(1),
            mean(2),
            most.name(),
            count(most),
            per.len()
        ))
    }

    /// For `run.json`: the steps averaged and, per device, its mean
    /// seconds and its bound.
    pub fn json(&self) -> serde_json::Value {
        let devices: Vec<serde_json::Value> = self
            .per_device()
            .into_iter()
            .map(|([c, m, i, h], b)| {
                serde_json::json!({ "compute_s": c, "communication_s": m, "exposed_communication_s": m,
                                    "hidden_communication_s": h, "idle_s": i, "bound": b.name() })
            })
            .collect();
        serde_json::json!({ "steps": self.steps, "devices": devices })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(wall: u64, compute: u64, comm: u64) -> DeviceTime {
        let ms = Duration::from_millis;
        DeviceTime { wall: ms(wall), compute: ms(compute), communication: ms(comm), hidden: ms(comm / 2) }
    }

    #[test]
    fn means_per_device_and_the_bound_of_most() {
        let mut v = Verdict::default();
        assert_eq!(v.line(), None);
        v.record(&[t(10, 6, 2), t(10, 2, 7), t(10, 5, 1)]);
        v.record(&[t(12, 8, 2), t(12, 2, 9), t(12, 7, 1)]);
        let per = v.per_device();
        assert_eq!(per[0].1, Bound::Compute);
        assert_eq!(per[1].1, Bound::Communication);
        assert!((per[0].0[0] - 0.007).abs() < 1e-12 && (per[0].0[2] - 0.002).abs() < 1e-12, "{per:?}");
        let line = v.line().unwrap();
        assert!(
            line.starts_with("per device (mean of 2 steps): compute 5.00 ms, communication 3.67 ms exposed"),
            "{line}"
        );
        // Hidden: half the communication, capped at the time outside it
        // (device 1's second step: 4 ms capped at 12 - 9).
        assert!(line.contains("(1.33 ms more in flight behind compute)"), "{line}");
        assert!((v.json()["devices"][0]["hidden_communication_s"].as_f64().unwrap() - 0.001).abs() < 1e-12);
        assert!(line.ends_with("compute-bound (2 of 3 devices)"), "{line}");
        assert_eq!(v.json()["devices"][1]["bound"], "communication");
        v.record(&[t(4, 0, 0)]);
        assert_eq!((v.steps, v.per_device()[0].1), (1, Bound::Idle), "another device count starts again");
    }
}
