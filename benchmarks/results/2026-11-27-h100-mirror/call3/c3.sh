#!/bin/bash
# Twenty-seventh session call 3: branch mirror-schedule at 59467cb (.prebuilt_mirror2: mirror, its
# item order tested before the fallbacks) against main's kernels (.drv_main: the driver of
# .prebuilt_kernels_66097af, main's kernels): drivers default / masks / dropout and memcheck of the
# mask cases on the branch; driver backward A/B, 3 rounds interleaved, on the schedules auto runs
# elsewhere (causal symmetric_shift, full shift, hd128 and hd64) and the masked kernel (window,
# descending): the schedule code's cost for the schedules that existed.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
chmod +x .prebuilt_mirror2/jax_dash_sm90_check .drv_main/jax_dash_sm90_check
D=.prebuilt_mirror2/jax_dash_sm90_check
for m in default masks dropout; do
  a=""; [ $m != default ] && a=$m
  timeout 120 $D $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
timeout 90 compute-sanitizer --tool memcheck $D masks > $L/memcheck_masks.txt 2>&1; echo "memcheck masks rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_masks.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
for r in 1 2 3; do
  for spec in "2 8192 16 16 128 1 symmetric_shift 5" "1 16384 16 16 128 1 symmetric_shift 5" \
              "4 4096 16 16 128 0 shift 5" "2 8192 32 32 64 1 symmetric_shift 5" \
              "4 4096 32 32 64 0 shift 5" "2 8192 16 16 128 1 descending 5 4096" \
              "2 8192 32 32 64 1 descending 5 4096"; do
    for v in drv_main prebuilt_mirror2; do
      timeout 30 .$v/jax_dash_sm90_check bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
echo "bench done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tar czf $OUT/c3.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/bench.txt
