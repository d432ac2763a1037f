//! The `bucket_collectives` pass: small all-reduces combined into one.
//!
//! A data-parallel step all-reduces every gradient on its own: dozens of
//! collectives, many of them a bias or a norm's scale of a few hundred
//! bytes. Each exchange across processes costs a round trip whatever its
//! size, so (as PyTorch DDP's gradient buckets do) this pass combines
//! all-reduces of the same group, reduction and dtype, each smaller than
//! the bucket size, into buckets of up to that size: the inputs are
//! flattened and concatenated, reduced by one `all_reduce`, and each
//! member's result is sliced out and reshaped back right before the first
//! step that reads it. An all-reduce combines elementwise, so each element
//! is folded from the same contributions in the same rank order: the
//! results are bitwise those of the separate collectives.
//!
//! A bucket's collective goes right after the last of its members' inputs
//! is made, so a member joins only if nothing reads its result before that
//! (a gradient is read by the optimizer, after the backward pass). Runs
//! before `overlap_collectives`, which then starts each bucket's all-reduce
//! there and waits for it where the first member's result is read.

use super::liveness::{reads, writes};
use weft_ir::device::{Buffer, BufferId, Collective, DeviceProgram, Step};
use weft_ir::{DType, Op, ReduceOp, TensorType};

/// A bucket being filled: its members (step indices), bytes, where its
/// collective goes (before this step: after every member's input is made)
/// and the first step that reads any member's result.
struct Open {
    key: (Vec<String>, ReduceOp, DType),
    members: Vec<usize>,
    bytes: u64,
    at: usize,
    first_read: usize,
}

/// A bucket: its members and where its collective goes.
struct Bucket {
    members: Vec<usize>,
    at: usize,
}

/// The pass (module docs). `bucket_bytes` is the most bytes of one bucket;
/// an all-reduce of that size or more stays alone, and 0 turns the pass
/// off.
pub fn bucket_collectives(p: &mut DeviceProgram, bucket_bytes: u64) {
    let n = p.steps.len();
    let mut first_read = vec![n; p.buffers.len()];
    let mut def = vec![0; p.buffers.len()];
    for (i, s) in p.steps.iter().enumerate().rev() {
        for b in reads(s) {
            first_read[b.index()] = i;
        }
        for b in writes(s) {
            def[b.index()] = i + 1;
        }
    }
    let mut open: Vec<Open> = Vec::new();
    let mut buckets: Vec<Bucket> = Vec::new();
    let close = |o: Open| Bucket { members: o.members, at: o.at };
    // Results of all-reduces that may be bucketed: a bucketed one is made
    // by its slice, later than its old step, so an all-reduce reading one
    // stays out of buckets.
    let mut may_move = vec![false; p.buffers.len()];
    for (i, s) in p.steps.iter().enumerate() {
        let Step::Collective { op: Collective::AllReduce { axes, op }, input, output } = s else { continue };
        let bytes = p.ty(*input).size_bytes() as u64;
        if bytes >= bucket_bytes || may_move[input.index()] {
            continue;
        }
        may_move[output.index()] = true;
        let key = (axes.clone(), *op, p.ty(*input).dtype);
        let (made, read) = (def[input.index()], first_read[output.index()]);
        if let Some(k) = open.iter().position(|o| o.key == key) {
            let o = &mut open[k];
            // With it, the bucket's result comes after its input is made:
            // every member's result must be read only from there.
            let at = o.at.max(made);
            if o.first_read.min(read) >= at && o.bytes + bytes <= bucket_bytes {
                o.members.push(i);
                o.bytes += bytes;
                o.at = at;
                o.first_read = o.first_read.min(read);
                continue;
            }
            buckets.push(close(open.swap_remove(k)));
        }
        open.push(Open { key, members: vec![i], bytes, at: made, first_read: read });
    }
    buckets.extend(open.into_iter().map(close));
    buckets.retain(|b| b.members.len() > 1);
    if buckets.is_empty() {
        return;
    }
    rewrite(p, &buckets, &first_read);
}

