#!/bin/bash
# Twenty-eighth session call 5: main with auto's new causal rule (Python only; kernels as
# .prebuilt_mirror2): every GPU test; bench_attention fp16 hd64 causal 512-2k with the Triton
# tutorial (PYTEST_VERSION=1: its forward's one test config) and bf16 hd128 causal 512-2k.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/fp16 $OUT/bf16
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_mirror2/*.whl > $L/pip.txt 2>&1
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD
OUT=$L timeout 330 bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -3 $L/gpu_tests_summary.txt >> $L/summary.txt
PYTEST_VERSION=1 timeout 120 python3 benchmarks/bench_attention.py --dtype float16 --triton-tutorial .peer_src/triton_06_fused_attention_5c846f015.py --impls jax_dash,cudnn,triton_tutorial --schedules auto --iters 10 --no-plots --item-timeout 100 --seqs 512,1k,2k --out $OUT/fp16 --head-dims 64 --masks causal > $L/fp16.txt 2>&1; echo "fp16 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 60 python3 benchmarks/bench_attention.py --impls jax_dash,cudnn --schedules auto --iters 10 --no-plots --seqs 512,1k,2k --out $OUT/bf16 --head-dims 128 --masks causal > $L/bf16.txt 2>&1; echo "bf16 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tar czf $OUT/c5.tgz -C $OUT logs fp16 bf16
cat $L/gpu.txt $L/summary.txt
grep -A8 "^## Backward TFLOP" $OUT/fp16/results.md | tail -3; grep -A8 "^## Backward TFLOP" $OUT/bf16/results.md | tail -3
