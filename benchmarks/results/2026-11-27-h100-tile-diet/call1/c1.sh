#!/bin/bash
# Twenty-fifth session call 1: fwd-tile-diet (d878a88, .prebuilt_diet) and bwd-dkv-stsm (947bd95,
# .prebuilt_dstsm, driver only) against main (1162421, the persistent cut at 8192 re-applied:
# .prebuilt_dcut2): driver A/B (rounds interleaved): forward cut/diet, backward cut/dstsm; driver
# checks and memcheck of both; diet's wheel digests against the reference.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in dcut2 diet dstsm; do chmod +x .prebuilt_$v/jax_dash_sm90_check; done
check() {  # check VARIANT MODE
  local a=""; [ $2 != default ] && a=$2
  timeout 100 .prebuilt_$1/jax_dash_sm90_check $a > $L/drv_$1_$2.txt 2>&1
  echo "drv $1 $2 rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$1_$2.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
}
bench_round() {
  for spec in "8 2048 16 16 128 1 descending 20" "4 4096 16 16 128 1 descending 20" \
              "2 8192 16 16 128 1 descending 10" "1 16384 16 16 128 1 descending 5" \
              "8 2048 16 16 128 0 shift 20" "4 4096 16 16 128 0 shift 10" \
              "32 512 32 32 64 1 descending 20" "16 1024 32 32 64 1 descending 20" \
              "8 2048 32 32 64 1 descending 20" "2 8192 32 32 64 1 descending 10" \
              "1 16384 16 16 128 1 descending 5 4096" "8 2048 8 8 256 1 descending 10"; do
    for v in dcut2 diet dstsm; do
      timeout 60 .prebuilt_$v/jax_dash_sm90_check bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$v r$1 /" >> $L/bench.txt
    done
  done
  echo "bench round $1 done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
}
check diet default; check dstsm default
bench_round 1
bench_round 2
for v in diet dstsm; do for m in masks dropout variants; do [ $(left) -gt 120 ] && check $v $m; done; done
for v in diet dstsm; do
  [ $(left) -lt 100 ] && break
  timeout 90 compute-sanitizer --tool memcheck .prebuilt_$v/jax_dash_sm90_check > $L/memcheck_$v.txt 2>&1; echo "memcheck $v default rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_$v.txt | tail -1)" >> $L/summary.txt
done
if [ $(left) -gt 90 ]; then
  mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .prebuilt_diet/*.whl > $L/pip.txt 2>&1
  rm -rf /tmp/site/jax_dash
  PYTHONPATH=/tmp/site:$PWD timeout 90 python3 maintainers/scripts/bits_digest.py --out $L/digest_diet.json > $L/digest.txt 2>&1; echo "digest rc=$?" >> $L/summary.txt
  PYTHONPATH=/tmp/site:$PWD python3 maintainers/scripts/bits_digest.py --compare calls/digest_ref.json $L/digest_diet.json >> $L/summary.txt 2>&1
fi
[ $(left) -gt 150 ] && bench_round 3
tar czf $OUT/c1.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/bench.txt
