"""Using jax_dash in Equinox models.

Equinox modules work on one example and are ``jax.vmap``-ed over the batch. ``jax_dash.attention``
fits that style as it is: it takes an unbatched ``[seq, heads, head_dim]`` query and its batching
rule folds any number of ``vmap`` axes into the kernel's batch axis, so no Python loop or per-example
kernel launch happens. This module adds:

* ``SelfAttention``: an ``eqx.Module`` self-attention block (``[seq, d_model] -> [seq, d_model]``,
  GQA optional) whose attention is ``jax_dash.attention``;
* ``multihead_attention``: runs an existing ``eqx.nn.MultiheadAttention`` (its weights unchanged)
  with jax_dash, as a replacement for ``mha(q, k, v, mask=causal_mask)``;
* ``single_head_attention``: ``[seq, head_dim]`` in and out, for code that ``vmap``s over heads
  the way ``eqx.nn.MultiheadAttention`` does internally.

Masks are structured, as in ``jax_dash.attention`` (no dense ``mask``): ``is_causal``,
``local_window_size`` and ``logits_soft_cap`` are static; per-sequence lengths and segment ids
(packed sequences) are arrays of the one sequence (a scalar length, ``[seq]`` ids) that ``vmap``
batches like the inputs. Dropout on the attention weights is not supported yet (a module with
``dropout_p > 0`` in training mode raises).
"""

from __future__ import annotations

import math
from typing import Callable

try:
    import equinox as eqx
except ImportError as error:  # Equinox is an optional dependency
    raise ImportError(
        "jax_dash.equinox needs Equinox, which is not installed: python -m pip install equinox "
        '(or, in a jax_dash checkout, python -m pip install ".[equinox]")'
    ) from error

import jax
import jax.numpy as jnp

import jax_dash
from jax_dash._args import _check_soft_cap, _check_window

__all__ = ["SelfAttention", "multihead_attention", "single_head_attention"]


