#!/bin/bash
# Twenty-third session call 3: bwd-s-next's kernels (.prebuilt_wnext wheel): issue 32's hd128 causal grid with FA3 and FA3 det; sustained (bench_attention) A/B against main's
# kernels (.prebuilt_wfinal wheel) at the full mask and head_dim 64.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/grid $OUT/ab_final $OUT/ab_next
T0=$(date +%s); left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .prebuilt_wnext/*.whl >> $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_final .prebuilt_wfinal/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash /tmp/jd_final/jax_dash
PYTHONPATH=/tmp/site:$PWD timeout 220 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 60 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$?" >> $L/summary.txt
for v in final next; do
  t=$(left); [ $t -lt 40 ] && break
  site=/tmp/site; [ $v = final ] && site=/tmp/jd_final
  PYTHONPATH=$site:$PWD timeout $(( t / 2 )) python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 2k,4k,16k --out $OUT/ab_$v --head-dims 128,64 --masks full,causal --impls jax_dash --no-plots > $L/ab_$v.txt 2>&1; echo "sustained $v rc=$?" >> $L/summary.txt
done
tar czf $OUT/c3.tgz -C $OUT logs grid ab_final ab_next
cat $L/gpu.txt $L/summary.txt; grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | head -10
for v in final next; do echo "== $v"; grep -h "time hd=" $L/ab_$v.txt | sed -E 's/.*time (hd=[0-9]+ \w+ seq=[0-9]+).*bwd ([0-9.]+) TFLOP.*/\1 \2/'; done
