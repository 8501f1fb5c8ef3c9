#!/usr/bin/env bash
# Seventeenth session, call 4 (H100): bwd-uniform's sanitizers, ncu of its backward (causal 8k, full 16k),
# GPU tests, then bench_train 32768 and 4096 (cudnn_gather vs dash_embed) on its kernels.
set -u
mkdir -p "$OUT" /tmp/o4
left() { echo $((575 - SECONDS)); }
log() { echo "$* at ${SECONDS}s" | tee -a /tmp/o4/times.txt; }
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_bu/*.whl > /tmp/o4/setup.log 2>&1
chmod +x .prebuilt_bu/jax_dash_sm90_check
nvidia-smi --query-gpu=name,driver_version --format=csv > /tmp/o4/gpu.txt
export PYTHONUNBUFFERED=1
D=.prebuilt_bu/jax_dash_sm90_check
OUT=/tmp/o4/san TOOLS="memcheck synccheck initcheck" LIMIT=90 bash scripts/sanitize.sh $D > /tmp/o4/sanitize.txt 2>&1; log "sanitize rc=$?"
OUT=/tmp/o4/san_masks TOOLS="memcheck synccheck initcheck" LIMIT=90 DRIVER_ARGS=masks bash scripts/sanitize.sh $D > /tmp/o4/sanitize_masks.txt 2>&1; log "sanitize masks rc=$?"
for spec in "c8k --batch 2 --seq 8192 --causal" "f16k --batch 1 --seq 16384"; do
  tag=${spec%% *}; args=${spec#* }
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 90 ncu --set full --import-source no --kernel-name-base demangled \
    -k 'regex:bwd_main_ws' --launch-skip 1 -c 1 -f -o /tmp/o4/ncu_$tag \
    python3 maintainers/scripts/attn_once.py --impl jax_dash --heads 16 --head-dim 128 --calls 3 $args > /tmp/o4/ncu_$tag.log 2>&1
  log "ncu $tag rc=$?"
  ncu -i /tmp/o4/ncu_$tag.ncu-rep --page details > /tmp/o4/ncu_${tag}_details.txt 2>&1
  ncu -i /tmp/o4/ncu_$tag.ncu-rep --page source --csv --print-source sass > /tmp/o4/ncu_${tag}_sass.csv 2>&1
  gzip -f /tmp/o4/ncu_${tag}_sass.csv; rm -f /tmp/o4/ncu_$tag.ncu-rep
done
OUT=/tmp/o4/gt timeout 200 bash scripts/gpu_tests.sh 8 --timeout 120 > /tmp/o4/gpu_tests.txt 2>&1; log "gpu tests rc=$?"
tail -2 /tmp/o4/gt/gpu_tests.log 2>/dev/null | tee -a /tmp/o4/times.txt
for seq in 32768 4096; do
  l=$(( $(left) - 10 )); (( l > 60 )) || break
  timeout $l python3 benchmarks/bench_train.py --seqs $seq --configs cudnn_gather,dash_embed --out /tmp/o4/train > /tmp/o4/train_$seq.log 2>&1
  log "train $seq rc=$?"
done
tar czf "$OUT/c4.tgz" -C /tmp/o4 .
cat /tmp/o4/times.txt; cat /tmp/o4/sanitize.txt /tmp/o4/sanitize_masks.txt | grep -v "^driver"
grep -E "^\| (cudnn_gather|dash_embed)" /tmp/o4/train/results.md 2>/dev/null | head
