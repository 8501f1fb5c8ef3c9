#!/bin/bash
# Twenty-first session call 3: the full mask (and 32k GQA causal), main / es / es+wg, three rounds of 10 iterations.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
declare -A DRV=([main]=.prebuilt_wm/jax_dash_sm90_check [es]=.prebuilt_es/jax_dash_sm90_check [eswg]=.prebuilt_eswg/jax_dash_sm90_check)
chmod +x ${DRV[main]} ${DRV[es]} ${DRV[eswg]}
for r in 1 2 3; do for shape in "1 16384 16 16 128 0" "2 8192 16 16 128 0" "4 4096 16 16 128 0" "1 16384 32 32 64 0" "1 32768 16 8 128 1"; do
  s=shift; case "$shape" in *" 1") s=symmetric_shift;; esac
  for v in main es eswg; do
    timeout 60 ${DRV[$v]} bench $shape $s 10 > $L/b_${v}_r${r}_${shape// /_}_$s.txt 2>&1
    grep "^bench" $L/b_${v}_r${r}_${shape// /_}_$s.txt | sed "s/^/$v r$r /" >> $L/bench.txt
  done
done; done
tar czf $OUT/c3.tgz -C $OUT logs
cat $L/gpu.txt; sed -E 's/ wave=[0-9]+//; s/bench B=//; s/fwd [0-9.]* ms \([0-9]* TFLOP\/s\), //' $L/bench.txt | cut -c1-120
