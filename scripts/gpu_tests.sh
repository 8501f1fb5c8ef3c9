#!/usr/bin/env bash
# Every GPU test (tests/test_gpu*.py) in N pytest-xdist worker processes that share the one GPU
# (the suite is bound by per-shape compilation on the CPU, so parallel processes cut its time).
#   scripts/gpu_tests.sh [N] [-k EXPR ...]    N default 6; env: OUT folder for the log (default ./device_out)
# Needs the test extra (pytest-xdist, pytest-timeout): python -m pip install ".[test]"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
N=${1:-6}; shift || true
PY=${PYTHON:-python3}
if ! $PY -c "import xdist" 2>/dev/null; then
  echo "error: pytest-xdist is not installed; run: $PY -m pip install \".[test]\"" >&2
  exit 2
fi
# Every worker allocates on demand: N processes each preallocating 75% of the GPU would not fit.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# The references' matmuls need no autotuning: it dominated the suite's time (compiles per shape).
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0"
echo "gpu tests: tests/test_gpu*.py in $N xdist workers; log $OUT/gpu_tests.log"
# xdist hands tests to whichever worker is free (--dist load): the files differ a lot in length.
$PY -m pytest -q -p no:cacheprovider -n "$N" --dist load -rfEs --durations=10 "$@" \
  tests/test_gpu*.py 2>&1 | tee "$OUT/gpu_tests.log" \
  | grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed|skipped|errors?)( |,|$)|no tests ran"
exit "${PIPESTATUS[0]}"
