//! The `overlap_collectives` pass: collectives that run while compute goes
//! on.
//!
//! A [`Step::Collective`] blocks its device until the group's result is
//! there. This pass splits each one whose result is not needed at once
//! into a [`Step::Start`] placed as early as its input allows and a
//! [`Step::Done`] placed right before the first step that reads its result
//! (or at the end): a data-parallel gradient's reduction starts when the
//! backward pass has computed it and is waited for only where the optimizer
//! reads it (DDP's overlap), and an FSDP all-gather of a weight starts
//! ahead of the layer that uses it (FSDP's prefetch). The values computed
//! are unchanged: the same collectives combine the same contributions in
//! the same rank order, so a run is bitwise the in-order program's.
//!
//! **Memory.** A started collective's result is held from its start, so a
//! start moved earlier holds its result longer; the input it reads may be
//! freed at the start instead of at the old position when the collective
//! was its last reader. The pass moves a start up only while the extra
//! bytes this costs, summed over every collective in flight at each step,
//! stay within [`OverlapOptions::prefetch_bytes`]; a reduction whose result
//! is no larger than its input (an all-reduce or a reduce-scatter of a
//! gradient) costs nothing and always moves up. Runs before `insert_frees`,
//! which then frees inputs right after their starts.
//!
//! Starts may overtake earlier collectives that move less far, but every
//! device runs the same rewritten program, so all start them in the same
//! order: what keeps multi-process exchanges matched.

use super::liveness::{reads, writes};
use weft_ir::device::{DeviceProgram, Step};

/// How the pass moves collectives (and `bucket_collectives` combines
/// them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverlapOptions {
    /// The most bytes one device may hold beyond the in-order program's
    /// because results of started collectives are held early (the
    /// prefetch window of all-gathers). Reductions that free as much as
    /// they hold move regardless.
    pub prefetch_bytes: u64,
    /// All-reduces smaller than this are combined into buckets of up to
    /// this many bytes (`bucket_collectives`); 0: none.
    pub bucket_bytes: u64,
}

impl Default for OverlapOptions {
    fn default() -> Self {
        OverlapOptions { prefetch_bytes: 64 << 20, bucket_bytes: 1 << 20 }
    }
}

pub use super::bucket::bucket_collectives;

/// Where one collective's start and done go: before step `start` and
/// before step `done` of the old program (`done` may be its length: at the
/// end).
struct Placement {
    step: usize,
    start: usize,
    done: usize,
}

