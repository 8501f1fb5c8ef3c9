#!/bin/bash
# Twenty-ninth session call 4: main's final kernels (.prebuilt_stride): the rest of issue 32's grid
# against cuDNN (bf16, head_dim 64 and 128, full and causal, 512-16k), the window points
# (bench_masks, FA3 at hd128), the Triton tutorial's closest points (fp16).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid $OUT/win $OUT/fp16
T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_stride/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD:/tmp/fa3
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout 60 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
timeout 260 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 512,1k,2k,4k,8k,16k --out $OUT/grid --head-dims 64,128 --masks full,causal --impls jax_dash,cudnn --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
t=$(( $(left) - 10 )); [ $t -gt 150 ] && t=150
[ $t -gt 40 ] && { PYTEST_VERSION=1 timeout $t python3 benchmarks/bench_attention.py --dtype float16 --triton-tutorial .peer_src/triton_06_fused_attention_5c846f015.py --impls jax_dash,cudnn,triton_tutorial --schedules auto --iters 10 --no-plots --item-timeout 60 --seqs 512,1k,2k --out $OUT/fp16 --head-dims 64 --masks causal,full > $L/fp16.txt 2>&1; echo "fp16 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt; }
tar czf $OUT/c4.tgz -C $OUT logs grid win fp16
cat $L/gpu.txt $L/summary.txt; grep -h "TFLOP" $L/win_*.txt | grep -v packed | head -12
grep -A12 "^## Backward TFLOP" $OUT/grid/results.md | tail -9; grep -A12 "^## Forward TFLOP" $OUT/grid/results.md | tail -9
grep -A8 "^## Backward TFLOP" $OUT/fp16/results.md | tail -5
