//! A stage's program: what one stage does in one training step, in order,
//! and its peak of live bytes.
//!
//! The pipeline driver executes exactly these operations, so the memory
//! they imply is the memory the stage holds: each microbatch's stash (its
//! input activations and batch rows) lives from its receive until its
//! backward, an output activation until it is sent, a cotangent from its
//! receive until the backward that consumes it. Under GPipe a stage
//! stashes all M microbatches before the first backward; under 1F1B at
//! most `S − s`, which is where 1F1B's memory advantage comes from. Under
//! the interleaved schedule a stage runs several chunks: each operation
//! names its chunk, and the stage's buffers are those of all its chunks.

use super::schedule::{stage_order, Phase, Schedule};

/// One operation of a stage's program.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum StageOp {
    /// Receive microbatch `m`'s input activations from the previous stage
    /// (the first stage: nothing) and take its rows of the batch.
    Recv(usize),
    /// Run the forward on microbatch `m`.
    Forward(usize),
    /// Send microbatch `m`'s output activations to the next stage.
    Send(usize),
    /// Receive the cotangents of microbatch `m`'s outputs.
    RecvCot(usize),
    /// Run the backward on microbatch `m` (recomputing the forward),
    /// accumulate the gradients, drop the stash.
    Backward(usize),
    /// Send the cotangents of microbatch `m`'s inputs to the previous stage.
    SendCot(usize),
}

/// A stage's program for one step.
#[derive(Clone, Debug, PartialEq)]
pub struct StageProgram {
    /// The stage.
    pub stage: usize,
    /// The stages.
    pub stages: usize,
    /// The chunks of the model (`S·V`; `S` without interleaving).
    pub chunks: usize,
    /// The operations in order, each with its chunk: "the previous stage"
    /// of chunk `c` is the one running chunk `c − 1`, "the next" the one
    /// running `c + 1`.
    pub ops: Vec<(usize, StageOp)>,
}

impl StageProgram {
    /// The chunks this stage runs, in order: `s, s + S, …`.
    pub fn own_chunks(&self) -> Vec<usize> {
        (self.stage..self.chunks).step_by(self.stages.max(1)).collect()
    }
}

/// Stage `s`'s program under `schedule`.
pub fn stage_program(schedule: Schedule, stages: usize, micro: usize, s: usize) -> StageProgram {
    let chunks = schedule.chunks(stages);
    let mut ops = Vec::new();
    for t in stage_order(schedule, stages, micro, s) {
        let (m, c) = (t.micro, t.chunk);
        let (first, last) = (c == 0, c + 1 == chunks);
        match t.phase {
            Phase::Forward => {
                ops.push((c, StageOp::Recv(m)));
                ops.push((c, StageOp::Forward(m)));
                if !last {
                    ops.push((c, StageOp::Send(m)));
                }
            }
            Phase::Backward => {
                if !last {
                    ops.push((c, StageOp::RecvCot(m)));
                }
                ops.push((c, StageOp::Backward(m)));
                if !first {
                    ops.push((c, StageOp::SendCot(m)));
                }
            }
        }
    }
    StageProgram { stage: s, stages, chunks, ops }
}

/// Bytes of a stage's buffers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageBytes {
    /// Held for the whole step: parameters, optimizer slots, gradient
    /// accumulators.
    pub resident: u64,
    /// Per microbatch in flight: input activations and batch rows.
    pub stash: u64,
    /// Output activations of one microbatch (until sent).
    pub act_out: u64,
    /// Cotangents of one microbatch's outputs (until its backward).
    pub cot_out: u64,
    /// Cotangents of one microbatch's inputs (until sent).
    pub cot_in: u64,
    /// The forward's own peak, beyond its inputs.
    pub forward_transient: u64,
    /// The backward's own peak, beyond its inputs.
    pub backward_transient: u64,
}

/// The peak of a stage program.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StagePeak {
    /// Peak of all live bytes.
    pub total: u64,
    /// Peak of the activation bytes held between tasks (stashes, activations
    /// and cotangents in transit).
    pub activations: u64,
    /// The most microbatches stashed at once.
    pub in_flight: usize,
}

