#!/bin/bash
# Twentieth session call 4: the backward at the training step's shape (1 x 32768, GQA 16/8, causal, hd128):
# every schedule (atomic = racing dQ) against cuDNN, and 16k; MHA at 32k for comparison.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/g2 $OUT/g1
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd .prebuilt_band/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/jd/jax_dash
export PYTHONPATH=$PWD:/tmp/jd
timeout 300 python3 benchmarks/bench_attention.py --head-dims 128 --masks causal --seqs 16k,32k --tokens 32768 --group 2 --impls jax_dash,cudnn --schedules auto,atomic,descending,shift,symmetric_shift --iters 10 --item-timeout 90 --out $OUT/g2 --no-plots > $L/g2.txt 2>&1; echo "g2 rc=$?" >> $L/summary.txt
timeout 200 python3 benchmarks/bench_attention.py --head-dims 128 --masks causal --seqs 32k --tokens 32768 --group 1 --impls jax_dash,cudnn --schedules auto,atomic --iters 10 --item-timeout 90 --out $OUT/g1 --no-plots > $L/g1.txt 2>&1; echo "g1 rc=$?" >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT logs g2 g1
cat $L/gpu.txt $L/summary.txt
for g in g2 g1; do echo "== $g"; grep -A40 "^## Backward TFLOP" $OUT/$g/results.md | head -30; done
