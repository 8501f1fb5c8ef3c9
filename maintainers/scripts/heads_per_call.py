"""Does a kernel call with fewer heads cost more per head? Times jax_dash.attention's forward and
backward (one GPU, bf16, head_dim 128) on the block shapes the ring's steps run (issue 35: the
ring's head groups), with 16 heads in one call against the same work as 4 calls of 4 heads.

    python maintainers/scripts/heads_per_call.py [local_tokens ...]   (default 131072 65536)
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


def main():
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
