#!/bin/bash
# Twenty-fifth session call 3: is call 2's hd128 causal 2k forward (331 TFLOP/s, first point of the
# grid) real? bench_attention at 2k and 4k with main before the diet (.prebuilt_wc, 1162421)
# and after (.prebuilt_m2, a78d2a8), each in its own process, two rounds interleaved; cuDNN in the
# same processes; then ncu of the new forward at 8 x 2k.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L /tmp/n
T0=$(date +%s); left() { echo $(( 585 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
: > $L/pip.txt

for v in wc m2; do
  mkdir -p /tmp/site_$v
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .prebuilt_$v/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/site_$v/jax_dash
done
for r in 1 2; do for v in wc m2; do
  [ $(left) -lt 100 ] && break 2
  PYTHONPATH=/tmp/site_$v:$PWD timeout 90 python3 benchmarks/bench_attention.py --schedules auto --iters 10 --item-timeout 40 --seqs 2k,4k --out $OUT/g_${v}_r$r --head-dims 128 --masks causal --impls jax_dash,cudnn --no-plots > $L/g_${v}_r$r.txt 2>&1
  echo "grid $v r$r rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done; done
D=.prebuilt_m2/jax_dash_sm90_check; chmod +x $D
timeout 120 ncu --set full --import-source no --kernel-name-base mangled -k "regex:fwd_kernel" --launch-skip 1 -c 1 -f -o /tmp/n/m2 $D bench 8 2048 16 16 128 1 descending 2 > $L/ncu_m2.log 2>&1; echo "ncu rc=$?" >> $L/summary.txt
ncu -i /tmp/n/m2.ncu-rep --page details > $L/m2_details.txt 2>&1
ncu -i /tmp/n/m2.ncu-rep --page source --csv --print-source sass 2>&1 | gzip -9 > $L/m2_sass.csv.gz
tar czf $OUT/c3.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
grep -h "time hd" $L/g_*.txt | sed 's/bitwise.*//' 
for f in $L/g_*.txt; do echo $f; grep "time hd" $f | sed 's/bitwise.*//'; done
grep -E "^\s+(Elapsed Cycles|Duration|Executed Ipc Active|Issue Slots Busy|Executed Instructions ) " $L/m2_details.txt
