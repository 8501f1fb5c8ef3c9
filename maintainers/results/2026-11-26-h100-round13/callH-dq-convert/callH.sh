set -u
PREBUILT=.prebuilt_conv STAGES="checks sanitize" SAN_TOOLS="memcheck synccheck initcheck" DEADLINE=200 bash scripts/device_round.sh > $OUT/round.txt 2>&1
tail -14 $OUT/round.txt
chmod +x .prebuilt_conv/jax_dash_sm90_check .prebuilt_narrow2/jax_dash_sm90_check
DRIVERS="main=.prebuilt_narrow2/jax_dash_sm90_check conv=.prebuilt_conv/jax_dash_sm90_check" SHAPES="32 512 16 16 128 0 shift;32 512 16 16 128 1 symmetric_shift;16 1024 16 16 128 0 shift;16 1024 16 16 128 1 symmetric_shift;32 512 32 32 64 1 symmetric_shift;16 1024 32 32 64 0 shift;8 2048 32 32 64 1 symmetric_shift;8 2048 16 16 128 0 shift;4 4096 32 32 64 0 shift;2 8192 16 16 128 0 shift" ROUNDS=3 ITERS=30 CHECKS=0 OUT=$OUT/ab DEADLINE=330 bash scripts/device_ab.sh > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
.prebuilt_conv/jax_dash_sm90_check bench 32 512 16 16 128 0 shift 5 | grep -A3 "writer hand\|^bench" | head -8
