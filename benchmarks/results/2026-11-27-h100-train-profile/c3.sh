#!/bin/bash
# Twentieth session call 3: where the 1 x 32768 training step's GPU time goes, cuDNN racing vs jax_dash + embed.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/prof
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd .prebuilt_band/*.whl > $L/pip.txt 2>&1
rm -rf /tmp/jd/jax_dash
export PYTHONPATH=$PWD:/tmp/jd
for c in cudnn_gather dash_embed; do
  timeout 200 python3 maintainers/scripts/train_profile.py --config $c --seq 32768 --tokens 32768 --steps 3 --top 40 --out $OUT/prof/profile_${c}_32768.json > $L/prof_$c.txt 2>&1; echo "$c rc=$?" >> $L/summary.txt
done
tar czf $OUT/c3.tgz -C $OUT logs prof
cat $L/gpu.txt $L/summary.txt; for c in cudnn_gather dash_embed; do head -48 $L/prof_$c.txt | cut -c1-150; done
