#!/bin/bash
# Twenty-fourth session call 3: main's new kernels (5d04244 = .prebuilt_wcand): issue 32's hd128
# causal grid with FA3 and FA3 det (forward and backward), the window points (4096, causal) with
# cuDNN and FA3 (hd128) / cuDNN (hd64).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win $OUT/grid
T0=$(date +%s); left() { echo $(( 575 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .prebuilt_wcand/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=/tmp/site:$PWD
timeout 270 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 60 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$?" >> $L/summary.txt
for hd in 128 64; do for seq in 16384 8192; do
  t=$(left); [ $t -lt 50 ] && break
  [ $t -gt 70 ] && t=70
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout $t python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$?" >> $L/summary.txt
done; done
tar czf $OUT/c3.tgz -C $OUT logs win grid
cat $L/gpu.txt $L/summary.txt; grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid/results.md | head -10; grep -h "TFLOP\|wrong\|unavailable" $L/win_*.txt | head -30
