#!/usr/bin/env bash
# One GPU session's checks in one command, for a lent CUDA machine that
# cannot build Rust (see BENCHMARKS.md, "NVIDIA H200 ...").
#
# Here:   benches/gpu.sh pack [BASE_BINARY]
#   builds `weft`, the GEMM example and the NCCL test with `--features cuda`,
#   strips and compresses them (with an optional earlier `weft` to compare)
#   into .devbin/ (ignored by git: `echo /.devbin/ >> .git/info/exclude`),
#   and copies ../shared/bench there (a sibling folder does not travel).
# There:  bash benches/gpu.sh run   (carry .devbin; about 6 minutes)
#   1. GEMM rates and the routine weft picks per product (runtime/examples/gpu_gemm.rs);
#   2. the NCCL tests (pip's NCCL, `libnccl.so` linked to `libnccl.so.2`);
#   3. ../shared/bench/gpu_vs_jax.sh (weft vs JAX and cuBLAS, side by side);
#   4. the base binary, if packed, beside the new one: one device, data=8 dp, tp, fsdp_tp;
#   5. losses against the CPU backend on a small GPT (f32 and bf16; one device,
#      dp, tp, fsdp_tp): the maximum relative difference per layout.
# Everything it prints is also under $OUT (the device tool's folder) when set.
set -u
cd "$(dirname "$0")/.."
D=$PWD/.devbin
case "${1:-}" in
pack)
    set -e
    mkdir -p "$D"
    cargo build --release --features cuda
    cargo build --release --features cuda -p weft-runtime --example gpu_gemm
    nccl=$(cargo test --release --features cuda --test nccl --no-run 2>&1 | sed -n 's/.*(\(target\/release\/deps\/nccl-[0-9a-f]*\)).*/\1/p' | tail -1)
    cp target/release/weft "$D/weft"; cp target/release/examples/gpu_gemm "$D/gpu_gemm"; cp "$nccl" "$D/nccl_test"
    if [ -n "${2:-}" ]; then cp "$2" "$D/weft-base"; fi
    # The NCCL test runs the `weft` built beside it, at this path.
    echo "$PWD/target/release/weft" > "$D/weft-path.txt"
    for f in weft gpu_gemm nccl_test weft-base; do
        [ -f "$D/$f" ] || continue
        strip "$D/$f" && rm -f "$D/$f.xz" && xz -T2 -6 "$D/$f"
    done
    mkdir -p "$D/bench" && cp ../shared/bench/* "$D/bench/"
    du -sh "$D"
    exit 0 ;;
run) ;;
*) echo "usage: benches/gpu.sh pack [BASE_BINARY] | run" >&2; exit 2 ;;
esac

OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0))s] $*"; }
for f in weft weft-base gpu_gemm nccl_test; do
    [ -f "$D/$f.xz" ] || continue
    python3 -c "import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$D/$f.xz" "/tmp/$f"
    chmod +x "/tmp/$f"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
NL=$(python3 -c "import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],'lib'))" 2>/dev/null)
mkdir -p /tmp/ncclso && ln -sf "$NL/libnccl.so.2" /tmp/ncclso/libnccl.so
export LD_LIBRARY_PATH=/tmp/ncclso:$NL:${LD_LIBRARY_PATH:-}

el gemm
SHAPES=4096x4096x4096,256x512x2048,2048x256x512 timeout 90 /tmp/gpu_gemm > "$OUT/gemm.txt" 2>&1
cat "$OUT/gemm.txt"
el nccl
# The NCCL test runs the `weft` binary at the path it was built with.
bin=$(cat "$D/weft-path.txt")
mkdir -p "$(dirname "$bin")" && cp /tmp/weft "$bin"
timeout 90 /tmp/nccl_test --nocapture --test-threads=1 > "$OUT/nccl.txt" 2>&1
tail -3 "$OUT/nccl.txt"
el gpu_vs_jax
W=/tmp/weft timeout 360 bash "$D/bench/gpu_vs_jax.sh" > "$OUT/gpu_vs_jax.txt" 2>&1
cat "$OUT/gpu_vs_jax.txt"

d=$(mktemp -d)
mlp() { printf 'steps = 1\nseed = 0\n[model]\nkind = "mlp"\nlayers = 4\nd = 512\nh = 2048\nbatch = 256\ncompute = "%s"\n[optimizer]\nkind = "sgd"\nlr = 0.01\n' "$1"; }
gpt() { printf 'steps = 1\nseed = 0\n[model]\nkind = "gpt"\nvocab = %s\nseq = %s\nd_model = %s\nheads = 8\nlayers = %s\nbatch = %s\ndropout = 0.0\ncompute = "%s"\n[optimizer]\nkind = "adamw"\nlr = 1e-3\nclip = 1.0\n' "$2" "$3" "$4" "$5" "$6" "$1"; }
step() { # binary name config steps mesh strategy backend
    timeout 120 "$1" train "$3" --steps "$4" --mesh "$5" --strategy "$6" --backend "$7" -q \
        --metrics "$d/$2.jsonl" --checkpoint-dir "$d/ck-$2" > "$d/$2.log" 2>&1
    echo "$2 rc=$? $(grep -o 'steady-state step [0-9.]* m\?s' "$d/$2.log") $(grep -i -m1 error "$d/$2.log" | cut -c1-200)"
}
for c in f32 bf16; do mlp $c > "$d/mlp-$c.toml"; gpt $c 8192 256 512 6 16 > "$d/gpt-$c.toml"; gpt $c 512 64 128 2 16 > "$d/small-$c.toml"; done
el steps
{
    for b in weft-base weft; do
        [ -x "/tmp/$b" ] || continue
        for c in f32 bf16; do for m in mlp gpt; do step "/tmp/$b" "$b-$m-$c" "$d/$m-$c.toml" 12 data=1 none cuda; done; done
        step "/tmp/$b" "$b-mlp-dp8" "$d/mlp-f32.toml" 8 data=8 dp cuda
        step "/tmp/$b" "$b-gpt-dp8" "$d/gpt-f32.toml" 6 data=8 dp cuda
        step "/tmp/$b" "$b-gpt-tp8" "$d/gpt-f32.toml" 6 data=2,model=4 tp cuda
        step "/tmp/$b" "$b-gpt-fsdp_tp8" "$d/gpt-f32.toml" 6 data=2,model=4 fsdp_tp cuda
    done
} > "$OUT/steps.txt" 2>&1
cat "$OUT/steps.txt"
el check
{
    for c in f32 bf16; do
        for ms in "data=1 none" "data=8 dp" "data=2,model=4 tp" "data=2,model=4 fsdp_tp"; do
            set -- $ms
            for be in cpu cuda; do step /tmp/weft "chk-$c-$1-$2-$be" "$d/small-$c.toml" 6 "$1" "$2" "$be" > /dev/null; done
            python3 - "$d/chk-$c-$1-$2-cpu.jsonl" "$d/chk-$c-$1-$2-cuda.jsonl" "$c $1 $2" <<'PY'
import json, os, sys
losses = lambda f: [json.loads(l)["loss"] for l in open(f)] if os.path.exists(f) else []
a, b = losses(sys.argv[1]), losses(sys.argv[2])
r = max(abs(x - y) / abs(y) for x, y in zip(b, a)) if a and len(a) == len(b) else float("nan")
print(sys.argv[3], "steps", len(a), len(b), "max relative loss difference cuda vs cpu", f"{r:.2e}")
PY
        done
    done
} > "$OUT/check.txt" 2>&1
cat "$OUT/check.txt"
el done
