#!/bin/bash
# Nineteenth session call 3 (4 GPUs): issue 35's table on the final ring (backward packs K/V over > 2 devices).
set -u
L=$OUT/c3; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpus.txt 2>&1
mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --target /tmp/site .prebuilt_band/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 330 python3 benchmarks/bench_ring.py --ring-sizes 2,4 --seqs 131072,262144 --repeats 3 --timed 5 --out $L/mha.json > $L/mha.log 2>&1; echo "mha rc=$?" >> $L/rc.txt
timeout 100 python3 -m pytest -q tests/test_gpu_ring.py > $L/gpu_ring_tests.log 2>&1; echo "gpu ring tests rc=$?" >> $L/rc.txt
timeout 130 python3 benchmarks/bench_ring.py --kv-heads 8 --ring-sizes 2,4 --seqs 262144 --layouts zigzag --check-seq 0 --repeats 2 --timed 5 --out $L/gqa.json > $L/gqa.log 2>&1; echo "gqa rc=$?" >> $L/rc.txt
tar czf $OUT/c3.tgz -C $OUT c3
cat $L/rc.txt; tail -2 $L/gpu_ring_tests.log; grep -v "^part:" $L/mha.log | tail -14; grep -v "^part:" $L/gqa.log | tail -4
