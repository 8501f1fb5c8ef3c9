#!/bin/bash
# Twenty-second session call 6: main's final kernels (.prebuilt_final): driver checks, sanitizers, issue 32's hd128
# causal grid with FA3 and FA3 det, the window points.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win $OUT/grid
T0=$(date +%s); left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .prebuilt_final/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=/tmp/site:$PWD
D=.prebuilt_final/jax_dash_sm90_check; chmod +x $D
for mode in default masks dropout variants; do
  a=""; [ $mode != default ] && a=$mode
  timeout 120 $D $a > $L/drv_$mode.txt 2>&1; echo "drv $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$mode.txt | tail -1)" >> $L/summary.txt
done
for tool in memcheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool $D > $L/$tool.txt 2>&1; echo "$tool default rc=$? $(grep -E 'ERROR SUMMARY' $L/$tool.txt | tail -1)" >> $L/summary.txt
done
timeout 260 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 60 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$?" >> $L/summary.txt
for hd in 128 64; do for seq in 16384 8192; do
  t=$(left); [ $t -lt 60 ] && break
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout 55 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$?" >> $L/summary.txt
done; done
tar czf $OUT/c6.tgz -C $OUT logs win grid
cat $L/gpu.txt $L/summary.txt; grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10; grep -h "TFLOP\|wrong\|unavailable" $L/win_*.txt | head -30
