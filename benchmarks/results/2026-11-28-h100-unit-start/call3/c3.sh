#!/bin/bash
# Thirtieth session call 3: branch unit-kv-first at b86afa9 (.prebuilt_kvf3: the fetched unit
# reaches the producer through an mbarrier; K, V and the first Q/dO stage loaded under the math's
# copy of the unit tables). Drivers default and masks, synccheck and memcheck (default); issue
# 32's hd128 causal grid with FA3 and FA3 det on the branch's wheel; every GPU test on it. (The A/B
# against main's driver is in call 4: both drivers and FA3's wheel exceed what a call carries.)
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid
T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
B=.prebuilt_kvf3/jax_dash_sm90_check; chmod +x $B
for m in default masks; do
  a=""; [ $m != default ] && a=$m
  timeout 60 $B $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
for tool in synccheck memcheck; do
  timeout 60 compute-sanitizer --tool $tool $B > $L/$tool.txt 2>&1
  echo "$tool default rc=$? $(grep -E 'ERROR SUMMARY' $L/$tool.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_kvf3/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD:/tmp/fa3
timeout 190 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
export PYTHONPATH=/tmp/site_none:$PWD
t=$(( $(left) - 10 )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c3.tgz -C $OUT logs grid
cat $L/gpu.txt $L/summary.txt
grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid/results.md | head -10
