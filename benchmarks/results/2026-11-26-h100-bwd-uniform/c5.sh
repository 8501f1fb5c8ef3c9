#!/usr/bin/env bash
# Seventeenth session, calls 5/6 (H100): issue 31's bench_train table with every recipe on main's kernels
# (bwd-uniform), two processes sharing a compilation cache. SEQ=32768 or 4096.
set -u
mkdir -p "$OUT" /tmp/o5
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > /tmp/o5/setup.log 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_bu/*.whl >> /tmp/o5/setup.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > /tmp/o5/gpu.txt
timeout 560 python3 benchmarks/bench_train.py --seqs $SEQ --compilation-cache --time-budget 530 \
  --configs cudnn_gather,dash_embed,dash_detscatter,dash_onehot,fa3,cudnn_detflag --out /tmp/o5/train > /tmp/o5/train.log 2>&1
echo "train rc=$? at ${SECONDS}s"
tar czf "$OUT/c5.tgz" -C /tmp/o5 .
grep -E "^\| (cudnn|dash|fa3)" /tmp/o5/train/results.md | head -8
