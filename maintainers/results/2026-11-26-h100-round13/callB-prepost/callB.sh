set -u
chmod +x .prebuilt_pp/jax_dash_sm90_check .prebuilt_fs/jax_dash_sm90_check
DRIVERS="main=.prebuilt_fs/jax_dash_sm90_check pp=.prebuilt_pp/jax_dash_sm90_check" SHAPES="8 2048 16 16 128 0 shift;8 2048 16 16 128 1 symmetric_shift;8 2048 32 32 64 1 symmetric_shift;4 4096 32 32 64 0 shift;2 8192 16 16 128 0 shift" ROUNDS=2 CHECKS=0 OUT=$OUT/ab DEADLINE=170 bash scripts/device_ab.sh > $OUT/ab.txt 2>&1
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
for sh in "8 2048 16 16 128 0 shift" "8 2048 16 16 128 1 symmetric_shift" "8 2048 32 32 64 1 symmetric_shift"; do
  tag=$(echo $sh | tr ' ' _)
  timeout 100 ncu --clock-control none --cache-control none -k regex:bwd_ --launch-skip 6 -c 3 --metrics $M --csv .prebuilt_pp/jax_dash_sm90_check bench $sh 3 > $OUT/ncu_$tag.csv 2>/dev/null
  python3 - $OUT/ncu_$tag.csv "$sh" >> $OUT/breakdown.txt <<'PY'
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
h=rows[0]; ki=h.index("Kernel Name"); mi=h.index("Metric Name"); vi=h.index("Metric Value")
out={}
for r in rows[1:]:
    k=r[ki].split("<")[0].replace("void ","")
    out.setdefault(k,{})[r[mi]]=r[vi]
print(sys.argv[2], " | ".join(f"{k}: {v.get('gpu__time_duration.sum')} ns dram {v.get('dram__throughput.avg.pct_of_peak_sustained_elapsed')}%" for k,v in out.items()))
PY
done
PREBUILT=.prebuilt_pp STAGES="checks masks sanitize" SAN_TOOLS="memcheck synccheck initcheck" DEADLINE=330 JAX_DASH_GIT_COMMIT=8ba1e75 bash scripts/device_round.sh > $OUT/round.txt 2>&1
tail -25 $OUT/round.txt; cat $OUT/breakdown.txt; cat $OUT/ab.txt
