#!/bin/bash
# Twentieth session call 13: masked kernels with one dQ writer again (bwd-writers-masked, .prebuilt_wm) against
# two (.prebuilt_tw) and main before the writers (.prebuilt_band): drivers, digests, window/packed points.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab $OUT/win
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in tw wm; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v .prebuilt_$v/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
D=.prebuilt_wm/jax_dash_sm90_check; chmod +x $D
for m in "" masks dropout; do
  timeout 120 $D $m > $L/drv_${m:-default}.txt 2>&1; echo "drv ${m:-default} rc=$?" >> $L/summary.txt; grep -E "^(PASS|FAIL)" $L/drv_${m:-default}.txt | tail -1 >> $L/summary.txt
done
for v in tw wm; do
  run $v timeout 120 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run wm python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_tw.json $OUT/ab/digest_wm.json >> $L/summary.txt 2>&1
for r in 1 2; do for hd in 64 128; do for v in tw wm; do
  run $v timeout 60 python3 benchmarks/bench_masks.py --seq 16384 --head-dim $hd --impls jax_dash --out $OUT/win/${v}_hd${hd}_r$r.json > $L/win_${v}_hd${hd}_r$r.txt 2>&1
  grep -h "jax_dash:" $L/win_${v}_hd${hd}_r$r.txt | sed "s/^ */$v r$r hd$hd /" >> $L/win.txt
done; done; done
timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 $D masks > $L/san_synccheck_masks.txt 2>&1; echo "synccheck masks rc=$?" >> $L/summary.txt; grep "ERROR SUMMARY" $L/san_synccheck_masks.txt | tail -1 >> $L/summary.txt
tar czf $OUT/c13.tgz -C $OUT logs ab win
cat $L/gpu.txt $L/summary.txt; sed -E 's/visible [0-9.]+ of S\^2, //; s/ \(visible work\)//' $L/win.txt
