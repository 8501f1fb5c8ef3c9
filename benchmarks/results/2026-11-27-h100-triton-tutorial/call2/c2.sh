#!/bin/bash
# Twenty-eighth session call 2: the Triton tutorial's causal points (fp16, hd64, 512-16k;
# warp_specialize as the tutorial's own benchmark chooses it), then issue 32's hd128 causal grid
# with FA3 and FA3 det (bf16, 2k-16k) and the window points (bench_masks, 16k and 8k) on main's
# kernels (.prebuilt_mirror2). PYTEST_VERSION=1: the tutorial's forward runs its one test config.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/fp16 $OUT/grid $OUT/win
T0=$(date +%s); left() { echo $(( 590 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_mirror2/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT)
PYTHONPATH=$PWD PYTEST_VERSION=1 timeout 200 python3 benchmarks/bench_attention.py --dtype float16 --triton-tutorial .peer_src/triton_06_fused_attention_5c846f015.py --impls jax_dash,cudnn,triton_tutorial --schedules auto --iters 10 --no-plots --item-timeout 120 --seqs 512,1k,2k,4k,8k,16k --out $OUT/fp16 --head-dims 64 --masks causal > $L/fp16_hd64c.txt 2>&1; echo "fp16 hd64 causal rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
export PYTHONPATH=$PWD:/tmp/fa3
timeout 200 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 50 --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det --no-plots > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  [ $(left) -lt 45 ] && break
  timeout 60 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
tar czf $OUT/c2.tgz -C $OUT logs fp16 grid win
cat $L/gpu.txt $L/summary.txt
grep -h "triton_tutorial" $L/fp16_*.txt | cut -c1-200 | head -8
grep -A10 "^## Backward TFLOP" $OUT/fp16/results.md | tail -7
grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | tail -5; grep -A8 "^## Forward TFLOP" $OUT/grid/results.md | tail -5
grep -h "TFLOP" $L/win_*.txt | grep window
