#!/bin/bash
# Thirty-first session call 4 (diagnostic): what the backward's trace costs when it is off. Branch
# no-trace-probe (.drv_notrace: WsTracer's start/stop compiled to nothing; SASS hd128 unmasked step
# loop 1049 -> 1013 instructions, 2 -> 1 LDL/STL; hd64 1650 -> 1632) against main's kernels
# (.drv_kvf4). Driver backward, the order of each round rotated; bits compared.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L/tr
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
declare -A D=([main]=.drv_kvf4/jax_dash_sm90_check [notrace]=.drv_notrace/jax_dash_sm90_check)
chmod +x ${D[main]} ${D[notrace]}
timeout 60 ${D[notrace]} > $L/drv_default.txt 2>&1
echo "notrace drv default rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_default.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
run() {  # round variant spec...
  local r=$1 v=$2; shift 2
  local f=$L/tr/r${r}_$(echo "$@" | tr ' ' _)_$v.txt
  timeout 40 ${D[$v]} bench "$@" 40 > $f 2>&1
  grep "^bench" $f | sed "s/^/r$r $v /" >> $L/ab.txt
}
for r in 1 2 3 4 5; do
  o="main notrace"; [ $((r % 2)) = 0 ] && o="notrace main"
  for spec in "1 16384 16 16 128 1 symmetric_shift" "2 8192 16 16 128 1 symmetric_shift"; do
    for v in $o; do run $r $v $spec; done
  done
  if [ $r -le 3 ]; then
    for spec in "8 2048 16 16 128 1 symmetric_shift" "4 4096 16 16 128 0 shift" "32 512 32 32 64 0 shift" "8 2048 32 32 64 0 shift"; do
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
for k in sorted({k for k, _ in d}):
    a, b = d[(k, 'main')], d[(k, 'notrace')]
    print(f"{k}: main {' '.join(f'{x:.3f}' for x in a)} | notrace {' '.join(f'{x:.3f}' for x in b)} | "
          f"notrace/main sums {sum(b) / sum(a):.4f}, med {statistics.median(b) / statistics.median(a):.4f} | bits {'same' if len(bits[k]) == 1 else 'DIFFER'}")
PY
tar czf $OUT/c4.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt $L/verdict.txt
