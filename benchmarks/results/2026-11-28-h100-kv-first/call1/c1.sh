#!/bin/bash
# Thirty-first session call 1: why the unit-start change (unit-kv-first, b86afa9 = .drv_kvf3) was
# 3.3% slower than main's kernels (.drv_vec) at hd128 causal 1 x 16k, with the order of each round
# rotated (call 5 ran main first every time), the per-role trace of every run, and the SM clock
# sampled. A third binary (.drv_kvf4, unit-kv-first-2): the first math thread's dK/dV read wait
# after the math's fetch barrier. Its checks first (drivers, synccheck, memcheck).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L/tr
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 200 > $L/clk.txt 2>&1 &
SMI=$!
declare -A D=([main]=.drv_vec/jax_dash_sm90_check [kvf3]=.drv_kvf3/jax_dash_sm90_check [kvf4]=.drv_kvf4/jax_dash_sm90_check)
chmod +x ${D[main]} ${D[kvf3]} ${D[kvf4]}
for m in default masks; do
  a=""; [ $m != default ] && a=$m
  timeout 60 ${D[kvf4]} $a > $L/drv_$m.txt 2>&1
  echo "kvf4 drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
for tool in synccheck memcheck; do
  timeout 60 compute-sanitizer --tool $tool ${D[kvf4]} > $L/$tool.txt 2>&1
  echo "kvf4 $tool rc=$? $(grep -E 'ERROR SUMMARY' $L/$tool.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
run() {  # round variant spec...
  local r=$1 v=$2; shift 2
  local f=$L/tr/r${r}_$(echo "$@" | tr ' ' _)_$v.txt
  echo "$(date +%H:%M:%S.%N) start r$r $v $*" >> $L/times.txt
  timeout 40 ${D[$v]} bench "$@" 40 > $f 2>&1
  echo "$(date +%H:%M:%S.%N) end" >> $L/times.txt
  grep "^bench" $f | sed "s/^/r$r $v /" >> $L/ab.txt
}
orders=("main kvf3 kvf4" "kvf4 main kvf3" "kvf3 kvf4 main" "kvf3 main kvf4" "main kvf4 kvf3" "kvf4 kvf3 main")
for r in 1 2 3 4 5 6 7 8; do
  for v in ${orders[$(( (r - 1) % 6 ))]}; do run $r $v 1 16384 16 16 128 1 symmetric_shift; done
  if [ $r -le 4 ]; then
    for v in ${orders[$(( (r + 2) % 6 ))]}; do run $r $v 2 8192 16 16 128 1 symmetric_shift; done
  fi
  if [ $r -le 3 ]; then
    for spec in "32 512 32 32 64 0 shift" "32 512 32 32 64 1 mirror" "8 2048 16 16 128 1 symmetric_shift"; do
      for v in ${orders[$(( (r + 3) % 6 ))]}; do run $r $v $spec; done
    done
  fi
  echo "round $r t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
kill $SMI
python3 - $L/ab.txt > $L/verdict.txt <<'PY'
import re, sys, collections, statistics
d = collections.defaultdict(list); bits = collections.defaultdict(set)
for line in open(sys.argv[1]):
    m = re.match(r'r\d (\w+) bench (.*?) wave=\d+: .* bwd ([\d.]+) ms.*bits (\w+)', line)
    if m: d[(m.group(2), m.group(1))].append(float(m.group(3))); bits[m.group(2)].add(m.group(4))
for k in sorted({k for k, _ in d}):
    a = d[(k, 'main')]
    s = f"{k}: main {' '.join(f'{x:.3f}' for x in a)}"
    for v in ('kvf3', 'kvf4'):
        b = d[(k, v)]
        s += f" | {v} {' '.join(f'{x:.3f}' for x in b)} ({v}/main sums {sum(b) / sum(a):.4f}, med {statistics.median(b) / statistics.median(a):.4f})"
    print(s + f" | bits {'same' if len(bits[k]) == 1 else 'DIFFER'}")
PY
# the trace, averaged per variant at 1 x 16k: cycles a unit for each line
python3 - $L/tr > $L/trace16k.txt <<'PY'
import re, sys, os, collections
acc = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(os.listdir(sys.argv[1])):
    if '16384' not in f: continue
    v = f.rsplit('_', 1)[1][:-4]
    for line in open(os.path.join(sys.argv[1], f)):
        m = re.match(r'\s+(\S.*?)\s+([\d.]+)%\s+(\d+)\s+(\d+)\s*$', line)
        if m: acc[m.group(1)][v].append(int(m.group(4)))
        m = re.match(r'\s+math\s+(\d+) units, (\d+) steps, (\d+) cycles per step, (\d+) per unit', line)
        if m: acc['cycles per step'][v].append(int(m.group(3))); acc['cycles per unit'][v].append(int(m.group(4)))
print(f"{'line (per unit)':32s}" + ''.join(f"{v:>12s}" for v in ('main', 'kvf3', 'kvf4')))
for k, vs in acc.items():
    print(f"{k:32s}" + ''.join(f"{sum(vs[v]) / max(1, len(vs[v])):12.0f}" for v in ('main', 'kvf3', 'kvf4')))
PY
tar czf $OUT/c1.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt $L/verdict.txt $L/trace16k.txt
