#!/usr/bin/env bash
# The GPU-machine wrapper: one run on a Hopper machine, in stages, each under its own time limit and
# all within DEADLINE seconds (default 570) of the start; logs go to a scratch folder and come back
# as one tarball plus the short text files under $OUT.
#   STAGES="build checks tests bench" JAX_DASH_GIT_COMMIT=<commit> bash scripts/device_round.sh
# (name the commit: the benchmark records JAX_DASH_GIT_COMMIT when it is set, and a copied tree
# may carry a stale .git)
# Stages:
#   build     pip wheel + install (the wheel and the standalone driver are copied to $OUT, so a
#             later run can take them back in a folder named by PREBUILT and skip the build;
#             maintainers/scripts/build_here.sh builds such a folder on a machine without a GPU)
#   sass      count HGMMA (wgmma) instructions per kernel in the built extension (cuobjdump);
#             fails if the forward kernel has none
#   checks    the standalone driver (tests/sm90_check.cu): default kernels, the forward variants'
#             bits, the masked kernels' cases (driver mode "masks") and dropout's ("dropout")
#   sanitize  scripts/sanitize.sh over the driver (SAN_TOOLS, default all four; SAN_ENV e.g.
#             "JAX_DASH_SM90_FWD=ws"); with "masks" in STAGES also memcheck, synccheck and
#             initcheck over the masked cases
#   ncu       Nsight Compute over the driver's bench (NCU_SHAPES, ';'-separated "B S H Hkv D causal
#             schedule"): forward and backward main kernels, speed of light, warp states and the
#             per-SASS-instruction stall samples (source page as CSV, in the tarball; summarise
#             with maintainers/scripts/ncu_sass_hotspots.py)
#   kbench    kernel-only timings of the default kernels with the driver's bench (KBENCH_SHAPES,
#             ';'-separated, default the headline shapes; KBENCH_ENV e.g. "JAX_DASH_SM90_FWD=ws";
#             KBENCH_RUNS e.g. "JAX_DASH_SM90_FWD=ws;JAX_DASH_SM90_FWD=ws-persistent": every
#             shape once per ';'-separated environment setting, logs kbench_r<i>_<shape>;
#             KBENCH_BASE=path/to/another/jax_dash_sm90_check: each shape timed with it too, right
#             after, logs kbench_base_<shape>)
#   ab        A/B of several standalone drivers (kernel variants built elsewhere): DRIVERS="name=path
#             ..." and SHAPES="B S H Hkv D causal schedule;..." are required; each driver first runs
#             its default and variants checks (AB_CHECKS=0 skips them), then every shape is timed
#             with every driver in turn, AB_ROUNDS times (default 3; interleaved, so drift hits all
#             alike), once per ';'-separated RUN_ENVS setting; AB_ITERS driver iterations (20).
#             Prints the median forward and backward ms per (shape, setting, driver); raw rows in
#             $OUT/ab_raw.txt
#   probe     tests/racecheck_probe.cu under racecheck: race-free and with a planted race
#   tests     scripts/gpu_tests.sh (GPU_TEST_ARGS appended, e.g. "-k bwd")
#   bench     benchmarks/bench_attention.py $BENCH_ARGS --out $SCRATCH/bench (results.md/json)
#   memory    benchmarks/bench_attention.py --skip-timing --memory $MEMORY_ARGS, same --out
#   maskbench benchmarks/bench_masks.py --cudnn $MASKBENCH_ARGS (the sliding-window and packed
#             points; JSON to $OUT/mask_results.json)
#   ring      benchmarks/bench_ring.py $RING_ARGS (ring attention over every local GPU; on one GPU
#             pass --ring-sizes 1 for a smoke run; JSON to $OUT/ring_results.json)
set -uo pipefail
cd "$(dirname "$0")/.."
RESULT=${OUT:-$PWD/device_out}
SCRATCH=${SCRATCH:-/tmp/device_round}
DEADLINE=${DEADLINE:-570}
STAGES=${STAGES:-build checks tests}
PY=${PYTHON:-python3}
mkdir -p "$RESULT" "$SCRATCH"
export PYTHONUNBUFFERED=1
summary=()
stage() {  # stage NAME LIMIT CMD...: at most LIMIT seconds and never past the deadline
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - SECONDS - 15))
  (( left < limit )) && limit=$left
  if (( limit < 20 )); then summary+=("$name: skipped (deadline)"); return 1; fi
  local start=$SECONDS rc=0
  timeout "$limit" "$@" >"$SCRATCH/$name.log" 2>&1 || rc=$?
  summary+=("$name: rc=$rc ($((SECONDS - start))s) $(grep -v '^\s*$' "$SCRATCH/$name.log" | tail -n 1 | cut -c1-150)")
  return $rc
}
has() { [[ " $STAGES " == *" $1 "* ]]; }
driver() { find build prebuilt_driver -name jax_dash_sm90_check -type f 2>/dev/null | head -n 1; }

