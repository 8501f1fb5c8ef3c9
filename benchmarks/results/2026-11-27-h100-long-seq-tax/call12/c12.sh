#!/bin/bash
# Twentieth session call 12: the window points old (one writer, .prebuilt_band) against new (two writers,
# .prebuilt_tw) in one call, hd64 and hd128, twice.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in old new; do
  dir=.prebuilt_band; [ $v = new ] && dir=.prebuilt_tw
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v $dir/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
for r in 1 2; do for hd in 64 128; do for v in old new; do
  env PYTHONPATH=$PWD:/tmp/jd_$v timeout 60 python3 benchmarks/bench_masks.py --seq 16384 --head-dim $hd --impls jax_dash --out $OUT/win/${v}_hd${hd}_r$r.json > $L/win_${v}_hd${hd}_r$r.txt 2>&1
  grep -h "jax_dash" $L/win_${v}_hd${hd}_r$r.txt | sed "s/^ */$v r$r hd$hd /" >> $L/win.txt
done; done; done
tar czf $OUT/c12.tgz -C $OUT logs win
cat $L/win.txt
