#!/bin/bash
# Twenty-ninth session call 1: branch shift-stride (.prebuilt_stride; shift's items start
# floor(Nq / Nkv) Q tiles apart) against main's kernels (.prebuilt_mirror2). Driver checks of the
# branch (default, masks); hd128 full backward, shift (main), shift (branch), atomic (main),
# 3 interleaved rounds, each with its per-role trace; bench_attention hd128 full with the branch's
# wheel against cuDNN (issue 32's >= 1.05x line at 2k-16k).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L/ab $OUT/grid
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
M=.prebuilt_mirror2/jax_dash_sm90_check; B=.prebuilt_stride/jax_dash_sm90_check; chmod +x $M $B
for m in default masks; do
  a=""; [ $m != default ] && a=$m
  timeout 150 $B $a > $L/drv_$m.txt 2>&1
  echo "drv $m rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_$m.txt | tail -1) t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
done
for r in 1 2 3; do
  for shape in "8 2048 16 16 128 0" "4 4096 16 16 128 0" "2 8192 16 16 128 0" "1 16384 16 16 128 0"; do
    for v in main:shift branch:shift main:atomic; do
      D=$M; [ ${v%%:*} = branch ] && D=$B
      f=$L/ab/r${r}_$(echo $shape | cut -d' ' -f1-2 | tr ' ' x)_${v/:/_}.txt
      timeout 40 $D bench $shape ${v#*:} 10 > $f 2>&1
      grep "^bench" $f | sed "s/^/r$r ${v%%:*} /" >> $L/ab.txt
    done
  done
done
echo "ab done t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
python3 -m pip install -q --no-index --no-deps --force-reinstall .prebuilt_stride/*.whl > $L/pip.txt 2>&1
export JAX_DASH_GIT_COMMIT=$(cat calls/COMMIT) PYTHONPATH=$PWD
timeout 200 python3 benchmarks/bench_attention.py --impls jax_dash,cudnn --schedules auto,atomic --iters 10 --no-plots --seqs 2k,4k,8k,16k --out $OUT/grid --head-dims 128 --masks full > $L/grid.txt 2>&1; echo "grid rc=$? t=$(( $(date +%s) - T0 ))" >> $L/summary.txt
tar czf $OUT/c1.tgz -C $OUT logs grid
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=[0-9]+ //; s/H=//; s/D=//; s/S=//; s/ \([0-9]+ TFLOP\/s\)//g; s/, bits (....).*/ \1/' $L/ab.txt
grep -A8 "^## Backward TFLOP" $OUT/grid/results.md | tail -6
for f in $L/ab/r1_1x16384_*; do echo "$f"; grep -E "writer wait ticket|math wait dQ|writer fence|math  " $f; done
