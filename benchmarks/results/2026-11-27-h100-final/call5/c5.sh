#!/bin/bash
# Twenty-first session call 5: issue 32's hd128 causal grid and window points with the peers, on main's new kernels
# (953549b: early lse/dsum reads, per-warpgroup dQ halves; .prebuilt_eswg).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win $OUT/grid
T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_eswg/*.whl >> $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 60 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$?" >> $L/summary.txt
for hd in 128 64; do for seq in 16384 8192; do
  t=$(left); [ $t -lt 70 ] && break
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout 60 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "hd$hd seq$seq rc=$?" >> $L/summary.txt
done; done
tar czf $OUT/c5.tgz -C $OUT logs win grid
cat $L/gpu.txt $L/summary.txt; grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10; grep -h "TFLOP\|wrong\|unavailable" $L/win_*.txt | head -30
