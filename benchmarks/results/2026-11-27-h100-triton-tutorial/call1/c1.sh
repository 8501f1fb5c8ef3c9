#!/bin/bash
# Twenty-eighth session call 1: the Triton tutorial (fp16; triton-lang/triton's
# python/tutorials/06-fused-attention.py at 5c846f015, carried in .peer_src/) beside jax_dash auto
# and cuDNN in bench_attention, hd64 causal and full, hd128 full, 512-16k; first the bf16 lines
# against cuDNN (hd64 full/causal, hd128 full, 2k-16k). Main's kernels (.prebuilt_mirror2).
# PYTEST_VERSION=1 makes the tutorial's forward use its one test config instead of autotuning
# ~27 configs per sequence length (its backward has fixed tiles either way): its forward numbers
# here are not its tuned best.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/bf16 $OUT/fp16
T0=$(date +%s); left() { echo $(( 590 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_mirror2/*.whl > $L/pip.txt 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $L/gpu.txt 2>&1
export PYTHONPATH=$PWD JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT)
B="python3 benchmarks/bench_attention.py --schedules auto --iters 10 --no-plots --seqs 2k,4k,8k,16k --impls jax_dash,cudnn"
timeout 90 $B --head-dims 64 --masks full,causal --out $OUT/bf16 > $L/bf16_hd64.txt 2>&1; echo "bf16 hd64 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 60 $B --head-dims 128 --masks full --out $OUT/bf16 > $L/bf16_hd128.txt 2>&1; echo "bf16 hd128 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
TT="--dtype float16 --triton-tutorial .peer_src/triton_06_fused_attention_5c846f015.py --impls jax_dash,cudnn,triton_tutorial --schedules auto --iters 10 --no-plots --item-timeout 200 --seqs 512,1k,2k,4k,8k,16k --out $OUT/fp16"
export PYTEST_VERSION=1
timeout $(( $(left) - 150 )) python3 benchmarks/bench_attention.py $TT --head-dims 64 --masks causal,full > $L/fp16_hd64.txt 2>&1; echo "fp16 hd64 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout $(( $(left) - 15 )) python3 benchmarks/bench_attention.py $TT --head-dims 128 --masks full > $L/fp16_hd128.txt 2>&1; echo "fp16 hd128 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tar czf $OUT/c1.tgz -C $OUT logs bf16 fp16
cat $L/gpu.txt $L/summary.txt
grep -h "triton_tutorial" $L/fp16_*.txt | cut -c1-230 | head -20
for d in bf16 fp16; do grep -A14 "^## Backward TFLOP" $OUT/$d/results.md | head -16; done
