#!/bin/bash
# Nineteenth session call 1 (4 GPUs): ring traces at 256k P=4 (issue 35).
set -u
L=$OUT/c1; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpus.txt 2>&1
mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --target /tmp/site .prebuilt_band/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 300 python3 maintainers/scripts/ring_trace.py --seq 262144 --ring-size 4 --groups 1,4 --out $L > $L/trace_a.log 2>&1; echo "a rc=$?" >> $L/rc.txt
timeout 150 python3 maintainers/scripts/ring_trace.py --seq 262144 --ring-size 4 --groups 4 --no-accumulate --out $L > $L/trace_b.log 2>&1; echo "b rc=$?" >> $L/rc.txt
tar czf $OUT/c1.tgz -C $OUT c1
cat $L/rc.txt; grep -v "^   " $L/summary.txt | cut -c1-200
