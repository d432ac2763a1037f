#!/usr/bin/env bash
# One GPU session's checks in one command, for a lent CUDA machine that
# cannot build Rust (see BENCHMARKS.md, "NVIDIA H200 ...").
#
# Here:   benches/gpu.sh pack [BASE_BINARY]
#   builds `weft`, the GEMM and launch examples and the NCCL test with `--features cuda`,
#   strips and compresses them (with an optional earlier `weft` to compare)
#   into .devbin/ (ignored by git: `echo /.devbin/ >> .git/info/exclude`),
#   and copies ../shared/bench there (a sibling folder does not travel).
# There:  bash benches/gpu.sh run   (carry .devbin; about 6 minutes)
#   PARTS="gpu_vs_jax trace" bash benches/gpu.sh run  runs only those parts
#   (default: smoke gemm nccl gpu_vs_jax steps check; opt-in: `routes`,
#   one-device steps and the MLP at data=8 with products on cuBLAS, cuBLAS
#   ordered by host waits, and cubek (WEFT_GEMM); `launch`, the cost
#   of one launch (runtime/examples/gpu_launch.rs); `trace`; `compare`, the
#   base binary beside the new on one device and the MLP at data=8; and
#   CHECK_LAYOUTS="data=1 none;data=8 dp" narrows `check`; TRACE_RUNS lists
#   the traces, FULL_TRACE=0 leaves out the dp8 trace, CubeCL's profile and nsys)
#   In the order they run:
#   0. (smoke) three steps of a small GPT, products on cuBLAS ordered on the
#      device; on failure the rest runs with WEFT_CUBLAS_ORDER=host;
#   1. the NCCL tests (pip's NCCL, `libnccl.so` linked to `libnccl.so.2`);
#   2. ../shared/bench/gpu_vs_jax.sh (weft vs JAX and cuBLAS, side by side);
#   3. GEMM rates and the routine weft picks per product (runtime/examples/gpu_gemm.rs;
#      GEMM_SHAPES=MxKxN,... sets the products);
#   4. (launch) the cost of one launch;
#   5. (compare) the base binary beside the new one: one device, and the MLP at data=8;
#   6. (trace) step traces of the MLP and GPT steps, f32 and bf16, host and
#      synced (`--trace`, `--trace-sync`), summarised by op class
#      (benches/trace_summary.py), and `nsys` where it is installed;
#   7. (steps) the base binary, if packed, beside the new one: one device,
#      data=8 dp, tp, fsdp_tp;
#   8. (check) losses against the CPU backend on a small GPT (f32 and bf16;
#      one device, dp, tp, fsdp_tp): the maximum relative difference per layout.
# Everything it prints is also under $OUT (the device tool's folder) when set.
set -u
cd "$(dirname "$0")/.."
D=$PWD/.devbin
case "${1:-}" in
pack)
    set -e
    mkdir -p "$D"
    cargo build --release --features cuda
    cargo build --release --features cuda -p weft-runtime --example gpu_gemm --example gpu_launch
    nccl=$(cargo test --release --features cuda --test nccl --no-run 2>&1 | sed -n 's/.*(\(target\/release\/deps\/nccl-[0-9a-f]*\)).*/\1/p' | tail -1)
    cp target/release/weft "$D/weft"; cp target/release/examples/gpu_gemm "$D/gpu_gemm"; cp "$nccl" "$D/nccl_test"
    cp target/release/examples/gpu_launch "$D/gpu_launch"
    if [ -n "${2:-}" ]; then cp "$2" "$D/weft-base"; fi
    # The NCCL test runs the `weft` built beside it, at this path.
    echo "$PWD/target/release/weft" > "$D/weft-path.txt"
    for f in weft gpu_gemm gpu_launch nccl_test weft-base; do
        [ -f "$D/$f" ] || continue
        strip "$D/$f" && rm -f "$D/$f.xz" && xz -T2 -6 "$D/$f"
    done
    mkdir -p "$D/bench" && cp ../shared/bench/* "$D/bench/" && cp benches/trace_summary.py "$D/"
    du -sh "$D"
    exit 0 ;;
run) ;;
*) echo "usage: benches/gpu.sh pack [BASE_BINARY] | run" >&2; exit 2 ;;
esac

OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0))s] $*"; }
for f in weft weft-base gpu_gemm gpu_launch nccl_test; do
    [ -f "$D/$f.xz" ] || continue
    python3 -c "import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$D/$f.xz" "/tmp/$f"
    chmod +x "/tmp/$f"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
NL=$(python3 -c "import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],'lib'))" 2>/dev/null)
mkdir -p /tmp/ncclso && ln -sf "$NL/libnccl.so.2" /tmp/ncclso/libnccl.so
# cuBLAS for weft's products (gpu/cublas.rs): pip's (PyTorch's or JAX's
# wheels) or the toolkit's, newest soname, linked as `libcublas.so`.
CB=$(python3 - <<'PY'
import glob, os, site
c = []
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    c += glob.glob(os.path.join(sp, "nvidia", "**", "libcublas.so.*"), recursive=True)
c += glob.glob("/usr/local/cuda*/lib64/libcublas.so.*")
c = [x for x in c if os.path.basename(x).count(".") == 2]
print(sorted(c, key=lambda x: int(x.rsplit(".", 1)[1]))[-1] if c else "")
PY
)
if [ -n "$CB" ]; then ln -sf "$CB" /tmp/ncclso/libcublas.so; CBD=$(dirname "$CB"); fi
echo "cuBLAS: ${CB:-not found}"
export LD_LIBRARY_PATH=/tmp/ncclso:$NL:${CBD:+$CBD:}${LD_LIBRARY_PATH:-}

