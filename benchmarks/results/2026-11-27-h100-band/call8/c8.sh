#!/bin/bash
# Twenty-fourth session call 8: main's final kernels (584b77d = .prebuilt_wfin): the rest of issue
# 32's grid against cuDNN (head_dim 64 and 128, full and causal, 512-16k; backward auto and forward).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_wfin/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=$PWD
timeout 560 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 512,1k,2k,4k,8k,16k --out $OUT/grid --head-dims 64,128 --masks full,causal --impls jax_dash,cudnn --no-plots > $L/grid.txt 2>&1; echo "grid rc=$?" >> $L/gpu.txt
tar czf $OUT/c8.tgz -C $OUT logs grid
cat $L/gpu.txt; grep -A30 "^## Backward TFLOP/s (%" $OUT/grid/results.md | head -30; grep -A30 "^## Forward TFLOP" $OUT/grid/results.md | head -30
