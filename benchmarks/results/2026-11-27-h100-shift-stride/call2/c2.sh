#!/bin/bash
# Twenty-ninth session call 2: branch pre-order (.prebuilt_pre: the backward preprocess's warps in
# memory order) against main (.prebuilt_stride, the same kernels otherwise). Driver checks of the
# branch (the dsum / lse_log2 bitwise check against the host replay included), memcheck; backward
# A/B, 3 interleaved rounds; ncu of the preprocess kernel (third launch) on both.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L/ncu
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
S=.prebuilt_stride/jax_dash_sm90_check; P=.prebuilt_pre/jax_dash_sm90_check; chmod +x $S $P
for m in default masks; do
  a=""; [ $m != default ] && a=$m
  timeout 100 $P $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
timeout 60 compute-sanitizer --tool memcheck $P > $L/memcheck.txt 2>&1; echo "memcheck default rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
for r in 1 2 3; do
  for spec in "32 512 32 32 64 1 mirror" "16 1024 32 32 64 1 mirror" "32 512 32 32 64 0 shift" \
              "8 2048 16 16 128 0 shift" "8 2048 16 16 128 1 symmetric_shift" "4 4096 32 32 64 0 shift"; do
    for v in main branch; do
      D=$S; [ $v = branch ] && D=$P
      timeout 30 $D bench $spec 20 > $L/b.txt 2>&1
      grep "^bench" $L/b.txt | sed "s/^/r$r $v /" >> $L/ab.txt
    done
  done
done
echo "ab done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
for spec in "32 512 32 32 64 1 mirror" "8 2048 16 16 128 0 shift"; do
  for v in main branch; do
    D=$S; [ $v = branch ] && D=$P
    f=$L/ncu/$(echo $spec | tr ' ' _)_$v.txt
    timeout 60 ncu --kernel-name regex:bwd_preprocess --launch-skip 2 --launch-count 1 --section SpeedOfLight $D bench $spec 3 > $f 2>&1
    echo "$v $spec: $(grep -E '^ +Duration' $f | head -1 | tr -s ' ') | $(grep -E 'DRAM Throughput' $f | head -1 | tr -s ' ')" >> $L/ncu.txt
  done
done
echo "ncu done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tar czf $OUT/c2.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt $L/ncu.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=[0-9]+ //; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/ab.txt
