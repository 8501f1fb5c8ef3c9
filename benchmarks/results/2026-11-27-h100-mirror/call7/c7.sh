#!/bin/bash
# Twenty-seventh session call 7: does 59467cb's masked kernel (mirror tested before the fallbacks,
# +~600 per-unit instructions in the masked backward) cost the window anything under mirror?
# Call 6's bench_masks read jax_dash's window backward 4-9% below call 1's (d5f5124). Driver A/B,
# mirror and descending, d5f5124 (.drv_mirror1) against 59467cb (.prebuilt_mirror2), 3 rounds.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
chmod +x .drv_mirror1/jax_dash_sm90_check .prebuilt_mirror2/jax_dash_sm90_check
for r in 1 2 3; do
  for spec in "1 16384 16 16 128 1 mirror 5 4096" "2 8192 16 16 128 1 mirror 5 4096" \
              "1 16384 32 32 64 1 mirror 5 4096" "2 8192 32 32 64 1 mirror 5 4096"; do
    for v in drv_mirror1 prebuilt_mirror2; do
      timeout 30 .$v/jax_dash_sm90_check bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
tar czf $OUT/c7.tgz -C $OUT logs
cat $L/gpu.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/bench.txt
