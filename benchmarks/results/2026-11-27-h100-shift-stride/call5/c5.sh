#!/bin/bash
# Twenty-ninth session call 5 (diagnostic, driver of main's final kernels = .prebuilt_stride):
# (1) the square tiles' lockstep: shift vs atomic with the per-role trace, hd64 full 4 x 4k and
# 2 x 8k, hd256 full 2 x 8k; (2) full-mask heads longer than one slice: hd128 1 x 32k, shift
# (two slices) vs descending (auto there) vs atomic; (3) what holds the preprocess at ~72% of
# DRAM peak: ncu occupancy, launch, warp-state and memory sections at hd64 32 x 512.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L/tr
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_stride/jax_dash_sm90_check; chmod +x $D
for r in 1 2; do
  for spec in "4 4096 32 32 64 0" "2 8192 32 32 64 0" "2 8192 8 8 256 0"; do
    for s in shift atomic; do
      f=$L/tr/r${r}_$(echo $spec | cut -d' ' -f1,2,5 | tr ' ' x)_$s.txt
      timeout 40 $D bench $spec $s 10 > $f 2>&1; grep "^bench" $f | sed "s/^/r$r /" >> $L/square.txt
    done
  done
  for s in shift descending atomic; do
    f=$L/tr/r${r}_1x32768x128_$s.txt
    timeout 60 $D bench 1 32768 16 16 128 0 $s 5 > $f 2>&1; grep "^bench" $f | sed "s/^/r$r /" >> $L/long.txt
  done
done
echo "drivers done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 90 ncu --kernel-name regex:bwd_preprocess --launch-skip 2 --launch-count 1 --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SpeedOfLight $D bench 32 512 32 32 64 1 mirror 3 > $L/ncu_pre.txt 2>&1
echo "ncu done rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tar czf $OUT/c5.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=[0-9]+ //; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/square.txt $L/long.txt
for f in $L/tr/r1_*; do echo "== $(basename $f)"; grep -E "writer wait ticket|math wait dQ|math  " $f; done
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Stall|L1/TEX Hit|Mem Busy|Max Bandwidth|One or More|No Eligible|Issued Warp|Active Warps" $L/ncu_pre.txt | head -30
