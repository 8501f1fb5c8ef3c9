#!/usr/bin/env bash
# The full check on a Hopper device machine, ordered by importance, each step under its own time
# limit so that one slow step cannot eat the whole call. Everything goes to $OUT/run.log; the
# benchmark writes $OUT/bench/ (results.json, results.md, plots).
#   OUT=... bash maintainers/scripts/device_full.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT/bench"
export PYTHONUNBUFFERED=1
export JAX_DASH_GIT_COMMIT=${JAX_DASH_GIT_COMMIT:-unknown}
LOG=$OUT/run.log
PY=python3
T0=$SECONDS
results=()

step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS rc=0
  echo "==== $name (limit ${limit}s)" >>"$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1 || rc=$?
  local what=ok; [[ $rc -eq 124 ]] && what="TIMEOUT" || { [[ $rc -ne 0 ]] && what="FAIL rc=$rc"; }
  results+=("$(printf '%-22s %-10s %4ds' "$name" "$what" $((SECONDS - start)))")
  grep -E "passed|failed|error" "$LOG" | tail -n 1 | sed "s/^/    $name: /"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"
step cutlass 60 $PY -m pip install -q --no-index --no-deps .whl/*.whl
step build 240 $PY -m pip install --no-build-isolation --no-deps -e .
pytest_args=(-q -p no:cacheprovider --timeout 60)
step fwd_tests 60 $PY -m pytest "${pytest_args[@]}" tests/test_gpu.py -k "not matches_reference"
step fwd_accuracy 45 $PY -m pytest "${pytest_args[@]}" -x tests/test_gpu.py -k "matches_reference"
step bench 230 $PY benchmarks/bench_attention.py --head-dims 128,64 --seqs 2048,8192 \
  --impls jax_dash,cudnn,cudnn_det --iters 10 --out "$OUT/bench" --fresh
step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 \
  $PY -m pytest -q -p no:cacheprovider tests/test_gpu_bwd.py -k sanitizer
step bwd_fp16 40 $PY -m pytest "${pytest_args[@]}" -x tests/test_gpu_bwd.py -k "accuracy_descending and fp16"
step memory 80 $PY benchmarks/bench_attention.py --skip-timing --memory \
  --memory-seqs 16384,32768,65536,131072 --impls jax_dash,cudnn,cudnn_det --out "$OUT/bench"

echo "==== summary ($((SECONDS - T0))s)" | tee -a "$LOG"
printf '%s\n' "${results[@]}" | tee -a "$LOG"
