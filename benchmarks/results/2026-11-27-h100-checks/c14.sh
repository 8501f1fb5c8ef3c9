#!/bin/bash
# Twentieth session call 14: main's final kernels (.prebuilt_wm = 6076858's, main's CUDA unchanged since):
# every GPU test, the drivers' variants mode, memcheck and initcheck.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_wm/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
DRV=.prebuilt_wm/jax_dash_sm90_check; chmod +x $DRV
timeout 90 $DRV variants > $L/drv_variants.txt 2>&1; echo "drv variants rc=$?" >> $L/summary.txt; tail -1 $L/drv_variants.txt >> $L/summary.txt
for t in memcheck initcheck; do
  timeout 100 compute-sanitizer --tool $t --error-exitcode 9 $DRV > $L/san_$t.txt 2>&1; echo "$t rc=$?" >> $L/summary.txt; grep "ERROR SUMMARY" $L/san_$t.txt | tail -1 >> $L/summary.txt
done
OUT=$L timeout 300 bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$?" >> $L/summary.txt
tail -3 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c14.tgz -C $OUT logs
cat $L/summary.txt
