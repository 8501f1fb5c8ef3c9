#!/bin/bash
# Twentieth session call 10: two dQ buffers at head_dim 128 (bwd-dq2-hd128) against one (main: two writers).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in old new; do
  dir=.prebuilt_tw; [ $v = new ] && dir=.prebuilt_dq2
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v $dir/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
NEW=.prebuilt_dq2/jax_dash_sm90_check; OLD=.prebuilt_tw/jax_dash_sm90_check; chmod +x $NEW $OLD
timeout 120 $NEW > $L/drv_default.txt 2>&1; echo "drv default rc=$?" >> $L/summary.txt; grep -E "^(PASS|FAIL)" $L/drv_default.txt | tail -1 >> $L/summary.txt
for v in old new; do
  run $v timeout 120 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run new python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_old.json $OUT/ab/digest_new.json >> $L/summary.txt 2>&1
for r in 1 2; do for shape in "1 32768 16 8 128 1" "2 16384 16 8 128 1" "4 8192 16 8 128 1" "8 2048 16 16 128 1" "1 16384 16 16 128 0"; do
  for s in symmetric_shift descending shift; do
    case "$shape" in *" 0") [ $s = shift ] || continue;; *) [ $s = shift ] && continue;; esac
    for v in old new; do
      D=$OLD; [ $v = new ] && D=$NEW
      timeout 60 $D bench $shape $s 5 > $L/b_${v}_r${r}_${shape// /_}_$s.txt 2>&1
      grep "^bench" $L/b_${v}_r${r}_${shape// /_}_$s.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done; done
tar czf $OUT/c10.tgz -C $OUT logs ab
cat $L/gpu.txt $L/summary.txt; cut -c1-125 $L/bench.txt
echo "== trace 32k sym old"; sed -n 2,20p $L/b_old_r1_1_32768_16_8_128_1_symmetric_shift.txt; echo "== new"; sed -n 2,20p $L/b_new_r1_1_32768_16_8_128_1_symmetric_shift.txt
