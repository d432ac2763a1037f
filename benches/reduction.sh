#!/usr/bin/env bash
# The fast reduction mode against the deterministic default on 2 processes
# (needs `cargo build --release --features mpi --bin weft --example mpi_collectives`
# and mpirun):
# - collectives: `mpi_collectives` (weft deterministic / weft fast / raw MPI,
#   one device per process), ROUNDS runs; min and median per call of
#   all_reduce and reduce_scatter;
# - DP step time: the DP weak-scaling config of benches/processes.sh (residual
#   MLP B=256 D=512 H=2048 L=4, SGD, mesh data=2, 128 rows per process), runs
#   alternating between the modes; min and median of weft's steady-state step.
# Usage: benches/reduction.sh [ROUNDS] [STEPS]   (default 5 rounds, 12 steps)
set -eu
R=${1:-5}
N=${2:-12}
W=${W:-$PWD/target/release/weft}
C=${C:-$PWD/target/release/examples/mpi_collectives}
MPI="mpirun --allow-run-as-root --oversubscribe"
d=$(mktemp -d)
cat > $d/two.toml <<TOML
steps = $N
seed = 0
[model]
kind = "mlp"
layers = 4
d = 512
h = 2048
batch = 256
[optimizer]
kind = "sgd"
lr = 0.01
TOML
step() { grep -o 'steady-state step [0-9.]* ms' | grep -o '[0-9.]*' | head -1; }
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$R"); do
  $MPI -n 2 "$C" > $d/coll.$r
  a=$($MPI -n 2 "$W" train $d/two.toml --mesh data=2 --strategy dp --reduction deterministic | step)
  b=$($MPI -n 2 "$W" train $d/two.toml --mesh data=2 --strategy dp --reduction fast | step)
  echo "$a $b" >> $d/dp
  echo "round $r: DP step deterministic $a ms, fast $b ms (load $(cut -d' ' -f1 /proc/loadavg))"
done
python3 - "$d" <<'PY'
import glob, statistics, sys
d = sys.argv[1]
def mm(xs):
    return f"{min(xs):.1f} / {statistics.median(xs):.1f}"
rows = {}
for f in glob.glob(f"{d}/coll.*"):
    for line in open(f):
        p = line.split()
        if len(p) == 7 and p[0] in ("all_reduce", "reduce_scatter"):
            rows.setdefault((p[0], int(p[1])), []).append(tuple(map(float, p[2:5])))
print("collective       bytes   weft det (us) min / median   weft fast   raw MPI")
for (name, size), v in sorted(rows.items()):
    cols = [mm([x[i] for x in v]) for i in range(3)]
    print(f"{name:<15} {size:>9}   {cols[0]:>22}   {cols[1]:>18}   {cols[2]:>18}")
dp = [tuple(map(float, l.split())) for l in open(f"{d}/dp")]
print(f"DP step (ms) min / median of {len(dp)}: deterministic {mm([a for a, _ in dp])}, fast {mm([b for _, b in dp])}")
PY
rm -rf "$d"
