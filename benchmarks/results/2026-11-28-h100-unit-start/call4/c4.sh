#!/bin/bash
# Thirtieth session call 4: the branch's wheel (.prebuilt_kvf3, b86afa9): issue 32's head_dim-64
# grid against cuDNN (bf16, full and causal, 512-8k) and the Triton tutorial's backward (fp16,
# head_dim 64, 512-2k); first one A/B round of the drivers
# against main's kernels (.drv_vec: the driver of .prebuilt_vec). The window kernels are unchanged.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid64 $OUT/fp16
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
M=.drv_vec/jax_dash_sm90_check; B=.prebuilt_kvf3/jax_dash_sm90_check; chmod +x $M $B
mkdir -p $L/tr
for spec in "32 512 32 32 64 0 shift" "32 512 32 32 64 1 mirror" "8 2048 32 32 64 0 shift" \
            "8 2048 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift"; do
  for v in main branch; do
    D=$M; [ $v = branch ] && D=$B
    f=$L/tr/$(echo $spec | tr ' ' _)_$v.txt
    timeout 30 $D bench $spec 20 > $f 2>&1
    grep "^bench" $f | sed "s/^/r1 $v /" >> $L/ab.txt
  done
done
echo "ab done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_kvf3/*.whl > $L/pip.txt 2>&1
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD
PYTEST_VERSION=1 timeout 130 python3 benchmarks/bench_attention.py --dtype float16 --triton-tutorial .peer_src/triton_06_fused_attention_5c846f015.py --impls jax_dash,cudnn,triton_tutorial --schedules auto --iters 10 --no-plots --item-timeout 60 --seqs 512,1k,2k --out $OUT/fp16 --head-dims 64 --masks causal,full > $L/fp16.txt 2>&1; echo "fp16 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 160 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 512,1k,2k,4k,8k --out $OUT/grid64 --head-dims 64 --masks full,causal --impls jax_dash,cudnn --no-plots > $L/grid64.txt 2>&1; echo "grid64 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT logs grid64 fp16
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/Hkv=[0-9]+ //; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (........).*/ \1/' $L/ab.txt
for d in fp16 grid64; do echo "== $d"; grep -A12 "^## Backward TFLOP" $OUT/$d/results.md | tail -11; done
grep -A12 "^## Forward TFLOP" $OUT/grid64/results.md | tail -11
