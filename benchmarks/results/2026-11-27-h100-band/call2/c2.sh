#!/bin/bash
# Twenty-fourth session call 2: main's new kernels (5d04244 = .prebuilt_wcand/.prebuilt_dcand):
# driver checks, sanitizers, digests against the reference (main 7477063's bits), every GPU test.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_dcand/jax_dash_sm90_check; chmod +x $D
for mode in default masks dropout variants; do
  a=""; [ $mode != default ] && a=$mode
  timeout 120 $D $a > $L/drv_$mode.txt 2>&1; echo "drv $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$mode.txt | tail -1)" >> $L/summary.txt
done
for tool in memcheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool $D masks > $L/${tool}_masks.txt 2>&1; echo "$tool masks rc=$? $(grep -E 'ERROR SUMMARY' $L/${tool}_masks.txt | tail -1)" >> $L/summary.txt
done
timeout 100 compute-sanitizer --tool synccheck $D > $L/synccheck_default.txt 2>&1; echo "synccheck default rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_default.txt | tail -1)" >> $L/summary.txt
mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_wcand/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD
timeout 120 python3 maintainers/scripts/bits_digest.py --out $L/digest_cand.json > $L/digest.txt 2>&1; echo "digest rc=$?" >> $L/summary.txt
python3 maintainers/scripts/bits_digest.py --compare calls/digest_ref.json $L/digest_cand.json >> $L/summary.txt 2>&1
t=$(left); [ $t -gt 330 ] && t=330
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? (limit $t s)" >> $L/summary.txt
tail -3 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c2.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
