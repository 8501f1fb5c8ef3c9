#!/bin/bash
# Twenty-seventh session call 9 (diagnostic): causal heads longer than symmetric_shift's one slice,
# where auto runs descending: 1 x 64k at hd64 (32 heads) and hd128 (16 heads), descending /
# mirror / symmetric_shift (several slices) / atomic, 2 rounds (driver, main's kernels).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_mirror2/jax_dash_sm90_check; chmod +x $D
for r in 1 2; do
  for spec in "1 65536 32 32 64 1 SCH 3" "1 65536 16 16 128 1 SCH 3"; do
    for s in descending mirror symmetric_shift atomic; do
      timeout 60 $D bench ${spec/SCH/$s} > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/r$r /" >> $L/bench.txt
    done
  done
done
tar czf $OUT/c9.tgz -C $OUT logs
cat $L/gpu.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/bench.txt
