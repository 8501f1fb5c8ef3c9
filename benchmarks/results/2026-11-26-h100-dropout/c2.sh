#!/bin/bash
# Eighteenth session call 2: the cost of dropout (bench_dropout.py), H100.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/site
rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_do/*.whl >> $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_dropout.py -m gpu > $L/pytest_dropout.txt 2>&1; echo "pytest dropout rc=$?" >> $L/summary.txt
tail -2 $L/pytest_dropout.txt >> $L/summary.txt
timeout 400 python3 benchmarks/bench_dropout.py --out $OUT/dropout --budget 1.0 --iters 8 > $L/bench.txt 2>&1; echo "bench rc=$?" >> $L/summary.txt
tar czf $OUT/c2.tgz -C $OUT logs dropout
cat $L/summary.txt; cat $OUT/dropout/dropout.md 2>/dev/null || tail -20 $L/bench.txt
