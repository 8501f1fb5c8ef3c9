#!/bin/bash
# Twenty-first session call 1: bwd-early-stats (driver only) and bwd-wg-dq (wheel + driver) against main (.prebuilt_wm).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L $OUT/ab
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
for v in main wg; do
  dir=.prebuilt_wm; [ $v = wg ] && dir=.prebuilt_wg
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$v $dir/*.whl >> $L/pip.txt 2>&1
  rm -rf /tmp/jd_$v/jax_dash
done
run() { local v=$1; shift; env PYTHONPATH=$PWD:/tmp/jd_$v "$@"; }
declare -A DRV=([main]=.prebuilt_wm/jax_dash_sm90_check [es]=.prebuilt_es/jax_dash_sm90_check [wg]=.prebuilt_wg/jax_dash_sm90_check)
chmod +x ${DRV[main]} ${DRV[es]} ${DRV[wg]}
for v in wg es; do for mode in default masks; do
  a=""; [ $mode = masks ] && a=masks
  timeout 150 ${DRV[$v]} $a > $L/drv_${v}_$mode.txt 2>&1; echo "drv $v $mode rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_${v}_$mode.txt | tail -1)" >> $L/summary.txt
done; done
for v in main wg; do
  run $v timeout 150 python3 maintainers/scripts/bits_digest.py --out $OUT/ab/digest_$v.json > $L/digest_$v.txt 2>&1; echo "digest $v rc=$?" >> $L/summary.txt
done
run wg python3 maintainers/scripts/bits_digest.py --compare $OUT/ab/digest_main.json $OUT/ab/digest_wg.json >> $L/summary.txt 2>&1
for r in 1 2; do for shape in "8 2048 16 16 128 1" "4 4096 16 16 128 1" "2 8192 16 16 128 1" "1 16384 16 16 128 1" "1 32768 16 8 128 1" "1 16384 16 16 128 0" "2 8192 32 32 64 1"; do
  for s in symmetric_shift atomic shift; do
    case "$shape" in *" 0") [ $s = shift ] || continue;; "2 8192 16 16 128 1") [ $s = shift ] && continue;; *) [ $s = symmetric_shift ] || continue;; esac
    for v in main es wg; do
      timeout 60 ${DRV[$v]} bench $shape $s 5 > $L/b_${v}_r${r}_${shape// /_}_$s.txt 2>&1
      grep "^bench" $L/b_${v}_r${r}_${shape// /_}_$s.txt | sed "s/^/$v r$r /" >> $L/bench.txt
    done
  done
done; done
timeout 240 compute-sanitizer --tool synccheck ${DRV[wg]} > $L/synccheck_wg.txt 2>&1; echo "synccheck wg rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_wg.txt | tail -1)" >> $L/summary.txt
tar czf $OUT/c1.tgz -C $OUT logs ab
cat $L/gpu.txt $L/summary.txt; sed -E 's/ wave=[0-9]+//; s/bench B=//' $L/bench.txt | cut -c1-120
