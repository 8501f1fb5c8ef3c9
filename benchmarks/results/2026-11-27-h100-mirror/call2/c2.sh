#!/bin/bash
# Twenty-seventh session call 2: branch mirror-schedule (.prebuilt_mirror, the same build as call
# 1): the packed point (segment ids, causal, 16k tokens) under descending, mirror and atomic
# (bench_masks --packed-schedules; documents of mean 2k and 8k, hd128 and hd64), then every GPU
# test on the wheel (mirror added to the deterministic schedules' lists).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/packed
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_mirror/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site_none:$PWD
for hd in 128 64; do for doc in 2048 8192; do
  timeout 70 python3 benchmarks/bench_masks.py --head-dim $hd --doc-mean $doc --impls jax_dash --packed-schedules descending,mirror,atomic --out $OUT/packed/hd${hd}_doc${doc}.json > $L/packed_hd${hd}_doc${doc}.txt 2>&1
  echo "packed hd$hd doc$doc rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
t=$(( $(left) - 10 )); [ $t -gt 330 ] && t=330; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -3 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c2.tgz -C $OUT logs packed
cat $L/gpu.txt $L/summary.txt; grep -h "packed\|window" $L/packed_*.txt | grep TFLOP
