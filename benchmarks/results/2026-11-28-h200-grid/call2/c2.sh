#!/bin/bash
# Thirty-third session call 2 (H200): main's final kernels (.prebuilt_final). The window points with
# bench_masks timing calls back to back (_timing.time_function); a second hd128 causal FA3 grid;
# hd128 causal backward by schedule (auto runs symmetric_shift at 2k-16k); every GPU test.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid_fa3 $OUT/sched $OUT/win
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_final/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD:/tmp/fa3
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout 50 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
timeout 100 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid_fa3 --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid_fa3.txt 2>&1; echo "grid fa3 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 90 python3 benchmarks/bench_attention.py --schedules auto,descending,shift,mirror --iters 10 --item-timeout 40 --seqs 2k,4k,8k,16k --out $OUT/sched --head-dims 128 --masks causal --impls jax_dash --no-plots > $L/sched.txt 2>&1; echo "sched rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
export PYTHONPATH=/tmp/site_none:$PWD
t=$(( $(left) - 10 )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c2.tgz -C $OUT logs grid_fa3 sched win
cat $L/gpu.txt $L/summary.txt; grep -h "TFLOP" $L/win_*.txt | grep -v packed | head -20
grep -A8 "^## Backward TFLOP" $OUT/grid_fa3/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid_fa3/results.md | head -10
grep "^|" $OUT/sched/results.md | head -30
