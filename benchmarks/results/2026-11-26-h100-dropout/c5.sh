#!/bin/bash
# Eighteenth session call 5: CompactMask (b0fd902) against its parent (81ef89c's kernels, .prebuilt_do2):
# bits digests, driver masks and dropout, then bench_masks.py A/B (causal, sliding window, packed).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
for v in old new; do
  dir=.prebuilt_old; [ $v = new ] && dir=.prebuilt_cm
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v $dir/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v:/tmp/site "$@"; }
DRV=.prebuilt_cm/jax_dash_sm90_check; chmod +x $DRV
true || timeout 60 $DRV masks > $L/drv_masks.txt 2>&1; echo "drv masks rc=$?" >> $L/summary.txt; tail -1 $L/drv_masks.txt >> $L/summary.txt
true || timeout 60 $DRV dropout > $L/drv_dropout.txt 2>&1; echo "drv dropout rc=$?" >> $L/summary.txt; tail -1 $L/drv_dropout.txt >> $L/summary.txt
true || timeout 60 $DRV > $L/drv_default.txt 2>&1; echo "drv default rc=$?" >> $L/summary.txt; tail -1 $L/drv_default.txt >> $L/summary.txt
for v in old new; do
  run $v timeout 150 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run new python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_old.json $OUT/ab/digest_new.json >> $L/summary.txt 2>&1
run old timeout 100 python3 benchmarks/bench_masks.py --impls jax_dash --no-check --out $OUT/ab/old1.json > $L/masks_old1.txt 2>&1; echo "masks old1 rc=$?" >> $L/summary.txt
run new timeout 150 python3 benchmarks/bench_masks.py --impls jax_dash,fa3 --out $OUT/ab/new1.json > $L/masks_new1.txt 2>&1; echo "masks new1 rc=$?" >> $L/summary.txt
run old timeout 80 python3 benchmarks/bench_masks.py --impls jax_dash --no-check --out $OUT/ab/old2.json > $L/masks_old2.txt 2>&1; echo "masks old2 rc=$?" >> $L/summary.txt
run new timeout 80 python3 benchmarks/bench_masks.py --impls jax_dash --no-check --out $OUT/ab/new2.json > $L/masks_new2.txt 2>&1; echo "masks new2 rc=$?" >> $L/summary.txt
tar czf $OUT/c5.tgz -C $OUT logs ab
cat $L/summary.txt
for f in old1 new1 old2 new2; do echo "== $f"; grep -h "TFLOP" $L/masks_$f.txt; done
