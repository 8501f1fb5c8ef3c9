#!/bin/bash
# Twenty-third session call 5: bwd-do-full (.prebuilt_do: Q and dO on separate stage barriers) against main
# 5067474 (driver .prebuilt_dnext): checks, digest, driver A/B (two rounds), ncu at hd128 full 4 x 4k.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab /tmp/n
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_do .prebuilt_do/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/jd_do/jax_dash; chmod +x .prebuilt_*/jax_dash_sm90_check
for mode in default masks dropout; do
  a=""; [ $mode != default ] && a=$mode
  timeout 150 .prebuilt_do/jax_dash_sm90_check $a > $L/drv_do_$mode.txt 2>&1; echo "drv do $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_do_$mode.txt | tail -1)" >> $L/summary.txt
done
PYTHONPATH=$PWD:/tmp/jd_do timeout 150 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_do.json > $L/digest_do.txt 2>&1; echo "digest do rc=$?" >> $L/summary.txt
PYTHONPATH=$PWD:/tmp/jd_do python3 maintainers/scripts/bits_digest.py --compare calls/digest_final.json $OUT/ab/digest_do.json >> $L/summary.txt 2>&1
for r in 1 2; do
  for spec in "8 2048 16 16 128 1 symmetric_shift" "4 4096 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift" \
              "1 16384 16 16 128 1 symmetric_shift" "8 2048 16 16 128 0 shift" "4 4096 16 16 128 0 shift" "1 16384 16 16 128 0 shift" \
              "2 8192 32 32 64 1 symmetric_shift" "4 4096 32 32 64 0 shift" "1 16384 16 16 128 1 descending 5 4096"; do
    set -- $spec
    args="$1 $2 $3 $4 $5 $6 $7 5 ${9:-}"
    for v in dnext do; do
      timeout 60 .prebuilt_$v/jax_dash_sm90_check bench $args > $L/b_${v}_r${r}_${args// /_}.txt 2>&1
      grep "^bench" $L/b_${v}_r${r}_${args// /_}.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
timeout 200 compute-sanitizer --tool synccheck .prebuilt_do/jax_dash_sm90_check > $L/synccheck_do.txt 2>&1; echo "synccheck do rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_do.txt | tail -1)" >> $L/summary.txt
for v in do; do
  timeout 100 ncu --set full --import-source no -k "regex:bwd_main_ws" --launch-skip 1 -c 1 -f -o /tmp/n/$v .prebuilt_$v/jax_dash_sm90_check bench 4 4096 16 16 128 0 shift 2 > $L/ncu_$v.log 2>&1
  echo "ncu $v rc=$?" >> $L/summary.txt
  ncu -i /tmp/n/$v.ncu-rep --page details > $L/${v}_details.txt 2>&1
  ncu -i /tmp/n/$v.ncu-rep --page source --csv --print-source sass > $L/${v}_sass.csv 2>&1
done
tar czf $OUT/c5.tgz -C $OUT logs ab
cat $L/gpu.txt $L/summary.txt
grep -E "^\s+(Elapsed Cycles|Executed Ipc Active) " $L/do_details.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/fwd [0-9.]+ ms \([0-9]+ TFLOP\/s\), //' $L/bench.txt | cut -c1-120
