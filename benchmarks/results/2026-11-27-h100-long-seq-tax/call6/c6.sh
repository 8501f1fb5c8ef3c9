#!/bin/bash
# Twentieth session call 6: two dQ writer warps (bwd-two-writers) against one (.prebuilt_band, fbe4917's kernels).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in old new; do
  dir=.prebuilt_band; [ $v = new ] && dir=.prebuilt_tw
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v $dir/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
NEW=.prebuilt_tw/jax_dash_sm90_check; OLD=.prebuilt_band/jax_dash_sm90_check; chmod +x $NEW $OLD
for m in "" masks dropout; do
  timeout 120 $NEW $m > $L/drv_${m:-default}.txt 2>&1; echo "drv ${m:-default} rc=$?" >> $L/summary.txt; grep -E "^(PASS|FAIL)" $L/drv_${m:-default}.txt | tail -2 >> $L/summary.txt
done
for v in old new; do
  run $v timeout 120 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run new python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_old.json $OUT/ab/digest_new.json >> $L/summary.txt 2>&1
for r in 1 2; do for shape in "1 32768" "2 16384" "4 8192"; do for s in symmetric_shift descending atomic; do for v in old new; do
  D=$OLD; [ $v = new ] && D=$NEW
  timeout 60 $D bench $shape 16 8 128 1 $s 5 2>&1 | grep "^bench" | sed "s/^/$v r$r /" >> $L/bench.txt
done; done; done; done
t=$(left); [ $t -gt 100 ] && { run new timeout $((t > 200 ? 180 : t - 20)) python3 benchmarks/bench_attention.py --head-dims 128 --masks causal --seqs 16k,32k --tokens 32768 --group 2 --impls jax_dash,cudnn --schedules auto,atomic --iters 10 --item-timeout 90 --out $OUT/g2 --no-plots > $L/g2.txt 2>&1; echo "g2 rc=$?" >> $L/summary.txt; }
t=$(left); [ $t -gt 60 ] && { timeout $((t - 10)) compute-sanitizer --tool memcheck --error-exitcode 9 $NEW > $L/san_memcheck.txt 2>&1; echo "memcheck rc=$?" >> $L/summary.txt; grep "ERROR SUMMARY" $L/san_memcheck.txt | tail -1 >> $L/summary.txt; }
tar czf $OUT/c6.tgz -C $OUT logs ab $( [ -d $OUT/g2 ] && echo g2 )
cat $L/gpu.txt $L/summary.txt; cut -c1-120 $L/bench.txt; grep -A6 "^## Backward TFLOP" $OUT/g2/results.md 2>/dev/null
