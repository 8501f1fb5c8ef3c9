#!/bin/bash
# Twenty-fifth session call 5: fwd-hd64-tma (1854acc, .prebuilt_t64: the persistent head_dim-64
# kernels store O through shared memory and TMA) against main (a78d2a8's kernels, .prebuilt_dm2):
# driver forward A/B (2 rounds interleaved), driver check, the wheel's digests against the
# reference, every GPU test on the branch's wheel.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
T0=$(date +%s); left() { echo $(( 440 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in dm2 t64; do chmod +x .prebuilt_$v/jax_dash_sm90_check; done
for r in 1 2; do
  for spec in "32 512 32 32 64 1 descending 20" "16 1024 32 32 64 1 descending 20" \
              "8 2048 32 32 64 1 descending 20" "4 4096 32 32 64 1 descending 20" \
              "4 4096 32 32 64 0 shift 10" "2 8192 32 32 64 1 descending 10" \
              "8 2048 16 16 128 1 descending 20"; do
    for v in dm2 t64; do
      timeout 30 .prebuilt_$v/jax_dash_sm90_check bench $spec > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done
echo "bench done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 60 .prebuilt_t64/jax_dash_sm90_check > $L/drv_default.txt 2>&1; echo "drv t64 default rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_default.txt | tail -1)" >> $L/summary.txt
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_t64/*.whl > $L/pip.txt 2>&1
export PYTHONPATH=/tmp/site_none:$PWD
timeout 70 python3 maintainers/scripts/bits_digest.py --out $L/digest_t64.json > $L/digest.txt 2>&1; echo "digest rc=$?" >> $L/summary.txt
python3 maintainers/scripts/bits_digest.py --compare calls/digest_ref.json $L/digest_t64.json >> $L/summary.txt 2>&1
t=$(left); echo "gpu tests with ${t}s left" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c5.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bwd [0-9.]+ ms//; s/, bits (....).*/ \1/' $L/bench.txt