PARTS=${PARTS:-smoke gemm nccl gpu_vs_jax steps check}
want() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
d=$(mktemp -d)
mlp() { printf 'steps = 1\nseed = 0\n[model]\nkind = "mlp"\nlayers = 4\nd = 512\nh = 2048\nbatch = 256\ncompute = "%s"\n[optimizer]\nkind = "sgd"\nlr = 0.01\n' "$1"; }
gpt() { printf 'steps = 1\nseed = 0\n[model]\nkind = "gpt"\nvocab = %s\nseq = %s\nd_model = %s\nheads = 8\nlayers = %s\nbatch = %s\ndropout = 0.0\ncompute = "%s"\n[optimizer]\nkind = "adamw"\nlr = 1e-3\nclip = 1.0\n' "$2" "$3" "$4" "$5" "$6" "$1"; }
step() { # binary name config steps mesh strategy backend [more flags]
    local bin=$1 name=$2 cfg=$3 n=$4 mesh=$5 strat=$6 be=$7; shift 7
    timeout 120 "$bin" train "$cfg" --steps "$n" --mesh "$mesh" --strategy "$strat" --backend "$be" -q \
        --metrics "$d/$name.jsonl" --checkpoint-dir "$d/ck-$name" "$@" > "$d/$name.log" 2>&1
    echo "$name rc=$? $(grep -o 'steady-state step [0-9.]* m\?s' "$d/$name.log") $(grep -i -m1 error "$d/$name.log" | cut -c1-200)"
}
for c in f32 bf16; do mlp $c > "$d/mlp-$c.toml"; gpt $c 8192 256 512 6 16 > "$d/gpt-$c.toml"; gpt $c 512 64 128 2 16 > "$d/small-$c.toml"; done

if want smoke; then
el smoke
# A few steps of the small GPT on cuBLAS ordered on the device: should they
# fail or hang, the later parts order cuBLAS by host waits instead.
if timeout 60 /tmp/weft train "$d/small-bf16.toml" --steps 3 --backend cuda -q --checkpoint-dir "$d/ck-smoke" > "$d/smoke.log" 2>&1; then
    echo "smoke: ok"
else
    echo "smoke: failed (rc $?), WEFT_CUBLAS_ORDER=host from here"; tail -5 "$d/smoke.log"
    export WEFT_CUBLAS_ORDER=host
fi
fi
if want nccl; then
el nccl
# The NCCL test runs the `weft` binary at the path it was built with.
bin=$(cat "$D/weft-path.txt")
mkdir -p "$(dirname "$bin")" && cp /tmp/weft "$bin"
timeout 90 /tmp/nccl_test --nocapture --test-threads=1 > "$OUT/nccl.txt" 2>&1
tail -3 "$OUT/nccl.txt"
fi
if want gpu_vs_jax; then
el gpu_vs_jax
W=/tmp/weft timeout 360 bash "$D/bench/gpu_vs_jax.sh" > "$OUT/gpu_vs_jax.txt" 2>&1
cat "$OUT/gpu_vs_jax.txt"
fi
if want gemm; then
el gemm
SHAPES=${GEMM_SHAPES:-4096x4096x4096,256x512x2048,2048x256x512} timeout 90 /tmp/gpu_gemm > "$OUT/gemm.txt" 2>&1
cat "$OUT/gemm.txt"
# PROBE_SHAPES=MxKxN,...: every cubek routine at those products too.
if [ -n "${PROBE_SHAPES:-}" ]; then
    SHAPES=$PROBE_SHAPES timeout 150 /tmp/gpu_gemm probe > "$OUT/probe.txt" 2>&1
    cat "$OUT/probe.txt"
