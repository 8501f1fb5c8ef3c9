#!/usr/bin/env bash
# One device call for the warp-specialized backward (cuda/sm90/bwd_main_ws.cuh, opt-in with
# JAX_DASH_SM90_BWD=ws): build, the standalone driver's checks under both main kernels (each under a
# timeout: a hang is a result), compute-sanitizer on the new kernel, then kernel-only timings of
# both kernels at the headline shapes with the new kernel's per-role wait trace.
#   scripts/device_ws.sh            env: OUT (default ./device_out), SKIP_BUILD=1, SANITIZE=0,
#                                        BENCH_ITERS (default 20)
# The GPU tests of the public op with the new kernel: JAX_DASH_SM90_BWD=ws bash scripts/gpu_tests.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
summary=()

step() {  # step NAME LIMIT CMD...: CMD under a timeout, output in $OUT/NAME.log, one summary line
  local name=$1 limit=$2; shift 2
  local start=$SECONDS rc=0
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  local last; last=$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-120)
  summary+=("$name: rc=$rc ($((SECONDS - start))s) $last")
  return $rc
}

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  step cutlass 120 "$PY" -m pip install -q --no-index --no-deps .whl/*.whl
  step build 420 "$PY" -m pip install --no-build-isolation --no-deps -v . || tail -n 30 "$OUT/build.log"
fi
DRIVER=$(find build -name jax_dash_sm90_check -type f -perm -u+x 2>/dev/null | head -n 1)
if [[ -z "$DRIVER" ]]; then echo "driver not built"; printf '%s\n' "${summary[@]}"; exit 2; fi

step check_classic 120 "$DRIVER"
JAX_DASH_SM90_BWD=ws step check_ws 120 "$DRIVER"
ws_ok=$?
if [[ $ws_ok -eq 0 && "${SANITIZE:-1}" == 1 ]]; then
  JAX_DASH_SM90_BWD=ws OUT="$OUT/san" TOOLS="synccheck racecheck memcheck" LIMIT=150 \
    step sanitize_ws 480 bash scripts/sanitize.sh "$DRIVER"
fi

iters=${BENCH_ITERS:-20}
shapes=("2 8192 16 16 128 0 descending" "2 8192 16 16 128 0 atomic"
        "2 8192 16 16 128 1 symmetric_shift" "1 16384 32 32 64 0 descending"
        "1 16384 32 32 64 0 atomic" "1 16384 32 32 64 1 symmetric_shift")
for shape in "${shapes[@]}"; do
  tag=$(echo "$shape" | tr ' ' '_')
  step "bench_classic_$tag" 120 "$DRIVER" bench $shape "$iters"
  [[ $ws_ok -eq 0 ]] && JAX_DASH_SM90_BWD=ws step "bench_ws_$tag" 120 "$DRIVER" bench $shape "$iters"
done

echo "==== device_ws summary ($(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)) ===="
printf '%s\n' "${summary[@]}"
grep -h "^bench\|trace\|^  " "$OUT"/bench_ws_*.log 2>/dev/null | head -n 80
