#!/bin/bash
# Thirty-second session call 4: the new GPU test of the forward's workspace check, and the forward
# kernels' bits test either side of the cut, on main's final build (.prebuilt_final).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_final/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site_none:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 -rfEs tests/test_gpu.py -k "workspace or same_bits" > $L/pytest.txt 2>&1; echo "pytest rc=$?" >> $L/summary.txt
tail -3 $L/pytest.txt >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
