#!/bin/bash
# Thirty-third session call 4 (H200): main's final kernels (.prebuilt_final). The driver's per-role
# trace at hd128 causal 2k-16k (auto's symmetric_shift); a third hd128 causal FA3 grid; hd64 full
# against cuDNN at 2k / 16k; the Triton tutorial's backward (fp16, hd64, 512-2k).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid_fa3 $OUT/hd64 $OUT/fp16
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
B=.prebuilt_final/jax_dash_sm90_check; chmod +x $B
for s in "8 2048" "4 4096" "2 8192" "1 16384"; do
  timeout 60 $B bench $s 16 16 128 1 symmetric_shift 20 > "$L/trace_$(echo $s | tr ' ' x).txt" 2>&1
  echo "trace $s rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_final/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD:/tmp/fa3
timeout 100 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid_fa3 --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid_fa3.txt 2>&1; echo "grid fa3 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 60 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 2k,16k --out $OUT/hd64 --head-dims 64 --masks full --impls jax_dash,cudnn --no-plots > $L/hd64.txt 2>&1; echo "hd64 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
t=$(( $(left) - 10 )); [ $t -gt 150 ] && t=150
[ $t -gt 40 ] && { PYTEST_VERSION=1 timeout $t python3 benchmarks/bench_attention.py --dtype float16 --triton-tutorial .peer_src/triton_06_fused_attention_5c846f015.py --impls jax_dash,cudnn,triton_tutorial --schedules auto --iters 10 --no-plots --item-timeout 60 --seqs 512,1k,2k --out $OUT/fp16 --head-dims 64 --masks causal,full > $L/fp16.txt 2>&1; echo "fp16 rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt; }
tar czf $OUT/c4.tgz -C $OUT logs grid_fa3 hd64 fp16
cat $L/gpu.txt $L/summary.txt
for f in $L/trace_*.txt; do grep -E "^bench|wait|unit start|math  " $f | head -14; done
grep -A8 "^## Backward TFLOP" $OUT/grid_fa3/results.md | head -10; grep -A8 "^## Forward TFLOP" $OUT/grid_fa3/results.md | head -10
grep -A5 "^## Backward TFLOP" $OUT/hd64/results.md | tail -3
grep -A8 "^## Backward TFLOP" $OUT/fp16/results.md | tail -7
