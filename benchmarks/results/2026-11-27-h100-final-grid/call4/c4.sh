#!/bin/bash
# Twenty-sixth session call 4 (diagnostic): why the window forward runs at ~0.64x the causal
# forward's TFLOP/s (bench_masks, call 3) where cuDNN and FA3 keep ~0.85x: ncu of our masked
# one-tile forward at the window point (1 x 16k, hd128, window 4096) beside the unmasked causal
# one at 1 x 16k, same driver (main's final kernels, .prebuilt_final).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L /tmp/n
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_final/jax_dash_sm90_check; chmod +x $D
for r in 1 2; do for w in "" 4096; do timeout 30 $D bench 1 16384 16 16 128 1 descending 5 $w | grep "^bench" >> $L/bench.txt; done; done
timeout 150 ncu --set full --import-source no --kernel-name-base mangled -k "regex:fwd_kernel" --launch-skip 1 -c 1 -f -o /tmp/n/win $D bench 1 16384 16 16 128 1 descending 2 4096 > $L/ncu_win.log 2>&1; echo "ncu win rc=$?" >> $L/summary.txt
timeout 150 ncu --set full --import-source no --kernel-name-base mangled -k "regex:fwd_kernel" --launch-skip 1 -c 1 -f -o /tmp/n/cau $D bench 1 16384 16 16 128 1 descending 2 > $L/ncu_cau.log 2>&1; echo "ncu cau rc=$?" >> $L/summary.txt
for v in win cau; do
  ncu -i /tmp/n/$v.ncu-rep --page details > $L/${v}_details.txt 2>&1
  ncu -i /tmp/n/$v.ncu-rep --page raw --csv > $L/${v}_raw.csv 2>&1
  ncu -i /tmp/n/$v.ncu-rep --page source --csv --print-source sass 2>&1 | gzip -9 > $L/${v}_sass.csv.gz
done
tar czf $OUT/c4.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt $L/bench.txt
for v in win cau; do echo "== $v"; grep -E "^\s+(Elapsed Cycles|Duration|Executed Ipc Active|Issue Slots Busy|Executed Instructions |L2 Hit Rate|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per Thread|Grid Size|Block Size|Achieved Occupancy|L1/TEX Hit Rate|Warp Cycles Per Issued Instruction|One or More Eligible) " $L/${v}_details.txt; done
