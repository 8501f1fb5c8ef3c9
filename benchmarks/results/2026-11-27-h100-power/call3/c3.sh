#!/bin/bash
# Twenty-second session call 3: ncu of FA3's racing backward and ours (main's kernels, symmetric_shift and
# atomic) at hd128 causal 2 x 8k, H16: details and per-SASS-instruction stall samples.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L /tmp/n
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .prebuilt_stsm/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
prof() {  # tag regex cmd...
  local tag=$1 rx=$2; shift 2
  timeout 150 ncu --set full --import-source no --kernel-name-base mangled -k "regex:$rx" --launch-skip 1 -c 1 -f -o /tmp/n/$tag "$@" > $L/ncu_$tag.log 2>&1
  echo "ncu $tag rc=$?" >> $L/summary.txt
  ncu -i /tmp/n/$tag.ncu-rep --page details > $L/${tag}_details.txt 2>&1
  ncu -i /tmp/n/$tag.ncu-rep --page source --csv --print-source sass > $L/${tag}_sass.csv 2>&1
}
prof fa3 FlashAttnBwdSm90 python3 maintainers/scripts/attn_once.py --impl fa3 --batch 2 --seq 8192 --heads 16 --head-dim 128 --causal --calls 3
chmod +x .prebuilt_stsm/jax_dash_sm90_check
prof ours bwd_main_ws .prebuilt_stsm/jax_dash_sm90_check bench 2 8192 16 16 128 1 symmetric_shift 2
prof ours_atomic bwd_main_ws .prebuilt_stsm/jax_dash_sm90_check bench 2 8192 16 16 128 1 atomic 2
tar czf $OUT/c3.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
for t in fa3 ours ours_atomic; do
  echo "== $t"; grep -E "^\s+(Elapsed Cycles|Duration|SM Frequency|Executed Ipc Active|Issue Slots Busy|Registers Per Thread|Executed Instructions |Compute \(SM\) Throughput|L1/TEX Hit|L2 Hit Rate|DRAM Throughput|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|Grid Size|Block Size|Achieved Occupancy) " $L/${t}_details.txt | head -20
  python3 maintainers/scripts/ncu_stalls.py $L/${t}_sass.csv 12 2>&1 | head -40
done
