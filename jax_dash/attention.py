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


def attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
              query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
              query_segment_ids=None, key_value_segment_ids=None, logits_soft_cap=None,
              schedule="auto"):
    """Scaled dot-product attention with a bitwise-reproducible backward pass.

    A drop-in for ``jax.nn.dot_product_attention``: the arguments it shares mean the same.

    Args:
      query: ``[batch, seq_q, num_heads, head_dim]``, or ``[seq_q, num_heads, head_dim]``.
      key: ``[batch, seq_kv, num_kv_heads, head_dim]`` (or without batch, like ``query``).
        ``num_heads`` must be a multiple of ``num_kv_heads`` (GQA/MQA): query head ``h`` reads
        kv head ``h // (num_heads // num_kv_heads)``.
      value: same shape as ``key``.
      bias, mask: dense additive bias / boolean mask: not supported (a ``ValueError`` says so);
        use the structured masks below, which the kernels skip tile by tile.
      scale: softmax scale, a Python number; default ``1 / sqrt(head_dim)``.
      is_causal: top-left causal mask: query ``i`` sees key ``j`` iff ``j <= i``.
      query_seq_lengths: int ``[batch]`` (``[]`` or ``[1]`` without a batch axis): query ``i``
        of row ``b`` is padding iff ``i >= query_seq_lengths[b]``; it sees no key.
      key_value_seq_lengths: int ``[batch]``: key ``j`` of row ``b`` is seen by no query iff
        ``j >= key_value_seq_lengths[b]``.
      local_window_size: ``int w`` or ``(left, right)`` (ints >= 0): query ``i`` sees only keys
        ``i - left <= j <= i + right``; an int means ``(w, w)``. With ``is_causal`` the right
        side is 0.
      query_segment_ids: int ``[batch, seq_q]`` (``[seq_q]`` without a batch axis), with
        ``key_value_segment_ids`` int ``[batch, seq_kv]``; both or neither: query ``i`` sees key
        ``j`` only if their ids are equal (packed sequences).
      logits_soft_cap: ``c > 0``: logits ``= c * tanh(scale * q.k / c)``, before masking and
        softmax (Gemma 2).
      schedule: backward tile schedule. ``"auto"`` (pick per head's problem), ``"ascending"``,
        ``"descending"``, ``"shift"``, ``"symmetric_shift"`` give bitwise-reproducible gradients;
        ``"atomic"`` is faster-racing and not reproducible (a reference for the cost of
        determinism). Every schedule computes the same function up to rounding.

    Every mask combines with every other (a key is seen only if all allow it). Lengths and
    segment ids are runtime arrays (traced under jit, batched under vmap, sharded with the
    batch); ``local_window_size`` and ``logits_soft_cap`` are Python numbers. A query that sees
    no key outputs 0 and gets zero gradient.

    Returns:
      Array with the shape and dtype of ``query``.

    dtypes: bfloat16 and float16 on GPU (Hopper, head_dim 64 or 128; windows, lengths, segment
    ids and soft cap run on the CPU kernels only for now); the CPU kernels also take float32 and
    any head_dim that is a multiple of 8 up to 256.
    """
    for dense, name in ((bias, "bias"), (mask, "mask")):
        if dense is not None:
            raise ValueError(
                f"{name} is not supported by jax_dash.attention (got "
                f"{_describe(dense)}): dense {name}es are not implemented; express the mask with "
                "is_causal, local_window_size, query_seq_lengths/key_value_seq_lengths or "
                "query_segment_ids/key_value_segment_ids, or use jax.nn.dot_product_attention")
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
    window = _check_window(local_window_size)
    soft_cap = _check_soft_cap(logits_soft_cap)

    unbatched = query.ndim == 3
    batch = 1 if unbatched else query.shape[0]
    seq_q, seq_kv = query.shape[-3], key.shape[-3]
    q_lengths = _check_lengths(query_seq_lengths, "query_seq_lengths", batch, unbatched, seq_q)
    kv_lengths = _check_lengths(key_value_seq_lengths, "key_value_seq_lengths", batch,
                                unbatched, seq_kv)
    q_segments, kv_segments = _check_segment_ids(query_segment_ids, key_value_segment_ids,
                                                 batch, unbatched, seq_q, seq_kv)
    has_lengths = q_lengths is not None or kv_lengths is not None
    has_segments = q_segments is not None
    # The kernels always take all four operands; absent ones mean "no mask" (full lengths, one
    # segment), and the static flags tell the kernels whether to read them.
    if q_lengths is None:
        q_lengths = jnp.full((batch,), seq_q, jnp.int32)
    if kv_lengths is None:
        kv_lengths = jnp.full((batch,), seq_kv, jnp.int32)
    if not has_segments:
        q_segments = jnp.zeros((batch, seq_q), jnp.int32)
        kv_segments = jnp.zeros((batch, seq_kv), jnp.int32)
    static_mask = _ffi.StaticMask(window=window, logits_soft_cap=soft_cap,
                                  has_seq_lengths=has_lengths, has_segment_ids=has_segments)

    if unbatched:
        query, key, value = query[None], key[None], value[None]
    if schedule == "auto":
        schedule = _auto_schedule(query.shape, key.shape, bool(is_causal), window)
    out = _attention(query, key, value, q_lengths, kv_lengths, q_segments, kv_segments, scale,
                     bool(is_causal), static_mask, schedule)
    return out[0] if unbatched else out


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def _attention(q, k, v, q_lengths, kv_lengths, q_segments, kv_segments, scale, is_causal,
               static_mask, schedule):
    out, _ = sharding.forward_op(scale, is_causal, static_mask)(
        q, k, v, q_lengths, kv_lengths, q_segments, kv_segments)
    return out


