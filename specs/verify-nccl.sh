#!/usr/bin/env bash
# Verifies the NCCL path (specs/runtime.md §2b) on a machine with a CUDA GPU
# and NCCL (loadable as libnccl.so: see §2b). Fails if anything skipped.
#
# 1. tests/nccl.rs with the `cuda` feature: on one GPU, the NCCL path at
#    world size 1; on G > 1 GPUs also the collectives at world size G and
#    the training step with NCCL collectives against the CPU oracle.
# 2. With two or more GPUs and mpirun: the MLP step on 2 processes, one GPU
#    each, NCCL unique ids sent over MPI, against the CPU oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
cargo test --features cuda --test nccl -- --nocapture --test-threads=1 2>&1 | tee "$log"
if grep -q "SKIPPED" "$log"; then
    echo "verify-nccl: FAILED: a test skipped (no CUDA GPU or no NCCL); see above" >&2
    exit 1
fi
not_run=$(grep "NOT RUN" "$log" || true)

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -ge 2 ] && command -v mpirun >/dev/null; then
    cargo build --release --features cuda,mpi
    dir=$(mktemp -d)
    printf 'steps = 3\nseed = 1\n[model]\nkind = "mlp"\nlayers = 2\nd = 16\nh = 32\nbatch = 16\n[optimizer]\nkind = "sgd"\nlr = 0.01\n' >"$dir/mlp.toml"
    weft=$PWD/target/release/weft
    "$weft" train "$dir/mlp.toml" --mesh data=2 --strategy dp --backend cpu --metrics "$dir/cpu.jsonl" -q
    # One GPU per rank (every process would otherwise open GPU 0, which
    # NCCL refuses as a duplicate GPU).
    WEFT_COLLECTIVES=nccl mpirun --allow-run-as-root -n 2 -x WEFT_COLLECTIVES bash -c \
        'CUDA_VISIBLE_DEVICES=${OMPI_COMM_WORLD_LOCAL_RANK:-${PMI_LOCAL_RANK:-0}} exec "$0" "$@"' \
        "$weft" train "$dir/mlp.toml" --mesh data=2 --strategy dp --backend cuda --metrics "$dir/nccl.jsonl" -q
    python3 - "$dir/cpu.jsonl" "$dir/nccl.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) and a, (a, b)
for s, (x, y) in enumerate(zip(b, a)):
    assert abs(x - y) <= 1e-5 * abs(y), f"step {s}: 2 processes with NCCL {x} vs cpu {y}"
print("verify-nccl: 2 processes x 1 GPU with NCCL match the CPU oracle:", b)
PY
else
    not_run="$not_run
NOT RUN: 2 processes with NCCL over MPI (needs 2 GPUs and mpirun)"
fi

if [ -n "$not_run" ]; then
    echo "verify-nccl: passed what this machine can run; not run:"
    echo "$not_run"
else
    echo "verify-nccl: passed, including the multi-GPU and multi-process checks"
fi
