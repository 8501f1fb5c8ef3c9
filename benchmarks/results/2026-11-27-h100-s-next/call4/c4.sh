#!/bin/bash
# Twenty-third session call 4: bwd-s-next's kernels (.prebuilt_next): driver variants, memcheck, every GPU test.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_next/jax_dash_sm90_check; chmod +x $D
timeout 120 $D variants > $L/drv_variants.txt 2>&1; echo "drv variants rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_variants.txt | tail -1)" >> $L/summary.txt
timeout 150 compute-sanitizer --tool memcheck $D > $L/memcheck.txt 2>&1; echo "memcheck default rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.txt | tail -1)" >> $L/summary.txt
mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_next/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
OUT=$L timeout 280 bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$?" >> $L/summary.txt
tail -3 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
