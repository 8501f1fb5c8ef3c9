"""The public op: ``jax_dash.attention``."""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from jax_dash import _ffi, sharding

# "auto" plus the schedules the kernels know (their ids live in _ffi, mirroring schedule.h).
SCHEDULES = ("auto",) + tuple(_ffi.SCHEDULE_IDS)
_CPU_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
MAX_HEAD_DIM = 256


def attention(query, key, value, *, scale=None, is_causal=False, schedule="auto"):
    """Scaled dot-product attention with a bitwise-reproducible backward pass.

    A drop-in for ``jax.nn.dot_product_attention(query, key, value, scale=..., is_causal=...)``.

    Args:
      query: ``[batch, seq_q, num_heads, head_dim]``, or ``[seq_q, num_heads, head_dim]``.
      key: ``[batch, seq_kv, num_kv_heads, head_dim]`` (or without batch, like ``query``).
        ``num_heads`` must be a multiple of ``num_kv_heads`` (GQA/MQA): query head ``h`` reads
        kv head ``h // (num_heads // num_kv_heads)``.
      value: same shape as ``key``.
      scale: softmax scale, a Python number; default ``1 / sqrt(head_dim)``.
      is_causal: top-left causal mask: query ``i`` sees key ``j`` iff ``j <= i`` (the meaning of
        ``jax.nn.dot_product_attention``). A query that sees no key outputs 0 and gets zero
        gradient.
      schedule: backward tile schedule. ``"auto"`` (pick per shape), ``"ascending"``,
        ``"descending"``, ``"shift"``, ``"symmetric_shift"`` give bitwise-reproducible gradients;
        ``"atomic"`` is faster-racing and not reproducible (a reference for the cost of
        determinism). Every schedule computes the same function up to rounding.

    Returns:
      Array with the shape and dtype of ``query``.

    dtypes: bfloat16 and float16 on GPU (Hopper, head_dim 64 or 128); the CPU kernels also take
    float32 and any head_dim that is a multiple of 8 up to 256.
    """
    query, key, value = (_as_array(x, name) for x, name in
                         ((query, "query"), (key, "key"), (value, "value")))
    _check_shapes(query, key, value)
    _check_dtypes(query, key, value)
    head_dim = query.shape[-1]
    scale = _check_scale(scale, head_dim)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a Python bool, got {is_causal!r} "
                        f"(type {type(is_causal).__name__})")
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {', '.join(SCHEDULES)}")

    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    if schedule == "auto":
        schedule = _auto_schedule(query.shape, key.shape, bool(is_causal))
    out = _attention(query, key, value, scale, bool(is_causal), schedule)
    return out[0] if unbatched else out


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _attention(q, k, v, scale, is_causal, schedule):
    out, _ = sharding.forward_op(scale, is_causal)(q, k, v)
    return out


def _attention_fwd(q, k, v, scale, is_causal, schedule):
    out, lse = sharding.forward_op(scale, is_causal)(q, k, v)
    return out, (q, k, v, out, lse)


def _attention_bwd(scale, is_causal, schedule, residuals, dout):
    q, k, v, out, lse = residuals
    return sharding.backward_op(scale, is_causal, schedule)(q, k, v, out, lse,
                                                            dout.astype(out.dtype))


_attention.defvjp(_attention_fwd, _attention_bwd)


def _auto_schedule(q_shape, k_shape, is_causal):
    """The schedule for ``schedule="auto"``: ``jax_dash.schedules.choose_schedule`` of one head's
    problem (seq_q, seq_kv, head_dim, mask) and the device's nominal wave. Batch size and head
    count are deliberately not passed: under vmap, sharding or a different batch the same
    sequence must get the same schedule, hence the same bits."""
    try:
        from jax_dash import schedules
    except ImportError:  # the simulator is optional at import time of the op
        return "descending"
    chooser = getattr(schedules, "choose_schedule", None)
    if chooser is None:
        return "descending"
    seq_q, head_dim = q_shape[-3], q_shape[-1]
    return chooser(seq_q=seq_q, seq_kv=k_shape[-3], head_dim=head_dim, is_causal=is_causal,
                   wave=_nominal_wave())


