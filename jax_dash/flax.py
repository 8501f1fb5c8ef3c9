"""jax_dash attention as the ``attention_fn`` of Flax's multi-head attention (NNX and Linen).

    import jax_dash.flax
    attn = nnx.MultiHeadAttention(..., attention_fn=jax_dash.flax.make_attention_fn(is_causal=True))

The adapter accepts the full signature of ``flax.nnx.dot_product_attention`` /
``flax.linen.dot_product_attention`` and computes the same thing. Flax hands the attention function
a dense ``mask``; jax_dash takes structured masks, so the adapter maps the dense masks it can
recognize: none, causal (query i sees key j iff j <= i), and either of them cut to a local window
declared with ``make_attention_fn(local_window_size=...)`` (sliding-window attention);
``make_attention_fn(logits_soft_cap=c)`` soft-caps the logits. Lengths and segment ids (padding,
packed sequences) reach Flax's attention only as dense masks, which the adapter cannot read while
tracing: call ``jax_dash.attention`` with them directly. Everything it cannot honour raises an
error instead of being dropped:

* ``bias``, attention-weight sowing (``module``/``sow_weights``) and custom einsums: ``ValueError``.
* dropout (``dropout_rate > 0`` and not ``deterministic``): applied by ``jax_dash.attention``'s
  reproducible dropout (its keep mask is ``jax_dash.dropout_keep_mask`` of ``dropout_rng``; CPU
  kernels only for now), which draws one mask per batch row and head: Flax's default
  ``broadcast_dropout=True`` (one mask shared by all batch rows and heads) raises a ``ValueError``
  asking for ``broadcast_dropout=False``. In evaluation mode (``deterministic=True``) dropout is
  off. Inside ``shard_map``, ``make_attention_fn(dropout_axes=(batch_axis, head_axis))`` gives the
  blocks their global coordinates (``jax_dash.attention``'s ``dropout_axes``).
* ``mask``: masks are usually traced arrays under ``jit``, whose values are unknown while tracing.
  The rule is therefore:

  - a concrete mask (a NumPy or committed JAX array, outside ``jit``) is checked while tracing;
    it must be the causal pattern or all ``True`` (each cut to the declared window, if any);
  - a traced mask is accepted only when the pattern is declared, by ``make_attention_fn(is_causal=
    True)`` (or ``False``) or by ``is_causal=True`` in the call (``nnx.MultiHeadAttention(...)(x,
    is_causal=True)``). The declared pattern is then verified on the device at run time; a mask that
    differs makes the computation fail with a ``ValueError`` message (wrapped in the runtime error
    JAX raises for failed callbacks). ``make_attention_fn(check_mask=False)`` skips that check (one
    reduction over the mask plus a host callback) and trusts the declaration.

  The fastest and simplest choice is to pass no mask at all and declare ``is_causal=True``.
  Autoregressive decoding (``decode=True``) is not supported: one query against the key cache,
  whose mask covers the keys filled so far, raises a ``ValueError`` saying so.
* ``precision`` and ``force_fp32_for_softmax`` are accepted and have no effect: jax_dash always
  accumulates in float32 and computes the softmax in float32.

This module needs no Flax import itself: the adapter is a plain function.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import jax_dash
from jax_dash._args import _check_soft_cap, _check_window, validate_scale

__all__ = ["attention_fn", "make_attention_fn"]


def _default_promote_dtype(arrays, dtype=None):
    # Flax's promotion: cast to ``dtype`` when given, else to the inputs' common type.
    dtype = dtype if dtype is not None else jnp.result_type(*arrays)
    return tuple(jnp.asarray(a, dtype) for a in arrays)


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _allowed_pattern(is_causal: bool, seq_q: int, seq_kv: int, window=None) -> np.ndarray:
    # jax.nn.dot_product_attention's conventions: causal is top-left (query i sees key j iff
    # j <= i); a window (left, right) keeps i - left <= j <= i + right.
    i = np.arange(seq_q)[:, None]
    j = np.arange(seq_kv)[None, :]
    pattern = j <= i if is_causal else np.ones((seq_q, seq_kv), dtype=bool)
    if window is not None:
        pattern = pattern & (j >= i - window[0]) & (j <= i + window[1])
    return pattern


def _pattern_name(is_causal: bool, window) -> str:
    name = "causal (query i sees key j iff j <= i)" if is_causal else "all True (no mask)"
    if window is not None:
        name += f" within local_window_size={window} (i - {window[0]} <= j <= i + {window[1]})"
    return name


def _check_mask_shape(mask, target_shape: tuple[int, ...]) -> None:
    try:
        broadcast = np.broadcast_shapes(tuple(mask.shape), target_shape)
    except ValueError:
        broadcast = None
    if broadcast != target_shape:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, which does not broadcast to "
            f"[batch..., num_heads, seq_q, seq_kv] = {target_shape}"
        )


def _pattern_of_concrete_mask(mask, seq_q: int, seq_kv: int, window=None) -> bool:
    """True for the causal pattern, False for all-True (each within the window); anything else
    raises."""
    values = np.asarray(mask).astype(bool)
    values = np.broadcast_to(values, values.shape[:-2] + (seq_q, seq_kv))
    for is_causal in (True, False):
        expected = np.broadcast_to(_allowed_pattern(is_causal, seq_q, seq_kv, window),
                                   values.shape)
        if np.array_equal(values, expected):
            return is_causal
    within = "" if window is None else f", each within local_window_size={window}"
    raise ValueError(
        "mask is neither the causal pattern (query i sees key j iff j <= i, as "
        f"flax.nnx.make_causal_mask builds) nor all True{within}; the Flax adapter maps only "
        "those (padding and "
        "packed-sequence masks: call jax_dash.attention with query_seq_lengths/"
        "key_value_seq_lengths or query_segment_ids/key_value_segment_ids; a sliding window: "
        "make_attention_fn(local_window_size=...)). Use jax.nn.dot_product_attention or flax's "
        "own attention_fn for other masks."
    )


_DECODING = ("decoding (decode=True) is not supported by jax_dash's attention_fn; use "
             "jax.nn.dot_product_attention for decoding")


def _decoding_error(seq_kv: int) -> ValueError:
    return ValueError(f"{_DECODING} (got one query against {seq_kv} keys with a mask: the key "
                      "cache and its mask of the keys filled so far, as decode=True builds them)")


def _is_cache_mask(mask, seq_kv: int) -> bool:
    """Whether every row of a concrete mask keeps a prefix of the keys (key j iff j < n for the
    row's n), not all of them, as Flax's decode=True mask keeps the keys cached so far."""
    values = np.asarray(mask).astype(bool)
    rows = np.broadcast_to(values, values.shape[:-1] + (seq_kv,)).reshape(-1, seq_kv)
    lengths = rows.sum(axis=1, keepdims=True)
    return np.array_equal(rows, np.arange(seq_kv) < lengths) and bool((lengths < seq_kv).any())


def _verify_traced_mask(mask, is_causal: bool, seq_q: int, seq_kv: int, window=None) -> None:
    """Checks on the device, at run time, that a traced mask is the declared pattern."""
    expected = jnp.asarray(_allowed_pattern(is_causal, seq_q, seq_kv, window))
    matches = jnp.all(jnp.asarray(mask).astype(bool) == expected)
    pattern = _pattern_name(is_causal, window)
    decoding = f" If this is Flax's decode=True: {_DECODING}." if seq_q == 1 < seq_kv else ""

    def raise_if_mismatch(ok):
        if not bool(ok):
            raise ValueError(
                f"mask does not match the declared pattern {pattern}: jax_dash computes "
                f"is_causal={is_causal} attention and cannot apply other masks. Pass "
                "is_causal matching your mask, or use jax.nn.dot_product_attention for "
                f"general masks.{decoding}"
            )

    jax.debug.callback(raise_if_mismatch, matches)


def make_attention_fn(
    *,
    is_causal: bool | None = None,
    schedule: str = "auto",
    scale: float | None = None,
    check_mask: bool = True,
    local_window_size: int | tuple[int, int] | None = None,
    logits_soft_cap: float | None = None,
    dropout_axes: tuple | None = None,
) -> Callable[..., jax.Array]:
    """Builds a Flax ``attention_fn`` that runs ``jax_dash.attention``.

    Args:
      is_causal: the attention pattern. ``None`` (default): take it from the call's ``is_causal``
        (NNX passes it) or from a concrete ``mask``. ``True``/``False``: declared; a traced mask
        passed anyway is verified at run time against it.
      schedule: ``jax_dash.attention``'s backward schedule (``"auto"``, ``"ascending"``, ...).
      scale: logit scale; default ``1/sqrt(head_dim)``, as Flax uses. Checked here by the rule of
        ``jax_dash.attention`` (a real number finite in float32, or a 0-d array).
      check_mask: verify a traced mask at run time (default). ``False`` trusts the declared
        ``is_causal`` and does not read the mask.
      local_window_size: sliding window, as in ``jax_dash.attention`` (``w`` or ``(left,
        right)``); a mask passed anyway must then be the pattern cut to this window.
      logits_soft_cap: ``c > 0``: logits ``c * tanh(scale * q.k / c)``, as in
        ``jax_dash.attention``.
      dropout_axes: for dropout inside ``shard_map``: the mesh axes the batch and heads are
        sharded over, ``(batch_axis, head_axis)``, as in ``jax_dash.attention`` (there Flax's
        batch dimensions count as one, the first major).

    Returns:
      A function with the signature of ``flax.nnx.dot_product_attention`` (a superset of
      ``flax.linen.dot_product_attention``'s keyword names, so Linen passes everything it has).
    """
    if is_causal is not None and not isinstance(is_causal, bool):
        raise TypeError(f"is_causal={is_causal!r} must be None, True or False")
    if not isinstance(schedule, str) or schedule not in jax_dash.SCHEDULES:
        raise ValueError(f"schedule={schedule!r} must be one of {jax_dash.SCHEDULES}")
    validate_scale(scale)  # jax_dash.attention's own rule, so that both take the same scales
    if not isinstance(check_mask, bool):
        raise TypeError(f"check_mask={check_mask!r} must be True or False")
    window = _check_window(local_window_size)  # jax_dash.attention's rules and messages
    soft_cap = _check_soft_cap(logits_soft_cap)
    if dropout_axes is not None:
        jax_dash.dropout.check_axes(dropout_axes)  # jax_dash.attention's rules and messages
    declared_causal = is_causal

    def jax_dash_attention_fn(
        query: jax.Array,
        key: jax.Array,
        value: jax.Array,
        bias: jax.Array | None = None,
        mask: jax.Array | None = None,
        broadcast_dropout: bool = True,
        dropout_rng: jax.Array | None = None,
        dropout_rate: float = 0.0,
        deterministic: bool = False,
        dtype: Any = None,
        precision: Any = None,
        module: Any = None,
        promote_dtype: Callable | None = None,
        is_causal: bool = False,
        force_fp32_for_softmax: bool = False,
        einsum_dot_general: Callable | None = None,
        qk_attn_weights_einsum: Callable | None = None,
        attn_weights_value_einsum: Callable | None = None,
    ) -> jax.Array:
        del precision, force_fp32_for_softmax  # see module doc
        if bias is not None:
            raise ValueError(
                f"bias (shape {getattr(bias, 'shape', '?')}) is not supported by jax_dash "
                "attention; only is_causal masking is. Use flax's own attention_fn for biases."
            )
        if module is not None:
            raise ValueError(
                "sow_weights=True (module given) is not supported: jax_dash never materializes "
                "the attention weights. Call with sow_weights=False."
            )
        for name, fn in (("einsum_dot_general", einsum_dot_general),
                         ("qk_attn_weights_einsum", qk_attn_weights_einsum),
                         ("attn_weights_value_einsum", attn_weights_value_einsum)):
            if fn is not None:
                raise ValueError(f"{name}={fn!r} is not supported: jax_dash runs its own kernels")
        apply_dropout = dropout_rate != 0.0 and not deterministic
        if apply_dropout and broadcast_dropout:
            raise ValueError(
                f"dropout_rate={dropout_rate!r} with deterministic=False and "
                "broadcast_dropout=True (Flax's default: one dropout mask shared by every batch "
                "row and head): jax_dash's dropout draws one mask per batch row and head "
                "(reproducibly, from dropout_rng). Build the module with broadcast_dropout=False, "
                "or use dropout_rate=0.0 / deterministic=True (evaluation, where dropout is off)."
            )
        if not isinstance(is_causal, bool):
            raise TypeError(f"is_causal={is_causal!r} must be True or False")
        if declared_causal is False and is_causal:
            raise ValueError(
                "is_causal=True in the call conflicts with make_attention_fn(is_causal=False)"
            )

        query, key, value = (promote_dtype or _default_promote_dtype)(
            (query, key, value), dtype=dtype)
        if query.ndim < 3 or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(
                f"query, key, value must have the same rank >= 3 ([batch..., seq, heads, "
                f"head_dim]); got shapes {query.shape}, {key.shape}, {value.shape}"
            )
        batch_dims = query.shape[:-3]
        if key.shape[:-3] != batch_dims or value.shape[:-3] != batch_dims:
            raise ValueError(
                f"query, key, value must share their batch dimensions; got shapes "
                f"{query.shape}, {key.shape}, {value.shape}"
            )
        seq_q, num_heads = query.shape[-3], query.shape[-2]
        seq_kv = key.shape[-3]

        # The pattern: declared by the factory, else by the call's is_causal, else by a
        # concrete mask. A call's is_causal=False is NNX's default, so it declares nothing.
        causal = declared_causal if declared_causal is not None else (True if is_causal else None)
        if mask is not None:
            _check_mask_shape(mask, batch_dims + (num_heads, seq_q, seq_kv))
            # Flax's decode=True calls with one query against the whole key cache and a mask of
            # the keys filled so far (at the first step that is also the one-query causal mask).
            decoding_shape = seq_q == 1 < seq_kv
            if not _is_traced(mask):
                if decoding_shape and _is_cache_mask(mask, seq_kv):
                    raise _decoding_error(seq_kv)
                mask_causal = _pattern_of_concrete_mask(mask, seq_q, seq_kv, window)
                # A pattern that is both (every query sees all its keys) agrees with either.
                both = np.array_equal(_allowed_pattern(True, seq_q, seq_kv, window),
                                      _allowed_pattern(False, seq_q, seq_kv, window))
                if causal is not None and causal != mask_causal and not both:
                    raise ValueError(
                        f"the mask is {'causal' if mask_causal else 'all True'} but "
                        f"is_causal={causal} was declared"
                    )
                causal = mask_causal if causal is None else causal
            elif decoding_shape and causal is not False:
                # Undeclared, or declared causal, which with one query would mean "key 0 only".
                raise _decoding_error(seq_kv)
            elif causal is None:
                raise ValueError(
                    "mask is a traced array (under jit its values are unknown while tracing), "
                    "so jax_dash cannot tell whether it is causal. Declare the pattern with "
                    "jax_dash.flax.make_attention_fn(is_causal=True) or call with is_causal=True "
                    "(the mask is then verified at run time), or better: pass no mask and "
                    "is_causal=True."
                )
            elif check_mask:
                _verify_traced_mask(mask, causal, seq_q, seq_kv, window)
        causal = bool(causal)

        # jax_dash.attention takes one batch axis (or none): fold Flax's batch dims into one.
        if len(batch_dims) > 1:
            flat = lambda x: x.reshape((math.prod(batch_dims),) + x.shape[-3:])
            query, key, value = flat(query), flat(key), flat(value)
        out = jax_dash.attention(query, key, value, scale=scale, is_causal=causal,
                                 local_window_size=window, logits_soft_cap=soft_cap,
                                 schedule=schedule,
                                 dropout_rate=dropout_rate if apply_dropout else 0.0,
                                 dropout_rng=dropout_rng if apply_dropout else None,
                                 dropout_axes=dropout_axes if apply_dropout else None)
        return out.reshape(batch_dims + out.shape[-3:])

    return jax_dash_attention_fn


attention_fn = make_attention_fn()
attention_fn.__doc__ = (
    "Flax ``attention_fn`` running jax_dash: pattern from the call's ``is_causal`` or a concrete "
    "mask (see ``make_attention_fn`` and this module's docstring)."
)


def __getattr__(name):
    # Embed subclasses flax.nnx.Embed, so it needs Flax: imported on first use only.
    if name == "Embed":
        from jax_dash._flax_embed import Embed
        return Embed
    raise AttributeError(f"module 'jax_dash.flax' has no attribute {name!r}")
