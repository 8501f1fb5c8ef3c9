#!/bin/bash
# Thirty-second session call 1: branch fwd-dynamic (.prebuilt_dyn: the persistent forward takes
# its tiles from an atomic tile counter, the grid order's last three head groups merged) against
# main's kernels (.drv_twin). Drivers default and variants, synccheck and memcheck; driver
# forward A/B, the order alternated; forced persistent against one-tile at 8k-16k; every GPU test
# on the branch's wheel.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L/tr
T0=$(date +%s); left() { echo $(( 560 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
declare -A D=([main]=.drv_twin/jax_dash_sm90_check [dyn]=.prebuilt_dyn/jax_dash_sm90_check)
chmod +x ${D[main]} ${D[dyn]}
for m in default variants; do
  a=""; [ $m != default ] && a=$m
  timeout 90 ${D[dyn]} $a > $L/drv_$m.txt 2>&1
  echo "dyn drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
for tool in synccheck memcheck; do
  timeout 70 compute-sanitizer --tool $tool ${D[dyn]} variants > $L/$tool.txt 2>&1
  echo "dyn $tool rc=$? $(grep -E 'ERROR SUMMARY' $L/$tool.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
run() {  # round variant env spec...
  local r=$1 v=$2 e=$3; shift 3
  local f=$L/tr/r${r}_$(echo "$@" | tr ' ' _)_$v$e.txt
  if [ "$e" = "P" ]; then JAX_DASH_SM90_FWD=ws-persistent timeout 40 ${D[$v]} bench "$@" 30 > $f 2>&1
  else timeout 40 ${D[$v]} bench "$@" 30 > $f 2>&1; fi
  grep "^bench" $f | sed "s/^/r$r $v$e /" >> $L/ab.txt
}
for r in 1 2 3; do
  o="main dyn"; [ $((r % 2)) = 0 ] && o="dyn main"
  for spec in "8 2048 16 16 128 1 descending" "4 4096 16 16 128 1 descending" \
              "2 8192 16 16 128 1 descending" "1 16384 16 16 128 1 descending" \
              "8 2048 16 16 128 0 descending" "32 512 32 32 64 1 descending" \
              "8 2048 32 32 64 1 descending" "4 4096 32 32 64 1 descending" \
              "2 8192 32 32 64 1 descending"; do
    for v in $o; do run $r $v "" $spec; done
  done
  for spec in "1 16384 16 16 128 1 descending" "2 8192 32 32 64 1 descending" \
              "1 16384 32 32 64 1 descending"; do
    run $r dyn P $spec
    [ "$spec" = "1 16384 32 32 64 1 descending" ] && run $r dyn "" $spec
  done
  echo "round $r t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
python3 - $L/ab.txt > $L/verdict.txt <<'PY'
import re, sys, collections, statistics
d = collections.defaultdict(list); bits = collections.defaultdict(set)
for line in open(sys.argv[1]):
    m = re.match(r'r\d (\w+) bench (.*?) wave=\d+: fwd ([\d.]+) ms.*bits (\w+)', line)
    if m: d[(m.group(2), m.group(1))].append(float(m.group(3))); bits[m.group(2)].add(m.group(4))
for k in sorted({k for k, _ in d}):
    base = d.get((k, 'main')) or d.get((k, 'dyn'))
    for v in ('dyn', 'dynP'):
        if (k, v) in d and base is not d[(k, v)]:
            b = d[(k, v)]
            print(f"{k}: {'main' if (k, 'main') in d else 'dyn'} {' '.join(f'{x:.4f}' for x in base)} | {v} "
                  f"{' '.join(f'{x:.4f}' for x in b)} | {v}/base sums {sum(b) / sum(base):.4f} | bits "
                  f"{'same' if len(bits[k]) == 1 else 'DIFFER'}")
PY
cat $L/verdict.txt >> $L/summary.txt
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_dyn/*.whl > $L/pip.txt 2>&1
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=/tmp/site_none:$PWD
t=$(( $(left) - 5 )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
tar czf $OUT/c1.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
