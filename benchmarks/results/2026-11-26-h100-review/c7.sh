#!/bin/bash
# Nineteenth session call 7 (H100): the review commits (launch wrappers inlined, driver loops shared,
# per-platform dispatch): drivers default/masks/dropout, GPU dropout and backward tests.
set -u
L=$OUT/c7; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --target /tmp/site .prebuilt_review/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
DRV=.prebuilt_review/jax_dash_sm90_check; chmod +x $DRV
for mode in "" masks dropout; do
  timeout 90 $DRV $mode > $L/drv_${mode:-default}.txt 2>&1; echo "drv ${mode:-default} rc=$?" >> $L/summary.txt; tail -1 $L/drv_${mode:-default}.txt >> $L/summary.txt
done
timeout 150 python3 -m pytest -q -x tests/test_gpu_dropout.py tests/test_gpu_bwd.py -k "schedule or repeat or auto or dropout" > $L/gpu_tests.txt 2>&1; echo "gpu tests rc=$?" >> $L/summary.txt; tail -2 $L/gpu_tests.txt >> $L/summary.txt
tar czf $OUT/c7.tgz -C $OUT c7
cat $L/summary.txt
