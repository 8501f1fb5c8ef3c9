#!/bin/bash
# Thirty-second session call 2: main's final kernels (.prebuilt_final, built from main after the
# tile counter's merge): drivers default, masks, dropout, variants; synccheck (default) and
# memcheck (masks); issue 32's hd128 causal grid with cuDNN, FA3 and FA3 det; the window points;
# every GPU test.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid $OUT/win
T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
B=.prebuilt_final/jax_dash_sm90_check; chmod +x $B
for m in default masks dropout variants; do
  a=""; [ $m != default ] && a=$m
  timeout 90 $B $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
timeout 80 compute-sanitizer --tool synccheck $B > $L/synccheck.txt 2>&1
echo "synccheck default rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 80 compute-sanitizer --tool memcheck $B masks > $L/memcheck_masks.txt 2>&1
echo "memcheck masks rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_masks.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_final/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD:/tmp/fa3
timeout 130 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout 45 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
export PYTHONPATH=/tmp/site_none:$PWD
t=$(( $(left) - 10 )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c2.tgz -C $OUT logs grid win
cat $L/gpu.txt $L/summary.txt; grep -h "TFLOP" $L/win_*.txt | grep -v packed | head -12
grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid/results.md | head -10
