#!/bin/bash
# Twenty-third session call 1: bwd-s-next (.prebuilt_next) against main (.prebuilt_final): checks, digests,
# driver A/B (two rounds), synccheck.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in final next; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v .prebuilt_$v/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash; chmod +x .prebuilt_$v/jax_dash_sm90_check
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
for mode in default masks dropout; do
  a=""; [ $mode != default ] && a=$mode
  timeout 150 .prebuilt_next/jax_dash_sm90_check $a > $L/drv_next_$mode.txt 2>&1; echo "drv next $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_next_$mode.txt | tail -1)" >> $L/summary.txt
done
for v in final next; do
  run $v timeout 150 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run next python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_final.json $OUT/ab/digest_next.json >> $L/summary.txt 2>&1
for r in 1 2; do
  for spec in "8 2048 16 16 128 1 symmetric_shift" "4 4096 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift" \
              "2 8192 16 16 128 1 atomic" "1 16384 16 16 128 1 symmetric_shift" "1 32768 16 8 128 1 symmetric_shift" \
              "4 4096 16 16 128 0 shift" "2 8192 32 32 64 1 symmetric_shift" "4 4096 32 32 64 0 shift"; do
    set -- $spec
    args="$1 $2 $3 $4 $5 $6 $7 5"
    for v in final next; do
      timeout 60 .prebuilt_$v/jax_dash_sm90_check bench $args > $L/b_${v}_r${r}_${args// /_}.txt 2>&1
      grep "^bench" $L/b_${v}_r${r}_${args// /_}.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
timeout 200 compute-sanitizer --tool synccheck .prebuilt_next/jax_dash_sm90_check > $L/synccheck_next.txt 2>&1; echo "synccheck next rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_next.txt | tail -1)" >> $L/summary.txt
tar czf $OUT/c1.tgz -C $OUT logs ab
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/fwd [0-9.]+ ms \([0-9]+ TFLOP\/s\), //' $L/bench.txt | cut -c1-120
