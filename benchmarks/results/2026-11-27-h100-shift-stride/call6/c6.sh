#!/bin/bash
# Twenty-ninth session call 6: branch pre-vector (.prebuilt_vec: the preprocess's rows through
# shared memory as 16-byte loads) against main's final kernels (.prebuilt_stride). Driver checks
# of the branch (dsum / lse_log2 bitwise against the host replay included), memcheck; backward
# A/B, 2 interleaved rounds; ncu of the preprocess on both; every GPU test on the branch's wheel
# if the branch is faster on average and no shape is slower by more than 1%.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L/ncu
T0=$(date +%s); left() { echo $(( 400 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
S=.prebuilt_stride/jax_dash_sm90_check; V=.prebuilt_vec/jax_dash_sm90_check; chmod +x $S $V
for m in default masks; do
  a=""; [ $m != default ] && a=$m
  timeout 100 $V $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
timeout 60 compute-sanitizer --tool memcheck $V > $L/memcheck.txt 2>&1; echo "memcheck default rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
for r in 1 2; do
  for spec in "32 512 32 32 64 1 mirror" "16 1024 32 32 64 1 mirror" "32 512 32 32 64 0 shift" \
              "8 2048 32 32 64 0 shift" "8 2048 16 16 128 0 shift" "8 2048 16 16 128 1 symmetric_shift" \
              "4 4096 32 32 64 0 shift"; do
    for v in main branch; do
      D=$S; [ $v = branch ] && D=$V
      timeout 30 $D bench $spec 20 > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/r$r $v /" >> $L/ab.txt
    done
  done
done
echo "ab done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
for spec in "32 512 32 32 64 1 mirror" "8 2048 16 16 128 0 shift"; do
  for v in main branch; do
    D=$S; [ $v = branch ] && D=$V
    f=$L/ncu/$(echo $spec | tr ' ' _)_$v.txt
    timeout 40 ncu --kernel-name regex:bwd_preprocess --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy $D bench $spec 3 > $f 2>&1
    echo "$v $spec: $(grep -E '^ +Duration' $f | head -1 | tr -s ' ') | $(grep -E 'DRAM Throughput' $f | head -1 | tr -s ' ') | $(grep -E 'Achieved Occupancy' $f | head -1 | tr -s ' ') | $(grep -E 'Registers Per' $f | head -1 | tr -s ' ')" >> $L/ncu.txt
  done
done
echo "ncu done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
python3 - $L/ab.txt > $L/verdict.txt <<'PY'
import re, sys, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r'r\d (\w+) bench (.*?) wave=\d+: .* bwd ([\d.]+) ms', line)
    if m: d[(m.group(2), m.group(1))].append(float(m.group(3)))
ratios = {k: sum(d[(k, 'branch')]) / sum(d[(k, 'main')]) for k, v in d if v == 'main' and (k, 'branch') in d}
for k, r in ratios.items(): print(f"{k}: branch/main {r:.4f}")
ok = ratios and max(ratios.values()) <= 1.01 and sum(ratios.values()) / len(ratios) < 1.0
print("VERDICT", "faster" if ok else "not faster")
PY
cat $L/verdict.txt >> $L/summary.txt
if grep -q "VERDICT faster" $L/verdict.txt; then
  python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_vec/*.whl > $L/pip.txt 2>&1
  export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=/tmp/site_none:$PWD
  t=$(( $(left) - 5 )); [ $t -gt 260 ] && t=260; echo "gpu tests with ${t}s" >> $L/summary.txt
  OUT=$L timeout $t bash scripts/gpu_tests.sh 8 > $L/gpu_tests_summary.txt 2>&1; echo "gpu tests rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
  tail -2 $L/gpu_tests_summary.txt >> $L/summary.txt
fi
tar czf $OUT/c6.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt $L/ncu.txt
