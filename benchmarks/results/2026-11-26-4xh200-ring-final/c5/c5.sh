#!/bin/bash
# Nineteenth session call 5 (4 GPUs): packed sums + pipelined hop home (HEAD) against 42aecca (calls/old), same machine.
set -u
L=$OUT/c5; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpus.txt 2>&1
mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --target /tmp/site .prebuilt_band/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONUNBUFFERED=1
PYTHONPATH=$PWD:/tmp/site timeout 250 python3 benchmarks/bench_ring.py --ring-sizes 4 --seqs 131072,262144 --repeats 3 --timed 5 --out $L/new.json > $L/new.log 2>&1; echo "new rc=$?" >> $L/rc.txt
PYTHONPATH=$PWD/calls/old:/tmp/site timeout 120 python3 benchmarks/bench_ring.py --ring-sizes 4 --seqs 131072,262144 --layouts zigzag --check-seq 0 --repeats 2 --timed 5 --out $L/old.json > $L/old.log 2>&1; echo "old rc=$?" >> $L/rc.txt
PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m pytest -q tests/test_gpu_ring.py > $L/gpu_ring_tests.log 2>&1; echo "gpu ring tests rc=$?" >> $L/rc.txt
tar czf $OUT/c5.tgz -C $OUT c5
cat $L/rc.txt; tail -2 $L/gpu_ring_tests.log; grep -v "^part:" $L/new.log | tail -24; grep -v "^part:" $L/old.log | tail -6
