#!/bin/bash
# Twenty-fourth session call 6: the forward's operand descriptors by the warp-uniform warpgroup
# index (wg = fwd-wg-desc) against main (cand = 5d04244's kernels): driver checks of wg, digests of
# its wheel against the reference, forward A/B (3 rounds, interleaved), synccheck, ncu at 8 x 2k.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L /tmp/n
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in cand wg; do chmod +x .prebuilt_d$v/jax_dash_sm90_check; done
K=.prebuilt_dwg/jax_dash_sm90_check
for mode in default masks dropout variants; do
  a=""; [ $mode != default ] && a=$mode
  timeout 120 $K $a > $L/drv_$mode.txt 2>&1; echo "drv wg $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$mode.txt | tail -1)" >> $L/summary.txt
done
timeout 100 compute-sanitizer --tool synccheck $K > $L/synccheck_default.txt 2>&1; echo "synccheck wg default rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_default.txt | tail -1)" >> $L/summary.txt
mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .prebuilt_wwg/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
PYTHONPATH=/tmp/site:$PWD timeout 120 python3 maintainers/scripts/bits_digest.py --out $L/digest_wg.json > $L/digest.txt 2>&1; echo "digest rc=$?" >> $L/summary.txt
PYTHONPATH=/tmp/site:$PWD python3 maintainers/scripts/bits_digest.py --compare calls/digest_ref.json $L/digest_wg.json >> $L/summary.txt 2>&1
for r in 1 2 3; do
  for spec in "8 2048 16 16 128 1 descending 20" "4 4096 16 16 128 1 descending 20" \
              "2 8192 16 16 128 1 descending 10" "1 16384 16 16 128 1 descending 10" \
              "8 2048 16 16 128 0 shift 20" "4 4096 16 16 128 0 shift 10" "1 16384 16 16 128 0 shift 5" \
              "32 512 32 32 64 1 descending 20" "16 1024 32 32 64 1 descending 20" \
              "8 2048 32 32 64 1 descending 20" "4 4096 32 32 64 0 shift 10" "1 16384 32 32 64 1 descending 5" \
              "1 16384 16 16 128 1 descending 5 4096" "1 16384 32 32 64 1 descending 5 4096" \
              "8 2048 8 8 256 1 descending 10"; do
    for v in cand wg; do
      timeout 60 .prebuilt_d$v/jax_dash_sm90_check bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
timeout 120 ncu --set full --import-source no --kernel-name-base mangled -k "regex:fwd_kernel" --launch-skip 1 -c 1 -f -o /tmp/n/wg $K bench 8 2048 16 16 128 1 descending 2 > $L/ncu_wg.log 2>&1
ncu -i /tmp/n/wg.ncu-rep --page details > $L/wg_details.txt 2>&1
ncu -i /tmp/n/wg.ncu-rep --page source --csv --print-source sass 2>&1 | gzip -9 > $L/wg_sass.csv.gz
tar czf $OUT/c6.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
grep -E "^\s+(Elapsed Cycles|Duration|Executed Ipc Active|Issue Slots Busy|Executed Instructions ) " $L/wg_details.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bwd [0-9.]+ ms//; s/, bits (....).*/ \1/' $L/bench.txt
