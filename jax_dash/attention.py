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
      scale: softmax scale; default ``1 / sqrt(head_dim)``. A Python number (it must be finite in
        float32) or a 0-d array, traced or not, as in ``jax.nn``. Either way it reaches the kernels
        as a float32 operand, so a changing scale reuses the compiled kernels, and ``jax.grad``
        differentiates with respect to a traced scale. A non-finite array scale is not checked
        (that would need its value on the host): it gives NaN or inf, as in ``jax.nn``.
      is_causal: top-left causal mask: query ``i`` sees key ``j`` iff ``j <= i`` (the meaning of
        ``jax.nn.dot_product_attention``).
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

    dtypes: bfloat16 and float16 on GPU (Hopper; head_dim up to 256: 64, 128 and 256 natively,
    another multiple of 8 zero-padded to the next of them; every mask argument); the CPU kernels
    also take float32; head_dim is a multiple of 8 up to 256 everywhere. Inputs that are not
    JAX arrays (NumPy arrays, lists) are converted with ``jnp.asarray`` first, as ``jax.nn``
    does, so NumPy float64 becomes float32 unless ``jax_enable_x64`` is on.

    Differentiation: first-order reverse mode (``jax.grad``, ``jax.vjp``) only. Derivatives of the
    gradient and forward mode (``jax.jvp``, ``jax.jacfwd``) raise a ``TypeError`` saying so (forward
    mode under ``jit`` gets JAX's own "can't apply forward-mode autodiff (jvp) to a custom_vjp
    function", raised while lowering).
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
    scale, scale_is_traced = _scale_operand(scale, head_dim)
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

    if schedule == "auto":
        schedule = _auto_schedule(query, key, bool(is_causal), window, has_segments)
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    # Inside shard_map, operands that vary over fewer mesh axes than the others (K/V of
    # tensor-parallel MQA, the scale) are cast to varying here, outside the custom_vjp: JAX's own
    # transpose of that cast sums their cotangents over those axes (jax.nn does the same).
    query, key, value, scale, *mask_arrays = _ffi._unify_varying(
        query, key, value, scale, q_lengths, kv_lengths, q_segments, kv_segments)
    try:
        out = _attention(query, key, value, scale, *mask_arrays, bool(is_causal), static_mask,
                         schedule, scale_is_traced)
    except TypeError as exc:  # JAX's own words for forward mode on a custom_vjp (eager)
        if "forward-mode autodiff (jvp) to a custom_vjp" not in str(exc):
            raise
        raise TypeError(_FIRST_ORDER_ONLY) from exc
    return out[0] if unbatched else out


_FIRST_ORDER_ONLY = (
    "jax_dash.attention supports first-order reverse-mode differentiation only (jax.grad, "
    "jax.vjp, jax.value_and_grad): forward mode (jax.jvp, jax.jacfwd) and derivatives of its "
    "gradient (grad of grad, jax.hessian) are not implemented; use "
    "jax.nn.dot_product_attention for those")


# Operands: q, k, v, the 0-d scale, then the four int32 mask arrays (q_lengths, kv_lengths,
# q_segments, kv_segments); static: is_causal, the StaticMask, the schedule, scale_is_traced.
@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11))
def _attention(q, k, v, scale, q_lengths, kv_lengths, q_segments, kv_segments, is_causal,
               static_mask, schedule, scale_is_traced):
    mask_arrays = (q_lengths, kv_lengths, q_segments, kv_segments)
    out, _ = _forward_op(is_causal, static_mask)(q, k, v, *mask_arrays, scale)
    return out


def _attention_fwd(q, k, v, scale, q_lengths, kv_lengths, q_segments, kv_segments, is_causal,
                   static_mask, schedule, scale_is_traced):
    mask_arrays = (q_lengths, kv_lengths, q_segments, kv_segments)
    out, lse = _forward_op(is_causal, static_mask)(q, k, v, *mask_arrays, scale)
    return out, (q, k, v, scale, mask_arrays, out, lse)


def _attention_bwd(is_causal, static_mask, schedule, scale_is_traced, residuals, dout):
    q, k, v, scale, mask_arrays, out, lse = residuals
    dout = dout.astype(out.dtype)
    masking = (mask_arrays, is_causal, static_mask, schedule)
    dq, dk, dv = _backward(q, k, v, out, lse, dout, scale, *masking)
    if scale_is_traced:
        dscale = _scale_cotangent(q, k, v, out, lse, dout, scale, dq, *masking)
    else:  # a number or a concrete array: no gradient can reach it
        dscale = jnp.zeros_like(scale)
    # The integer mask operands have no cotangent.
    return (dq, dk, dv, dscale) + (None,) * len(mask_arrays)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _backward(q, k, v, out, lse, dout, scale, mask_arrays, is_causal, static_mask, schedule):
    """The backward op; ``schedule`` is a name, or ``((platform, name), ...)`` when "auto" chose
    per platform (traced inputs): the branch of the platform the computation lowers for runs."""
    args = (q, k, v, out, lse, dout, *mask_arrays, scale)
    if isinstance(schedule, str):
        return _backward_op(is_causal, schedule, static_mask)(*args)
    branches = {platform: _backward_op(is_causal, name, static_mask)
                for platform, name in schedule}
    return jax.lax.platform_dependent(*args, **branches)


