#!/bin/bash
# Twentieth session call 7: every GPU test and the variants driver on bwd-two-writers.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_tw/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
DRV=.prebuilt_tw/jax_dash_sm90_check; chmod +x $DRV
for mode in variants; do
  timeout 90 $DRV $mode > $L/drv_${mode:-default}.txt 2>&1; echo "drv ${mode:-default} rc=$?" >> $L/summary.txt; tail -1 $L/drv_${mode:-default}.txt >> $L/summary.txt
done
OUT=$L timeout 330 bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$?" >> $L/summary.txt
tail -3 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c7.tgz -C $OUT logs
cat $L/summary.txt