stage cutlass 120 "$PY" -m pip install -q --no-index --no-deps .whl/nvidia_cutlass*.whl
if [[ -n "${PREBUILT:-}" ]] && ls "$PREBUILT"/*.whl >/dev/null 2>&1; then
  stage install 120 "$PY" -m pip install --no-index --no-deps --force-reinstall "$PREBUILT"/*.whl
  mkdir -p prebuilt_driver && cp "$PREBUILT/jax_dash_sm90_check" prebuilt_driver/ && chmod +x prebuilt_driver/*
elif has build; then
  rm -rf "$SCRATCH/wheel"
  stage build 420 "$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$SCRATCH/wheel" . &&
    stage install 120 "$PY" -m pip install --no-index --no-deps --force-reinstall "$SCRATCH"/wheel/*.whl
  cp "$SCRATCH"/wheel/*.whl "$RESULT/" 2>/dev/null
  d=$(driver); [[ -n "$d" ]] && cp "$d" "$RESULT/"
fi
D=$(driver)
if has sass; then
  stage sass 60 bash -c 'so=$("$0" -c "import _jax_dash as m; print(m.__file__)") || exit 1
    echo "extension: $so"; cuobjdump -sass "$so" >"$1/sass.txt" || exit 1
    awk "/Function :/ {name=\$3} /HGMMA/ {h[name]++} /[^H]HMMA/ {m[name]++}
      END {for (n in h) print \"HGMMA\", h[n], n; for (n in m) print \"HMMA(no wgmma)\", m[n], n}" \
      "$1/sass.txt" | sort | tee "$1/sass_summary.txt"
    grep -q "^HGMMA .*fwd_kernel" "$1/sass_summary.txt"' "$PY" "$SCRATCH"
  rm -f "$SCRATCH/sass.txt"
fi
if has checks && [[ -n "$D" ]]; then
  stage check_default 90 "$D"
  stage variants 90 "$D" variants
  stage check_masks 120 "$D" masks
  stage check_dropout 120 "$D" dropout
fi
if has ncu && [[ -n "$D" ]]; then
  IFS=';' read -r -a ncu_shapes <<<"${NCU_SHAPES:-2 8192 16 16 128 0 descending;1 16384 32 32 64 0 descending}"
  for shape in "${ncu_shapes[@]}"; do
    tag=$(echo $shape | tr ' ' '_')
    stage "ncu_$tag" 120 ncu --section SpeedOfLight --section WarpStateStats --section SourceCounters \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
      -k 'regex:bwd_main_ws|fwd_kernel' -c 2 -f -o "$SCRATCH/ncu_$tag" "$D" bench $shape 1 &&
    { ncu -i "$SCRATCH/ncu_$tag.ncu-rep" --page details >"$SCRATCH/ncu_${tag}_details.txt" 2>&1
      ncu -i "$SCRATCH/ncu_$tag.ncu-rep" --page source --csv --print-source sass \
        >"$SCRATCH/ncu_${tag}_sass.csv" 2>&1 ||
        ncu -i "$SCRATCH/ncu_$tag.ncu-rep" --page source --csv >"$SCRATCH/ncu_${tag}_sass.csv" 2>&1
      rm -f "$SCRATCH/ncu_$tag.ncu-rep"; }
  done
fi
if has probe; then
  stage probe_build 120 nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o "$SCRATCH/probe" \
    tests/racecheck_probe.cu &&
  for mode in both unit handshake race; do
    stage "probe_$mode" 60 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 100000 \
      "$SCRATCH/probe" $mode
    # hazards per (kind, write line, read line)
    grep -A2 "Potential" "$SCRATCH/probe_$mode.log" | grep -o "Potential [A-Z]* hazard\|racecheck_probe.cu:[0-9]*" |
      paste -sd' ' | sed 's/Potential/\nPotential/g' | sed 's/ *$//' | grep . | sort | uniq -c >"$SCRATCH/probe_${mode}_pairs.txt"
  done
fi
if has kbench && [[ -n "$D" ]]; then
  IFS=';' read -r -a kb_shapes <<<"${KBENCH_SHAPES:-2 8192 16 16 128 0 descending;2 8192 16 16 128 0 atomic;2 8192 16 16 128 1 symmetric_shift;1 16384 32 32 64 0 descending;1 16384 32 32 64 0 atomic;1 16384 32 32 64 1 symmetric_shift;8 2048 16 16 128 0 descending;8 2048 32 32 64 0 descending}"
  # The runs, each a log-name tag and an environment setting: KBENCH_RUNS (tags r0, r1, ...),
  # or the defaults (no tag).
  tags=(); envs=()
  if [[ -n "${KBENCH_RUNS:-}" ]]; then
    IFS=';' read -r -a envs <<<"$KBENCH_RUNS"
    for i in "${!envs[@]}"; do tags+=("r${i}_"); done
  else
    tags=(""); envs=("")
  fi
  for shape in "${kb_shapes[@]}"; do
    for i in "${!envs[@]}"; do
      stage "kbench_${tags[$i]}$(echo $shape | tr ' ' '_')" 60 env ${KBENCH_ENV:-} ${envs[$i]} \
        "$D" bench $shape "${BENCH_ITERS:-20}"
      # KBENCH_BASE: another driver (e.g. .prebuilt/jax_dash_sm90_check, main's kernels), timed
      # right after on the same shape and setting, for a before/after in one call.
      if [[ -n "${KBENCH_BASE:-}" ]]; then
        chmod +x "$KBENCH_BASE" 2>/dev/null
        stage "kbench_base_${tags[$i]}$(echo $shape | tr ' ' '_')" 60 env ${KBENCH_ENV:-} \
          ${envs[$i]} "$KBENCH_BASE" bench $shape "${BENCH_ITERS:-20}"
      fi
    done
  done
fi
if has ab; then
  read -r -a ab_drivers <<<"${DRIVERS:-}"
  IFS=';' read -r -a ab_shapes <<<"${SHAPES:-}"
  IFS=';' read -r -a ab_envs <<<"${RUN_ENVS:-}"
  (( ${#ab_envs[@]} == 0 )) && ab_envs=("")
  if (( ${#ab_drivers[@]} == 0 || ${#ab_shapes[@]} == 0 )); then
    summary+=("ab: skipped (DRIVERS=\"name=path ...\" and SHAPES=\"B S H Hkv D causal schedule;...\" are required)")
  else
    for d in "${ab_drivers[@]}"; do chmod +x "${d#*=}" 2>/dev/null; done
    if [[ ${AB_CHECKS:-1} != 0 ]]; then
      for d in "${ab_drivers[@]}"; do
        stage "ab_check_${d%%=*}" 120 "${d#*=}"
        stage "ab_check_${d%%=*}_variants" 120 "${d#*=}" variants
      done
    fi
    : >"$RESULT/ab_raw.txt"
    for ((round = 0; round < ${AB_ROUNDS:-3}; ++round)); do
      for shape in "${ab_shapes[@]}"; do
        for e in "${!ab_envs[@]}"; do
          for d in "${ab_drivers[@]}"; do
            (( SECONDS > DEADLINE - 30 )) && { summary+=("ab: deadline, stopped in round $round"); break 4; }
            line=$(timeout 60 env ${ab_envs[$e]} "${d#*=}" bench $shape "${AB_ITERS:-20}" 2>&1 | grep "^bench ")
            fwd=$(sed -n 's/.*fwd \([0-9.]*\) ms.*/\1/p' <<<"$line")
            bwd=$(sed -n 's/.*bwd \([0-9.]*\) ms.*/\1/p' <<<"$line")
            echo "$shape|${ab_envs[$e]:-default}|${d%%=*}|${fwd:-nan}|${bwd:-nan}" >>"$RESULT/ab_raw.txt"
          done
        done
      done
    done
    "$PY" - "$RESULT/ab_raw.txt" >"$RESULT/ab.txt" <<'PY'
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
  fi
