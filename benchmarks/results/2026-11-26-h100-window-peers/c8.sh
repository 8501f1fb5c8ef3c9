#!/bin/bash
# Eighteenth session call 8: issue 32's window points with every peer (624f744's kernels).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_ncw/*.whl >> $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout 120 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "hd$hd seq$seq rc=$?" >> $L/summary.txt
done; done
tar czf $OUT/c8.tgz -C $OUT logs win
cat $L/summary.txt; grep -h "TFLOP\|wrong\|unavailable" $L/win_*.txt