def _attention_fwd(q, k, v, q_lengths, kv_lengths, q_segments, kv_segments, scale, is_causal,
                   static_mask, schedule):
    mask_arrays = (q_lengths, kv_lengths, q_segments, kv_segments)
    out, lse = sharding.forward_op(scale, is_causal, static_mask)(q, k, v, *mask_arrays)
    return out, (q, k, v, out, lse, mask_arrays)


def _attention_bwd(scale, is_causal, static_mask, schedule, residuals, dout):
    q, k, v, out, lse, mask_arrays = residuals
    dq, dk, dv = sharding.backward_op(scale, is_causal, schedule, static_mask)(
        q, k, v, out, lse, dout.astype(out.dtype), *mask_arrays)
    # The integer mask operands have no cotangent.
    return (dq, dk, dv) + (None,) * len(mask_arrays)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _auto_schedule(q_shape, k_shape, is_causal, window=None):
    """The schedule for ``schedule="auto"``: ``jax_dash.schedules.choose_schedule`` of one head's
    problem (seq_q, seq_kv, head_dim, causal + window band) and the device's nominal wave. Batch
    size, head count and the data (lengths, segment ids) are deliberately not passed: under vmap,
    sharding or a different batch the same sequence must get the same schedule, hence the same
    bits."""
    try:
        from jax_dash import schedules
    except ImportError:  # the simulator is optional at import time of the op
        return "descending"
    chooser = getattr(schedules, "choose_schedule", None)
    if chooser is None:
        return "descending"
    seq_q, head_dim = q_shape[-3], q_shape[-1]
    return chooser(seq_q=seq_q, seq_kv=k_shape[-3], head_dim=head_dim, is_causal=is_causal,
                   wave=_nominal_wave(), window=window)


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
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array, got {type(x).__name__} ({x!r})") from exc


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


def _describe(x):
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is not None:
        return f"an array of shape {tuple(shape)} and dtype {dtype}"
    return f"{x!r}"


def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _check_window(window):
    """``local_window_size`` as ``(left, right)`` Python ints, or None."""
    if window is None:
        return None
    allowed = "None, an int >= 0, or a (left, right) tuple of ints >= 0"
    if _is_int(window):
        window = (window, window)
    elif isinstance(window, (tuple, list)) and len(window) == 2 and all(map(_is_int, window)):
        window = tuple(window)
    else:
        raise TypeError(f"local_window_size must be {allowed} (a Python value, compiled into the "
                        f"kernel), got {window!r} of type {type(window).__name__}")
    if window[0] < 0 or window[1] < 0:
        raise ValueError(f"local_window_size={window!r} must not be negative; allowed: {allowed}")
    if max(window) >= 2 ** 40:
        raise ValueError(f"local_window_size={window!r} is too large: each side must be below "
                         "2**40 (use None for no window)")
    return int(window[0]), int(window[1])


def _check_soft_cap(cap):
    """``logits_soft_cap`` as a float > 0 that is finite in float32, or None."""
    if cap is None:
        return None
    if isinstance(cap, (bool, np.bool_)) or not isinstance(cap, numbers.Real):
        raise TypeError(f"logits_soft_cap must be None or a Python number > 0 (compiled into the "
                        f"kernel), got {cap!r} of type {type(cap).__name__}")
    try:
        as_float = float(cap)
    except OverflowError:
        as_float = math.inf
    with np.errstate(over="ignore"):
        finite = bool(np.isfinite(np.float32(as_float)))
    if not (finite and np.float32(as_float) > 0):
        raise ValueError(f"logits_soft_cap={cap!r} must be a finite number > 0 (in float32), or "
                         "None for no cap")
    return as_float


def _check_int_array(x, name):
    x = _as_array(x, name)
    dtype = jnp.dtype(x.dtype)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype (int32 recommended), got {dtype}")
    return x


def _check_lengths(lengths, name, batch, unbatched, seq):
    """``[batch]`` int lengths as int32, clipped to [0, seq] (which keeps their meaning: position
    i is kept iff i < length), or None."""
    if lengths is None:
        return None
    lengths = _check_int_array(lengths, name)
    allowed = "[] or [1] (no batch axis)" if unbatched else f"[batch] = [{batch}]"
    if unbatched and lengths.shape in ((), (1,)):
        lengths = lengths.reshape((1,))
    elif tuple(lengths.shape) != (batch,):
        raise ValueError(f"{name} has shape {tuple(lengths.shape)}; expected {allowed}")
    return jnp.clip(lengths, 0, seq).astype(jnp.int32)


def _check_segment_ids(q_ids, kv_ids, batch, unbatched, seq_q, seq_kv):
    if q_ids is None and kv_ids is None:
        return None, None
    if q_ids is None or kv_ids is None:
        given, missing = (("query_segment_ids", "key_value_segment_ids") if kv_ids is None
                          else ("key_value_segment_ids", "query_segment_ids"))
        raise ValueError(f"{given} was given without {missing}: pass both or neither")
    out = []
    for ids, name, seq in ((q_ids, "query_segment_ids", seq_q),
                           (kv_ids, "key_value_segment_ids", seq_kv)):
        ids = _check_int_array(ids, name)
        expected = (seq,) if unbatched else (batch, seq)
        if unbatched and tuple(ids.shape) == (1, seq):
            ids = ids.reshape((seq,))
        if tuple(ids.shape) != expected:
            what = "[seq] or [1, seq]" if unbatched else "[batch, seq]"
            raise ValueError(f"{name} has shape {tuple(ids.shape)}; expected {what} = "
                             f"{list(expected)}")
        out.append(ids.reshape((batch, seq)).astype(jnp.int32))
    return tuple(out)


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
