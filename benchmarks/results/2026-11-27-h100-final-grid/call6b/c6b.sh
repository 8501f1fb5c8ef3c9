#!/bin/bash
# Twenty-sixth session call 6b (the wheel; 6a ran the drivers), on the fixed branch (66097af): fwd-band-rows (fbc0995, .prebuilt_brc, its driver stripped: the masked forward's predicate
# as one column interval per row) against main's final kernels (.prebuilt_fd: .prebuilt_final's driver, stripped): driver window
# forward A/B (3 rounds interleaved), the branch's driver checks and memcheck of the mask cases,
# its wheel's digests against the reference, every GPU test on its wheel, the window points
# (bench_masks) with cuDNN and FA3.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
check() {  # check VARIANT MODE
  local a=""; [ $2 != default ] && a=$2
  timeout 100 .prebuilt_$1/jax_dash_sm90_check $a > $L/drv_$1_$2.txt 2>&1
  echo "drv $1 $2 rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$1_$2.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
}
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_brw/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export PYTHONPATH=/tmp/site_none:$PWD
timeout 70 python3 maintainers/scripts/bits_digest.py --out $L/digest_br.json > $L/digest.txt 2>&1; echo "digest rc=$?" >> $L/summary.txt
python3 maintainers/scripts/bits_digest.py --compare calls/digest_ref.json $L/digest_br.json >> $L/summary.txt 2>&1
export PYTHONPATH=$PWD:/tmp/fa3
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  timeout 60 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
export PYTHONPATH=/tmp/site_none:$PWD
t=$(( $(left) - 10 )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c6b.tgz -C $OUT logs win
cat $L/gpu.txt $L/summary.txt; grep -h "TFLOP" $L/win_*.txt | grep -v packed | head -20
: sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/bench.txt
