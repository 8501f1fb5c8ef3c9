#!/bin/bash
# Nineteenth session call 6 (4 GPUs): P = 2 rows (MHA) and GQA rows on bb91497.
set -u
L=$OUT/c6; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpus.txt 2>&1
mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --target /tmp/site .prebuilt_band/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 180 python3 benchmarks/bench_ring.py --ring-sizes 2 --seqs 131072,262144 --check-seq 0 --repeats 2 --timed 5 --out $L/mha_p2.json > $L/mha_p2.log 2>&1; echo "mha p2 rc=$?" >> $L/rc.txt
timeout 130 python3 benchmarks/bench_ring.py --kv-heads 8 --ring-sizes 2,4 --seqs 262144 --layouts zigzag --check-seq 0 --repeats 2 --timed 5 --out $L/gqa.json > $L/gqa.log 2>&1; echo "gqa rc=$?" >> $L/rc.txt
tar czf $OUT/c6.tgz -C $OUT c6
cat $L/rc.txt; grep -v "^part:" $L/mha_p2.log | tail -8; grep -v "^part:" $L/gqa.log | tail -4