def single_head_attention(query, key, value, *, scale=None, is_causal=False, schedule="auto",
                          **mask):
    """One head: ``query [seq_q, head_dim]``, ``key``/``value [seq_kv, head_dim]`` -> ``[seq_q,
    head_dim]``. Meant for ``jax.vmap(..., in_axes=1, out_axes=1)`` over a heads axis (and further
    ``vmap``s over the batch); every mapped axis becomes part of the kernel's batch. ``mask``:
    ``jax_dash.attention``'s structured masks for this one sequence (``local_window_size``,
    ``logits_soft_cap``, scalar ``query_seq_lengths``/``key_value_seq_lengths``, ``[seq]``
    ``query_segment_ids``/``key_value_segment_ids``)."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if jnp.ndim(x) != 2:
            raise ValueError(f"{name} must be [seq, head_dim] (one head, unbatched); got shape "
                             f"{jnp.shape(x)}. Use jax_dash.attention for [seq, heads, head_dim].")
    if jnp.shape(value)[-1] != jnp.shape(query)[-1]:
        raise ValueError(f"value's head_dim ({jnp.shape(value)[-1]}) must equal query's "
                         f"({jnp.shape(query)[-1]}): jax_dash needs one head_dim for q, k and v")
    out = jax_dash.attention(query[:, None], key[:, None], value[:, None], scale=scale,
                             is_causal=is_causal, schedule=schedule, **mask)
    return out[:, 0]


def _check_not_training_dropout(dropout_p: float, inference: bool) -> None:
    if dropout_p > 0 and not inference:
        raise ValueError(
            f"dropout_p={dropout_p!r} in training mode (inference=False): the Equinox adapter "
            "does not apply attention dropout yet (jax_dash.attention takes dropout_rate and "
            "dropout_rng on the CPU kernels only). Use dropout_p=0.0, or inference=True."
        )


def multihead_attention(
    mha: "eqx.nn.MultiheadAttention",
    query: jax.Array,
    key_: jax.Array,
    value: jax.Array,
    *,
    is_causal: bool = False,
    schedule: str = "auto",
    inference: bool | None = None,
    process_heads: Callable | None = None,
    **mask,
) -> jax.Array:
    """``mha(query, key_, value)`` computed with jax_dash, for an ``eqx.nn.MultiheadAttention``.

    Same projections, scaling (``1/sqrt(qk_size)``) and output as ``mha.__call__``; instead of a
    ``mask`` it takes ``is_causal`` (``True`` equals ``mask=jnp.tril(jnp.ones((q_seq, kv_seq),
    bool))``). ``qk_size`` must equal ``vo_size``. ``query [q_seq, query_size]`` ->
    ``[q_seq, output_size]``; ``vmap`` it over the batch. ``mask``: ``jax_dash.attention``'s
    structured masks for this sequence (``local_window_size``, ``logits_soft_cap``, scalar
    lengths, ``[seq]`` segment ids), which replace the dense masks ``mha`` would take.
    """
    if not isinstance(mha, eqx.nn.MultiheadAttention):
        raise TypeError(f"mha must be an equinox.nn.MultiheadAttention, got {type(mha).__name__}")
    if mha.qk_size != mha.vo_size:
        raise ValueError(f"mha has qk_size={mha.qk_size} and vo_size={mha.vo_size}: jax_dash "
                         "needs equal head sizes for queries/keys and values; build the module "
                         "with qk_size == vo_size, or call it directly")
    inference = mha.dropout.inference if inference is None else inference
    _check_not_training_dropout(mha.dropout.p, inference)
    for name, x in (("query", query), ("key_", key_), ("value", value)):
        if jnp.ndim(x) != 2:
            raise ValueError(f"{name} must be [seq, features] (unbatched; vmap over the batch); "
                             f"got shape {jnp.shape(x)}")

    def project(linear, x):
        return jax.vmap(linear)(x).reshape(x.shape[0], mha.num_heads, -1)

    q = project(mha.query_proj, query)
    k = project(mha.key_proj, key_)
    v = project(mha.value_proj, value)
    if process_heads is not None:
        q, k, v = process_heads(q, k, v)
    out = jax_dash.attention(q, k, v, is_causal=is_causal, schedule=schedule, **mask)
    return jax.vmap(mha.output_proj)(out.reshape(query.shape[0], -1))


class SelfAttention(eqx.Module):
    """Multi-head (or grouped-query) self-attention on one sequence, using jax_dash.

    ``__call__(x [seq, d_model]) -> [seq, d_model]``; ``jax.vmap`` over the batch.
    """

    query_proj: eqx.nn.Linear
    key_proj: eqx.nn.Linear
    value_proj: eqx.nn.Linear
    output_proj: eqx.nn.Linear
    num_heads: int = eqx.field(static=True)
    num_kv_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    is_causal: bool = eqx.field(static=True)
    schedule: str = eqx.field(static=True)
    local_window_size: tuple[int, int] | None = eqx.field(static=True)
    logits_soft_cap: float | None = eqx.field(static=True)

    def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None,
                 head_dim: int | None = None, is_causal: bool = True, schedule: str = "auto",
                 use_bias: bool = False, dtype=None, local_window_size=None,
                 logits_soft_cap=None, key: jax.Array):
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        for name, val in (("d_model", d_model), ("num_heads", num_heads),
                          ("num_kv_heads", num_kv_heads)):
            if not isinstance(val, int) or isinstance(val, bool) or val < 1:
                raise ValueError(f"{name}={val!r} must be a positive integer")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of "
                             f"num_kv_heads={num_kv_heads}")
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(f"d_model={d_model} is not a multiple of num_heads={num_heads}; "
                                 "pass head_dim explicitly")
            head_dim = d_model // num_heads
        if not isinstance(is_causal, bool):
            raise TypeError(f"is_causal={is_causal!r} must be True or False")
        if schedule not in jax_dash.SCHEDULES:
            raise ValueError(f"schedule={schedule!r} must be one of {jax_dash.SCHEDULES}")
        q_key, k_key, v_key, o_key = jax.random.split(key, 4)
        linear = lambda i, o, k: eqx.nn.Linear(i, o, use_bias=use_bias, dtype=dtype, key=k)
        self.query_proj = linear(d_model, num_heads * head_dim, q_key)
        self.key_proj = linear(d_model, num_kv_heads * head_dim, k_key)
        self.value_proj = linear(d_model, num_kv_heads * head_dim, v_key)
        self.output_proj = linear(num_heads * head_dim, d_model, o_key)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.is_causal, self.schedule = is_causal, schedule
        self.local_window_size = _check_window(local_window_size)
        self.logits_soft_cap = _check_soft_cap(logits_soft_cap)

    def __call__(self, x: jax.Array, *, seq_length=None, segment_ids=None) -> jax.Array:
        """``seq_length``: a scalar; positions >= it are padding (they see nothing and nothing
        sees them). ``segment_ids``: ``[seq]`` ints (packed sequences): a position sees only
        those with its id."""
        if x.ndim != 2:
            raise ValueError(f"x must be [seq, d_model] (one sequence; vmap over the batch); "
                             f"got shape {x.shape}")
        seq = x.shape[0]
        q = jax.vmap(self.query_proj)(x).reshape(seq, self.num_heads, self.head_dim)
        k = jax.vmap(self.key_proj)(x).reshape(seq, self.num_kv_heads, self.head_dim)
        v = jax.vmap(self.value_proj)(x).reshape(seq, self.num_kv_heads, self.head_dim)
        out = jax_dash.attention(q, k, v, scale=1.0 / math.sqrt(self.head_dim),
                                 is_causal=self.is_causal, schedule=self.schedule,
                                 local_window_size=self.local_window_size,
                                 logits_soft_cap=self.logits_soft_cap,
                                 query_seq_lengths=seq_length, key_value_seq_lengths=seq_length,
                                 query_segment_ids=segment_ids, key_value_segment_ids=segment_ids)
        return jax.vmap(self.output_proj)(out.reshape(seq, self.num_heads * self.head_dim))


from jax_dash._equinox_embed import Embedding  # noqa: E402  (after the Equinox import check)
