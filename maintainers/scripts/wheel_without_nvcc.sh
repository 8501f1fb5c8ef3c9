#!/usr/bin/env bash
# Issue 34's proof on a GPU machine: a release wheel installed into a fresh venv with nvcc's folder
# off PATH, and every GPU test run from a copy of the tree without the jax_dash/ source folder (so
# the tests import the wheel). The machine's own packages (jax with CUDA, pytest-xdist) are reached
# through a .pth file: on the device machines python3 is itself a venv, which a
# `--system-site-packages` venv does not see.
#   bash maintainers/scripts/wheel_without_nvcc.sh path/to/jax_dash-*-cp312-*manylinux*.whl
# Run on 2026-11-26 (H100, wheel of 7a81519 from `PYTHONS=3.12 bash scripts/build_wheels.sh`):
# 511 passed, 4 skipped (two-GPU tests) in 160 s.
set -uo pipefail
WHEEL=${1:?the wheel}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$PWD/device_out}; mkdir -p "$OUT"
VENV=${VENV:-/tmp/wheel_venv}; TREE=${TREE:-/tmp/wheel_tree}
SITE=$(python3 -c "import site; print(site.getsitepackages()[0])")
rm -rf "$VENV" "$TREE"
python3 -m venv "$VENV" && echo "$SITE" > "$VENV"/lib/python3.*/site-packages/machine.pth
"$VENV/bin/python" -m pip install -q --no-index --no-deps "$WHEEL" || exit 1
NVCC_DIR=$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/nvcc)")
CLEAN=$(echo "$PATH" | tr ':' '\n' | grep -v -x "$NVCC_DIR" | paste -sd:)
export PATH="$VENV/bin:$CLEAN"
if command -v nvcc >/dev/null; then echo "error: nvcc is still on PATH ($(command -v nvcc))" >&2; exit 1; fi
echo "no nvcc on PATH"
mkdir -p "$TREE" && tar -C "$ROOT" --exclude=./jax_dash --exclude=./.git --exclude=./build \
  --exclude=./.whl --exclude='./.prebuilt*' -cf - . | tar -x -C "$TREE"
cd "$TREE" && python3 -c "import jax, jax_dash; print('jax_dash', jax_dash.__version__, jax_dash.__file__, jax.devices())"
OUT=$OUT bash scripts/gpu_tests.sh 8 --timeout 120
