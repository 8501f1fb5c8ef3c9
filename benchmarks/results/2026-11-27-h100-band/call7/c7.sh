#!/bin/bash
# Twenty-fourth session call 7: main's final kernels (584b77d = .prebuilt_wfin/.prebuilt_dfin):
# driver checks, memcheck, every GPU test, issue 32's hd128 causal grid with FA3 and FA3 det, the
# window points, then (time left) hd64 and full masks against cuDNN.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win $OUT/grid $OUT/grid2
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_dfin/jax_dash_sm90_check; chmod +x $D
for mode in default masks; do
  a=""; [ $mode != default ] && a=$mode
  timeout 100 $D $a > $L/drv_$mode.txt 2>&1; echo "drv $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$mode.txt | tail -1)" >> $L/summary.txt
done
timeout 100 compute-sanitizer --tool memcheck $D > $L/memcheck.txt 2>&1; echo "memcheck default rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.txt | tail -1)" >> $L/summary.txt
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_wfin/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export PYTHONPATH=/tmp/site_none:$PWD
OUT=$L timeout 280 bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$?" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
export PYTHONPATH=$PWD:/tmp/fa3
t=$(left); [ $t -gt 180 ] && t=180
timeout $t python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$?" >> $L/summary.txt
for hd in 128 64; do for seq in 16384 8192; do
  t=$(left); [ $t -lt 45 ] && break
  [ $t -gt 60 ] && t=60
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout $t python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$?" >> $L/summary.txt
done; done
tar czf $OUT/c7.tgz -C $OUT logs win grid
cat $L/gpu.txt $L/summary.txt; grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid/results.md | head -10; grep -h "TFLOP" $L/win_*.txt | grep -v packed | head -20
