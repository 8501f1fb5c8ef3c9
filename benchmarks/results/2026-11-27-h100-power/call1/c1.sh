#!/bin/bash
# Twenty-second session call 1: bwd-stsm-first (.prebuilt_stsm) against main (.prebuilt_main), driver A/B;
# the window's determinism tax and body (driver bench with window_left, descending vs atomic).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $L/gpu.txt 2>&1
for v in main stsm; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v .prebuilt_$v/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
declare -A DRV=([main]=.prebuilt_main/jax_dash_sm90_check [stsm]=.prebuilt_stsm/jax_dash_sm90_check)
chmod +x ${DRV[main]} ${DRV[stsm]}
for mode in default masks; do
  a=""; [ $mode = masks ] && a=masks
  timeout 150 ${DRV[stsm]} $a > $L/drv_stsm_$mode.txt 2>&1; echo "drv stsm $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_stsm_$mode.txt | tail -1)" >> $L/summary.txt
done
for v in main stsm; do
  run $v timeout 150 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run stsm python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_main.json $OUT/ab/digest_stsm.json >> $L/summary.txt 2>&1
for r in 1 2; do
  for spec in "8 2048 16 16 128 1 symmetric_shift" "4 4096 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift" \
              "2 8192 16 16 128 1 atomic" "1 16384 16 16 128 1 symmetric_shift" "1 32768 16 8 128 1 symmetric_shift" \
              "4 4096 16 16 128 0 shift" "2 8192 32 32 64 1 symmetric_shift" \
              "1 16384 16 16 128 1 descending 5 4096" "1 16384 16 16 128 1 atomic 5 4096" \
              "2 8192 16 16 128 1 descending 5 4096" "2 8192 16 16 128 1 atomic 5 4096" \
              "1 16384 32 32 64 1 descending 5 4096" "1 16384 32 32 64 1 atomic 5 4096"; do
    set -- $spec
    args="$1 $2 $3 $4 $5 $6 $7 5 ${9:-}"
    for v in main stsm; do
      timeout 60 ${DRV[$v]} bench $args > $L/b_${v}_r${r}_${args// /_}.txt 2>&1
      grep "^bench" $L/b_${v}_r${r}_${args// /_}.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
# Sustained load: the same shape timed over 5 and 400 iterations, clocks and power sampled meanwhile;
# then bench_attention's number for the same point (jax_dash only), to set the driver against it.
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 100 > $L/smi_long.txt 2>&1 &
SMI=$!
for it in 5 400 5; do
  timeout 60 ${DRV[main]} bench 2 8192 16 16 128 1 symmetric_shift $it 2>&1 | grep "^bench" | sed "s/^/iters=$it /" >> $L/long.txt
done
kill $SMI
run main timeout 240 python3 benchmarks/bench_attention.py --head-dims 128 --masks causal --seqs 8192 --impls jax_dash --schedules symmetric_shift --iters 10 --out $OUT/ba --fresh --no-plots > $L/ba.txt 2>&1; echo "bench_attention rc=$?" >> $L/summary.txt
timeout 60 ${DRV[main]} bench 2 8192 16 16 128 1 symmetric_shift 5 2>&1 | grep "^bench" | sed "s/^/after-ba iters=5 /" >> $L/long.txt
timeout 200 compute-sanitizer --tool synccheck ${DRV[stsm]} > $L/synccheck_stsm.txt 2>&1; echo "synccheck stsm rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_stsm.txt | tail -1)" >> $L/summary.txt
tar czf $OUT/c1.tgz -C $OUT logs ab ba
cat $L/gpu.txt $L/summary.txt $L/long.txt; sort -t, -k1 -n $L/smi_long.txt | awk -F, 'NR==1{print "smi min " $0} END{print "smi max " $0}'; grep -iE "tflop|bwd" $L/ba.txt | tail -5; sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//' $L/bench.txt | cut -c1-130
