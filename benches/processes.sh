#!/usr/bin/env bash
# Multi-process step times (needs `cargo build --release --features mpi` and mpirun):
# - the residual MLP of ../shared/bench (B=256 D=512 H=2048 L=4, SGD) on mesh data=2,model=4
#   as 1 process x 8 devices, 2 x 4 and 8 x 1, per strategy;
# - DP weak scaling: 128 rows per process, 1 process on one core (mesh data=1) vs 2 processes (data=2),
#   beside one process running the same data=2 mesh on two worker threads.
# Prints weft's own steady-state step (median of the steps after the first, process 0).
# Usage: benches/processes.sh [STEPS]   (default 12)
set -eu
N=${1:-12}
W=${W:-$PWD/target/release/weft}
MPI="mpirun --allow-run-as-root --oversubscribe"
d=$(mktemp -d)
cfg() { cat > $d/$1.toml <<TOML
steps = $N
seed = 0
[model]
kind = "mlp"
layers = 4
d = 512
h = 2048
batch = $2
[optimizer]
kind = "sgd"
lr = 0.01
TOML
}
step() { grep -o 'steady-state step [0-9.]* ms' | grep -o '[0-9.]*' | head -1; }
cfg mlp 256
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-8s %12s %12s %12s\n" strategy "1x8 (ms)" "2x4 (ms)" "8x1 (ms)"
for s in dp tp fsdp fsdp_tp; do
  a=$("$W" train $d/mlp.toml --mesh data=2,model=4 --strategy $s | step)
  b=$($MPI -n 2 "$W" train $d/mlp.toml --mesh data=2,model=4 --strategy $s | step)
  c=$($MPI -n 8 "$W" train $d/mlp.toml --mesh data=2,model=4 --strategy $s | step)
  printf "%-8s %12s %12s %12s\n" $s $a $b $c
done
cfg one 128; cfg two 256
# One core for the one process, as each of the two processes has one: a
# lone device would otherwise split its products over both cores.
t1=$(WEFT_KERNEL_THREADS=1 "$W" train $d/one.toml --mesh data=1 --strategy dp | step)
t2=$($MPI -n 2 "$W" train $d/two.toml --mesh data=2 --strategy dp | step)
t2t=$("$W" train $d/two.toml --mesh data=2 --strategy dp | step)
python3 - "$t1" "$t2" "$t2t" <<'PY'
import sys
t1, t2, t2t = map(float, sys.argv[1:])
print(f"DP weak scaling, 128 rows per process: 1 process {t1:.1f} ms ({128/t1*1e3:.0f} rows/s); "
      f"2 processes {t2:.1f} ms ({256/t2*1e3:.0f} rows/s, {256/t2/(128/t1):.2f}x); "
      f"1 process, 2 threads {t2t:.1f} ms ({256/t2t/(128/t1):.2f}x)")
PY
rm -rf "$d"
