#!/bin/bash
# Twenty-seventh session call 8: the hd128 window points again (bench_masks, jax_dash / cuDNN /
# FA3, --iters 30, two repetitions each): calls 1 and 6 read jax_dash / FA3 0.92 / 0.88 and
# 0.84 / 0.83 at 16k / 8k on the same kernels (call 7: the two builds within 0.5% of each other).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_mirror2/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export PYTHONPATH=$PWD:/tmp/fa3
for r in 1 2; do for seq in 16384 8192; do
  [ $(left) -lt 60 ] && break
  timeout 90 python3 benchmarks/bench_masks.py --seq $seq --head-dim 128 --iters 30 --impls jax_dash,cudnn,fa3 --out $OUT/win/r${r}_s${seq}.json > $L/win_r${r}_s${seq}.txt 2>&1
  echo "window r$r seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
tar czf $OUT/c8.tgz -C $OUT logs win
cat $L/gpu.txt $L/summary.txt; for f in $L/win_r*.txt; do echo "== $f"; grep -h "TFLOP" $f | grep -v packed; done
