#!/usr/bin/env bash
# What a multi-process checkpoint costs the steps beside it (issue 34):
# `mpirun -n 2`, the MLP (L=8 D=512 H=2048 B=64, AdamW: 201 MB of state),
# fsdp over data=2 (each process writes half), a save every 10 steps.
# Per binary: the run without checkpoints, and with them, in one run each
# (interleaved, REPEAT times): weft's median step while a save is being
# written in the background (`step_s_while_saving` in run.json) against the
# others, and the wall time per step of the whole run (boundaries and
# saves included).
# Usage: benches/saves.sh [BASE_BINARY]   (BASE: an earlier weft, blocking saves)
set -eu
W=${W:-$PWD/target/release/weft}
BASE=${1:-}
N=${N:-80}
REPEAT=${REPEAT:-3}
MPI="mpirun --allow-run-as-root --oversubscribe -n 2"
d=$(mktemp -d)
cat > $d/c.toml <<TOML
steps = $N
seed = 0
mesh = "data=2"
strategy = "fsdp"
[model]
kind = "mlp"
layers = 8
d = 512
h = 2048
batch = 64
[optimizer]
kind = "adamw"
lr = 1e-3
TOML
echo "machine: $(nproc) cores, $(grep MemTotal /proc/meminfo | awk '{print $2/1048576 " GiB"}'), load $(cut -d' ' -f1-3 /proc/loadavg); disk: $(df -h $d | tail -1 | awk '{print $1}')"
run() { # BIN LABEL [checkpoint flags...]
  local bin=$1 label=$2; shift 2
  rm -rf $d/ck $d/m.jsonl
  local t0=$(date +%s.%N)
  $MPI "$bin" train $d/c.toml -q --metrics $d/m.jsonl "$@" > $d/out.txt 2>&1 || { cat $d/out.txt; exit 1; }
  local t1=$(date +%s.%N)
  local steady=$(grep -o 'steady-state step [0-9.]* ms' $d/out.txt | grep -o '[0-9.]*' | head -1)
  local busy=$(grep -o 'background: median [0-9.]* ms ([0-9]* steps), [-+0-9.]*%' $d/out.txt || true)
  printf "%-28s wall %7.1f ms/step  steady %7s ms  %s\n" "$label" "$(echo "($t1 - $t0) * 1000 / $N" | bc -l)" "$steady" "$busy"
}
for r in $(seq 1 $REPEAT); do
  run "$W" "new, no checkpoints"
  run "$W" "new, save every 10" --checkpoint-dir $d/ck --checkpoint-every 10
  if [ -n "$BASE" ]; then
    run "$BASE" "base, no checkpoints"
    run "$BASE" "base, save every 10" --checkpoint-dir $d/ck --checkpoint-every 10
  fi
done
rm -rf $d
