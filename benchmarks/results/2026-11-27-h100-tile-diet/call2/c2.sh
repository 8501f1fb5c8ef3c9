#!/bin/bash
# Twenty-fifth session call 2: main's kernels after the merge (a78d2a8 = .prebuilt_m2: the persistent
# cut at 8192 keys for head_dim 128 and the forward's per-tile diet): driver checks, every GPU test,
# issue 32's hd128 causal grid with FA3 and FA3 det, the hd64 short causal forward against cuDNN,
# then (time left) the persistent forward against the one-tile kernel at 16k.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid $OUT/grid64
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_m2/jax_dash_sm90_check; chmod +x $D
for mode in default masks; do
  a=""; [ $mode != default ] && a=$mode
  timeout 100 $D $a > $L/drv_$mode.txt 2>&1; echo "drv $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$mode.txt | tail -1)" >> $L/summary.txt
done
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_m2/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export PYTHONPATH=/tmp/site_none:$PWD
OUT=$L timeout 280 bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
export PYTHONPATH=$PWD:/tmp/fa3
t=$(left); [ $t -gt 170 ] && t=170
timeout $t python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
t=$(left); [ $t -gt 70 ] && t=70
[ $t -gt 40 ] && { timeout $t python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 30 --seqs 512,1k,2k --out $OUT/grid64 --head-dims 64 --masks causal --impls jax_dash,cudnn --no-plots > $L/grid64.txt 2>&1; echo "grid64 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt; }
for r in 1 2; do
  for spec in "1 16384 16 16 128 1 descending 5" "1 16384 16 16 128 0 shift 3"; do
    for k in ws ws-persistent; do
      [ $(left) -lt 15 ] && break 3
      JAX_DASH_SM90_FWD=$k timeout 30 $D bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$k r$r /" >> $L/bench.txt
    done
  done
done
tar czf $OUT/c2.tgz -C $OUT logs grid grid64
cat $L/gpu.txt $L/summary.txt; grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid/results.md | head -10; grep -A6 "^## Forward TFLOP" $OUT/grid64/results.md | head -8
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/bench.txt
