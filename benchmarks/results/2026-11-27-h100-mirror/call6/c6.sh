#!/bin/bash
# Twenty-seventh session call 6: main's final kernels (688ad09; .prebuilt_mirror2 = 59467cb, whose
# kernels main has, comments aside): issue 32's hd128 causal grid with FA3 and FA3 det
# (bench_attention), the window points (bench_masks, auto = mirror), and a probe of the forward's
# kernel choice where the grid reads lowest against its peers (hd64 full 512-2k, hd128 causal and
# full 2k): the default against the other kernels by JAX_DASH_SM90_FWD, 2 rounds (driver).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid $OUT/win
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_mirror2/jax_dash_sm90_check; chmod +x $D
for r in 1 2; do
  for spec in "32 512 32 32 64 0 shift 10" "16 1024 32 32 64 0 shift 10" "8 2048 32 32 64 0 shift 10" \
              "8 2048 16 16 128 1 symmetric_shift 10" "8 2048 16 16 128 0 shift 10"; do
    for v in default ws ws-persistent-narrow; do
      if [ $v = default ]; then timeout 30 $D bench $spec > $L/b.txt 2>&1
      else JAX_DASH_SM90_FWD=$v timeout 30 $D bench $spec > $L/b.txt 2>&1; fi
      grep "^bench" $L/b.txt | sed "s/^/$v r$r /" >> $L/fwd.txt
    done
  done
done
echo "fwd probe done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_mirror2/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export PYTHONPATH=$PWD:/tmp/fa3
timeout 200 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  [ $(left) -lt 45 ] && break
  timeout 60 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
tar czf $OUT/c6.tgz -C $OUT logs grid win
cat $L/gpu.txt $L/summary.txt; grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid/results.md | head -10
grep -h "TFLOP" $L/win_*.txt | grep window
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bwd.*//' $L/fwd.txt
