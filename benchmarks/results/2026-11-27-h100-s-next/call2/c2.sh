#!/bin/bash
# Twenty-third session call 2: bwd-s-next2 (.prebuilt_n2: S^T issued before the dQ-empty wait) against
# bwd-s-next (driver .prebuilt_dnext) and main (driver .prebuilt_dfinal): checks, digest, driver A/B (two rounds),
# ncu cycles at hd128 full 4 x 4k.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab /tmp/n
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_n2 .prebuilt_n2/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/jd_n2/jax_dash; chmod +x .prebuilt_*/jax_dash_sm90_check
for mode in default masks; do
  a=""; [ $mode != default ] && a=$mode
  timeout 150 .prebuilt_n2/jax_dash_sm90_check $a > $L/drv_n2_$mode.txt 2>&1; echo "drv n2 $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_n2_$mode.txt | tail -1)" >> $L/summary.txt
done
PYTHONPATH=$PWD:/tmp/jd_n2 timeout 150 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_n2.json > $L/digest_n2.txt 2>&1; echo "digest n2 rc=$?" >> $L/summary.txt
PYTHONPATH=$PWD:/tmp/jd_n2 python3 maintainers/scripts/bits_digest.py --compare calls/digest_final.json $OUT/ab/digest_n2.json >> $L/summary.txt 2>&1
for r in 1 2; do
  for spec in "8 2048 16 16 128 1 symmetric_shift" "4 4096 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift" \
              "1 16384 16 16 128 1 symmetric_shift" "4 4096 16 16 128 0 shift" "2 8192 16 16 128 0 shift" "1 16384 16 16 128 0 shift" \
              "8 2048 16 16 128 0 shift" "2 8192 32 32 64 1 symmetric_shift" "4 4096 32 32 64 0 shift"; do
    set -- $spec
    args="$1 $2 $3 $4 $5 $6 $7 5"
    for v in dfinal dnext n2; do
      timeout 60 .prebuilt_$v/jax_dash_sm90_check bench $args > $L/b_${v}_r${r}_${args// /_}.txt 2>&1
      grep "^bench" $L/b_${v}_r${r}_${args// /_}.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
for v in dfinal dnext n2; do
  timeout 100 ncu --set full --import-source no -k "regex:bwd_main_ws" --launch-skip 1 -c 1 -f -o /tmp/n/$v .prebuilt_$v/jax_dash_sm90_check bench 4 4096 16 16 128 0 shift 2 > $L/ncu_$v.log 2>&1
  echo "ncu $v rc=$?" >> $L/summary.txt
  ncu -i /tmp/n/$v.ncu-rep --page details > $L/${v}_details.txt 2>&1
  ncu -i /tmp/n/$v.ncu-rep --page source --csv --print-source sass > $L/${v}_sass.csv 2>&1
done
tar czf $OUT/c2.tgz -C $OUT logs ab
cat $L/gpu.txt $L/summary.txt
for v in dfinal dnext n2; do echo "== $v"; grep -E "^\s+(Elapsed Cycles|Executed Ipc Active|Executed Instructions ) " $L/${v}_details.txt; done
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/fwd [0-9.]+ ms \([0-9]+ TFLOP\/s\), //' $L/bench.txt | cut -c1-120