fi
if has tests; then
  stage tests 400 env OUT="$SCRATCH/gt" bash scripts/gpu_tests.sh 8 --timeout 120 ${GPU_TEST_ARGS:-}
  cp "$SCRATCH/gt/gpu_tests.log" "$RESULT/" 2>/dev/null
fi
# Sanitizers last but the benchmark: slow, and the other stages answer the call's question.
if has sanitize && [[ -n "$D" ]]; then
  stage sanitize 400 env ${SAN_ENV:-} OUT="$SCRATCH/san" LIMIT="${SAN_LIMIT:-150}" \
    TOOLS="${SAN_TOOLS:-memcheck racecheck synccheck initcheck}" bash scripts/sanitize.sh "$D"
  has masks && stage sanitize_masks 300 env OUT="$SCRATCH/san_masks" LIMIT="${SAN_LIMIT:-150}" \
    DRIVER_ARGS=masks TOOLS="memcheck synccheck initcheck" bash scripts/sanitize.sh "$D"
fi
if has bench; then
  stage bench 560 "$PY" benchmarks/bench_attention.py ${BENCH_ARGS:-} --no-plots --out "$SCRATCH/bench"
  cp "$SCRATCH/bench/results.md" "$RESULT/bench_results.md" 2>/dev/null
  cp "$SCRATCH/bench/results.json" "$RESULT/bench_results.json" 2>/dev/null
