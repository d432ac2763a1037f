#!/usr/bin/env bash
# Step time across hosts (needs `cargo build --release --features mpi`, mpirun, root and iproute2):
# the residual MLP of ../shared/bench (B=256 D=512 H=2048 L=4, SGD) on mesh data=2,model=4,
# per strategy, as
# - 1 process x 8 devices;
# - 4 processes on one host (Open MPI's shared-memory transport between them);
# - 4 processes on 2 hosts of 2 (network namespaces of this machine, tests/hosts/netns.sh:
#   TCP over a veth bridge between the hosts, shared memory within each).
# Prints weft's own steady-state step (median of the steps after the first, process 0).
# Usage: benches/hosts.sh [STEPS]   (default 12)
set -eu
N=${1:-12}
W=${W:-$PWD/target/release/weft}
NETNS=$PWD/tests/hosts/netns.sh
MPI="mpirun --allow-run-as-root --oversubscribe"
d=$(mktemp -d)
prefix=wb$$
octet=$((200 + $$ % 50))
trap '"$NETNS" down $prefix 2; rm -rf "$d"' EXIT
"$NETNS" up $prefix 2 $octet
export WEFT_NETNS_PREFIX=$prefix
HOSTS="--host h1:2,h2:2 --mca plm_rsh_agent '$NETNS agent' --mca btl self,vader,tcp \
  --mca oob_tcp_if_include 10.213.$octet.0/24 --mca btl_tcp_if_include 10.213.$octet.0/24"
cat > $d/mlp.toml <<TOML
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
printf "%-8s %14s %18s %18s\n" strategy "1x8 (ms)" "4 procs, 1 host" "4 procs, 2 hosts"
for s in dp tp fsdp fsdp_tp; do
  a=$("$W" train $d/mlp.toml --mesh data=2,model=4 --strategy $s | step)
  b=$($MPI -n 4 "$W" train $d/mlp.toml --mesh data=2,model=4 --strategy $s | step)
  c=$(eval $MPI -n 4 $HOSTS "$W" train $d/mlp.toml --mesh data=2,model=4 --strategy $s | step)
  printf "%-8s %14s %18s %18s\n" $s $a $b $c
done
