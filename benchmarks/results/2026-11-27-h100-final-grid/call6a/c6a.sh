#!/bin/bash
# Twenty-sixth session call 6a (drivers; 6b runs the wheel): call 5a again on the fixed branch (66097af): fwd-band-rows (fbc0995, .prebuilt_brc, its driver stripped: the masked forward's predicate
# as one column interval per row) against main's final kernels (.prebuilt_fd: .prebuilt_final's driver, stripped): driver window
# forward A/B (3 rounds interleaved), the branch's driver checks and memcheck of the mask cases,
# its wheel's digests against the reference, every GPU test on its wheel, the window points
# (bench_masks) with cuDNN and FA3.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in fd brd; do chmod +x .prebuilt_$v/jax_dash_sm90_check; done
check() {  # check VARIANT MODE
  local a=""; [ $2 != default ] && a=$2
  timeout 100 .prebuilt_$1/jax_dash_sm90_check $a > $L/drv_$1_$2.txt 2>&1
  echo "drv $1 $2 rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$1_$2.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
}
for m in default masks dropout variants; do check brd $m; done
for r in 1 2 3; do
  for spec in "1 16384 16 16 128 1 descending 5 4096" "2 8192 16 16 128 1 descending 5 4096" \
              "1 16384 32 32 64 1 descending 5 4096" "2 8192 32 32 64 1 descending 5 4096"; do
    for v in fd brd; do
      timeout 30 .prebuilt_$v/jax_dash_sm90_check bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
echo "bench done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 60 compute-sanitizer --tool memcheck .prebuilt_brd/jax_dash_sm90_check masks > $L/memcheck_masks.txt 2>&1; echo "memcheck brd masks rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_masks.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
# Diagnostic (time left): ncu of the window backward at hd64 16k (main's kernels; 0.88-0.92x
# cuDNN in call 3) and, beside it, the causal hd64 16k backward (1.06x cuDNN).
mkdir -p /tmp/n
if [ $(left) -gt 150 ]; then
  timeout 100 ncu --set full --import-source no --kernel-name-base mangled -k "regex:bwd_main_ws" --launch-skip 1 -c 1 -f -o /tmp/n/bw64 .prebuilt_fd/jax_dash_sm90_check bench 1 16384 32 32 64 1 descending 2 4096 > $L/ncu_bw64.log 2>&1; echo "ncu bw64 rc=$?" >> $L/summary.txt
  timeout 100 ncu --set full --import-source no --kernel-name-base mangled -k "regex:bwd_main_ws" --launch-skip 1 -c 1 -f -o /tmp/n/bc64 .prebuilt_fd/jax_dash_sm90_check bench 1 16384 32 32 64 1 descending 2 > $L/ncu_bc64.log 2>&1; echo "ncu bc64 rc=$?" >> $L/summary.txt
  for v in bw64 bc64; do
    ncu -i /tmp/n/$v.ncu-rep --page details > $L/${v}_details.txt 2>&1
    ncu -i /tmp/n/$v.ncu-rep --page source --csv --print-source sass 2>&1 | gzip -9 > $L/${v}_sass.csv.gz
  done
fi
tar czf $OUT/c6a.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
for v in bw64 bc64; do echo "== $v"; grep -E "^\s+(Elapsed Cycles|Duration|Executed Ipc Active|Executed Instructions |L2 Hit Rate) " $L/${v}_details.txt 2>/dev/null; done
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/bench.txt
