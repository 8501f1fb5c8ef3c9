#!/bin/bash
# Thirtieth session call 2: branch unit-kv-first at 3740600 (.prebuilt_kvf2: the producer loads a
# unit's K and V and its first Q/dO stage at the fetch barrier, under the math's copy of the unit
# tables) against main's kernels (.prebuilt_vec). Driver checks of the branch (default, masks),
# synccheck and memcheck (default); backward A/B with the per-role trace, 3 interleaved rounds;
# bits hashes compared; every GPU test on the branch's wheel if it is faster on average.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L/tr
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
M=.prebuilt_vec/jax_dash_sm90_check; B=.prebuilt_kvf2/jax_dash_sm90_check; chmod +x $M $B
for m in default masks; do
  a=""; [ $m != default ] && a=$m
  timeout 60 $B $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
for tool in synccheck memcheck; do
  timeout 60 compute-sanitizer --tool $tool $B > $L/$tool.txt 2>&1
  echo "$tool default rc=$? $(grep -E 'ERROR SUMMARY' $L/$tool.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
for r in 1 2 3; do
  for spec in "32 512 32 32 64 0 shift" "32 512 32 32 64 1 mirror" "8 2048 32 32 64 0 shift" \
              "4 4096 32 32 64 0 shift" "8 2048 16 16 128 0 shift" "8 2048 16 16 128 1 symmetric_shift" \
              "4 4096 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift" \
              "2 8192 16 16 128 1 atomic"; do
    for v in main branch; do
      D=$M; [ $v = branch ] && D=$B
      f=$L/tr/r${r}_$(echo $spec | tr ' ' _)_$v.txt
      timeout 40 $D bench $spec 20 > $f 2>&1
      grep "^bench" $f | sed "s/^/r$r $v /" >> $L/ab.txt
    done
  done
  echo "round $r done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
python3 - $L/ab.txt > $L/verdict.txt <<'PY'
import re, sys, collections
d = collections.defaultdict(list); bits = collections.defaultdict(set)
for line in open(sys.argv[1]):
    m = re.match(r'r\d (\w+) bench (.*?) wave=\d+: .* bwd ([\d.]+) ms.*bits (\w+)', line)
    if m:
        d[(m.group(2), m.group(1))].append(float(m.group(3))); bits[m.group(2)].add(m.group(4))
ratios = {k: sum(d[(k, 'branch')]) / sum(d[(k, 'main')]) for k, v in d if v == 'main' and (k, 'branch') in d}
for k, r in ratios.items():
    print(f"{k}: main {' '.join(f'{x:.3f}' for x in d[(k, 'main')])} | branch {' '.join(f'{x:.3f}' for x in d[(k, 'branch')])} | branch/main {r:.4f} | bits {'same' if len(bits[k]) == 1 else 'DIFFER' if 'atomic' not in k else 'n/a (atomic)'}")
ok = ratios and max(ratios.values()) <= 1.01 and sum(ratios.values()) / len(ratios) < 1.0
print("VERDICT", "faster" if ok else "not faster", f"mean {sum(ratios.values()) / len(ratios):.4f}")
PY
cat $L/verdict.txt >> $L/summary.txt
# every GPU test on the branch's wheel if the mean ratio is under 0.995 (needed for a merge)
if python3 -c "import re,sys; sys.exit(0 if float(re.search(r'mean ([\d.]+)', open('$L/verdict.txt').read()).group(1)) < 0.995 else 1)"; then
  python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_kvf2/*.whl > $L/pip.txt 2>&1
  export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=/tmp/site_none:$PWD
  t=$(( 560 - ($(date +%s) - T0) )); [ $t -gt 300 ] && t=300; echo "gpu tests with ${t}s" >> $L/summary.txt
  OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
  tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
fi
tar czf $OUT/c2.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
for f in $L/tr/r1_*; do echo "== $(basename $f .txt)"; grep -E "math wait K/V|unit start|math epilogue|math  " $f; done