fi
fi
if want routes; then
el routes
# The same binary with its products on cuBLAS, on cuBLAS ordered by host
# waits, and on cubek's routines (WEFT_GEMM, WEFT_CUBLAS_ORDER).
{
    keep=${WEFT_CUBLAS_ORDER:-}
    for g in cublas cublas-host cubek; do
        export WEFT_GEMM=${g%-host} WEFT_CUBLAS_ORDER=$keep
        [ "$g" = cublas-host ] && export WEFT_CUBLAS_ORDER=host
        for c in f32 bf16; do for m in mlp gpt; do
            [ "$g" = cublas-host ] && [ "$m" = mlp ] && continue
            step /tmp/weft "$g-$m-$c" "$d/$m-$c.toml" 12 data=1 none cuda
        done; done
        [ "$g" = cublas-host ] || step /tmp/weft "$g-mlp-dp8" "$d/mlp-f32.toml" 8 data=8 dp cuda
    done
    export WEFT_CUBLAS_ORDER=$keep
    unset WEFT_GEMM
} > "$OUT/routes.txt" 2>&1
cat "$OUT/routes.txt"
fi
if want launch; then
el launch
timeout 120 /tmp/gpu_launch > "$OUT/launch.txt" 2>&1
cat "$OUT/launch.txt"
fi
if want compare; then
el compare
{
    for b in weft-base weft; do
        [ -x "/tmp/$b" ] || continue
        for c in f32 bf16; do for m in mlp gpt; do step "/tmp/$b" "$b-$m-$c" "$d/$m-$c.toml" 12 data=1 none cuda; done; done
        step "/tmp/$b" "$b-mlp-dp8" "$d/mlp-f32.toml" 8 data=8 dp cuda
    done
} > "$OUT/compare.txt" 2>&1
cat "$OUT/compare.txt"
fi
if want trace; then
el trace
{
    which nsys ncu 2>&1
    for run in ${TRACE_RUNS:-gpt-bf16-host gpt-bf16-sync gpt-f32-sync mlp-bf16-host mlp-bf16-sync}; do
        set -- ${run//-/ }
        flags=(--trace "$OUT/trace-$run.json" --trace-steps 3..5)
        [ "$3" = sync ] && flags+=(--trace-sync)
        step /tmp/weft "tr-$run" "$d/$1-$2.toml" 6 data=1 none cuda "${flags[@]}"
        python3 "$D/trace_summary.py" "$OUT/trace-$run.json" 25
    done
    if [ "${FULL_TRACE:-1}" = 1 ]; then
    step /tmp/weft "tr-mlp-dp8" "$d/mlp-f32.toml" 6 data=8 dp cuda --trace "$OUT/trace-mlp-dp8.json" --trace-steps 3..5
    python3 "$D/trace_summary.py" "$OUT/trace-mlp-dp8.json" 12
    # CubeCL's own per-kernel device timing (each launch waits for its timing).
    mkdir -p "$d/prof" && printf '[profiling.logger]\nlevel = "basic"\nfile = "%s"\n' "$d/prof/kernels.log" > "$d/prof/cubecl.toml"
    (cd "$d/prof" && step /tmp/weft prof-gpt-bf16 "$d/gpt-bf16.toml" 3 data=1 none cuda)
    head -c 4000000 "$d/prof/kernels.log" > "$OUT/cubecl-kernels.log"; tail -40 "$d/prof/kernels.log"
    if command -v nsys > /dev/null; then
        timeout 150 nsys profile -o "$d/gpt" --stats=false -t cuda /tmp/weft train "$d/gpt-bf16.toml" --steps 6 \
            --backend cuda -q --checkpoint-dir "$d/ck-nsys" > "$d/nsys.log" 2>&1
        tail -3 "$d/nsys.log"
        timeout 90 nsys stats -r cuda_api_sum,cuda_gpu_kern_sum "$d/gpt.nsys-rep" 2>&1 | head -80
    fi
    fi
} > "$OUT/trace.txt" 2>&1
cat "$OUT/trace.txt"
fi
if want steps; then
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
fi
if want check; then
el check
# CHECK_LAYOUTS="data=1 none;data=8 dp" narrows the layouts.
LAYOUTS=("data=1 none" "data=8 dp" "data=2,model=4 tp" "data=2,model=4 fsdp_tp")
[ -n "${CHECK_LAYOUTS:-}" ] && IFS=';' read -ra LAYOUTS <<< "$CHECK_LAYOUTS"
{
    for c in f32 bf16; do
        for ms in "${LAYOUTS[@]}"; do
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
fi
el done