/// Replaces each bucket's members by one all-reduce where the bucket goes
/// and a slice of each member's result before its first reader.
fn rewrite(p: &mut DeviceProgram, buckets: &[Bucket], first_read: &[usize]) {
    let n = p.steps.len();
    let mut member = vec![false; n];
    let mut placed: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
    for (k, b) in buckets.iter().enumerate() {
        b.members.iter().for_each(|&m| member[m] = true);
        placed[b.at].push(k);
    }
    let old = std::mem::take(&mut p.steps);
    let mut steps = Vec::with_capacity(old.len() + 4 * buckets.iter().map(|b| b.members.len()).sum::<usize>());
    // Slices waiting for their member's first reader: (before step, steps).
    let mut pending: Vec<(usize, Vec<Step>)> = Vec::new();
    for i in 0..=n {
        for &k in &placed[i] {
            bucket_steps(p, &old, &buckets[k], k, first_read, &mut steps, &mut pending);
        }
        take_due(&mut pending, i, &mut steps);
        if i < n && !member[i] {
            steps.push(old[i].clone());
        }
    }
    p.steps = steps;
}

/// The steps of bucket `k` (flatten, concatenate, all-reduce) into
/// `steps`, and its members' slices into `pending`.
fn bucket_steps(
    p: &mut DeviceProgram,
    old: &[Step],
    bucket: &Bucket,
    k: usize,
    first_read: &[usize],
    steps: &mut Vec<Step>,
    pending: &mut Vec<(usize, Vec<Step>)>,
) {
    let members: Vec<(BufferId, BufferId, Collective)> = bucket
        .members
        .iter()
        .map(|&m| match &old[m] {
            Step::Collective { op, input, output } => (*input, *output, op.clone()),
            _ => unreachable!("bucketed all-reduces"),
        })
        .collect();
    let dtype = p.ty(members[0].0).dtype;
    let total: usize = members.iter().map(|(x, _, _)| p.ty(*x).num_elements()).sum();
    let mut flats = Vec::with_capacity(members.len());
    for (x, _, _) in &members {
        let len = p.ty(*x).num_elements();
        let flat = add_buffer(p, dtype, vec![len], None);
        steps.push(Step::Compute { op: Op::Reshape { shape: vec![len] }, inputs: vec![*x], outputs: vec![flat] });
        flats.push(flat);
    }
    let joined = add_buffer(p, dtype, vec![total], None);
    steps.push(Step::Compute { op: Op::Concatenate { dim: 0 }, inputs: flats, outputs: vec![joined] });
    let reduced = add_buffer(p, dtype, vec![total], Some(format!("bucket{k}")));
    steps.push(Step::Collective { op: members[0].2.clone(), input: joined, output: reduced });
    let mut offset = 0;
    for (x, out, _) in &members {
        let len = p.ty(*x).num_elements();
        let piece = add_buffer(p, dtype, vec![len], None);
        let shape = p.ty(*out).shape.clone();
        let slice = Op::Slice { start: vec![offset], limit: vec![offset + len], stride: vec![1] };
        let due = vec![
            Step::Compute { op: slice, inputs: vec![reduced], outputs: vec![piece] },
            Step::Compute { op: Op::Reshape { shape }, inputs: vec![piece], outputs: vec![*out] },
        ];
        pending.push((first_read[out.index()], due));
        offset += len;
    }
}

/// Moves the pending slices due before step `i` (in the order they were
/// made) into `steps`.
fn take_due(pending: &mut Vec<(usize, Vec<Step>)>, i: usize, steps: &mut Vec<Step>) {
    let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(pending).into_iter().partition(|(at, _)| *at <= i);
    *pending = rest;
    steps.extend(due.into_iter().flat_map(|(_, s)| s));
}