def _nominal_wave():
    """Resident backward CTAs of the default device's model (its SM count on GPU; the CPU kernels'
    CPU_WAVE otherwise): a property of the GPU model, never of the call, so auto's choice does
    not change with the batch or the sharding."""
    device = jax.devices()[0]
    cores = getattr(device, "core_count", None)
    if device.platform == "gpu" and isinstance(cores, int) and cores > 0:
        return cores
    return _ffi.CPU_WAVE


# ---- validation ---------------------------------------------------------------------------------

def _as_array(x, name):
    if isinstance(x, jax.Array) or hasattr(x, "shape") and hasattr(x, "dtype"):
        return x
    try:
        return jnp.asarray(x)
    except TypeError as exc:
        raise TypeError(f"{name} must be an array, got {type(x).__name__}") from exc


def _check_shapes(query, key, value):
    for x, name in ((query, "query"), (key, "key"), (value, "value")):
        if x.ndim not in (3, 4):
            raise ValueError(
                f"{name} must be 4-D [batch, seq, heads, head_dim] or 3-D [seq, heads, head_dim], "
                f"got shape {tuple(x.shape)}")
    if not query.ndim == key.ndim == value.ndim:
        raise ValueError(
            "query, key and value must all be 4-D or all be 3-D, got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if tuple(key.shape) != tuple(value.shape):
        raise ValueError(f"key and value must have the same shape, got key {tuple(key.shape)} "
                         f"and value {tuple(value.shape)}")
    batch_axis = query.ndim == 4
    if batch_axis and query.shape[0] != key.shape[0]:
        raise ValueError(f"query and key must have the same batch size, got query "
                         f"{tuple(query.shape)} and key {tuple(key.shape)}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same head_dim, got query "
                         f"{tuple(query.shape)} and key {tuple(key.shape)}")
    seq_q, num_heads, head_dim = query.shape[-3:]
    seq_kv, num_kv_heads = key.shape[-3], key.shape[-2]
    if seq_q == 0 or seq_kv == 0:
        raise ValueError(f"sequence lengths must be at least 1, got seq_q={seq_q} and "
                         f"seq_kv={seq_kv} (query {tuple(query.shape)}, key {tuple(key.shape)})")
    if num_heads == 0 or num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads "
                         f"({num_kv_heads}) (query {tuple(query.shape)}, key {tuple(key.shape)})")
    if head_dim == 0 or head_dim % 8 or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is not supported: it must be a multiple of 8 up to "
                         f"{MAX_HEAD_DIM} (64 or 128 on GPU)")
    if batch_axis and query.shape[0] == 0:
        raise ValueError(f"batch must be at least 1, got query {tuple(query.shape)}")


def _check_dtypes(query, key, value):
    dtypes = [jnp.dtype(x.dtype) for x in (query, key, value)]
    for dtype, name in zip(dtypes, ("query", "key", "value")):
        if dtype not in _CPU_DTYPES:
            raise TypeError(f"{name} has dtype {dtype}; allowed: bfloat16, float16 (GPU and CPU) "
                            "and float32 (CPU only)")
    if len(set(dtypes)) != 1:
        raise TypeError("query, key and value must have the same dtype, got "
                        f"{dtypes[0]}, {dtypes[1]}, {dtypes[2]}")


def _check_scale(scale, head_dim=None):
    """The softmax scale as a float: ``1 / sqrt(head_dim)`` for None, else a real number that is
    finite in float32, the precision the kernels take it in (1e39 would become inf there).
    Also validates ``scale`` for the Flax adapter, which has no head_dim yet (None stays None)."""
    if scale is None:
        return None if head_dim is None else 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a Python number (it is compiled into the kernel), got "
                        f"{scale!r} of type {type(scale).__name__}")
    try:
        as_float = float(scale)
    except OverflowError:  # a Python int beyond float64
        as_float = math.inf
    with np.errstate(over="ignore"):
        finite = bool(np.isfinite(np.float32(as_float)))
    if not finite:
        raise ValueError(f"scale must be finite, got {scale!r}: the kernels take it as float32, "
                         f"whose finite values are at most {float(np.finfo(np.float32).max):.8g} "
                         "in magnitude")
    return as_float
