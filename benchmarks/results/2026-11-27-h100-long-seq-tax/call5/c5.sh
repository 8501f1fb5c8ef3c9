#!/bin/bash
# Twentieth session call 5: the backward's per-role wait trace at the step's shape (1 x 32768, GQA 16/8,
# causal, hd128) under symmetric_shift and atomic, and at 2 x 16384.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
DRV=.prebuilt_band/jax_dash_sm90_check; chmod +x $DRV
for shape in "1 32768" "2 16384" "4 8192"; do for s in symmetric_shift atomic descending; do
  timeout 60 $DRV bench $shape 16 8 128 1 $s 5 > "$L/bench_${shape// /x}_$s.txt" 2>&1; echo "$shape $s rc=$?" >> $L/summary.txt
done; done
cat $L/gpu.txt $L/summary.txt
for f in $L/bench_*; do echo "== $f"; cat $f; done
