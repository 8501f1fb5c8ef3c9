#!/usr/bin/env bash
# A/B of standalone drivers (tests/sm90_check.cu builds) in one device call, for kernel variants
# built off the GPU machine: each driver first runs its checks (the default cases against the fp64
# host reference, then "variants": the kernel variants' bits against each other), then every shape
# is timed with every driver in turn, ROUNDS times (interleaved, so drift hits all alike).
#   DRIVERS="main=.drv/main feature=.drv/feature" SHAPES="8 2048 16 16 128 1 shift;..." \
#     bash maintainers/scripts/device_ab.sh
# env: ROUNDS (default 3), ITERS (driver bench iterations, default 20), RUN_ENVS (';'-separated
#      environment settings, each shape timed once per setting, default one run with none),
#      CHECKS=0 skips the checks, OUT (logs; default ./device_out), DEADLINE seconds (default 560).
# Prints one line per (shape, setting, driver): median forward and backward ms over the rounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device_out}; mkdir -p "$OUT"
DEADLINE=${DEADLINE:-560}
read -r -a drivers <<<"${DRIVERS:?DRIVERS=\"name=path ...\" is required}"
IFS=';' read -r -a shapes <<<"${SHAPES:?SHAPES=\"B S H Hkv D causal schedule;...\" is required}"
IFS=';' read -r -a envs <<<"${RUN_ENVS:-}"
(( ${#envs[@]} == 0 )) && envs=("")
for d in "${drivers[@]}"; do chmod +x "${d#*=}" 2>/dev/null; done
if [[ ${CHECKS:-1} != 0 ]]; then
  for d in "${drivers[@]}"; do
    name=${d%%=*}; path=${d#*=}
    for mode in "" variants; do
      timeout 120 "$path" $mode >"$OUT/check_${name}${mode:+_$mode}.log" 2>&1
      echo "check $name ${mode:-default}: rc=$? $(tail -n 1 "$OUT/check_${name}${mode:+_$mode}.log")"
    done
  done
fi
: >"$OUT/ab_raw.txt"
for ((round = 0; round < ${ROUNDS:-3}; ++round)); do
  for shape in "${shapes[@]}"; do
    for e in "${!envs[@]}"; do
      for d in "${drivers[@]}"; do
        (( SECONDS > DEADLINE )) && { echo "deadline: stopped in round $round"; break 4; }
        name=${d%%=*}; path=${d#*=}
        line=$(timeout 60 env ${envs[$e]} "$path" bench $shape "${ITERS:-20}" 2>&1 | grep "^bench ")
        fwd=$(sed -n 's/.*fwd \([0-9.]*\) ms.*/\1/p' <<<"$line")
        bwd=$(sed -n 's/.*bwd \([0-9.]*\) ms.*/\1/p' <<<"$line")
        echo "$shape|${envs[$e]:-default}|$name|${fwd:-nan}|${bwd:-nan}" >>"$OUT/ab_raw.txt"
      done
    done
  done
done
python3 - "$OUT/ab_raw.txt" <<'PY'
import sys, statistics, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    shape, env, name, fwd, bwd = line.rstrip("\n").split("|")
    rows.setdefault((shape, env), collections.OrderedDict()).setdefault(name, []).append(
        (float(fwd), float(bwd)))
print(f"{'shape':34} {'setting':28} {'driver':10} {'fwd ms':>8} {'vs 1st':>7} {'bwd ms':>8} {'vs 1st':>7}  n")
for (shape, env), by_name in rows.items():
    base = None
    for name, samples in by_name.items():
        fwd = statistics.median(s[0] for s in samples)
        bwd = statistics.median(s[1] for s in samples)
        if base is None:
            base = (fwd, bwd)
        print(f"{shape:34} {env[:28]:28} {name:10} {fwd:8.3f} {fwd / base[0]:7.3f} {bwd:8.3f} "
              f"{bwd / base[1]:7.3f}  {len(samples)}")
PY
