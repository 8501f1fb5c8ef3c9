#!/bin/bash
# Twenty-fourth session call 9: main's final kernels (.prebuilt_dfin, 584b77d's): the forward's
# persistent kernel against the one-tile kernel that `auto` runs beyond 4096 keys (8k, 16k; head_dim
# 64 and 128, causal and full), 3 rounds interleaved; the same bits by construction (hash shown).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_dfin/jax_dash_sm90_check; chmod +x $D
for r in 1 2 3; do
  for spec in "2 8192 16 16 128 1 descending 10" "2 8192 16 16 128 0 shift 10" \
              "2 8192 32 32 64 1 descending 10" "2 8192 32 32 64 0 shift 10" \
              "1 16384 16 16 128 1 descending 5" "1 16384 16 16 128 0 shift 5" \
              "1 16384 32 32 64 1 descending 5" "1 16384 32 32 64 0 shift 5" \
              "2 8192 16 4 128 1 descending 10"; do
    for k in ws ws-persistent; do
      JAX_DASH_SM90_FWD=$k timeout 60 $D bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$k r$r /" >> $L/bench.txt
    done
  done
done
tar czf $OUT/c9.tgz -C $OUT logs
cat $L/gpu.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bwd [0-9.]+ ms//; s/, bits (....).*/ \1/' $L/bench.txt
