#!/bin/bash
# Twenty-eighth session call 4 (driver, main's kernels = .prebuilt_mirror2): causal backward,
# symmetric_shift (auto) against mirror and atomic over the paper grid's shapes, hd64/128/256,
# 512-16k, 2 interleaved rounds.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_mirror2/jax_dash_sm90_check; chmod +x $D
for r in 1 2; do
  for d in 64 128 256; do
    H=$(( 2048 / d ))
    for S in 512 1024 2048 4096 8192 16384; do
      B=$(( 16384 / S )); it=20; [ $S -ge 8192 ] && it=10
      for s in symmetric_shift mirror atomic; do
        [ $(( $(date +%s) - T0 )) -gt 540 ] && break 4
        timeout 30 $D bench $B $S $H $H $d 1 $s $it > $L/b.txt 2>&1; grep "^bench" $L/b.txt | sed "s/^/r$r /" >> $L/sched.txt
      done
    done
  done
done
tar czf $OUT/c4.tgz -C $OUT logs
cat $L/gpu.txt; sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=[0-9]+ //; s/H=//; s/D=//; s/S=//; s/fwd [0-9.]+ ms \([0-9]+ TFLOP\/s\), //; s/ TFLOP\/s\)//; s/, bits.*//' $L/sched.txt
