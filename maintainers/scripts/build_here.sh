#!/usr/bin/env bash
# Builds, on this (GPU-less) machine, what a device call would otherwise build: the cp312 wheel
# and the standalone driver (tests/sm90_check.cu) of a commit, into a folder that
# scripts/device_round.sh takes as PREBUILT (carry it, with .whl), so the call skips its ~4-minute
# build. The device machine runs Python 3.12 and jax/jaxlib 0.11.2, so the wheel is built with a
# Python 3.12 interpreter against jaxlib 0.11.2's FFI headers (a venv made on first use).
#   bash maintainers/scripts/build_here.sh COMMIT_OR_BRANCH OUT_DIR      e.g. ... verify/s10 .prebuilt_s10
# env: PY312 (default ~/.pyenv/versions/3.12.1/bin/python), VENV (default /tmp/py312).
# The first device call with such a folder should confirm it imports (the tests stage does).
set -euo pipefail
REF=${1:?commit or branch}; OUT=${2:?output folder}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY312=${PY312:-$HOME/.pyenv/versions/3.12.1/bin/python}
VENV=${VENV:-/tmp/py312}
if [[ ! -x $VENV/bin/python ]]; then
  "$PY312" -m venv "$VENV"
  "$VENV/bin/pip" install -q "jax==0.11.2" "jaxlib==0.11.2" scikit-build-core nanobind cmake ninja \
    "$ROOT"/.whl/nvidia_cutlass-4.2.0.0-py3-none-any.whl
fi
SRC=$(mktemp -d /tmp/build_here.XXXXXX)
git -C "$ROOT" archive "$REF" | tar -x -C "$SRC"
export PATH="$VENV/bin:$PATH"
( cd "$SRC" && "$VENV/bin/pip" wheel -q --no-build-isolation --no-deps -w "$SRC/wheel" . )
mkdir -p "$ROOT/$OUT"
cp "$SRC"/wheel/*.whl "$ROOT/$OUT/"
find "$SRC/build" -name jax_dash_sm90_check -type f -exec cp {} "$ROOT/$OUT/" \;
echo "$REF $(git -C "$ROOT" rev-parse --short "$REF")" > "$ROOT/$OUT/COMMIT"
ls -la "$ROOT/$OUT"
rm -rf "$SRC"
