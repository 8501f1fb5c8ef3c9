"""Times the jax_dash Hopper forward against cuDNN's (jax.nn.dot_product_attention) in one process.

Paper grid rows at one sequence length: batch 2, hidden 2048 (heads = 2048 / head_dim), bf16, full
and causal masks. FLOPs: 4 * B * H * S^2 * D, halved for causal. Median of timed calls after a
warm-up, rotating between input sets so that no call reads inputs left in L2 by the previous one.
Writes a markdown table (--out) and prints it.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp

from jax_dash import _ffi


def median_ms(fn, inputs, warmup=3, reps=20):
    for i in range(warmup):
        jax.block_until_ready(fn(*inputs[i % len(inputs)]))
    times = []
    for i in range(reps):
        args = inputs[i % len(inputs)]
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--out", default="fwd_timing.md")
    args = parser.parse_args()

    gpu = jax.devices()[0]
    try:
        gpu_name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        gpu_name = gpu.device_kind
    rows = []
    for head_dim in (128, 64):
        heads = 2048 // head_dim
        shape = (args.batch, args.seq, heads, head_dim)
        keys = jax.random.split(jax.random.key(0), 9)
        inputs = [tuple(jax.random.normal(keys[3 * i + j], shape, jnp.bfloat16) for j in range(3))
                  for i in range(3)]
        scale = head_dim ** -0.5
        for is_causal in (False, True):
            ours = jax.jit(lambda q, k, v, c=is_causal: _ffi.fwd_call(q, k, v, scale, c)[0])
            cudnn = jax.jit(lambda q, k, v, c=is_causal: jax.nn.dot_product_attention(
                q, k, v, scale=scale, is_causal=c, implementation="cudnn"))
            flops = 4 * args.batch * heads * args.seq * args.seq * head_dim / (2 if is_causal else 1)
            t_ours = median_ms(ours, inputs)
            t_cudnn = median_ms(cudnn, inputs)
            rows.append((head_dim, "causal" if is_causal else "full", t_ours, t_cudnn,
                         flops / t_ours / 1e9, flops / t_cudnn / 1e9))
    lines = [
        f"# Forward timing: jax_dash sm90 vs cuDNN ({gpu_name})",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- jax {jax.__version__}; batch {args.batch}, seq {args.seq}, hidden 2048, bf16",
        "- command: `python3 maintainers/scripts/fwd_timing.py`",
        "- median of 20 calls after 3 warm-ups, 3 rotating input sets, wall clock around "
        "block_until_ready",
        "",
        "| head_dim | mask | jax_dash ms | cuDNN ms | jax_dash TFLOP/s | cuDNN TFLOP/s | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for d, mask, t_o, t_c, f_o, f_c in rows:
        lines.append(f"| {d} | {mask} | {t_o:.3f} | {t_c:.3f} | {f_o:.0f} | {f_c:.0f} | "
                     f"{t_c / t_o:.2f}x |")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
