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
batches like the inputs.

Dropout on the attention weights follows ``eqx.nn.MultiheadAttention``: ``dropout_p`` and
``inference`` live in the module's ``eqx.nn.Dropout`` (so ``eqx.nn.inference_mode`` switches it
off), a call's ``inference`` overrides the module's, and a call in training mode with
``dropout_p > 0`` needs ``key``. The mask is ``jax_dash.attention``'s reproducible one
(``jax_dash.dropout_keep_mask`` of ``key``: one key for all heads, which the mask tells apart by
their index, where Equinox splits the key per head), so the gradients repeat bit for bit, on the
CPU and the Hopper kernels. Under ``vmap`` over the batch each example is its own call: pass one
key per example (``jax.random.split``), as with Equinox's own dropout.
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


def _check_dropout_p(dropout_p) -> float:
    """``dropout_p`` of a module built here: a Python float in [0, 1) (compiled into the
    kernels)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) \
            or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p!r} must be a Python float in [0, 1)")
    return float(dropout_p)


def _dropout_arguments(dropout: "eqx.nn.Dropout", inference: bool | None, key):
    """``(dropout_rate, dropout_rng)`` for ``jax_dash.attention`` from a module's
    ``eqx.nn.Dropout``, the call's ``inference`` and ``key``, decided as ``eqx.nn.Dropout``
    decides: off where ``inference`` (the call's, else the module's) is True or ``p`` is 0;
    otherwise ``key`` is required."""
    if inference is None:
        inference = dropout.inference
    p = dropout.p
    if inference or (isinstance(p, (int, float)) and p == 0):
        return 0.0, None
    if isinstance(p, jax.core.Tracer):
        raise TypeError("the module's dropout_p is a traced array: jax_dash compiles the dropout "
                        "rate into its kernels, so keep dropout_p a Python float (eqx.filter_jit "
                        "leaves floats static), or set inference=True")
    rate = float(p)
    if rate == 0:
        return 0.0, None
    if key is None:
        raise RuntimeError(f"dropout_p={rate!r} in training mode (inference=False) needs a key, as "
                           "Equinox's dropout does: pass key=jax.random.key(...) (one per example "
                           "under vmap), or inference=True")
    return rate, key


def multihead_attention(
    mha: "eqx.nn.MultiheadAttention",
    query: jax.Array,
    key_: jax.Array,
    value: jax.Array,
    *,
    is_causal: bool = False,
    schedule: str = "auto",
    key: jax.Array | None = None,
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

    Dropout as ``mha.__call__`` decides it: ``mha.dropout.p`` on the attention weights in
    training mode (``inference`` None takes ``mha.dropout.inference``), with ``key`` (required
    then); the mask is ``jax_dash.attention``'s for ``dropout_rng=key`` (module docstring).
    """
    if not isinstance(mha, eqx.nn.MultiheadAttention):
        raise TypeError(f"mha must be an equinox.nn.MultiheadAttention, got {type(mha).__name__}")
    if mha.qk_size != mha.vo_size:
        raise ValueError(f"mha has qk_size={mha.qk_size} and vo_size={mha.vo_size}: jax_dash "
                         "needs equal head sizes for queries/keys and values; build the module "
                         "with qk_size == vo_size, or call it directly")
    dropout_rate, dropout_rng = _dropout_arguments(mha.dropout, inference, key)
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
    out = jax_dash.attention(q, k, v, is_causal=is_causal, schedule=schedule,
                             dropout_rate=dropout_rate, dropout_rng=dropout_rng, **mask)
    return jax.vmap(mha.output_proj)(out.reshape(query.shape[0], -1))


class SelfAttention(eqx.Module):
    """Multi-head (or grouped-query) self-attention on one sequence, using jax_dash.

    ``__call__(x [seq, d_model]) -> [seq, d_model]``; ``jax.vmap`` over the batch. Attention
    dropout as in ``eqx.nn.MultiheadAttention``: ``dropout_p`` and ``inference`` at construction
    (held by an ``eqx.nn.Dropout``, so ``eqx.nn.inference_mode`` switches it off), ``key`` and
    ``inference`` per call.
    """

    query_proj: eqx.nn.Linear
    key_proj: eqx.nn.Linear
    value_proj: eqx.nn.Linear
    output_proj: eqx.nn.Linear
    dropout: eqx.nn.Dropout
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
                 logits_soft_cap=None, dropout_p: float = 0.0, inference: bool = False,
                 key: jax.Array):
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
        if not isinstance(inference, bool):
            raise TypeError(f"inference={inference!r} must be True or False")
        self.dropout = eqx.nn.Dropout(_check_dropout_p(dropout_p), inference=inference)

    def __call__(self, x: jax.Array, *, seq_length=None, segment_ids=None,
                 key: jax.Array | None = None, inference: bool | None = None) -> jax.Array:
        """``seq_length``: a scalar; positions >= it are padding (they see nothing and nothing
        sees them). ``segment_ids``: ``[seq]`` ints (packed sequences): a position sees only
        those with its id. ``key``: the dropout key (required in training mode with
        ``dropout_p > 0``); ``inference``: overrides the module's (True: no dropout)."""
        if x.ndim != 2:
            raise ValueError(f"x must be [seq, d_model] (one sequence; vmap over the batch); "
                             f"got shape {x.shape}")
        dropout_rate, dropout_rng = _dropout_arguments(self.dropout, inference, key)
        seq = x.shape[0]
        q = jax.vmap(self.query_proj)(x).reshape(seq, self.num_heads, self.head_dim)
        k = jax.vmap(self.key_proj)(x).reshape(seq, self.num_kv_heads, self.head_dim)
        v = jax.vmap(self.value_proj)(x).reshape(seq, self.num_kv_heads, self.head_dim)
        out = jax_dash.attention(q, k, v, scale=1.0 / math.sqrt(self.head_dim),
                                 is_causal=self.is_causal, schedule=self.schedule,
                                 local_window_size=self.local_window_size,
                                 logits_soft_cap=self.logits_soft_cap,
                                 query_seq_lengths=seq_length, key_value_seq_lengths=seq_length,
                                 query_segment_ids=segment_ids, key_value_segment_ids=segment_ids,
                                 dropout_rate=dropout_rate, dropout_rng=dropout_rng)
        return jax.vmap(self.output_proj)(out.reshape(seq, self.num_heads * self.head_dim))


from jax_dash._equinox_embed import Embedding  # noqa: E402  (after the Equinox import check)
