#!/bin/bash
# Twenty-fourth session call 4: ncu of FA3's forward and ours (main 5d04244) at hd128 causal 8 x 2k
# (H16), where ours is 0.91x FA3: details and per-SASS-instruction stall samples; plus the
# driver's forward at 2k-16k (persistent and one-tile) for the per-tile overhead fit.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L /tmp/n
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .prebuilt_wcand/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
D=.prebuilt_dcand/jax_dash_sm90_check; chmod +x $D
for spec in "8 2048" "4 4096" "2 8192" "1 16384"; do for r in 1 2; do
  $D bench $spec 16 16 128 1 descending 20 | grep ^bench | sed "s/^/r$r /" >> $L/fwd_fit.txt
  JAX_DASH_SM90_FWD=ws-persistent $D bench $spec 16 16 128 1 descending 20 | grep ^bench | sed "s/^/P r$r /" >> $L/fwd_fit.txt
done; done
prof() {  # tag regex cmd...
  local tag=$1 rx=$2; shift 2
  timeout 150 ncu --set full --import-source no --kernel-name-base mangled -k "regex:$rx" --launch-skip 1 -c 1 -f -o /tmp/n/$tag "$@" > $L/ncu_$tag.log 2>&1
  echo "ncu $tag rc=$?" >> $L/summary.txt
  ncu -i /tmp/n/$tag.ncu-rep --page details > $L/${tag}_details.txt 2>&1
  ncu -i /tmp/n/$tag.ncu-rep --page source --csv --print-source sass > $L/${tag}_sass.csv 2>&1
}
prof fa3 FlashAttnFwdSm90 python3 maintainers/scripts/attn_once.py --impl fa3 --batch 8 --seq 2048 --heads 16 --head-dim 128 --causal --calls 3
prof ours fwd_kernel $D bench 8 2048 16 16 128 1 descending 2
gzip -9 $L/*_sass.csv
tar czf $OUT/c4.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt $L/fwd_fit.txt | sed -E 's/ wave=[0-9]+//; s/, bwd.*//'
for t in fa3 ours; do
  echo "== $t"; grep -E "^\s+(Elapsed Cycles|Duration|SM Frequency|Executed Ipc Active|Issue Slots Busy|Registers Per Thread|Executed Instructions |Compute \(SM\) Throughput|L2 Hit Rate|DRAM Throughput|Dynamic Shared Memory Per Block|Grid Size|Block Size|Achieved Occupancy) " $L/${t}_details.txt | head -16
  zcat $L/${t}_sass.csv.gz > /tmp/${t}.csv; python3 maintainers/scripts/ncu_sass_hotspots.py /tmp/${t}.csv --top 14 2>&1 | head -36
done
