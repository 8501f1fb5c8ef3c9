#!/bin/bash
# Twenty-fifth session call 4: issue 32's hd128 causal grid at 2k and 4k again on main's kernels
# (a78d2a8, .prebuilt_wm2), with cuDNN, FA3 and FA3 det, in a process started on an idle GPU (call
# 2's 2k forward point ran as the GPU tests' workers were exiting).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_wm2/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export PYTHONPATH=$PWD:/tmp/fa3
timeout 200 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$?" >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT logs grid
cat $L/gpu.txt $L/summary.txt; grep -A5 "^## Backward TFLOP" $OUT/grid/results.md; grep -A5 "^## Forward TFLOP" $OUT/grid/results.md
