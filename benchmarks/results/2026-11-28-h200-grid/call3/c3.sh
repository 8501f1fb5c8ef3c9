#!/bin/bash
# Thirty-third session call 3 (H200): main's final kernels (.prebuilt_final): the driver's checks and
# the sanitizers on this GPU; ncu (--set full) of FA3 det's backward kernel and ours at hd128 causal
# 8 x 2k, H16 (the point where FA3 det gains most from H100 to H200).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L /tmp/n
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
B=.prebuilt_final/jax_dash_sm90_check; chmod +x $B
for m in default masks dropout variants; do
  a=""; [ $m != default ] && a=$m
  timeout 90 $B $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
timeout 90 compute-sanitizer --tool synccheck $B > $L/synccheck.txt 2>&1
echo "synccheck default rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 90 compute-sanitizer --tool memcheck $B masks > $L/memcheck_masks.txt 2>&1
echo "memcheck masks rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_masks.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .prebuilt_final/*.whl >> $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
prof() {  # tag regex cmd...
  local tag=$1 rx=$2; shift 2
  timeout 120 ncu --set full --import-source no --kernel-name-base mangled -k "regex:$rx" --launch-skip 1 -c 1 -f -o /tmp/n/$tag "$@" > $L/ncu_$tag.log 2>&1
  echo "ncu $tag rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
  ncu -i /tmp/n/$tag.ncu-rep --page details > $L/${tag}_details.txt 2>&1
  ncu -i /tmp/n/$tag.ncu-rep --page source --csv --print-source sass > $L/${tag}_sass.csv 2>&1
}
JAX_DASH_BENCH_FA3_DETERMINISTIC=1 prof fa3_det FlashAttnBwdSm90 python3 maintainers/scripts/attn_once.py --impl fa3_det --batch 8 --seq 2048 --heads 16 --head-dim 128 --causal --calls 3
prof ours bwd_main_ws $B bench 8 2048 16 16 128 1 symmetric_shift 2
tar czf $OUT/c3.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
for t in fa3_det ours; do
  echo "== $t"; grep -E "^\s+(Elapsed Cycles|Duration|SM Frequency|DRAM Frequency|Executed Ipc Active|Issue Slots Busy|Registers Per Thread|Executed Instructions |Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|DRAM Throughput|Dynamic Shared Memory Per Block|Grid Size|Block Size) " $L/${t}_details.txt | head -20
  python3 maintainers/scripts/ncu_sass_hotspots.py $L/${t}_sass.csv --top 12 2>&1 | head -30
done
