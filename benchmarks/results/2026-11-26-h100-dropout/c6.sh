#!/bin/bash
# Eighteenth session call 6: two Philox calls in flight (f759958) against b0fd902: bits, driver, cost.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in old new; do
  dir=.prebuilt_cmw; [ $v = new ] && dir=.prebuilt_il
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v $dir/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
DRV=.prebuilt_il/jax_dash_sm90_check; chmod +x $DRV
timeout 60 $DRV dropout > $L/drv_dropout.txt 2>&1; echo "drv dropout rc=$?" >> $L/summary.txt; tail -1 $L/drv_dropout.txt >> $L/summary.txt
for v in old new; do
  run $v timeout 150 python3 maintainers/scripts/bits_digest.py --dropout --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run new python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_old.json $OUT/ab/digest_new.json >> $L/summary.txt 2>&1
for r in 1 2; do for v in old new; do
  run $v timeout 110 python3 benchmarks/bench_dropout.py --no-cudnn --out $OUT/ab/${v}$r --seqs 4k,16k --budget 1.0 --iters 8 > $L/bench_${v}$r.txt 2>&1; echo "bench $v$r rc=$?" >> $L/summary.txt
done; done
tar czf $OUT/c6.tgz -C $OUT logs ab
cat $L/summary.txt
for f in old1 new1 old2 new2; do echo "== $f"; cat $OUT/ab/$f/dropout.md 2>/dev/null | tail -8; done
