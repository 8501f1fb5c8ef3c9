#!/bin/bash
# Nineteenth session call 4 (4 GPUs): trace of the final ring at 256k P=4 (what stays exposed).
set -u
L=$OUT/c4; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpus.txt 2>&1
mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --target /tmp/site .prebuilt_band/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
timeout 200 python3 maintainers/scripts/ring_trace.py --seq 262144 --ring-size 4 --groups 4 --out $L > $L/trace.log 2>&1; echo "trace rc=$?" >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT c4
grep -v "^   " $L/summary.txt | cut -c1-160
