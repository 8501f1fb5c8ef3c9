set -u
for d in main=.prebuilt_narrow2 conv=.prebuilt_conv; do
  n=${d%%=*}; p=${d#*=}/jax_dash_sm90_check; chmod +x $p
  timeout 200 ncu --section WarpStateStats --section SpeedOfLight --section SourceCounters -k regex:bwd_main_ws --launch-skip 2 -c 1 -f -o $OUT/ncu_$n $p bench 32 512 16 16 128 0 shift 3 > $OUT/ncu_$n.txt 2>&1
  ncu -i $OUT/ncu_$n.ncu-rep --page source --csv --print-source sass > $OUT/sass_$n.csv 2>/dev/null
  ncu -i $OUT/ncu_$n.ncu-rep --page details > $OUT/details_$n.txt 2>&1
  echo "== $n"; grep -E "Elapsed Cycles|Duration|Issue Slots Busy|Warp Cycles Per Issued|No Eligible" $OUT/details_$n.txt | head -8
  python3 scripts/ncu_stalls.py $OUT/sass_$n.csv 25 2>&1 | tail -40 > $OUT/stalls_$n.txt
  rm -f $OUT/ncu_$n.ncu-rep
done
head -60 $OUT/stalls_conv.txt
