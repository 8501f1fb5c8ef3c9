#!/bin/bash
# Twenty-fourth session call 1 (drivers only; each prints a hash of its backward's bits):
# backward: the window/lengths kernels (kMask, not kAllMasks) with S^T a step ahead (bnc =
# bwd-band-next-chain), + lse first (bl = bwd-band-lse), + two dQ writers (b2 = bwd-band-2w),
# against main (m = 7d13fa7); forward: the persistent kernel's turns running on across tiles
# (bnc; bl and b2 have main's forward).
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt 2>&1
V="m bnc bl b2"
for v in $V; do chmod +x .prebuilt_d$v/jax_dash_sm90_check; done
for v in m bnc; do
  timeout 100 .prebuilt_d$v/jax_dash_sm90_check > $L/drv_${v}_default.txt 2>&1; echo "drv $v default rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_${v}_default.txt | tail -1)" >> $L/summary.txt
done
for v in $V; do
  timeout 100 .prebuilt_d$v/jax_dash_sm90_check masks > $L/drv_${v}_masks.txt 2>&1; echo "drv $v masks rc=$? $(grep -E '^(PASS|FAIL)' $L/drv_${v}_masks.txt | tail -1)" >> $L/summary.txt
done
b() {  # b TAG DRIVER ENV SPEC...
  local tag=$1 v=$2 env=$3; shift 3
  env $env timeout 60 .prebuilt_d$v/jax_dash_sm90_check bench "$@" > $L/b.txt 2>&1
  grep "^bench" $L/b.txt | sed "s/^/$v $tag /" >> $L/bench.txt
}
for r in 1 2; do
  for spec in "1 16384 16 16 128 1 descending 5 4096" "1 16384 16 16 128 1 atomic 5 4096" \
              "2 8192 16 16 128 1 descending 5 4096" "2 8192 16 16 128 1 atomic 5 4096" \
              "1 16384 32 32 64 1 descending 5 4096" "1 16384 32 32 64 1 atomic 5 4096"; do
    for v in $V; do b r$r $v "" $spec; done
  done
  [ $(left) -lt 200 ] && break
  for spec in "8 2048 16 16 128 1 descending 10" "4 4096 16 16 128 1 descending 10" \
              "2 8192 16 16 128 1 descending 10" "1 16384 16 16 128 1 descending 10" \
              "8 2048 16 16 128 0 shift 10" "4 4096 16 16 128 0 shift 10" \
              "8 2048 32 32 64 1 descending 10" "4 4096 32 32 64 0 shift 10" \
              "32 512 32 32 64 1 descending 10" "16 1024 32 32 64 1 descending 10"; do
    for v in m bnc; do
      b fwd$r $v "" $spec
      case "$spec" in "2 8192"*|"1 16384"*) b fwdP$r $v "JAX_DASH_SM90_FWD=ws-persistent" $spec;; esac
    done
  done
done
t=$(left); [ $t -gt 150 ] && t=150
timeout $t compute-sanitizer --tool synccheck .prebuilt_dbnc/jax_dash_sm90_check masks > $L/synccheck_bnc.txt 2>&1; echo "synccheck bnc masks rc=$? $(grep -E 'ERROR SUMMARY' $L/synccheck_bnc.txt | tail -1)" >> $L/summary.txt
tar czf $OUT/c1.tgz -C $OUT logs
cat $L/gpu.txt $L/summary.txt
sed -E 's/ wave=[0-9]+//; s/bench B=//; s/Hkv=//; s/H=//; s/D=//; s/S=//' $L/bench.txt | sed -E 's/TFLOP\/s/T/g' | cut -c1-150
