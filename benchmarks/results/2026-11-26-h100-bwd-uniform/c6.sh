#!/usr/bin/env bash
# Seventeenth session, call 7 (H100): the README's grid on main's kernels with every peer in one run.
set -u
mkdir -p "$OUT" /tmp/o6
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /tmp/o6/setup.log 2>&1
rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_bu/*.whl >> /tmp/o6/setup.log 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
G=/tmp/o6/grid
bench() { local l=$((370 - SECONDS)); (( l > 30 )) || return 0
  timeout $l python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 60 \
    --seqs 2k,4k,8k,16k --out $G "$@" >> /tmp/o6/grid.log 2>&1; echo "grid $* rc=$? at ${SECONDS}s" | tee -a /tmp/o6/times.txt; }
bench --head-dims 128 --masks causal --impls jax_dash,cudnn,cudnn_det,fa3,fa3_det,tokamax
bench --head-dims 128 --masks full --impls jax_dash,cudnn,tokamax
bench --head-dims 64 --masks causal,full --impls jax_dash,cudnn,tokamax
tar czf "$OUT/c6.tgz" -C /tmp/o6 .
