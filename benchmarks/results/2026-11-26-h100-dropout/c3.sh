#!/bin/bash
# Eighteenth session call 3: where dropout's time goes (ncu, with and without), then the grid.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ncu
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
mkdir -p /tmp/site; rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_do/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
prof() {  # name rate args...
  local name=$1 rate=$2; shift 2
  timeout 120 ncu --set full --import-source no --kernel-name-base demangled \
    -k 'regex:bwd_main_ws|fwd_kernel' --launch-skip 2 -c 2 -f -o $OUT/ncu/$name \
    python3 maintainers/scripts/attn_once.py --impl jax_dash --calls 2 --dropout-rate $rate "$@" \
    > $L/ncu_$name.txt 2>&1
  echo "ncu $name rc=$?" >> $L/summary.txt
  ncu -i $OUT/ncu/$name.ncu-rep --page details --csv > $OUT/ncu/${name}_details.csv 2>/dev/null
}
prof hd64_none 0 --batch 4 --seq 4096 --heads 32 --head-dim 64
prof hd64_drop 0.1 --batch 4 --seq 4096 --heads 32 --head-dim 64
prof hd128c_none 0 --batch 2 --seq 8192 --heads 16 --head-dim 128 --causal
prof hd128c_drop 0.1 --batch 2 --seq 8192 --heads 16 --head-dim 128 --causal
ncu -i $OUT/ncu/hd64_drop.ncu-rep --page source --csv --print-source sass -k regex:bwd_main_ws > $OUT/ncu/hd64_drop_bwd_sass.csv 2>/dev/null
rm -f $OUT/ncu/*.ncu-rep
timeout 300 python3 benchmarks/bench_dropout.py --out $OUT/dropout --budget 1.0 --iters 8 > $L/bench.txt 2>&1; echo "bench rc=$?" >> $L/summary.txt
tar czf $OUT/c3.tgz -C $OUT logs ncu dropout
cat $L/summary.txt; cat $OUT/dropout/dropout.md 2>/dev/null || grep -v "^    @" $L/bench.txt | tail -20
