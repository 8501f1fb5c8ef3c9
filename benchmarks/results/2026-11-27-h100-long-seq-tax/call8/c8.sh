#!/bin/bash
# Twentieth session call 8: the 1 x 32768 training step with two dQ writers (bwd-two-writers) against cuDNN racing.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd .prebuilt_tw/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/jd/jax_dash
export PYTHONPATH=$PWD:/tmp/jd
timeout 340 python3 benchmarks/bench_train.py --seqs 32768 --configs cudnn_gather,dash_embed --compilation-cache --time-budget 330 --out $OUT/train --no-plots > $L/train.txt 2>&1; echo "train rc=$?" >> $L/summary.txt
tar czf $OUT/c8.tgz -C $OUT logs train
cat $L/gpu.txt $L/summary.txt; cat $OUT/train/results.md 2>/dev/null | head -30
