#!/bin/bash
# Twenty-second session call 2: backward time, SM clock and power, short burst against sustained load,
# jax_dash (main's kernels = .prebuilt_stsm for hd128) beside FA3, FA3 det and cuDNN.
set -u
cd "$(dirname "$0")/.."
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > $L/gpu.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_fa3/*.whl > $L/pip.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .prebuilt_stsm/*.whl >> $L/pip.txt 2>&1
rm -rf /tmp/site/jax_dash
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python3 benchmarks/results/2026-11-27-h100-power/call2/power.py --impls fa3,jax_dash:symmetric_shift,jax_dash:atomic,cudnn --out $OUT/power.json > $L/power.txt 2>&1; echo "power rc=$?" >> $L/summary.txt
JAX_DASH_BENCH_FA3_DETERMINISTIC=1 timeout 120 python3 benchmarks/results/2026-11-27-h100-power/call2/power.py --impls fa3_det --out $OUT/power_det.json > $L/power_det.txt 2>&1; echo "power det rc=$?" >> $L/summary.txt
cat $L/gpu.txt $L/summary.txt
python3 - <<'PY'
import json, os
rows = []
for f in ("power.json", "power_det.json"):
    p = os.path.join(os.environ["OUT"], f)
    if os.path.exists(p): rows += json.load(open(p))
for r in rows:
    if "error" in r: print(r["point"], r["impl"], r["error"][:200]); continue
    print(f'{r["point"]:34s} {r["impl"]:26s} short {r["short_ms"]:.3f} ms {r["short_tflops"]:.0f} | sust {r["sustained_ms"]:.3f} ms {r["sustained_tflops"]:.0f} | {r.get("clock_mhz",0):.0f} MHz (min {r.get("clock_min",0):.0f}) {r.get("power_w",0):.0f} W | Mcyc {r.get("mcycles_per_bwd",0):.2f} J {r.get("joules_per_bwd",0):.2f}')
PY