/// The pass (module docs). Collectives whose result is read by the very
/// next step and whose input is made by the step before stay as they are.
pub fn overlap_collectives(p: &mut DeviceProgram, opts: &OverlapOptions) {
    let n = p.steps.len();
    let mut def: Vec<usize> = vec![0; p.buffers.len()];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); p.buffers.len()];
    for (i, s) in p.steps.iter().enumerate() {
        for b in writes(s) {
            def[b.index()] = i + 1;
        }
        for b in reads(s) {
            readers[b.index()].push(i);
        }
    }
    // Extra bytes held at each step by starts moved up so far.
    let mut extra: Vec<u64> = vec![0; n];
    let mut placements = Vec::new();
    for (i, s) in p.steps.iter().enumerate() {
        let Step::Collective { input, output, .. } = s else { continue };
        let done = p.steps[i + 1..]
            .iter()
            .position(|s| reads(s).contains(output) || matches!(s, Step::Free(bs) if bs.contains(output)))
            .map_or(n, |k| i + 1 + k);
        let earliest = def[input.index()];
        let held = p.ty(*output).size_bytes() as u64;
        let reads_of_input = &readers[input.index()];
        let freed = if reads_of_input.last() == Some(&i) && !p.outputs.contains(input) {
            p.ty(*input).size_bytes() as u64
        } else {
            0
        };
        // Until the input's other readers before the old position, the
        // input stays live beside the result held early.
        let other = reads_of_input.iter().copied().filter(|&r| r < i).max();
        let cost = |t: usize| if other.is_some_and(|r| t <= r) { held } else { held.saturating_sub(freed) };
        // The earliest start from which holding `cost` more stays in budget
        // at every step up to the old position.
        let mut start = i;
        while start > earliest && {
            let c = cost(start - 1);
            c == 0 || extra[start - 1] + c <= opts.prefetch_bytes
        } {
            start -= 1;
        }
        if start == i && done == i + 1 {
            continue;
        }
        for (t, e) in extra.iter_mut().enumerate().take(i).skip(start) {
            *e += cost(t);
        }
        // Its result exists from its `done` (which goes before the dones
        // and starts that come later at the same place): a collective
        // reading it starts there at the earliest.
        def[output.index()] = done;
        placements.push(Placement { step: i, start, done });
    }
    if placements.is_empty() {
        return;
    }
    let mut starts_before: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
    let mut dones_before: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
    let mut split = vec![false; n];
    for pl in &placements {
        starts_before[pl.start].push(pl.step);
        dones_before[pl.done].push(pl.step);
        split[pl.step] = true;
    }
    let old = std::mem::take(&mut p.steps);
    let mut steps = Vec::with_capacity(old.len() + 2 * placements.len());
    for i in 0..=n {
        for &k in &dones_before[i] {
            let Step::Collective { output, .. } = &old[k] else { unreachable!("placed collectives") };
            steps.push(Step::Done(*output));
        }
        for &k in &starts_before[i] {
            let Step::Collective { op, input, output } = &old[k] else { unreachable!("placed collectives") };
            steps.push(Step::Start { op: op.clone(), input: *input, output: *output });
        }
        if i < n && !split[i] {
            steps.push(old[i].clone());
        }
    }
    p.steps = steps;
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::device::{parse_program, print_program, verify_program};

    fn run(text: &str, prefetch_bytes: u64) -> String {
        let mut p = parse_program(text).unwrap();
        overlap_collectives(&mut p, &OverlapOptions { prefetch_bytes, bucket_bytes: 0 });
        verify_program(&p).unwrap();
        let body: Vec<String> = print_program(&p).lines().skip(1).map(|l| l.trim().to_string()).collect();
        body.join("\n")
    }

    #[test]
    fn a_gradient_reduction_starts_when_made_and_is_waited_for_where_read() {
        let text = "device_program @f mesh [data=2] {
  input %0 : f32[4]
  %1 = neg %0 : f32[4]
  %2 = all_reduce %1 {axes = [data], op = sum} : f32[4]
  %3 = exp %0 : f32[4]
  %4 = tanh %3 : f32[4]
  %5 = add %2, %4 : f32[4]
  return %5
}";
        let got = run(text, 0);
        let want = "input %0 : f32[4]
%1 = neg %0 : f32[4]
%2 = all_reduce_start %1 {axes = [data], op = sum} : f32[4]
%3 = exp %0 : f32[4]
%4 = tanh %3 : f32[4]
done %2
%5 = add %2, %4 : f32[4]
return %5
}";
        assert_eq!(got, want);
    }

    #[test]
    fn gathers_move_up_within_the_prefetch_bound() {
        // Two all-gathers of inputs, each read by the step after it; each
        // holds its 32 bytes early at every step it moves up (its input is
        // read again later, so the start frees nothing).
        let text = "device_program @f mesh [data=2] {
  input %0 : f32[4]
  input %1 : f32[4]
  %2 = exp %0 : f32[4]
  %3 = all_gather %0 {dim = 0, axes = [data]} : f32[8]
  %4 = neg %3 : f32[8]
  %5 = all_gather %1 {dim = 0, axes = [data]} : f32[8]
  %6 = neg %5 : f32[8]
  %7 = add %0, %1 : f32[4]
  return %2, %4, %6, %7
}";
        // No room: nothing moves (each result is read by the next step).
        assert!(!run(text, 0).contains("_start"));
        // Room for one gathered weight: the first gather moves to the top,
        // the second up to where the first was (from there on the first's
        // result is held in the in-order program too).
        let got = run(text, 32);
        let want = "input %0 : f32[4]
