#!/bin/bash
# Thirty-first session call 3: (1) is the unit-start change slower under bench_attention's sustained
# load at hd128 causal 8k-16k? main's kernels before it (.prebuilt_vec, ef1359e's C++) and after
# (.prebuilt_kvf4, main's current C++), bench_attention with cuDNN as the anchor, two rounds each,
# interleaved; (2) the rest of issue 32's grid against cuDNN on the current kernels (bf16, hd64 and
# hd128, full and causal, 512-16k); (3) the Triton tutorial (fp16, hd64, 512-2k).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab $OUT/grid $OUT/fp16
T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD
for r in 1 2; do for v in vec kvf4; do
  python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_$v/*.whl > $L/pip_$v.txt 2>&1
  timeout 80 python3 benchmarks/bench_attention.py --schedules auto --iters 20 --item-timeout 40 --seqs 8k,16k --out $OUT/ab/r${r}_$v --head-dims 128 --masks causal --impls jax_dash,cudnn --no-plots > $L/ab_r${r}_$v.txt 2>&1
  echo "ab r$r $v rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
  grep -E "time hd=128" $L/ab_r${r}_$v.txt | sed "s/^/r$r $v /" >> $L/ab.txt
done; done
timeout 200 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 512,1k,2k,4k,8k,16k --out $OUT/grid --head-dims 64,128 --masks full,causal --impls jax_dash,cudnn --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
t=$(( $(left) - 10 )); [ $t -gt 150 ] && t=150
[ $t -gt 40 ] && { PYTEST_VERSION=1 timeout $t python3 benchmarks/bench_attention.py --dtype float16 --triton-tutorial .peer_src/triton_06_fused_attention_5c846f015.py --impls jax_dash,cudnn,triton_tutorial --schedules auto --iters 10 --no-plots --item-timeout 60 --seqs 512,1k,2k --out $OUT/fp16 --head-dims 64 --masks causal,full > $L/fp16.txt 2>&1; echo "fp16 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt; }
tar czf $OUT/c3.tgz -C $OUT logs ab grid fp16
cat $L/gpu.txt $L/summary.txt; sed -E 's/B=[0-9]+ H=16 //; s/, bitwise.*//' $L/ab.txt
grep -A26 "^## Backward TFLOP" $OUT/grid/results.md | tail -25; grep -A26 "^## Forward TFLOP" $OUT/grid/results.md | tail -25
grep -A8 "^## Backward TFLOP" $OUT/fp16/results.md | tail -7
