#!/bin/bash
# Twenty-sixth session call 1: fwd-first-rescale (057d440, .prebuilt_fr: the rescale of a still-zero
# O before a tile's first P V skipped) against main (8369a04, .prebuilt_main): driver forward A/B
# (rounds interleaved), the branch's driver checks, its wheel's digests against the reference, every
# GPU test on its wheel; time left: memcheck, a third round.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in main fr; do chmod +x .prebuilt_$v/jax_dash_sm90_check; done
check() {  # check VARIANT MODE
  local a=""; [ $2 != default ] && a=$2
  timeout 100 .prebuilt_$1/jax_dash_sm90_check $a > $L/drv_$1_$2.txt 2>&1
  echo "drv $1 $2 rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$1_$2.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
}
bench_round() {
  for spec in "8 2048 16 16 128 1 descending 20" "4 4096 16 16 128 1 descending 20" \
              "8 2048 16 16 128 0 shift 20" "1 16384 16 16 128 1 descending 5" \
              "32 512 32 32 64 1 descending 20" "16 1024 32 32 64 1 descending 20" \
              "8 2048 32 32 64 1 descending 20" "4 4096 32 32 64 0 shift 10"; do
    for v in main fr; do
      timeout 30 .prebuilt_$v/jax_dash_sm90_check bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$v r$1 /" >> $L/bench.txt
    done
  done
  echo "bench round $1 done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
}
check fr default
bench_round 1
bench_round 2
for m in masks dropout variants; do check fr $m; done
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_fr/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site_none:$PWD
timeout 70 python3 maintainers/scripts/bits_digest.py --out $L/digest_fr.json > $L/digest.txt 2>&1; echo "digest rc=$?" >> $L/summary.txt
python3 maintainers/scripts/bits_digest.py --compare calls/digest_ref.json $L/digest_fr.json >> $L/summary.txt 2>&1
t=$(( $(left) - 45 )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
[ $(left) -gt 40 ] && { timeout 35 compute-sanitizer --tool memcheck .prebuilt_fr/jax_dash_sm90_check > $L/memcheck_fr.txt 2>&1; echo "memcheck fr default rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_fr.txt | tail -1)" >> $L/summary.txt; }
tar czf $OUT/c1.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bwd [0-9.]+ ms//; s/, bits (....).*/ \1/' $L/bench.txt
