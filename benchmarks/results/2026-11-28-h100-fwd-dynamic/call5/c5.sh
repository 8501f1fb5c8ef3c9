#!/bin/bash
# Thirty-second session call 5: a third run of issue 32's hd128 causal grid with FA3 and FA3 det,
# and hd64 full 4k / 16k against cuDNN, on main's final build (.prebuilt_final): the spread of the
# ratios near their lines (all runs reported).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid_fa3 $OUT/hd64
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_final/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD:/tmp/fa3
timeout 130 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid_fa3 --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid_fa3.txt 2>&1; echo "grid fa3 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 60 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 4k,16k --out $OUT/hd64 --head-dims 64 --masks full --impls jax_dash,cudnn --no-plots > $L/hd64.txt 2>&1; echo "hd64 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tar czf $OUT/c5.tgz -C $OUT logs grid_fa3 hd64
cat $L/gpu.txt $L/summary.txt
grep -A8 "^## Backward TFLOP" $OUT/grid_fa3/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid_fa3/results.md | head -10
grep -A5 "^## Backward TFLOP" $OUT/hd64/results.md | tail -3
