#!/bin/bash
# Twenty-fourth session call 5: the forward producer loading K one iteration ahead of V (kv =
# fwd-k-ahead) against main (m = 5d04244's kernels): driver checks of kv, forward A/B (3 rounds,
# interleaved), synccheck, ncu of kv's forward at hd128 causal 8 x 2k (stall samples).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L /tmp/n
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in cand kv; do chmod +x .prebuilt_d$v/jax_dash_sm90_check; done
K=.prebuilt_dkv/jax_dash_sm90_check
for mode in default masks dropout variants; do
  a=""; [ $mode != default ] && a=$mode
  timeout 120 $K $a > $L/drv_$mode.txt 2>&1; echo "drv kv $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$mode.txt | tail -1)" >> $L/summary.txt
done
for r in 1 2 3; do
  for spec in "8 2048 16 16 128 1 descending 20" "4 4096 16 16 128 1 descending 20" \
              "2 8192 16 16 128 1 descending 10" "1 16384 16 16 128 1 descending 10" \
              "8 2048 16 16 128 0 shift 20" "4 4096 16 16 128 0 shift 10" "1 16384 16 16 128 0 shift 5" \
              "32 512 32 32 64 1 descending 20" "16 1024 32 32 64 1 descending 20" \
              "8 2048 32 32 64 1 descending 20" "4 4096 32 32 64 0 shift 10" "1 16384 32 32 64 1 descending 5" \
              "1 16384 16 16 128 1 descending 5 4096" "1 16384 32 32 64 1 descending 5 4096" \
              "8 2048 8 8 256 1 descending 10"; do
    for v in cand kv; do
      timeout 60 .prebuilt_d$v/jax_dash_sm90_check bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
timeout 100 compute-sanitizer --tool synccheck $K > $L/synccheck_default.txt 2>&1; echo "synccheck kv default rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_default.txt | tail -1)" >> $L/summary.txt
timeout 100 compute-sanitizer --tool synccheck $K masks > $L/synccheck_masks.txt 2>&1; echo "synccheck kv masks rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_masks.txt | tail -1)" >> $L/summary.txt
timeout 120 ncu --set full --import-source no --kernel-name-base mangled -k "regex:fwd_kernel" --launch-skip 1 -c 1 -f -o /tmp/n/kv $K bench 8 2048 16 16 128 1 descending 2 > $L/ncu_kv.log 2>&1
ncu -i /tmp/n/kv.ncu-rep --page details > $L/kv_details.txt 2>&1
ncu -i /tmp/n/kv.ncu-rep --page source --csv --print-source sass 2>&1 | gzip -9 > $L/kv_sass.csv.gz
tar czf $OUT/c5.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
grep -E "^\s+(Elapsed Cycles|Duration|Executed Ipc Active|Issue Slots Busy|Executed Instructions ) " $L/kv_details.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits.*//' $L/bench.txt
