#!/bin/bash
# Twenty-sixth session call 2: main's final kernels (f053674 = .prebuilt_final): driver checks,
# issue 32's hd128 causal grid with FA3 and FA3 det, every GPU test, memcheck.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_final/jax_dash_sm90_check; chmod +x $D
for mode in default masks; do
  a=""; [ $mode != default ] && a=$mode
  timeout 100 $D $a > $L/drv_$mode.txt 2>&1; echo "drv $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$mode.txt | tail -1)" >> $L/summary.txt
done
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_final/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export PYTHONPATH=$PWD:/tmp/fa3
timeout 190 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
export PYTHONPATH=/tmp/site_none:$PWD
t=$(( $(left) - 45 )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
[ $(left) -gt 40 ] && { timeout 35 compute-sanitizer --tool memcheck $D > $L/memcheck.txt 2>&1; echo "memcheck default rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.txt | tail -1)" >> $L/summary.txt; }
tar czf $OUT/c2.tgz -C $OUT logs grid
cat $L/gpu.txt $L/summary.txt; grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid/results.md | head -10
