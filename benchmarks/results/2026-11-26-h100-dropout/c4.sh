#!/bin/bash
# Eighteenth session call 4: the unmasked dropout instantiation: driver, sanitizers, GPU tests, grid.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_do2/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
DRV=$(ls .prebuilt_do2/jax_dash_sm90_check* | head -1); chmod +x $DRV
timeout 100 $DRV dropout > $L/drv_dropout.txt 2>&1; echo "drv dropout rc=$?" >> $L/summary.txt
tail -1 $L/drv_dropout.txt >> $L/summary.txt
for tool in memcheck synccheck initcheck; do
  timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 $DRV dropout > $L/san_$tool.txt 2>&1; echo "sanitizer $tool rc=$?" >> $L/summary.txt
  grep -E "ERROR SUMMARY" $L/san_$tool.txt | tail -1 >> $L/summary.txt
done
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_dropout.py -m gpu > $L/pytest_dropout.txt 2>&1; echo "pytest dropout rc=$?" >> $L/summary.txt
tail -1 $L/pytest_dropout.txt >> $L/summary.txt
timeout 200 python3 benchmarks/bench_dropout.py --out $OUT/dropout --budget 1.0 --iters 8 > $L/bench.txt 2>&1; echo "bench rc=$?" >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT logs dropout
cat $L/summary.txt; cat $OUT/dropout/dropout.md 2>/dev/null || grep -v "^    @" $L/bench.txt | tail -20
