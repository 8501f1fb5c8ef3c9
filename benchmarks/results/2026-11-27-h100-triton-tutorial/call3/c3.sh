#!/bin/bash
# Twenty-eighth session call 3 (driver, main's kernels = .prebuilt_mirror2): every backward
# schedule at hd64 causal 32 x 512 and 16 x 1024 (auto runs symmetric_shift there), and the
# full mask's tax at hd128 2 x 8k and 1 x 16k (shift = auto, against atomic); 3 interleaved rounds.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_mirror2/jax_dash_sm90_check; chmod +x $D
for r in 1 2 3; do
  for shape in "32 512 32 32 64 1" "16 1024 32 32 64 1"; do
    for s in symmetric_shift descending mirror shift ascending atomic; do
      timeout 30 $D bench $shape $s 20 > $L/b.txt 2>&1; grep "^bench" $L/b.txt | sed "s/^/r$r /" >> $L/sched.txt
    done
  done
  for shape in "2 8192 16 16 128 0" "1 16384 16 16 128 0"; do
    for s in shift atomic; do
      timeout 30 $D bench $shape $s 10 > $L/b.txt 2>&1; grep "^bench" $L/b.txt | sed "s/^/r$r /" >> $L/tax.txt
    done
  done
done
tar czf $OUT/c3.tgz -C $OUT logs
cat $L/gpu.txt; cat $L/sched.txt $L/tax.txt | sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=[0-9]+ //; s/H=//; s/D=//; s/S=//'
