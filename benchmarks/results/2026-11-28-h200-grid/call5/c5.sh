#!/bin/bash
# Thirty-third session call 5 (H200): the launch's for_each_main_kernel (.prebuilt_s33, device code
# identical to main's): drivers default and masks, the bench's bits at hd128 causal 2k / 8k (the
# untraced twin timed, the traced kernel for the trace), every GPU test on its wheel; the bf16 grid's
# short points (512, 1k) against cuDNN.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/short
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
B=.prebuilt_s33/jax_dash_sm90_check; chmod +x $B
for m in default masks; do
  a=""; [ $m != default ] && a=$m
  timeout 90 $B $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
for s in "8 2048" "2 8192"; do
  timeout 60 $B bench $s 16 16 128 1 symmetric_shift 20 > "$L/bench_$(echo $s | tr ' ' x).txt" 2>&1
  echo "bench $s rc=$? $(grep -o 'bits [0-9a-f]*' "$L/bench_$(echo $s | tr ' ' x).txt") t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_s33/*.whl > $L/pip.txt 2>&1
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=/tmp/site_none:$PWD
timeout 90 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 512,1k --out $OUT/short --head-dims 64,128 --masks full,causal --impls jax_dash,cudnn --no-plots > $L/short.txt 2>&1; echo "short rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
t=$(( $(left) - 10 )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c5.tgz -C $OUT logs short
cat $L/gpu.txt $L/summary.txt
grep -A10 "^## Backward TFLOP" $OUT/short/results.md | tail -9; grep -A10 "^## Forward TFLOP" $OUT/short/results.md | tail -9
