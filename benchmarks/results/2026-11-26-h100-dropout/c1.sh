#!/bin/bash
# Eighteenth session call 1: the Hopper backward's dropout, correctness.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/site
rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_do/*.whl >> $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
DRV=$(ls .prebuilt_do/jax_dash_sm90_check* | head -1); chmod +x $DRV
timeout 150 $DRV dropout > $L/drv_dropout.txt 2>&1; echo "drv dropout rc=$?" >> $L/summary.txt
tail -1 $L/drv_dropout.txt >> $L/summary.txt
timeout 60 $DRV > $L/drv_default.txt 2>&1; echo "drv default rc=$?" >> $L/summary.txt
timeout 60 $DRV masks > $L/drv_masks.txt 2>&1; echo "drv masks rc=$?" >> $L/summary.txt
timeout 210 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_dropout.py -m gpu > $L/pytest_dropout.txt 2>&1; echo "pytest dropout rc=$?" >> $L/summary.txt
tail -3 $L/pytest_dropout.txt >> $L/summary.txt
for tool in memcheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $DRV dropout > $L/san_$tool.txt 2>&1; echo "sanitizer $tool rc=$?" >> $L/summary.txt
  grep -E "ERROR SUMMARY|dropout cases failed" $L/san_$tool.txt | tail -2 >> $L/summary.txt
done
tar czf $OUT/c1.tgz -C $OUT logs
cat $L/summary.txt
