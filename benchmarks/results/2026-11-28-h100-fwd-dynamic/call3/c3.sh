#!/bin/bash
# Thirty-second session call 3: main's final kernels (.prebuilt_final): the grid against cuDNN
# (512-16k, head_dim 64 / 128, full / causal), the Triton tutorial (fp16, head_dim 64, 512-2k), and
# a second run of issue 32's hd128 causal grid with FA3 and FA3 det (the ratios' spread).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid $OUT/fp16 $OUT/grid_fa3
T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_final/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD:/tmp/fa3
timeout 130 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid_fa3 --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid_fa3.txt 2>&1; echo "grid fa3 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 220 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 512,1k,2k,4k,8k,16k --out $OUT/grid --head-dims 64,128 --masks full,causal --impls jax_dash,cudnn --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
t=$(( $(left) - 10 )); [ $t -gt 150 ] && t=150
[ $t -gt 40 ] && { PYTEST_VERSION=1 timeout $t python3 benchmarks/bench_attention.py --dtype float16 --triton-tutorial .peer_src/triton_06_fused_attention_5c846f015.py --impls jax_dash,cudnn,triton_tutorial --schedules auto --iters 10 --no-plots --item-timeout 60 --seqs 512,1k,2k --out $OUT/fp16 --head-dims 64 --masks causal,full > $L/fp16.txt 2>&1; echo "fp16 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt; }
tar czf $OUT/c3.tgz -C $OUT logs grid fp16 grid_fa3
cat $L/gpu.txt $L/summary.txt
grep -A8 "^## Backward TFLOP" $OUT/grid_fa3/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid_fa3/results.md | head -10
grep -A26 "^## Backward TFLOP" $OUT/grid/results.md | tail -25; grep -A26 "^## Forward TFLOP" $OUT/grid/results.md | tail -25
grep -A8 "^## Backward TFLOP" $OUT/fp16/results.md | tail -7
