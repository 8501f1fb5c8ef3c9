#!/bin/bash
# Twenty-second session call 4: bwd-lse-first (.prebuilt_lse) against main (.prebuilt_main2): checks, digests,
# driver A/B, ncu of both at hd128 causal 2 x 8k.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab /tmp/n
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in main2 lse; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v .prebuilt_$v/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash; chmod +x .prebuilt_$v/jax_dash_sm90_check
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
for mode in default masks dropout; do
  a=""; [ $mode != default ] && a=$mode
  timeout 150 .prebuilt_lse/jax_dash_sm90_check $a > $L/drv_lse_$mode.txt 2>&1; echo "drv lse $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_lse_$mode.txt | tail -1)" >> $L/summary.txt
done
for v in main2 lse; do
  run $v timeout 150 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run lse python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_main2.json $OUT/ab/digest_lse.json >> $L/summary.txt 2>&1
for r in 1 2; do
  for spec in "8 2048 16 16 128 1 symmetric_shift" "4 4096 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift" \
              "2 8192 16 16 128 1 atomic" "1 16384 16 16 128 1 symmetric_shift" "1 32768 16 8 128 1 symmetric_shift" \
              "4 4096 16 16 128 0 shift" "1 16384 16 16 128 0 shift" "2 8192 8 8 256 1 symmetric_shift" "2 8192 32 32 64 1 symmetric_shift" \
              "1 16384 16 16 128 1 descending 5 4096" "1 16384 16 16 128 1 atomic 5 4096"; do
    set -- $spec
    args="$1 $2 $3 $4 $5 $6 $7 5 ${9:-}"
    for v in main2 lse; do
      timeout 60 .prebuilt_$v/jax_dash_sm90_check bench $args > $L/b_${v}_r${r}_${args// /_}.txt 2>&1
      grep "^bench" $L/b_${v}_r${r}_${args// /_}.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
for v in main2 lse; do
  timeout 120 ncu --set full --import-source no -k "regex:bwd_main_ws" --launch-skip 1 -c 1 -f -o /tmp/n/$v .prebuilt_$v/jax_dash_sm90_check bench 2 8192 16 16 128 1 symmetric_shift 2 > $L/ncu_$v.log 2>&1
  echo "ncu $v rc=$?" >> $L/summary.txt
  ncu -i /tmp/n/$v.ncu-rep --page details > $L/${v}_details.txt 2>&1
  ncu -i /tmp/n/$v.ncu-rep --page source --csv --print-source sass > $L/${v}_sass.csv 2>&1
done
timeout 200 compute-sanitizer --tool synccheck .prebuilt_lse/jax_dash_sm90_check > $L/synccheck_lse.txt 2>&1; echo "synccheck lse rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_lse.txt | tail -1)" >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT logs ab
cat $L/gpu.txt $L/summary.txt
for v in main2 lse; do echo "== $v"; grep -E "^\s+(Elapsed Cycles|Executed Ipc Active|Executed Instructions |Compute \(SM\) Throughput) " $L/${v}_details.txt; done
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/fwd [0-9.]+ ms \([0-9]+ TFLOP\/s\), //' $L/bench.txt | cut -c1-120