fn add_buffer(p: &mut DeviceProgram, dtype: DType, shape: Vec<usize>, name: Option<String>) -> BufferId {
    p.buffers.push(Buffer { ty: TensorType { dtype, shape }, name });
    BufferId(p.buffers.len() as u32 - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::device::{parse_program, print_program, simulate, verify_program};
    use weft_ir::tensor::HostTensor;

    const GRADS: &str = "device_program @f mesh [data=2] {
  input %0 : f32[2,3]
  input %1 : f32[3]
  input %2 : f32[]
  %3 = neg %0 : f32[2,3]
  %4 = all_reduce %3 {axes = [data], op = sum} : f32[2,3]
  %5 = exp %1 : f32[3]
  %6 = all_reduce %5 {axes = [data], op = sum} : f32[3]
  %7 = all_reduce %2 {axes = [data], op = max} : f32[]
  %8 = tanh %2 : f32[]
  %9 = all_reduce %8 {axes = [data], op = sum} : f32[]
  %10 = add %0, %4 : f32[2,3]
  %11 = mul %5, %6 : f32[3]
  return %10, %11, %7, %9
}";

    fn inputs() -> Vec<Vec<HostTensor>> {
        (0..2)
            .map(|d| {
                let f = |k: usize, shape: &[usize], n: usize| {
                    let data = (0..n).map(|i| (i as f32 * 0.7 + k as f32 + d as f32 * 1.3).sin()).collect();
                    HostTensor::from_f32(shape, data).unwrap()
                };
                vec![f(0, &[2, 3], 6), f(1, &[3], 3), f(2, &[], 1)]
            })
            .collect()
    }

    #[test]
    fn small_all_reduces_of_one_kind_share_a_bucket_bitwise() {
        let before = parse_program(GRADS).unwrap();
        let mut p = before.clone();
        bucket_collectives(&mut p, 1 << 20);
        verify_program(&p).unwrap();
        let text = print_program(&p);
        // The three sums are one all-reduce at the last of them; the max
        // has no partner; each result is sliced out before its reader.
        assert_eq!(text.matches("all_reduce").count(), 2, "{text}");
        assert!(text.contains("= concatenate %12, %13, %14 {dim = 0} : f32[10]"), "{text}");
        assert!(text.contains("= all_reduce %15 {axes = [data], op = sum} : f32[10]  // bucket"), "{text}");
        assert!(text.contains("%7 = all_reduce %2 {axes = [data], op = max} : f32[]"), "{text}");
        let want = simulate(&before, inputs()).unwrap();
        let got = simulate(&p, inputs()).unwrap();
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!(g.bitwise_eq(w), "got {g}, want {w}");
        }
    }

    #[test]
    fn an_all_reduce_of_a_bucketed_result_stays_apart() {
        // %4 reduces %2, which the first bucket makes by a slice: it must
        // not join a bucket placed before that slice.
        let text = "device_program @f mesh [data=2, model=2] {
  input %0 : f32[3]
  input %1 : f32[3]
  %2 = all_reduce %0 {axes = [model], op = sum} : f32[3]
  %3 = all_reduce %1 {axes = [model], op = sum} : f32[3]
  %4 = all_reduce %2 {axes = [data], op = sum} : f32[3]
  %5 = all_reduce %1 {axes = [data], op = sum} : f32[3]
  %6 = add %3, %4 : f32[3]
  %7 = add %6, %5 : f32[3]
  return %7
}";
        let before = parse_program(text).unwrap();
        let mut p = before.clone();
        bucket_collectives(&mut p, 1 << 20);
        verify_program(&p).unwrap_or_else(|e| panic!("{e}\n{}", print_program(&p)));
        let out = print_program(&p);
        assert!(out.contains("// bucket0"), "{out}");
        assert!(out.contains("= all_reduce %2 {axes = [data], op = sum} : f32[3]"), "{out}");
        let inputs: Vec<Vec<HostTensor>> = (0..4)
            .map(|d| {
                let t = |k: f32| HostTensor::from_f32(&[3], vec![k + d as f32, 0.5 * k, -k * d as f32]).unwrap();
                vec![t(1.0), t(2.0)]
            })
            .collect();
        let (want, got) = (simulate(&before, inputs.clone()).unwrap(), simulate(&p, inputs).unwrap());
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!(g.bitwise_eq(w), "got {g}, want {w}");
        }
    }

    #[test]
    fn a_result_read_before_the_bucket_would_close_keeps_it_apart() {
        // %4 is read (by %6's input) before %7's all-reduce: it cannot wait
        // for a bucket closing there.
        let text = "device_program @f mesh [data=2] {
  input %0 : f32[3]
  %1 = neg %0 : f32[3]
  %4 = all_reduce %1 {axes = [data], op = sum} : f32[3]
  %6 = exp %4 : f32[3]
  %7 = all_reduce %6 {axes = [data], op = sum} : f32[3]
  return %7
}";
        let mut p = parse_program(text).unwrap();
        bucket_collectives(&mut p, 1 << 20);
        assert_eq!(print_program(&p), print_program(&parse_program(text).unwrap()));
        // Too small a bucket, or none: nothing changes either.
        let mut q = parse_program(GRADS).unwrap();
        bucket_collectives(&mut q, 12);
        assert_eq!(print_program(&q), print_program(&parse_program(GRADS).unwrap()));
        bucket_collectives(&mut q, 0);
        assert_eq!(print_program(&q), print_program(&parse_program(GRADS).unwrap()));
    }
}
