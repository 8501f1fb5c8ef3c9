#!/bin/bash
# Twentieth session call 2: the forward draws under the S wgmma (fwd-draw-early) against fbe4917's kernels:
# driver, bits, cost A/B, sanitizers, GPU dropout tests. Each step under its own timeout.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in old new; do
  dir=.prebuilt_band; [ $v = new ] && dir=.prebuilt_de
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v $dir/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
DRV=.prebuilt_de/jax_dash_sm90_check; chmod +x $DRV
timeout 60 $DRV dropout > $L/drv_dropout.txt 2>&1; echo "drv dropout rc=$?" >> $L/summary.txt; tail -1 $L/drv_dropout.txt >> $L/summary.txt
for v in old new; do
  run $v timeout 120 python3 maintainers/scripts/bits_digest.py --dropout --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run new python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_old.json $OUT/ab/digest_new.json >> $L/summary.txt 2>&1
for v in old new; do
  run $v timeout 100 python3 benchmarks/bench_dropout.py --no-cudnn --out $OUT/ab/${v}1 --seqs 4k,16k --budget 1.0 --iters 8 > $L/bench_${v}1.txt 2>&1; echo "bench ${v}1 rc=$?" >> $L/summary.txt
done
timeout 80 compute-sanitizer --tool memcheck --error-exitcode 9 $DRV dropout > $L/san_memcheck.txt 2>&1; echo "memcheck rc=$?" >> $L/summary.txt; grep "ERROR SUMMARY" $L/san_memcheck.txt | tail -1 >> $L/summary.txt
t=$(left); [ $t -gt 130 ] && { run new timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_dropout.py -m gpu > $L/pytest_dropout.txt 2>&1; echo "pytest dropout rc=$?" >> $L/summary.txt; tail -1 $L/pytest_dropout.txt >> $L/summary.txt; }
t=$(left); [ $t -gt 150 ] && { run new timeout $((t - 15)) python3 benchmarks/bench_dropout.py --no-cudnn --out $OUT/ab/grid --budget 1.0 --iters 8 > $L/bench_grid.txt 2>&1; echo "grid rc=$?" >> $L/summary.txt; }
tar czf $OUT/c2.tgz -C $OUT logs ab
cat $L/gpu.txt $L/summary.txt
for f in old1 new1 grid; do echo "== $f"; cat $OUT/ab/$f/dropout.md 2>/dev/null | tail -16; done
