#!/bin/bash
# Twenty-seventh session call 1: branch mirror-schedule (.prebuilt_mirror): the mirror schedule.
# Drivers (default, masks, dropout: mirror cases added), memcheck of the mask cases, the window's
# tax per schedule (driver: descending, mirror, atomic; 2 rounds interleaved), the wheel's digests
# against the reference (expected: only the two auto-window cases differ), the window points
# (bench_masks; auto = mirror now) with cuDNN and FA3.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/win
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
D=.prebuilt_mirror/jax_dash_sm90_check; chmod +x $D
for m in default masks dropout; do
  a=""; [ $m != default ] && a=$m
  timeout 120 $D $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
for r in 1 2; do
  for spec in "1 16384 16 16 128 1 SCH 5 4096" "2 8192 16 16 128 1 SCH 5 4096" \
              "1 16384 32 32 64 1 SCH 5 4096" "2 8192 32 32 64 1 SCH 5 4096"; do
    for s in descending mirror atomic; do
      timeout 30 $D bench ${spec/SCH/$s} > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/r$r /" >> $L/tax.txt
    done
  done
done
echo "tax done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
timeout 90 compute-sanitizer --tool memcheck $D masks > $L/memcheck_masks.txt 2>&1; echo "memcheck masks rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_masks.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_mirror/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fa3 .whl_fa3/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/fa3/jax_dash* /tmp/fa3/_jax_dash*
export PYTHONPATH=/tmp/site_none:$PWD
timeout 70 python3 maintainers/scripts/bits_digest.py --out $L/digest_mirror.json > $L/digest.txt 2>&1; echo "digest rc=$?" >> $L/summary.txt
python3 maintainers/scripts/bits_digest.py --compare calls/digest_ref.json $L/digest_mirror.json >> $L/summary.txt 2>&1
export PYTHONPATH=$PWD:/tmp/fa3
for hd in 128 64; do for seq in 16384 8192; do
  impls=jax_dash,cudnn,fa3; [ $hd = 64 ] && impls=jax_dash,cudnn
  [ $(left) -lt 50 ] && break
  timeout 60 python3 benchmarks/bench_masks.py --seq $seq --head-dim $hd --impls $impls --out $OUT/win/hd${hd}_s${seq}.json > $L/win_hd${hd}_s${seq}.txt 2>&1
  echo "window hd$hd seq$seq rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
tar czf $OUT/c1.tgz -C $OUT logs win
cat $L/gpu.txt $L/summary.txt; grep -h "TFLOP" $L/win_*.txt | grep -v packed | head -20
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/tax.txt
