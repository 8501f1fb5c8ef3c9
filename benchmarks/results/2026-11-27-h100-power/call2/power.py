"""Backward time, SM clock and board power, short burst against sustained load, per impl.

python calls/power.py --impls jax_dash:symmetric_shift,jax_dash:atomic,fa3,cudnn --out X.json
(fa3_det: a separate process with JAX_DASH_BENCH_FA3_DETERMINISTIC=1.)
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
import jax  # noqa: E402

import _grid  # noqa: E402
import _peers  # noqa: E402


def sampler():
    return subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
         "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def stop(proc):
    proc.terminate()
    out, _ = proc.communicate()
    rows = []
    for line in out.splitlines():
        try:
            rows.append([float(x) for x in line.split(",")])
        except ValueError:
            pass
    if not rows:
        return {}
    n = len(rows)
    return {"samples": n, "clock_mhz": sum(r[0] for r in rows) / n,
            "power_w": sum(r[1] for r in rows) / n, "temp_c": rows[-1][2],
            "clock_min": min(r[0] for r in rows)}


def measure(impl, point, seconds):
    name, _, schedule = impl.partition(":")
    fn = _peers.attention_fn(name, is_causal=point.is_causal, schedule=schedule or None,
                             head_dim=point.head_dim)
    inputs = _peers.random_inputs(point, num_sets=1)[0]
    check = None
    if name in _peers.CHECKED_IMPLS:
        check = _peers.check_against_reference(fn, *inputs, is_causal=point.is_causal)
    residuals, bwd = _peers.jitted_backward(fn)
    res = jax.block_until_ready(residuals(*inputs[:3]))
    for _ in range(3):
        jax.block_until_ready(bwd(res, inputs[3]))
    time.sleep(4.0)  # cool down to the idle clock
    t0 = time.perf_counter()
    for _ in range(5):
        r = bwd(res, inputs[3])
    jax.block_until_ready(r)
    short = (time.perf_counter() - t0) / 5
    proc = sampler()
    chunks = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(10):
            r = bwd(res, inputs[3])
        jax.block_until_ready(r)
        chunks.append((time.perf_counter() - t0) / 10)
    smi = stop(proc)
    tail = sorted(chunks[len(chunks) // 2:])
    sustained = tail[len(tail) // 2]
    flops = _grid.backward_flops(point)
    out = {"impl": impl, "point": point.label(), "short_ms": short * 1e3,
           "sustained_ms": sustained * 1e3, "short_tflops": flops / short / 1e12,
           "sustained_tflops": flops / sustained / 1e12, **smi}
    if smi:
        out["mcycles_per_bwd"] = sustained * smi["clock_mhz"]  # s * MHz = M cycles
        out["joules_per_bwd"] = sustained * smi["power_w"]
    if check is not None:
        out["check_ok"] = True
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impls", required=True)
    ap.add_argument("--seqs", default="8192,16384")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    results = []
    for seq in [int(s) for s in a.seqs.split(",")]:
        point = _grid.make_grid((128,), (seq,), ("causal",))[0]
        for impl in a.impls.split(","):
            try:
                r = measure(impl, point, a.seconds)
            except Exception as e:  # noqa: BLE001 - reported, the others still run
                r = {"impl": impl, "point": point.label(), "error": f"{type(e).__name__}: {e}"}
            results.append(r)
            print(json.dumps(r), flush=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
