#!/usr/bin/env bash
# One device call that verifies the Hopper kernels: build, compute-sanitizer over the standalone
# driver (in the background), every GPU test in 4 processes, then kernel-only timings of the driver
# and an Nsight Compute profile of the backward. Logs under $OUT; a summary is printed last.
#   OUT=... bash maintainers/scripts/device_verify.sh      env: SKIP_BUILD=1, SKIP_NCU=1, TEST_K=<pytest -k>
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=python3
T0=$SECONDS
results=()
step() {  # step NAME LIMIT CMD...: output to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local start=$SECONDS rc=0
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  local what=ok; [[ $rc -eq 124 ]] && what=TIMEOUT || { [[ $rc -ne 0 ]] && what="FAIL rc=$rc"; }
  results+=("$(printf '%-12s %-10s %4ds' "$name" "$what" $((SECONDS - start)))")
  echo "== $name: $what ($((SECONDS - start))s)"; tail -n 8 "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  step cutlass 60 $PY -m pip install -q --no-index --no-deps .whl/*.whl
  step build 300 $PY -m pip install --no-build-isolation --no-deps -e .
fi
DRIVER=$(find build -name jax_dash_sm90_check -type f -perm -u+x | head -n 1)
echo "driver: $DRIVER"
OUT=$OUT LIMIT=150 bash scripts/sanitize.sh "$DRIVER" >"$OUT/sanitize.log" 2>&1 &
san_pid=$!
if [[ -n "${TEST_K:-}" ]]; then step gpu_tests 420 env OUT="$OUT" bash scripts/gpu_tests.sh ${SHARDS:-6} -k "$TEST_K"
else step gpu_tests 420 env OUT="$OUT" bash scripts/gpu_tests.sh ${SHARDS:-6}; fi
wait $san_pid; san_rc=$?
results+=("$(printf '%-12s %-10s' sanitize "$([[ $san_rc -eq 0 ]] && echo ok || echo "FAIL rc=$san_rc")")")
echo "== sanitize"; cat "$OUT/sanitize.log"
step drv_bench 90 bash -c 'd=$0; for a in "0 descending" "0 shift" "0 atomic" "1 descending" \
  "1 symmetric_shift" "1 atomic"; do set -- $a; "$d" bench 2 8192 16 16 128 $1 $2 10; \
  "$d" bench 4 8192 32 32 64 $1 $2 10; done' "$DRIVER"
if [[ "${SKIP_NCU:-0}" != 1 ]]; then
  step ncu 150 ncu --kernel-name regex:bwd_main_kernel --launch-skip 1 --launch-count 1 --set full \
    --import-source yes -f -o "$OUT/bwd_hd128_full" "$DRIVER" bench 2 8192 16 16 128 0 descending 1
  ncu -i "$OUT/bwd_hd128_full.ncu-rep" --page details >"$OUT/ncu_bwd_details.txt" 2>&1
  ncu -i "$OUT/bwd_hd128_full.ncu-rep" --page source --csv --print-source sass \
    >"$OUT/ncu_bwd_sass.csv" 2>&1
  gzip -f "$OUT/ncu_bwd_sass.csv"
fi
# Few files come back from the device machine: pack the logs into one archive.
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude='*.ncu-rep' *.log *.txt *.csv.gz 2>/dev/null \
  && rm -f *.log *.txt *.csv.gz)
echo "==== summary ($((SECONDS - T0))s)"
printf '%s\n' "${results[@]}"