impl StageProgram {
    /// The peak live bytes of running the program, with `bytes[i]` the
    /// buffers of its `i`-th own chunk ([`StageProgram::own_chunks`]; one
    /// entry without interleaving). Every chunk's resident bytes are held
    /// throughout.
    pub fn peak(&self, bytes: &[StageBytes]) -> StagePeak {
        let mut acts = 0u64;
        let mut stashed = 0usize;
        let mut peak = StagePeak::default();
        let resident: u64 = bytes.iter().map(|b| b.resident).sum();
        let see = |acts: u64, transient: u64, stashed: usize, peak: &mut StagePeak| {
            peak.total = peak.total.max(resident + acts + transient);
            peak.activations = peak.activations.max(acts);
            peak.in_flight = peak.in_flight.max(stashed);
        };
        let stages = self.stages.max(1);
        for &(c, ref op) in &self.ops {
            let b = &bytes[c / stages];
            let (first, last) = (c == 0, c + 1 == self.chunks);
            match op {
                StageOp::Recv(_) => {
                    acts += b.stash;
                    stashed += 1;
                    see(acts, 0, stashed, &mut peak);
                }
                StageOp::Forward(_) => {
                    see(acts, b.forward_transient, stashed, &mut peak);
                    if !last {
                        acts += b.act_out;
                        see(acts, 0, stashed, &mut peak);
                    }
                }
                StageOp::Send(_) => acts -= b.act_out,
                StageOp::RecvCot(_) => {
                    acts += b.cot_out;
                    see(acts, 0, stashed, &mut peak);
                }
                StageOp::Backward(_) => {
                    see(acts, b.backward_transient, stashed, &mut peak);
                    acts -= b.stash;
                    stashed -= 1;
                    if !last {
                        acts -= b.cot_out;
                    }
                    if !first {
                        acts += b.cot_in;
                        see(acts, 0, stashed, &mut peak);
                    }
                }
                StageOp::SendCot(_) => acts -= b.cot_in,
            }
        }
        peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_send_what_the_neighbours_receive() {
        for schedule in Schedule::ALL {
            let (s_n, m) = (3, 5);
            let ps: Vec<StageProgram> = (0..s_n).map(|s| stage_program(schedule, s_n, m, s)).collect();
            let pick = |p: &StageProgram, f: fn(&StageOp) -> Option<usize>| -> Vec<usize> {
                p.ops.iter().filter_map(|(_, o)| f(o)).collect()
            };
            let send = |o: &StageOp| if let StageOp::Send(m) = o { Some(*m) } else { None };
            let recv = |o: &StageOp| if let StageOp::Recv(m) = o { Some(*m) } else { None };
            let send_cot = |o: &StageOp| if let StageOp::SendCot(m) = o { Some(*m) } else { None };
            let recv_cot = |o: &StageOp| if let StageOp::RecvCot(m) = o { Some(*m) } else { None };
            for (s, p) in ps.iter().enumerate() {
                // Every microbatch once, in the order the neighbour uses it.
                assert_eq!(pick(p, recv), (0..m).collect::<Vec<_>>());
                if s + 1 < s_n {
                    assert_eq!(pick(p, send), pick(&ps[s + 1], recv), "{schedule} stage {s}");
                    assert_eq!(pick(&ps[s + 1], send_cot), pick(p, recv_cot), "{schedule} stage {s}");
                } else {
                    assert!(pick(p, send).is_empty() && pick(p, recv_cot).is_empty());
                }
                if s == 0 {
                    assert!(pick(p, send_cot).is_empty());
                }
            }
        }
    }

    #[test]
    fn gpipe_stashes_every_microbatch_and_1f1b_at_most_the_stages() {
        let b = StageBytes {
            resident: 1000,
            stash: 100,
            act_out: 100,
            cot_out: 100,
            cot_in: 100,
            forward_transient: 50,
            backward_transient: 70,
        };
        for m in [4, 8, 16] {
            for s in 0..4 {
                let g = stage_program(Schedule::GPipe, 4, m, s).peak(std::slice::from_ref(&b));
                let o = stage_program(Schedule::OneFOneB, 4, m, s).peak(std::slice::from_ref(&b));
                assert_eq!(g.in_flight, m);
                assert_eq!(o.in_flight, 4 - s);
                assert!(o.activations <= 4 * (b.stash + b.act_out + b.cot_out + b.cot_in), "stage {s}: {o:?}");
                assert!(g.activations >= m as u64 * b.stash);
                assert!(o.total < g.total || m <= 4 - s);
            }
        }
    }

    #[test]
    fn interleaved_chunks_send_what_the_next_chunk_receives() {
        let schedule = Schedule::Interleaved { virtual_stages: 2 };
        let (s_n, m) = (2, 4);
        let ps: Vec<StageProgram> = (0..s_n).map(|s| stage_program(schedule, s_n, m, s)).collect();
        let ops_of = |c: usize, want: fn(&StageOp) -> Option<usize>| -> Vec<usize> {
            let p = &ps[c % s_n];
            p.ops.iter().filter(|(x, _)| *x == c).filter_map(|(_, o)| want(o)).collect()
        };
        let send = |o: &StageOp| if let StageOp::Send(m) = o { Some(*m) } else { None };
        let recv = |o: &StageOp| if let StageOp::Recv(m) = o { Some(*m) } else { None };
        let send_cot = |o: &StageOp| if let StageOp::SendCot(m) = o { Some(*m) } else { None };
        let recv_cot = |o: &StageOp| if let StageOp::RecvCot(m) = o { Some(*m) } else { None };
        for c in 0..s_n * 2 - 1 {
            assert_eq!(ops_of(c, send), (0..m).collect::<Vec<_>>(), "chunk {c}");
            assert_eq!(ops_of(c + 1, recv), ops_of(c, send));
            assert_eq!(ops_of(c + 1, send_cot), ops_of(c, recv_cot));
        }
        assert_eq!(ps[1].own_chunks(), vec![1, 3]);
        let b = StageBytes { resident: 10, stash: 1, act_out: 1, cot_out: 1, cot_in: 1, ..Default::default() };
        let p = ps[0].peak(&[b.clone(), b]);
        assert!(p.total >= 20 && p.in_flight >= 2, "{p:?}");
    }
}
