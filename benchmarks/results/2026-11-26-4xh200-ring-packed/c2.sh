#!/bin/bash
# Nineteenth session call 2 (4 GPUs): issue 35's table on the packed-K/V ring, the GPU ring tests,
# the dK/dV packing A/B.
set -u
L=$OUT/c2; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpus.txt 2>&1
mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --target /tmp/site .prebuilt_band/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 330 python3 benchmarks/bench_ring.py --ring-sizes 2,4 --seqs 131072,262144 --repeats 3 --timed 5 --out $L/mha.json > $L/mha.log 2>&1; echo "mha rc=$?" >> $L/rc.txt
timeout 110 python3 benchmarks/bench_ring.py --pack-sums --ring-sizes 2,4 --seqs 262144 --layouts zigzag --check-seq 0 --repeats 2 --timed 5 --out $L/packsums.json > $L/packsums.log 2>&1; echo "packsums rc=$?" >> $L/rc.txt
timeout 100 python3 -m pytest -q tests/test_gpu_ring.py > $L/gpu_ring_tests.log 2>&1; echo "gpu ring tests rc=$?" >> $L/rc.txt
tar czf $OUT/c2.tgz -C $OUT c2
cat $L/rc.txt; tail -3 $L/gpu_ring_tests.log; grep -v "^part:" $L/mha.log | tail -32; grep -v "^part:" $L/packsums.log | tail -6
