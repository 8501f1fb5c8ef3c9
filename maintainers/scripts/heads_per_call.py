"""Does a kernel call with fewer heads cost more per head? Times jax_dash.attention's forward and
backward (one GPU, bf16, head_dim 128) on the block shapes the ring's steps run (issue 35: the
ring's head groups), with 16 heads in one call against the same work as 4 calls of 4 heads.

    python maintainers/scripts/heads_per_call.py [local_tokens ...]   (default 131072 65536)
    python maintainers/scripts/heads_per_call.py --split [local_tokens ...]  (forward, backward
                                                                           apart, per schedule)
"""
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_dash


def timed(fn, args, runs=5):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def program(is_causal):
    def run(q, k, v, dout):
        out, vjp = jax.vjp(functools.partial(jax_dash.attention, is_causal=is_causal), q, k, v)
        return (out, *vjp(dout))
    return jax.jit(run)


def split_timing(local):
    """The forward alone and the backward alone (a VJP on precomputed residuals) of the full
    block at ``local`` tokens, 16 heads against 4 x 4 heads, and each schedule's backward."""
    for schedule in ("auto", "descending", "shift", "symmetric_shift"):
        ms = {}
        for heads in (16, 4):
            key = jax.random.split(jax.random.PRNGKey(0), 4)
            q, k, v, dout = (jax.random.normal(kk, (1, local, heads, 128), jnp.bfloat16)
                             for kk in key)
            fn = functools.partial(jax_dash.attention, schedule=schedule)
            fwd = jax.jit(lambda q, k, v: jax.vjp(fn, q, k, v))
            out, vjp = fwd(q, k, v)
            bwd = jax.jit(lambda vjp, d: vjp(d))
            ms[heads] = (timed(jax.jit(fn), (q, k, v)) * 1e3, timed(bwd, (vjp, dout)) * 1e3)
            del q, k, v, dout, out, vjp
        print(f"{local:>7} full {schedule:>16}: forward {ms[16][0]:8.2f} / {4 * ms[4][0]:8.2f} "
              f"({4 * ms[4][0] / ms[16][0]:.3f}), backward {ms[16][1]:8.2f} / {4 * ms[4][1]:8.2f} "
              f"({4 * ms[4][1] / ms[16][1]:.3f})", flush=True)


def main():
    if sys.argv[1:2] == ["--split"]:
        for local in [int(x) for x in sys.argv[2:]] or [131072]:
            split_timing(local)
        return
    lengths = [int(x) for x in sys.argv[1:]] or [131072, 65536]
    print(f"{jax.devices()[0].device_kind}; ms of forward + backward; 'x4' = 4 calls of 4 heads")
    print(f"{'local':>7} {'step':>16} {'16 heads':>9} {'4 x 4 heads':>11} {'ratio':>6}")
    for local in lengths:
        half = local // 2
        for name, lq, lk, causal in (("diagonal causal", local, local, True),
                                     ("full block", local, local, False),
                                     ("zigzag earlier", local, half, False),
                                     ("zigzag later", half, local, False)):
            ms = {}
            for heads in (16, 4):
                key = jax.random.split(jax.random.PRNGKey(0), 4)
                q = jax.random.normal(key[0], (1, lq, heads, 128), jnp.bfloat16)
                k = jax.random.normal(key[1], (1, lk, heads, 128), jnp.bfloat16)
                v = jax.random.normal(key[2], (1, lk, heads, 128), jnp.bfloat16)
                dout = jax.random.normal(key[3], (1, lq, heads, 128), jnp.bfloat16)
                ms[heads] = timed(program(causal), (q, k, v, dout)) * 1e3
                del q, k, v, dout
            print(f"{local:>7} {name:>16} {ms[16]:9.2f} {4 * ms[4]:11.2f} {4 * ms[4] / ms[16]:6.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
