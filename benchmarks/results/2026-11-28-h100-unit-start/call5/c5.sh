#!/bin/bash
# Thirtieth session call 5: the long points of the unit-start change, where calls 1-4 read a tie
# inside a 7% spread: main's kernels before (.drv_vec) against main's current ones (.prebuilt_kvf3,
# b86afa9), 6 interleaved rounds of the driver's backward at hd128 causal 2 x 8k and 1 x 16k
# (symmetric_shift) and hd128 full 4 x 4k (shift).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
M=.drv_vec/jax_dash_sm90_check; B=.prebuilt_kvf3/jax_dash_sm90_check; chmod +x $M $B
for r in 1 2 3 4 5 6; do
  for spec in "2 8192 16 16 128 1 symmetric_shift" "1 16384 16 16 128 1 symmetric_shift" \
              "4 4096 16 16 128 0 shift"; do
    for v in main new; do
      D=$M; [ $v = new ] && D=$B
      timeout 30 $D bench $spec 20 > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/r$r $v /" >> $L/ab.txt
    done
  done
  echo "round $r t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
python3 - $L/ab.txt > $L/verdict.txt <<'PY'
import re, sys, collections, statistics
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r'r\d (\w+) bench (.*?) wave=\d+: .* bwd ([\d.]+) ms', line)
    if m: d[(m.group(2), m.group(1))].append(float(m.group(3)))
for k in sorted({k for k, _ in d}):
    a, b = d[(k, 'main')], d[(k, 'new')]
    print(f"{k}: main {' '.join(f'{x:.3f}' for x in a)} | new {' '.join(f'{x:.3f}' for x in b)} | "
          f"new/main sums {sum(b) / sum(a):.4f}, medians {statistics.median(b) / statistics.median(a):.4f}")
PY
tar czf $OUT/c5.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt $L/verdict.txt