fi
if has memory; then
  stage memory 400 "$PY" benchmarks/bench_attention.py --skip-timing --memory ${MEMORY_ARGS:-} \
    --no-plots --out "$SCRATCH/bench"
  cp "$SCRATCH/bench/results.md" "$RESULT/bench_results.md" 2>/dev/null
  cp "$SCRATCH/bench/results.json" "$RESULT/bench_results.json" 2>/dev/null
fi
if has maskbench; then
  stage maskbench 400 "$PY" benchmarks/bench_masks.py --cudnn ${MASKBENCH_ARGS:-} \
    --out "$SCRATCH/mask_results.json"
  cp "$SCRATCH/mask_results.json" "$RESULT/" 2>/dev/null
fi
if has ring; then
  stage ring "${RING_LIMIT:-450}" "$PY" benchmarks/bench_ring.py ${RING_ARGS:-} --out "$SCRATCH/ring_results.json"
  cp "$SCRATCH/ring_results.json" "$RESULT/" 2>/dev/null
fi
tar czf "$RESULT/logs.tgz" -C "$SCRATCH" --exclude=wheel . 2>/dev/null
echo "==== device_round ($(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1), git ${JAX_DASH_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null) (device .git, may be stale)}) ===="
printf '%s\n' "${summary[@]}"
[[ -f "$SCRATCH/sass_summary.txt" ]] && head -n 20 "$SCRATCH/sass_summary.txt"
[[ -f "$RESULT/ab.txt" ]] && cat "$RESULT/ab.txt"
[[ -f "$SCRATCH/sanitize.log" ]] && cat "$SCRATCH/sanitize.log"
for f in "$SCRATCH"/kbench_*.log; do
  [[ -f $f ]] && echo "$(basename "$f" .log | sed 's/^kbench_//; s/_[0-9].*//; s/^[0-9]*$/default/'): $(grep -h "^bench " "$f")"
  [[ -f $f ]] && grep -h "math wait dQ buffer\|writer\|math epilogue" "$f" | sed 's/^ */    /'
done
for m in both unit handshake race; do
  f="$SCRATCH/probe_$m.log"
  [[ -f $f ]] && echo "probe $m: $(grep -E "RACECHECK SUMMARY|probe \(" $f | tr '\n' ' ')" && cat "$SCRATCH/probe_${m}_pairs.txt"
done
[[ -f "$SCRATCH/ring.log" ]] && tail -n 30 "$SCRATCH/ring.log"
[[ -f "$SCRATCH/maskbench.log" ]] && grep "TFLOP/s (visible work)" "$SCRATCH/maskbench.log"
[[ -f "$SCRATCH/gt/gpu_tests.log" ]] && grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$SCRATCH/gt/gpu_tests.log" | tail -n 15
exit 0
