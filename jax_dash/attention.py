"""The public op: ``jax_dash.attention``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_dash import _ffi, dropout, sharding
from jax_dash._args import (SCHEDULES, _as_array, _auto_schedule, _check_dense, _check_dtypes,
                            _check_implementation, _check_lengths, _check_segment_ids,
                            _check_shapes, _check_soft_cap, _check_unexpected_keywords,
                            _check_window, _scale_operand)


def attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
              query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
              query_segment_ids=None, key_value_segment_ids=None, logits_soft_cap=None,
              schedule="auto", implementation=None, return_residual=False, dropout_rate=0.0,
              dropout_rng=None, dropout_offsets=None, dropout_axes=None, **unexpected):
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
        ``"descending"``, ``"shift"``, ``"symmetric_shift"``, ``"mirror"`` (``"descending"`` on
        the sequence read from its end) give bitwise-reproducible gradients;
        ``"atomic"`` is faster-racing and not reproducible (a reference for the cost of
        determinism). Every schedule computes the same function up to rounding.
      implementation: ``None`` only (``jax.nn``'s choice of backend; jax_dash is its own: a
        ``ValueError`` says so for any other value).
      return_residual: also return the softmax log-sum-exp, as ``jax.nn`` does (see Returns).
      dropout_rate: attention dropout, a Python float in ``[0, 1)``: each probability is kept or
        dropped (kept ones scaled by ``1 / (1 - dropout_rate)``), after the softmax, as Flax's
        attention does. Whether ``(b, h, i, j)`` is kept is ``jax_dash.dropout_keep_mask`` of the
        key: a pure function of the key and the coordinates, so runs and schedules give the same
        bits. 0 (the default) is exactly the op without dropout. The CPU and the Hopper kernels
        keep the same elements (the Hopper backward regenerates the forward's mask; it needs the
        warp-specialized kernel's tables to fit, as the masks beyond causal do: a query longer
        than about 250k tokens is refused). Under ``jit`` on sharded arrays the mask is the
        unsharded one; inside ``shard_map`` pass ``dropout_axes`` or ``dropout_offsets`` (a
        ``ValueError`` asks for them). Under ``vmap`` each mapped element is its own call
        (coordinates from 0, as ``jax.random`` with an unbatched key).
      dropout_rng: the JAX PRNG key of the mask (``jax.random.key(seed)``, or a raw uint32[2]
        key), required when ``dropout_rate > 0``.
      dropout_offsets: where this call's problem sits in a larger one, for the mask:
        ``(batch, head, q, kv)``, the global coordinates of its element ``(0, 0, 0, 0)``, so
        element ``(b, h, i, j)`` is kept where ``dropout_keep_mask`` of the whole problem keeps
        ``(batch + b, head + h, q + i, kv + j)`` (``head`` counts query heads). Each a
        non-negative int or an integer scalar array, traced or not (e.g. from
        ``jax.lax.axis_index``), or one integer array of shape ``(4,)``; default zeros. A
        traced offset is checked when the call runs (``< 0`` is an error there).
      dropout_axes: inside ``shard_map``, the mesh axes this call's dimensions are sharded over,
        from which the offsets follow (``axis_index(axis) * local size``, evenly sharded):
        ``(batch_axis, head_axis)`` or ``(batch_axis, head_axis, q_axis, kv_axis)``, each
        ``None`` (not sharded), a mesh axis name, or a tuple of names (sharded over several,
        major first, as in a ``PartitionSpec``). E.g. ``in_specs=P("data", None, "model")``
        takes ``dropout_axes=("data", "model")``. The named axes must be those the operands vary
        over (a ``ValueError`` names one that is missing or wrong). With these the bits are the
        unsharded call's for batch and head sharding. Give ``dropout_axes`` or
        ``dropout_offsets``, not both.

    Flax's ``attention_fn`` keywords (``dropout_rng``, ``deterministic``, ``dtype``, ...) raise a
    ``TypeError`` pointing to ``jax_dash.flax.make_attention_fn``, the adapter that takes them.

    Every mask combines with every other (a key is seen only if all allow it). Lengths and
    segment ids are runtime arrays (traced under jit, batched under vmap, sharded with the
    batch); ``local_window_size`` and ``logits_soft_cap`` are Python numbers. A query that sees
    no key outputs 0 and gets zero gradient.

    Returns:
      Array with the shape and dtype of ``query``. With ``return_residual=True``, ``(output,
      residual)`` as in ``jax.nn``: ``residual`` is ``[batch, seq_q, num_heads]`` (``[seq_q,
      num_heads]`` without a batch axis) in the dtype of ``query``, per query and head the natural
      log of the sum over visible keys of ``exp(logit)``, where ``logit`` is ``scale * q.k`` (soft
      capped if asked); no gradient flows through it (``jax.nn`` stops it too). A query that sees
      no key gets ``-inf`` (``jax.nn``'s XLA path gives a large negative number there).

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
    _check_unexpected_keywords(unexpected)
    threshold = dropout.dropout_threshold(dropout_rate)  # checks the rate (TypeError/ValueError)
    _check_dense(bias, mask)
    _check_implementation(implementation)
    if not isinstance(return_residual, (bool, np.bool_)):
        raise TypeError(f"return_residual must be a Python bool, got {return_residual!r} "
                        f"(type {type(return_residual).__name__})")
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
    if dropout_rate > 0:
        # Before the operands are made to vary alike: dropout_axes is checked against the axes
        # each one varies over.
        offsets = dropout.block_offsets(query, key, dropout_offsets, dropout_axes)
    else:  # unused, but a wrong argument is wrong at any rate
        dropout.check_offset_arguments(dropout_offsets, dropout_axes)
    # Inside shard_map, operands that vary over fewer mesh axes than the others (K/V of
    # tensor-parallel MQA, the scale) are cast to varying here, outside the custom_vjp: JAX's own
    # transpose of that cast sums their cotangents over those axes (jax.nn does the same).
    query, key, value, scale, *mask_arrays = _ffi._unify_varying(
        query, key, value, scale, q_lengths, kv_lengths, q_segments, kv_segments)
    try:
        if dropout_rate > 0:
            out, lse = _with_dropout(query, key, value, scale, mask_arrays, dropout_rng,
                                     float(dropout_rate), threshold, bool(is_causal), static_mask,
                                     schedule, scale_is_traced, offsets)
        else:
            out, lse = _attention(query, key, value, scale, *mask_arrays, bool(is_causal),
                                  static_mask, schedule, scale_is_traced)
    except TypeError as exc:  # JAX's own words for forward mode on a custom_vjp (eager)
        if "forward-mode autodiff (jvp) to a custom_vjp" not in str(exc):
            raise
        raise TypeError(_FIRST_ORDER_ONLY) from exc
    if unbatched:
        out, lse = out[0], lse[0]
    if not return_residual:
        return out
    # The kernels' lse is [..., H, Sq] float32 in natural log of the scaled logits, jax.nn's
    # residual [..., Sq, H] in the inputs' dtype: the same quantity, transposed and rounded.
    return out, jax.lax.stop_gradient(jnp.swapaxes(lse, -1, -2).astype(out.dtype))


_FIRST_ORDER_ONLY = (
    "jax_dash.attention supports first-order reverse-mode differentiation only (jax.grad, "
    "jax.vjp, jax.value_and_grad): forward mode (jax.jvp, jax.jacfwd) and derivatives of its "
    "gradient (grad of grad, jax.hessian) are not implemented; use "
    "jax.nn.dot_product_attention for those")


# Operands: q, k, v, the 0-d scale, then the four int32 mask arrays (q_lengths, kv_lengths,
# q_segments, kv_segments); static: is_causal, the StaticMask, the schedule, scale_is_traced.
# Returns (out, lse); lse is jax.nn's residual, through which no gradient flows.
@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11))
def _attention(q, k, v, scale, q_lengths, kv_lengths, q_segments, kv_segments, is_causal,
               static_mask, schedule, scale_is_traced):
    mask_arrays = (q_lengths, kv_lengths, q_segments, kv_segments)
    return _behind_barrier(*_forward_op(is_causal, static_mask)(q, k, v, *mask_arrays, scale))


def _attention_fwd(q, k, v, scale, q_lengths, kv_lengths, q_segments, kv_segments, is_causal,
                   static_mask, schedule, scale_is_traced):
    mask_arrays = (q_lengths, kv_lengths, q_segments, kv_segments)
    out, lse = _behind_barrier(*_forward_op(is_causal, static_mask)(q, k, v, *mask_arrays, scale))
    return (out, lse), (q, k, v, scale, mask_arrays, out, lse)


def _behind_barrier(out, lse):
    """The forward call's outputs behind an optimization barrier, its only user. Under
    ``lax.scan`` (a model's layers) the backward's residuals, ours and those of the ops that
    consume ``out`` (the output projection's matmul keeps its input), are stored into stacked
    arrays with dynamic-update-slices; XLA's GPU pass dynamic-slice-fusion-rewriter-v2 (jaxlib
    0.11.2) then fuses a copy of our custom call with those stores and keeps the original for the
    other users: the forward kernel ran twice per layer (16 launches for 8 layers, 111 ms of a
    595 ms training step at 32k tokens on an H100). The pass's walk from the call stops at the
    barrier, which costs nothing at run time; the stores become plain copies, as every other
    op's outputs get."""
    return tuple(jax.lax.optimization_barrier((out, lse)))


def _attention_bwd(is_causal, static_mask, schedule, scale_is_traced, residuals, cotangents):
    q, k, v, scale, mask_arrays, out, lse = residuals
    dout, _ = cotangents  # the lse's is zero: attention() stops its gradient
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
    op = _per_platform(schedule, lambda name: _backward_op(is_causal, name, static_mask))
    return op(q, k, v, out, lse, dout, *mask_arrays, scale)


def _per_platform(schedule, op_for):
    """``op_for(schedule)`` for a schedule name; for ``((platform, name), ...)`` (what "auto"
    chose per platform) a function running the op of the platform the computation lowers for.
    ``op_for`` should return the same function for the same name (cached), so that an eager
    call does not compile ``platform_dependent`` anew."""
    if isinstance(schedule, str):
        return op_for(schedule)
    branches = {platform: op_for(name) for platform, name in schedule}
    return lambda *args: jax.lax.platform_dependent(*args, **branches)


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


# ---- dropout ----------------------------------------------------------------------------------

def _with_dropout(query, key, value, scale, mask_arrays, rng, rate, threshold, is_causal,
                  static_mask, schedule, scale_is_traced, offsets):
    words = dropout.dropout_key_words(rng)
    key_words = jnp.stack(words).astype(jnp.uint32)
    keep_scale = 1.0 / (1.0 - rate)
    return _dropout_attention(query, key, value, scale, key_words, offsets, *mask_arrays,
                              is_causal, static_mask, schedule, scale_is_traced, threshold,
                              keep_scale)


# Operands: q, k, v, the 0-d scale, the uint32 [2] dropout key, the int32 [4] dropout offsets,
# the four mask arrays; static: is_causal, the StaticMask, the schedule, scale_is_traced, the
# threshold and 1 / (1 - rate).
@functools.partial(jax.custom_vjp, nondiff_argnums=(10, 11, 12, 13, 14, 15))
def _dropout_attention(q, k, v, scale, key_words, offsets, q_lengths, kv_lengths, q_segments,
                       kv_segments, is_causal, static_mask, schedule, scale_is_traced, threshold,
                       keep_scale):
    return _behind_barrier(*_ffi.fwd_call(
        q, k, v, scale, is_causal, mask=static_mask,
        mask_arrays=(q_lengths, kv_lengths, q_segments, kv_segments),
        dropout=(key_words, offsets, threshold, keep_scale)))


def _dropout_attention_fwd(q, k, v, scale, key_words, offsets, q_lengths, kv_lengths, q_segments,
                           kv_segments, is_causal, static_mask, schedule, scale_is_traced,
                           threshold, keep_scale):
    mask_arrays = (q_lengths, kv_lengths, q_segments, kv_segments)
    out, lse = _behind_barrier(*_ffi.fwd_call(
        q, k, v, scale, is_causal, mask=static_mask, mask_arrays=mask_arrays,
        dropout=(key_words, offsets, threshold, keep_scale)))
    return (out, lse), (q, k, v, scale, key_words, offsets, mask_arrays, out, lse)


def _dropout_attention_bwd(is_causal, static_mask, schedule, scale_is_traced, threshold,
                           keep_scale, residuals, cotangents):
    q, k, v, scale, key_words, offsets, mask_arrays, out, lse = residuals
    dout = cotangents[0].astype(out.dtype)

    op = _dropout_backward_op(is_causal, static_mask, schedule, threshold, keep_scale)

    def backward(q, scale):
        return op(q, k, v, out, lse, dout, scale, key_words, offsets, *mask_arrays)

    dq, dk, dv = backward(q, scale)
    if scale_is_traced:  # dL/dscale = <Q, dQ> / scale; at scale 0, <Q, dQ'> of Q' = 0, scale 1
        dscale = jax.lax.cond(
            scale != 0, lambda: _inner(q, dq) / scale,
            lambda: _inner(q, backward(jnp.zeros_like(q), jnp.ones_like(scale))[0])
        ).astype(scale.dtype)
    else:
        dscale = jnp.zeros_like(scale)
    return (dq, dk, dv, dscale, None, None) + (None,) * len(mask_arrays)


_dropout_attention.defvjp(_dropout_attention_fwd, _dropout_attention_bwd)


# Cached per static key: eagerly, platform_dependent with new branch functions compiles anew.
@functools.lru_cache(maxsize=64)
def _dropout_backward_op(is_causal, static_mask, schedule, threshold, keep_scale):
    """The dropout backward as a function of ``(q, k, v, out, lse, dout, scale, key_words,
    offsets, *mask_arrays)``; ``schedule`` as in ``_per_platform``."""
    def on(name):
        def call(q, k, v, out, lse, dout, scale, key_words, offsets, *mask_arrays):
            return _ffi.bwd_call(q, k, v, out, lse, dout, scale, is_causal, name,
                                 mask=static_mask, mask_arrays=mask_arrays,
                                 dropout=(key_words, offsets, threshold, keep_scale))
        return call

    return _per_platform(schedule, on)
