#!/bin/bash
# Twenty-seventh session call 5: the GPU mask tests again (.prebuilt_mirror2's wheel) after the fix
# of test_dropped_hidden_pairs_keep_the_band_order's last assertion (call 4: at head_dim 128
# mirror's and descending's dQ rounded to the same bf16 there; dK/dV differ).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_mirror2/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site_none:$PWD
OUT=$L timeout 300 bash scripts/gpu_tests.sh 8 -k "masks" > $L/gpu_tests_summary.txt 2>&1; echo "gpu mask tests rc=$?" >> $L/summary.txt
tail -3 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c5.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
