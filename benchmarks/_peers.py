"""The implementations under test, as plain functions (q, k, v) -> out over [B, S, H, D] arrays.

`jax_dash` is our op (one variant per backward schedule); `cudnn`, `cudnn_det` and `xla` are
`jax.nn.dot_product_attention`. `cudnn_det` is the same call as `cudnn`: what makes it
deterministic is XLA_FLAGS=--xla_gpu_deterministic_ops=true, which only a separate process can set
(see DETERMINISTIC_XLA_FLAG and bench_attention.py's worker groups).
"""

from __future__ import annotations

import os

DETERMINISTIC_XLA_FLAG = "--xla_gpu_deterministic_ops=true"


class Unavailable(Exception):
    """The implementation cannot run here (no GPU for cuDNN, jax_dash not built, ...)."""


def xla_flags_with_determinism(env: dict) -> dict:
    env = dict(env)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + DETERMINISTIC_XLA_FLAG).strip()
    return env


def process_is_deterministic() -> bool:
    return DETERMINISTIC_XLA_FLAG in os.environ.get("XLA_FLAGS", "")


def attention_fn(impl: str, *, is_causal: bool, schedule: str | None = None):
    """Returns f(q, k, v) -> out for `impl`, or raises Unavailable with the reason."""
    import jax
    if impl == "jax_dash":
        try:
            import jax_dash
        except Exception as e:  # not built / import error: recorded, the peers still run
            raise Unavailable(f"import jax_dash failed: {type(e).__name__}: {e}")
        sched = schedule or "auto"
        return lambda q, k, v: jax_dash.attention(q, k, v, is_causal=is_causal, schedule=sched)
    if impl in ("cudnn", "cudnn_det"):
        if jax.default_backend() != "gpu":
            raise Unavailable(f"cuDNN attention needs a CUDA GPU; this process runs on "
                              f"{jax.default_backend()!r}")
        if (impl == "cudnn_det") != process_is_deterministic():
            raise Unavailable(f"{impl} must run in a process with XLA_FLAGS "
                              f"{'containing' if impl == 'cudnn_det' else 'without'} "
                              f"{DETERMINISTIC_XLA_FLAG}")
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=is_causal, implementation="cudnn")
    if impl == "xla":
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=is_causal, implementation="xla")
    raise ValueError(f"impl={impl!r} is not one of jax_dash, cudnn, cudnn_det, xla")


def jitted_pair(fn):
    """(forward, forward+backward) jitted. The backward is the VJP with a given cotangent `dout`
    (equivalent to grad of sum(out * dout)); fwd+bwd returns only (dq, dk, dv)."""
    import jax

    def fwd_bwd(q, k, v, dout):
        _, vjp = jax.vjp(fn, q, k, v)
        return vjp(dout)

    return jax.jit(fn), jax.jit(fwd_bwd)


def jitted_backward(fn):
    """(residuals, backward), both jitted, to time the backward alone.

    `residuals(q, k, v)` runs the forward and returns its VJP function: a pytree that holds what
    the backward needs (for jax_dash q, k, v, out and the log-sum-exp; for XLA's attention the
    S^2 probabilities), exactly what a training step keeps from its forward. `backward(vjp_fn,
    dout)` runs the backward only and returns (dq, dk, dv).
    """
    import jax

    def residuals(q, k, v):
        return jax.vjp(fn, q, k, v)[1]

    def backward(vjp_fn, dout):
        return vjp_fn(dout)

    return jax.jit(residuals), jax.jit(backward)


def random_inputs(point, *, num_sets: int, dtype_name: str = "bfloat16", seed: int = 0):
    """`num_sets` independent (q, k, v, dout) tuples of standard normals (never zeros)."""
    import jax
    import jax.numpy as jnp
    dtype = jnp.dtype(dtype_name)
    shape = (point.batch, point.seq, point.heads, point.head_dim)
    sets = []
    for i in range(num_sets):
        keys = jax.random.split(jax.random.key(seed * 1000 + i), 4)
        sets.append(tuple(jax.random.normal(kk, shape, dtype) for kk in keys))
    return sets