def _first_order_only(op):
    """``op`` behind a custom_jvp whose rule says, in words, that it is not differentiable: the
    custom_vjp's forward and backward are differentiated only by higher-order or forward-mode
    AD, which would otherwise fail inside JAX's internals (custom_partitioning has no JVP)."""
    @jax.custom_jvp
    def wrapped(*args):
        return op(*args)

    @wrapped.defjvp
    def wrapped_jvp(primals, tangents):
        raise TypeError(_FIRST_ORDER_ONLY)

    return wrapped


@functools.lru_cache(maxsize=64)  # keyed by (is_causal, static mask)
def _forward_op(is_causal, static_mask):
    return _first_order_only(sharding.forward_op(is_causal, static_mask))


@functools.lru_cache(maxsize=64)  # keyed by (is_causal, schedule, static mask)
def _backward_op(is_causal, schedule, static_mask):
    return _first_order_only(sharding.backward_op(is_causal, schedule, static_mask))


def _scale_cotangent(q, k, v, out, lse, dout, scale, dq, mask_arrays, is_causal, static_mask,
                     schedule):
    """dL/dscale for a traced scale. With S = Q K^T and logits scale * S, dL/dscale =
    sum(dLogits * S), and dQ = scale * dLogits K, so <Q, dQ> = scale * sum(dLogits * S)
    (with a soft cap c, logits = c tanh(scale S / c) and both sides gain the factor 1 - tanh^2;
    masks only remove terms):
    dL/dscale = <Q, dQ> / scale (as precise as dQ in the input dtype: float16's range makes it
    coarse for |scale| below about 1e-3, where dQ nears float16's subnormals). At scale == 0
    that quotient is 0 / 0, so there the backward runs once more on Q' = 0 * Q with scale 1, a
    problem with the same logits (all 0), hence the same out and lse: its dQ' is dLogits K
    itself and dL/dscale = <Q, dQ'>. ``lax.cond`` runs that second backward only when scale == 0."""
    zero_scale = _zero_scale_cotangent(is_causal, static_mask, schedule)
    return jax.lax.cond(scale != 0, _nonzero_scale_cotangent, zero_scale,
                        q, k, v, out, lse, dout, scale, dq, *mask_arrays).astype(scale.dtype)


def _inner(a, b):
    return jnp.sum(a.astype(jnp.float32) * b.astype(jnp.float32))


def _nonzero_scale_cotangent(q, k, v, out, lse, dout, scale, dq, *mask_arrays):
    return _inner(q, dq) / scale


# The cond's branches take every operand and are cached per static key: eagerly, a cond with new
# branch functions compiles (and keeps) a new program on every call.
@functools.lru_cache(maxsize=64)  # keyed by (is_causal, static mask, schedule)
def _zero_scale_cotangent(is_causal, static_mask, schedule):
    def zero_scale(q, k, v, out, lse, dout, scale, dq, *mask_arrays):
        dq_unscaled, _, _ = _backward(jnp.zeros_like(q), k, v, out, lse, dout,
                                      jnp.ones_like(scale), mask_arrays, is_causal, static_mask,
                                      schedule)
        return _inner(q, dq_unscaled)

    return zero_scale


def _auto_schedule(query, key, is_causal, window=None, segment_ids=False):
    """The schedule for ``schedule="auto"``: ``jax_dash.schedules.choose_schedule`` of one head's
    problem (seq_q, seq_kv, head_dim, causal + window band, whether segment ids are given) and the
    nominal wave of the device the computation runs on. Batch size, head count and the data
    (lengths, the segment ids' values) are deliberately not passed: under vmap, sharding or a
    different batch the same sequence must get the same schedule, hence the same bits.

    The device: that of concrete (not traced) inputs; for traced inputs it is not known before
    lowering, so the choice is made per platform (CPU and, where JAX has one, the GPU) and
    ``lax.platform_dependent`` picks the one the computation lowers for. Returns a schedule name,
    or ``((platform, name), ...)`` where the platforms' choices differ."""
    from jax_dash import schedules

    def choose(wave):
        return schedules.choose_schedule(seq_q=query.shape[-3], seq_kv=key.shape[-3],
                                         head_dim=query.shape[-1], is_causal=is_causal, wave=wave,
                                         window=window, segment_ids=segment_ids)

    device = _device_of(query, key)
    if device is not None:
        return choose(_device_wave(device))
    choices = {"cpu": choose(_ffi.CPU_WAVE)}
    gpu_wave = _gpu_wave()
    if gpu_wave is not None:
        choices["cuda"] = choose(gpu_wave)
    if len(set(choices.values())) == 1:
        return choices["cpu"]
    return tuple(sorted(choices.items()))


