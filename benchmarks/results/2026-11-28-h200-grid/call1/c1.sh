#!/bin/bash
# Thirty-third session call 1 (H200; no H100 kind is lent this session): issue 32's grid on main's
# final kernels (.prebuilt_final): hd128 causal with cuDNN, FA3 and FA3 det; hd64 full / causal and
# hd128 full against cuDNN at 2k-16k; the window points.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid_fa3 $OUT/grid $OUT/win
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_final/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD:/tmp/fa3
timeout 130 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid_fa3 --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid_fa3.txt 2>&1; echo "grid fa3 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 170 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 64,128 --masks full,causal --impls jax_dash,cudnn --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout 45 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
tar czf $OUT/c1.tgz -C $OUT logs grid grid_fa3 win
cat $L/gpu.txt $L/summary.txt; grep -h "TFLOP" $L/win_*.txt | grep -v packed | head -12
grep -A8 "^## Backward TFLOP" $OUT/grid_fa3/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid_fa3/results.md | head -10
grep -A20 "^## Backward TFLOP" $OUT/grid/results.md | tail -19; grep -A20 "^## Forward TFLOP" $OUT/grid/results.md | tail -19
