#!/usr/bin/env bash
# Seventeenth session, call 3 (H100): the uniform-descriptor/stmatrix backward (bwd-uniform) against
# main's kernels: driver checks, bits digests old/new, kernel A/B, then the grid with FA3 peers.
set -u
mkdir -p "$OUT" /tmp/o
left() { echo $((570 - SECONDS)); }
log() { echo "$* at ${SECONDS}s" | tee -a /tmp/o/times.txt; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > /tmp/o/setup.log 2>&1
for x in gqa bu; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/jd_$x .prebuilt_$x/*.whl >> /tmp/o/setup.log 2>&1
  rm -rf /tmp/jd_$x/jax_dash; chmod +x .prebuilt_$x/jax_dash_sm90_check
done
rm -rf /tmp/site/jax_dash* /tmp/site/_jax_dash*
nvidia-smi --query-gpu=name,driver_version --format=csv > /tmp/o/gpu.txt
export PYTHONUNBUFFERED=1
NEW=.prebuilt_bu/jax_dash_sm90_check OLD=.prebuilt_gqa/jax_dash_sm90_check
timeout 150 $NEW > /tmp/o/check_new.log 2>&1; log "check new rc=$?"
timeout 100 $NEW masks > /tmp/o/check_new_masks.log 2>&1; log "check new masks rc=$?"
chmod +x .prebuilt_fdd/jax_dash_sm90_check; timeout 60 .prebuilt_fdd/jax_dash_sm90_check dropout > /tmp/o/check_fd_dropout.log 2>&1; log "check fwd-dropout rc=$?"
for x in gqa bu; do
  PYTHONPATH=$PWD:/tmp/jd_$x:/tmp/site timeout 150 python3 maintainers/scripts/bits_digest.py --out /tmp/o/bits_$x.json > /tmp/o/bits_$x.log 2>&1
  log "bits $x rc=$?"
done
python3 maintainers/scripts/bits_digest.py --compare /tmp/o/bits_gqa.json /tmp/o/bits_bu.json > /tmp/o/bits_compare.txt 2>&1; log "bits compare rc=$?"
SHAPES=("2 8192 16 16 128 1 symmetric_shift" "1 32768 16 8 128 1 symmetric_shift" "4 4096 16 8 128 1 symmetric_shift" "1 16384 16 16 128 0 shift" "2 8192 32 32 64 1 symmetric_shift" "8 2048 16 16 128 1 symmetric_shift")
for round in 1 2 3; do
  for s in "${SHAPES[@]}"; do
    for d in old=$OLD new=$NEW; do
      (( $(left) > 200 )) || break 3
      line=$(timeout 60 ${d#*=} bench $s 20 2>&1 | grep "^bench ")
      echo "$s|${d%%=*}|$line" >> /tmp/o/ab_raw.txt
    done
  done
done
log "ab done"
G=/tmp/grid
bench() { local l=$(( $(left) - 15 )); (( l > 30 )) || return 0
  PYTHONPATH=$PWD:/tmp/jd_bu:/tmp/site timeout $l python3 benchmarks/bench_attention.py --schedules auto --iters 10 \
    --item-timeout 90 --seqs 2k,4k,8k,16k --out $G "$@" >> /tmp/o/grid.log 2>&1; log "grid $* rc=$?"; }
bench --head-dims 128 --masks causal --impls jax_dash,cudnn,fa3,fa3_det
bench --head-dims 128 --masks full --impls jax_dash,cudnn
bench --head-dims 64 --masks causal,full --impls jax_dash,cudnn
cp -r $G /tmp/o/ 2>/dev/null
tar czf "$OUT/c3.tgz" -C /tmp/o .
cat /tmp/o/times.txt; cat /tmp/o/bits_compare.txt | head -5
python3 - <<'PY'
import re, collections, statistics
rows = collections.OrderedDict()
for line in open('/tmp/o/ab_raw.txt'):
    s, name, rest = line.rstrip('\n').split('|', 2)
    f = re.search(r'fwd ([0-9.]+) ms', rest); b = re.search(r'bwd ([0-9.]+) ms', rest)
    rows.setdefault(s, {}).setdefault(name, []).append(float(b.group(1)) if b else float('nan'))
for s, d in rows.items():
    o = statistics.median(d.get('old', [float('nan')])); n = statistics.median(d.get('new', [float('nan')]))
    print(f"{s:36s} bwd old {o:8.3f} new {n:8.3f} new/old {n/o:6.3f}")
PY