input %1 : f32[4]
%3 = all_gather_start %0 {dim = 0, axes = [data]} : f32[8]
%2 = exp %0 : f32[4]
%5 = all_gather_start %1 {dim = 0, axes = [data]} : f32[8]
done %3
%4 = neg %3 : f32[8]
done %5
%6 = neg %5 : f32[8]
%7 = add %0, %1 : f32[4]
return %2, %4, %6, %7
}";
        assert_eq!(got, want);
        // Room for both: both start at the top, in program order.
        assert!(run(text, 64).starts_with(
            "input %0 : f32[4]\ninput %1 : f32[4]\n%3 = all_gather_start %0 {dim = 0, axes = [data]} : f32[8]\n\
             %5 = all_gather_start %1 {dim = 0, axes = [data]} : f32[8]\n%2 = exp %0 : f32[4]"
        ));
    }

    #[test]
    fn a_collective_of_a_collective_starts_after_its_done() {
        let text = "device_program @f mesh [data=2] {
  input %0 : f32[4]
  %1 = neg %0 : f32[4]
  %2 = all_reduce %1 {axes = [data], op = sum} : f32[4]
  %3 = exp %0 : f32[4]
  %4 = all_gather %2 {dim = 0, axes = [data]} : f32[8]
  %5 = tanh %3 : f32[4]
  return %4, %5
}";
        let got = run(text, 1 << 20);
        let want = "input %0 : f32[4]
%1 = neg %0 : f32[4]
%2 = all_reduce_start %1 {axes = [data], op = sum} : f32[4]
%3 = exp %0 : f32[4]
done %2
%4 = all_gather_start %2 {dim = 0, axes = [data]} : f32[8]
%5 = tanh %3 : f32[4]
done %4
return %4, %5
}";
        assert_eq!(got, want);
    }

    #[test]
    fn an_input_still_read_before_the_old_place_is_no_free_saving() {
        // The sum's input %1 is read by `exp` after it is made: starting the
        // sum above that read holds its result beside a still-live input,
        // which a zero prefetch bound does not allow; below it, free.
        let text = "device_program @f mesh [data=2] {
  input %0 : f32[4]
  %1 = neg %0 : f32[4]
  %2 = tanh %0 : f32[4]
  %3 = exp %1 : f32[4]
  %4 = all_reduce %1 {axes = [data], op = sum} : f32[4]
  %5 = add %3, %2 : f32[4]
  %6 = add %4, %5 : f32[4]
  return %6
}";
        let got = run(text, 0);
        assert!(got.contains("%3 = exp %1 : f32[4]\n%4 = all_reduce_start %1"), "{got}");
        let roomy = run(text, 1 << 20);
        assert!(roomy.contains("%1 = neg %0 : f32[4]\n%4 = all_reduce_start %1"), "{roomy}");
    }

    #[test]
    fn results_read_at_once_and_outputs() {
        // A result read by the next step and made from the step before
        // stays in place; one only returned is waited for at the end.
        let text = "device_program @f mesh [data=2] {
  input %0 : f32[4]
  %1 = neg %0 : f32[4]
  %2 = all_reduce %1 {axes = [data], op = max} : f32[4]
  %3 = exp %2 : f32[4]
  %4 = all_reduce %3 {axes = [data], op = sum} : f32[4]
  %5 = neg %3 : f32[4]
  return %4, %5
}";
        let got = run(text, 1 << 20);
        let want = "input %0 : f32[4]
%1 = neg %0 : f32[4]
%2 = all_reduce %1 {axes = [data], op = max} : f32[4]
%3 = exp %2 : f32[4]
%4 = all_reduce_start %3 {axes = [data], op = sum} : f32[4]
%5 = neg %3 : f32[4]
done %4
return %4, %5
}";
        assert_eq!(got, want);
    }
}
