#!/bin/bash
# Twenty-seventh session call 10 (diagnostic): head_dim 256 (64 x 64 tiles) causal heads longer
# than one symmetric_shift slice (> 16,896 tokens): descending / mirror / atomic, 2 rounds
# (driver, main's kernels), where the model puts descending at 1.17-1.19 of atomic, mirror 1.04.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_mirror2/jax_dash_sm90_check; chmod +x $D
for r in 1 2; do
  for spec in "1 24576 8 8 256 1 SCH 3" "1 40960 8 8 256 1 SCH 2"; do
    for s in descending mirror atomic; do
      timeout 60 $D bench ${spec/SCH/$s} > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/r$r /" >> $L/bench.txt
    done
  done
done
tar czf $OUT/c10.tgz -C $OUT logs
cat $L/gpu.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/bench.txt
