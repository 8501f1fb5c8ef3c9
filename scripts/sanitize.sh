#!/usr/bin/env bash
# compute-sanitizer over the standalone driver of the Hopper kernels (tests/sm90_check.cu; JAX
# processes crash at start under the sanitizer). Each tool runs the driver's small cases: forward
# and backward against an fp64 host reference, poisoned outputs, bitwise repeatability.
#   scripts/sanitize.sh [driver]     (default: the driver CMake built under build/)
#   env: OUT  folder for the logs (default ./device_out); TOOLS (default "memcheck racecheck
#        synccheck initcheck"); LIMIT seconds per tool (default 180); DRIVER_ARGS, e.g. "masks"
#        for the masked kernels' cases
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
DRIVER=${1:-$(find build -name jax_dash_sm90_check -type f -perm -u+x 2>/dev/null | head -n 1)}
if [[ -z "$DRIVER" || ! -x "$DRIVER" ]]; then
  echo "sanitize: driver jax_dash_sm90_check not found (build with nvcc present first)"; exit 2
fi
rc_all=0
echo "driver: $DRIVER"
timeout "${LIMIT:-180}" "$DRIVER" ${DRIVER_ARGS:-} >"$OUT/sanitize_plain.log" 2>&1
rc=$?; echo "plain run: rc=$rc ($(tail -n 1 "$OUT/sanitize_plain.log"))"; [[ $rc -ne 0 ]] && rc_all=1
for tool in ${TOOLS:-memcheck racecheck synccheck initcheck}; do
  extra=()
  [[ $tool == racecheck ]] && extra=(--racecheck-report all)
  [[ $tool == memcheck ]] && extra=(--leak-check full)
  start=$SECONDS
  timeout "${LIMIT:-180}" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 3 \
    "$DRIVER" ${DRIVER_ARGS:-} >"$OUT/sanitize_$tool.log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY" "$OUT/sanitize_$tool.log" | tr '\n' ' ')
  echo "$tool: rc=$rc ($((SECONDS - start))s) ${summary:-no summary} | $(grep -E '^(PASS|FAIL)' "$OUT/sanitize_$tool.log" | tail -n 1)"
  [[ $rc -ne 0 ]] && rc_all=1
done
exit $rc_all
