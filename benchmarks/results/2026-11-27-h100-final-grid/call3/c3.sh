#!/bin/bash
# Twenty-sixth session call 3: main's final kernels (f053674 = .prebuilt_final): the window points
# (bench_masks, FA3 at hd128), the window's tax (driver, descending / atomic), and the rest of the
# grid against cuDNN (hd64 and hd128, full and causal, 512-16k).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win $OUT/grid
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_final/jax_dash_sm90_check; chmod +x $D
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_final/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export PYTHONPATH=$PWD:/tmp/fa3
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout 60 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
for r in 1 2; do
  for spec in "1 16384 16 16 128 1 SCH 5 4096" "2 8192 16 16 128 1 SCH 5 4096" \
              "1 16384 32 32 64 1 SCH 5 4096" "2 8192 32 32 64 1 SCH 5 4096"; do
    for s in descending atomic; do
      timeout 30 $D bench ${spec/SCH/$s} > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/r$r /" >> $L/tax.txt
    done
  done
done
echo "tax done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
t=$(( $(left) - 15 )); [ $t -gt 300 ] && t=300
timeout $t python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 512,1k,2k,4k,8k,16k --out $OUT/grid --head-dims 64,128 --masks full,causal --impls jax_dash,cudnn --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tar czf $OUT/c3.tgz -C $OUT logs win grid
cat $L/gpu.txt $L/summary.txt; grep -h "TFLOP" $L/win_*.txt | grep -v packed | head -20
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/tax.txt
grep -A30 "^## Backward TFLOP/s (%" $OUT/grid/results.md | head -30; grep -A30 "^## Forward TFLOP" $OUT/grid/results.md | head -30
