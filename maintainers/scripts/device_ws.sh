#!/usr/bin/env bash
# One device call for the warp-specialized kernels (backward cuda/sm90/bwd_main_ws.cuh: ws-rs, the
# default, with dV/dK from registers, or JAX_DASH_SM90_BWD=ws; forward with a producer warpgroup and
# ping-pong, the default; JAX_DASH_SM90_{FWD,BWD}=classic select the first kernels):
# build, the standalone driver's checks under the default and the new kernels (each under a
# timeout: a hang is a result), compute-sanitizer on the new kernels, then kernel-only timings of
# both at the headline shapes with the new backward's per-role wait trace.
#   maintainers/scripts/device_ws.sh            env: OUT (default ./device_out), SKIP_BUILD=1,
#                                        SANITIZE (default "synccheck"; "" for none, or e.g.
#                                        "synccheck racecheck memcheck initcheck"), BENCH_ITERS (20)
# The GPU tests of the public op with the new kernel: JAX_DASH_SM90_BWD=ws bash scripts/gpu_tests.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
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

JAX_DASH_SM90_FWD=ws step check_fwd_ws 60 "$DRIVER"
fwd_ok=$?
JAX_DASH_SM90_BWD=ws step check_bwd_ws 60 "$DRIVER"
bwd_ok=$?
JAX_DASH_SM90_BWD=ws-rs step check_bwd_ws_rs 60 "$DRIVER"
bwd_rs_ok=$?
JAX_DASH_SM90_FWD=classic JAX_DASH_SM90_BWD=classic step check_classic 60 "$DRIVER"
[[ $fwd_ok -eq 0 && $bwd_ok -eq 0 && $bwd_rs_ok -eq 0 ]] && step variants 60 "$DRIVER" variants
# The "_ws" steps below run each new kernel that passed its check (ws-rs before ws).
[[ $fwd_ok -eq 0 ]] && export JAX_DASH_SM90_FWD=ws
if [[ $bwd_rs_ok -eq 0 ]]; then export JAX_DASH_SM90_BWD=ws-rs
elif [[ $bwd_ok -eq 0 ]]; then export JAX_DASH_SM90_BWD=ws; fi
ws_ok=$(( fwd_ok == 0 || bwd_ok == 0 || bwd_rs_ok == 0 ? 0 : 1 ))
sanitize_tools=${SANITIZE-synccheck}
if [[ $ws_ok -eq 0 && -n "$sanitize_tools" ]]; then
  mkdir -p "$OUT/san"
  OUT="$OUT/san" TOOLS="$sanitize_tools" LIMIT=120 \
    step sanitize_ws 300 bash scripts/sanitize.sh "$DRIVER"
fi

iters=${BENCH_ITERS:-20}
shapes=("2 8192 16 16 128 0 descending" "2 8192 16 16 128 0 atomic"
        "2 8192 16 16 128 1 symmetric_shift" "1 16384 32 32 64 0 descending"
        "1 16384 32 32 64 0 atomic" "1 16384 32 32 64 1 symmetric_shift")
for shape in "${shapes[@]}"; do
  tag=$(echo "$shape" | tr ' ' '_')
  JAX_DASH_SM90_FWD=classic JAX_DASH_SM90_BWD=classic step "bench_classic_$tag" 45 "$DRIVER" bench $shape "$iters"
  [[ $bwd_ok -eq 0 ]] && JAX_DASH_SM90_BWD=ws step "bench_ws_$tag" 45 "$DRIVER" bench $shape "$iters"
  [[ $bwd_rs_ok -eq 0 ]] && JAX_DASH_SM90_BWD=ws-rs step "bench_wsrs_$tag" 45 "$DRIVER" bench $shape "$iters"
done

echo "==== device_ws summary ($(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)) ===="
printf '%s\n' "${summary[@]}"
grep -h "^bench" "$OUT"/bench_*.log 2>/dev/null
grep -h "trace\|^  " "$OUT"/bench_ws*.log 2>/dev/null | head -n 80
