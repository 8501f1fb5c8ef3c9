"""Backward-only timing of every jax_dash schedule against cuDNN's backward, same process, same GPU.

    python benchmarks/bwd_schedules_sm90.py [--seq 8192 --batch 2 --heads 16 --head-dim 128]

Times only the backward: jax_dash's raw FFI backward (fed the forward's out/lse), and cuDNN's
backward as the jitted vjp of jax.nn.dot_product_attention(implementation="cudnn"). Median of
--iters runs after warm-up. FLOPs: backward = 2.5 x 4*B*H*Sq*Sk*D, halved for causal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_dash import _ffi
from jax_dash.reference import reference_forward

SCHEDULES = tuple(_ffi.SCHEDULE_IDS)  # every kernel schedule ("auto" only picks one of them)


def _median_seconds(fn, args, warmup, iters):
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args()

    b, s, h, d = args.batch, args.seq, args.heads, args.head_dim
    dtype = jnp.bfloat16
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, dout = (jax.random.normal(key, (b, s, h, d), jnp.float32).astype(dtype)
                     for key in keys)
    scale = 1.0 / np.sqrt(d)
    device = jax.devices()[0]
    results = {"device": device.device_kind, "date": time.strftime("%Y-%m-%d"),
               "shape": [b, s, h, d], "dtype": "bfloat16", "rows": []}
    for is_causal in (False, True):
        mask = "causal" if is_causal else "full"
        flops = 2.5 * 4 * b * h * s * s * d * (0.5 if is_causal else 1.0)
        out, lse = jax.jit(reference_forward, static_argnames=("scale", "is_causal"))(
            q, k, v, scale=scale, is_causal=is_causal)
        out = out.astype(dtype)

        def cudnn_attention(q_, k_, v_, is_causal=is_causal):
            return jax.nn.dot_product_attention(q_, k_, v_, scale=scale, is_causal=is_causal,
                                                implementation="cudnn")

        _, cudnn_vjp = jax.vjp(cudnn_attention, q, k, v)
        cudnn_bwd = jax.jit(lambda vjp_fn, ct: vjp_fn(ct))
        cudnn_s = _median_seconds(cudnn_bwd, (cudnn_vjp, dout), args.warmup, args.iters)
        row = {"mask": mask, "impl": "cudnn", "ms": cudnn_s * 1e3,
               "tflops": flops / cudnn_s / 1e12, "vs_cudnn": 1.0}
        results["rows"].append(row)
        print(f"{mask:6s} {'cudnn':16s} {row['ms']:8.3f} ms {row['tflops']:7.1f} TFLOP/s", flush=True)
        for schedule in SCHEDULES:
            fn = jax.jit(lambda *a, schedule=schedule: _ffi.bwd_call(*a, scale, is_causal, schedule))
            sec = _median_seconds(fn, (q, k, v, out, lse, dout), args.warmup, args.iters)
            row = {"mask": mask, "impl": f"jax_dash/{schedule}", "ms": sec * 1e3,
                   "tflops": flops / sec / 1e12, "vs_cudnn": cudnn_s / sec}
            results["rows"].append(row)
            print(f"{mask:6s} {schedule:16s} {row['ms']:8.3f} ms {row['tflops']:7.1f} TFLOP/s "
                  f"{row['vs_cudnn']:5.2f}x cuDNN", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
