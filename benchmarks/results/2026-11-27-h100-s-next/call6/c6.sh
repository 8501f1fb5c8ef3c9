#!/bin/bash
# Twenty-third session call 6: bwd-last-s (.prebuilt_last: a unit's last step issues a one-wgmma stub S^T) against
# main 290cd8a (driver .prebuilt_dnext, same kernels as 5067474): checks, digest, driver A/B (three rounds).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_last .prebuilt_last/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/jd_last/jax_dash; chmod +x .prebuilt_*/jax_dash_sm90_check
for mode in default masks; do
  a=""; [ $mode != default ] && a=$mode
  timeout 150 .prebuilt_last/jax_dash_sm90_check $a > $L/drv_last_$mode.txt 2>&1; echo "drv last $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_last_$mode.txt | tail -1)" >> $L/summary.txt
done
PYTHONPATH=$PWD:/tmp/jd_last timeout 150 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_last.json > $L/digest_last.txt 2>&1; echo "digest last rc=$?" >> $L/summary.txt
PYTHONPATH=$PWD:/tmp/jd_last python3 maintainers/scripts/bits_digest.py --compare calls/digest_final.json $OUT/ab/digest_last.json >> $L/summary.txt 2>&1
for r in 1 2 3; do
  for spec in "8 2048 16 16 128 1 symmetric_shift" "4 4096 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift" \
              "8 2048 16 16 128 0 shift" "4 4096 16 16 128 0 shift" "8 2048 32 32 64 1 symmetric_shift" "2 8192 32 32 64 1 symmetric_shift"; do
    set -- $spec
    args="$1 $2 $3 $4 $5 $6 $7 5"
    for v in dnext last; do
      timeout 60 .prebuilt_$v/jax_dash_sm90_check bench $args > $L/b_${v}_r${r}_${args// /_}.txt 2>&1
      grep "^bench" $L/b_${v}_r${r}_${args// /_}.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
tar czf $OUT/c6.tgz -C $OUT logs ab
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/fwd [0-9.]+ ms \([0-9]+ TFLOP\/s\), //' $L/bench.txt | cut -c1-120
