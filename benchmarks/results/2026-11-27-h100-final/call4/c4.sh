#!/bin/bash
# Twenty-first session call 4: main's new kernels (953549b, .prebuilt_eswg): driver variants, memcheck,
# initcheck; the 1 x 32768 training step (cudnn_gather, dash_embed).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
DRV=.prebuilt_eswg/jax_dash_sm90_check; chmod +x $DRV
timeout 90 $DRV variants > $L/drv_variants.txt 2>&1; echo "drv variants rc=$? $(tail -1 $L/drv_variants.txt)" >> $L/summary.txt
for t in memcheck initcheck; do
  timeout 100 compute-sanitizer --tool $t --error-exitcode 9 $DRV > $L/san_$t.txt 2>&1; echo "$t rc=$? $(grep 'ERROR SUMMARY' $L/san_$t.txt | tail -1)" >> $L/summary.txt
done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd .prebuilt_eswg/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/jd/jax_dash
export PYTHONPATH=$PWD:/tmp/jd
timeout 340 python3 benchmarks/bench_train.py --seqs 32768 --configs cudnn_gather,dash_embed --compilation-cache --time-budget 330 --out $OUT/train --no-plots > $L/train.txt 2>&1; echo "train rc=$?" >> $L/summary.txt
tar czf $OUT/c4.tgz -C $OUT logs train
cat $L/gpu.txt $L/summary.txt; cat $OUT/train/results.md 2>/dev/null | head -30
