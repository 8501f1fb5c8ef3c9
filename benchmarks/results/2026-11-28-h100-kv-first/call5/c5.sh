#!/bin/bash
# Thirty-first session call 5: branch untraced-hd128 (.prebuilt_twin: head_dim 128's unmasked
# kernel runs an untraced twin when no trace is asked for) against main's kernels (.drv_kvf4).
# Drivers default and masks, synccheck and memcheck (default); driver backward A/B, the order
# alternated; every GPU test on the branch's wheel if no shape is slower by more than 1% and
# hd128 causal 2k and 16k are faster by at least 0.8%.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L/tr
T0=$(date +%s); left() { echo $(( 500 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
declare -A D=([main]=.drv_kvf4/jax_dash_sm90_check [twin]=.prebuilt_twin/jax_dash_sm90_check)
chmod +x ${D[main]} ${D[twin]}
for m in default masks; do
  a=""; [ $m != default ] && a=$m
  timeout 60 ${D[twin]} $a > $L/drv_$m.txt 2>&1
  echo "twin drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
for tool in synccheck memcheck; do
  timeout 60 compute-sanitizer --tool $tool ${D[twin]} > $L/$tool.txt 2>&1
  echo "twin $tool rc=$? $(grep -E 'ERROR SUMMARY' $L/$tool.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
run() {  # round variant spec...
  local r=$1 v=$2; shift 2
  local f=$L/tr/r${r}_$(echo "$@" | tr ' ' _)_$v.txt
  timeout 40 ${D[$v]} bench "$@" 40 > $f 2>&1
  grep "^bench" $f | sed "s/^/r$r $v /" >> $L/ab.txt
}
for r in 1 2 3 4 5; do
  o="main twin"; [ $((r % 2)) = 0 ] && o="twin main"
  for spec in "1 16384 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift"; do
    for v in $o; do run $r $v $spec; done
  done
  if [ $r -le 3 ]; then
    for spec in "8 2048 16 16 128 1 symmetric_shift" "4 4096 16 16 128 0 shift"; do
      for v in $o; do run $r $v $spec; done
    done
  fi
  echo "round $r t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
python3 - $L/ab.txt > $L/verdict.txt <<'PY'
import re, sys, collections, statistics
d = collections.defaultdict(list); bits = collections.defaultdict(set)
for line in open(sys.argv[1]):
    m = re.match(r'r\d (\w+) bench (.*?) wave=\d+: .* bwd ([\d.]+) ms.*bits (\w+)', line)
    if m: d[(m.group(2), m.group(1))].append(float(m.group(3))); bits[m.group(2)].add(m.group(4))
ratios = {}
for k in sorted({k for k, _ in d}):
    a, b = d[(k, 'main')], d[(k, 'twin')]
    ratios[k] = sum(b) / sum(a)
    print(f"{k}: main {' '.join(f'{x:.3f}' for x in a)} | twin {' '.join(f'{x:.3f}' for x in b)} | "
          f"twin/main sums {ratios[k]:.4f}, med {statistics.median(b) / statistics.median(a):.4f} | bits {'same' if len(bits[k]) == 1 else 'DIFFER'}")
key = [r for k, r in ratios.items() if 'D=128 causal' in k and ('S=2048' in k or 'S=16384' in k)]
ok = ratios and max(ratios.values()) <= 1.01 and key and max(key) <= 0.992 and all(len(b) == 1 for b in bits.values())
print("VERDICT", "faster" if ok else "not faster")
PY
cat $L/verdict.txt >> $L/summary.txt
if grep -q "VERDICT faster" $L/verdict.txt; then
  python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_twin/*.whl > $L/pip.txt 2>&1
  export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=/tmp/site_none:$PWD
  t=$(( $(left) - 5 )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
  OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
  tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
fi
tar czf $OUT/c5.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
