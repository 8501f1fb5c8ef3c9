#!/bin/bash
# Twenty-seventh session call 4: branch mirror-schedule (.prebuilt_mirror2's wheel): its digests
# against the reference (expected different: the auto cases with a window or causal segment
# ids), every GPU test.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_mirror2/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site_none:$PWD
timeout 70 python3 maintainers/scripts/bits_digest.py --out $L/digest_mirror2.json > $L/digest.txt 2>&1; echo "digest rc=$?" >> $L/summary.txt
python3 maintainers/scripts/bits_digest.py --compare calls/digest_ref.json $L/digest_mirror2.json >> $L/summary.txt 2>&1
t=$(( $(left) - 10 )); [ $t -gt 400 ] && t=400; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -3 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
