#!/bin/bash
# Eighteenth session call 9: window/lengths-only masked instantiations (HEAD) against 624f744.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in old new; do
  dir=.prebuilt_ncw; [ $v = new ] && dir=.prebuilt_band
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v $dir/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
DRV=.prebuilt_band/jax_dash_sm90_check; chmod +x $DRV
for mode in masks dropout; do
  timeout 90 $DRV $mode > $L/drv_$mode.txt 2>&1; echo "drv $mode rc=$?" >> $L/summary.txt; tail -1 $L/drv_$mode.txt >> $L/summary.txt
done
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $DRV masks > $L/san_masks.txt 2>&1; echo "memcheck masks rc=$?" >> $L/summary.txt; grep "ERROR SUMMARY" $L/san_masks.txt | tail -1 >> $L/summary.txt
for v in old new; do
  run $v timeout 170 python3 maintainers/scripts/bits_digest.py --dropout --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run new python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_old.json $OUT/ab/digest_new.json >> $L/summary.txt 2>&1
for r in 1 2; do for v in old new; do for hd in 64 128; do
  run $v timeout 60 python3 benchmarks/bench_masks.py --seq 16384 --head-dim $hd --impls jax_dash --no-check --out $OUT/ab/${v}${r}_hd$hd.json > $L/masks_${v}${r}_hd$hd.txt 2>&1
done; done; done
tar czf $OUT/c9.tgz -C $OUT logs ab
cat $L/summary.txt
for f in $L/masks_*.txt; do echo "== $(basename $f)"; grep -h "sliding\|packed" $f; done
