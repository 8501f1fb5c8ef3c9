#!/bin/bash
# Twenty-first session call 6: main's new kernels (953549b, .prebuilt_eswg): every GPU test; the 4 x 4096
# training step (cudnn_gather, dash_embed).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_eswg/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
OUT=$L timeout 300 bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$?" >> $L/summary.txt
tail -3 $L/gpu_tests_summary.txt >> $L/summary.txt
timeout 250 python3 benchmarks/bench_train.py --seqs 4096 --configs cudnn_gather,dash_embed --compilation-cache --time-budget 240 --out $OUT/train --no-plots > $L/train.txt 2>&1; echo "train rc=$?" >> $L/summary.txt
tar czf $OUT/c6.tgz -C $OUT logs train
cat $L/gpu.txt $L/summary.txt; grep "^|" $OUT/train/results.md 2>/dev/null | head -5