def _device_of(*arrays):
    """The device a concrete array lives on (the lowest id where it is sharded), else None."""
    for x in arrays:
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            try:
                return min(x.devices(), key=lambda d: d.id)
            except Exception:  # noqa: BLE001 - a deleted or otherwise unusable array
                return None
    return None


def _device_wave(device):
    """Resident backward CTAs of a device's model (its SM count on GPU; the CPU kernels'
    CPU_WAVE otherwise): a property of the GPU model, never of the call, so auto's choice does
    not change with the batch or the sharding."""
    cores = getattr(device, "core_count", None)
    if device.platform == "gpu" and isinstance(cores, int) and cores > 0:
        return cores
    return _ffi.CPU_WAVE


@functools.lru_cache(maxsize=1)  # a process's backends do not change
def _gpu_wave():
    """The wave of this process's (first) CUDA GPU, or None where JAX has no CUDA backend."""
    try:
        gpus = jax.devices("cuda")
    except RuntimeError:
        return None
    return _device_wave(gpus[0]) if gpus else None


# ---- validation ---------------------------------------------------------------------------------

def _as_array(x, name):
    """JAX arrays (and tracers) as they are; anything else through ``jnp.asarray`` as jax.nn does
    (NumPy float64 becomes float32 unless x64 is on, as under jit)."""
    if isinstance(x, jax.Array):
        return x
    if isinstance(x, jax.ShapeDtypeStruct):
        raise TypeError(f"{name} is a jax.ShapeDtypeStruct {x.shape} {x.dtype}, which describes an "
                        "array but holds no values; pass an array (for shapes only, call "
                        "jax.eval_shape(jax_dash.attention, query, key, value))")
    if x is None:
        raise TypeError(f"{name} must be an array, got None")
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array, got {type(x).__name__} that jnp.asarray "
                        f"cannot convert: {exc}") from exc


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
                         f"{MAX_HEAD_DIM}")
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


def _check_scale(scale, head_dim=None, allowed="a real number"):
    """The softmax scale as a float: ``1 / sqrt(head_dim)`` for None, else a real number that is
    finite in float32, the precision the kernels take it in (1e39 would become inf there).
    Python (and NumPy scalar) numbers only; ``_scale_operand`` also takes arrays."""
    if scale is None:
        return None if head_dim is None else 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be {allowed}, got {scale!r} of type {type(scale).__name__}")
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


_SCALE_ALLOWED = "a real number or a 0-d array of a real dtype"


def validate_scale(scale):
    """Raises what ``attention`` raises for a bad ``scale`` (None is fine): for adapters that
    take the scale before they see a head_dim (the Flax factory)."""
    if scale is not None:
        _scale_operand(scale, None)


def _scale_operand(scale, head_dim):
    """(0-d float32 array for the kernels, whether it is traced: a gradient may reach it).

    Numbers keep ``_check_scale``'s checks. Arrays (``jax.Array``, tracers, NumPy 0-d arrays) must
    be 0-d with a real (integer or floating) dtype; their value is not checked, which would need it
    on the host: a non-finite scale gives NaN or inf as in jax.nn."""
    if scale is None or isinstance(scale, numbers.Real):
        return jnp.asarray(_check_scale(scale, head_dim, _SCALE_ALLOWED), jnp.float32), False
    if not isinstance(scale, (jax.Array, np.ndarray)):
        _check_scale(scale, allowed=_SCALE_ALLOWED)  # raises the TypeError for other objects
    dtype = np.dtype(scale.dtype)
    if dtype == np.bool_ or not (jnp.issubdtype(dtype, jnp.floating)
                                 or jnp.issubdtype(dtype, jnp.integer)):
        raise TypeError(f"scale must be {_SCALE_ALLOWED}, got an array of dtype {dtype}")
    if np.shape(scale) != ():
        raise ValueError(f"scale must be 0-d (a single number), got an array of shape "
                         f"{tuple(np.shape(scale))}")
    if isinstance(scale, np.ndarray):  # a host value: checked like a number; no gradient
        return jnp.asarray(_check_scale(scale.item()), jnp.float32), False
    return jnp.asarray(scale).astype(jnp.float32), isinstance(scale, jax.core.Tracer)
