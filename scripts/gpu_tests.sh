#!/usr/bin/env bash
# Every GPU test (tests/test_gpu*.py), split over N pytest processes that share the one GPU (the
# suite is bound by per-shape compilation on the CPU, so 4 processes take ~1/3 of the time).
#   scripts/gpu_tests.sh [N] [-k EXPR]      env: OUT folder for the logs (default ./device_out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
N=${1:-4}; shift || true
PY=${PYTHON:-python3}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# The references' matmuls need no autotuning: it dominated the suite's time (compiles per shape).
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0"
mapfile -t ids < <($PY -m pytest --collect-only -q -p no:cacheprovider "$@" tests/test_gpu*.py \
                   | grep '::')
echo "gpu tests: ${#ids[@]} collected, $N processes"
pids=()
for ((s = 0; s < N; s++)); do
  shard=()
  for ((i = s; i < ${#ids[@]}; i += N)); do shard+=("${ids[$i]}"); done
  [[ ${#shard[@]} -eq 0 ]] && continue
  $PY -m pytest -q -p no:cacheprovider -rfEs --durations=5 "${shard[@]}" >"$OUT/gpu_tests_$s.log" 2>&1 &
  pids+=($!)
done
rc_all=0
for pid in "${pids[@]}"; do wait "$pid" || rc_all=1; done
for ((s = 0; s < N; s++)); do
  [[ -f "$OUT/gpu_tests_$s.log" ]] && echo "  shard $s: $(grep -E "passed|failed" "$OUT/gpu_tests_$s.log" | tail -n 1)"
done
grep -hE "^(FAILED|ERROR)" "$OUT"/gpu_tests_*.log | head -n 40
exit $rc_all
