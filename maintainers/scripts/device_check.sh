#!/usr/bin/env bash
# One-call check on the GPU machine: install the CUTLASS wheel, build the extension, check the SASS
# for HGMMA, run the pytest files given as arguments, optionally time the forward.
#
#   maintainers/scripts/device_check.sh [pytest args...]        (default: tests/test_gpu.py)
#   env: OUT     folder for the logs (default ./device_out)
#        TIMING  1 = also run maintainers/scripts/fwd_timing.py (writes $OUT/fwd_timing.md)
#        SKIP_BUILD 1 = reuse the build already on the machine
# Full logs go to $OUT/*.log; the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
summary=()
failed=0

step() {  # step NAME CMD...: runs CMD with its output in $OUT/NAME.log, records ok/FAIL and seconds
  local name=$1; shift
  local start=$SECONDS rc=0
  "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  if [[ $rc -eq 0 ]]; then summary+=("$name: ok ($((SECONDS - start))s)")
  else summary+=("$name: FAIL rc=$rc ($((SECONDS - start))s), see $name.log"); failed=1; fi
  return $rc
}

sass_check() {  # counts HGMMA per kernel in the built extension; fails if a kernel with MMA has none
  local so
  so=$("$PY" -c "import _jax_dash as m; print(m.__file__)") || return 1
  echo "extension: $so"
  cuobjdump -sass "$so" >"$OUT/sass.txt" || return 1
  awk '/Function :/ {name=$3} /HGMMA/ {h[name]++} /[^H]HMMA/ {m[name]++}
       END {for (n in h) print "HGMMA", h[n], n; for (n in m) print "HMMA(no wgmma)", m[n], n}' \
    "$OUT/sass.txt" | sort | tee "$OUT/sass_summary.txt"
  grep -q "^HGMMA .*fwd_kernel" "$OUT/sass_summary.txt"
}

step env bash -c "nvidia-smi; $PY -c 'import jax; print(jax.__version__, jax.devices())'"
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  step cutlass "$PY" -m pip install -q --no-index --no-deps .whl/*.whl
  step build "$PY" -m pip install --no-build-isolation --no-deps -v -e . ||
    tail -n 40 "$OUT/build.log"
fi
step import "$PY" -c "import jax_dash, jax_dash._ffi as f; print('built_with_cuda', f.built_with_cuda)"
step sass sass_check
if [[ $# -eq 0 ]]; then set -- tests/test_gpu.py; fi
# A hung kernel must not eat the whole device call: per-test timeout where pytest-timeout exists.
timeout_args=()
if "$PY" -c "import pytest_timeout" 2>/dev/null; then timeout_args=(--timeout "${PYTEST_TIMEOUT:-240}"); fi
step pytest "$PY" -m pytest --maxfail=10 -q -rs --durations=15 "${timeout_args[@]}" "$@"
tail -n 25 "$OUT/pytest.log"
if [[ "${TIMING:-0}" == 1 ]]; then
  step timing "$PY" maintainers/scripts/fwd_timing.py --out "$OUT/fwd_timing.md"
  cat "$OUT/fwd_timing.md" 2>/dev/null
fi

echo "==== device_check summary ($(date -u +%FT%TZ)) ===="
cat "$OUT/sass_summary.txt" 2>/dev/null | head -20
printf '%s\n' "${summary[@]}"
exit $failed
