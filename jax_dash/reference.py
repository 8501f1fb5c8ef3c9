"""Pure-JAX attention: the simplest correct forward (out, lse) and explicit backward.

Tests and benchmarks judge the kernels against these functions. Shapes follow
``jax_dash.attention``: ``q`` ``[B, Sq, H, D]``, ``k``/``v`` ``[B, Sk, Hkv, D]``, ``lse``
``[B, H, Sq]`` (natural log). ``compute_dtype`` is the dtype every operation runs in: float32 for
the reference, the input dtype for a "naive low-precision" run, float64 (with x64 enabled) for
numerics studies.
"""

from __future__ import annotations

import math

import jax.numpy as jnp


def _expand_kv(x, num_heads):
    """[B, Sk, Hkv, D] -> [B, Sk, H, D]: query head h reads kv head h // (H // Hkv)."""
    return jnp.repeat(x, num_heads // x.shape[2], axis=2)


def visible_mask(seq_q, seq_kv, *, batch=1, is_causal=False, query_seq_lengths=None,
                 key_value_seq_lengths=None, local_window_size=None, query_segment_ids=None,
                 key_value_segment_ids=None):
    """[B, Sq, Sk] boolean: query i of row b sees key j. The dense form of every structured mask
    of ``jax_dash.attention`` (lengths [B], segment ids [B, S]; window int or (left, right))."""
    i = jnp.arange(seq_q)[:, None]
    j = jnp.arange(seq_kv)[None, :]
    visible = jnp.ones((batch, seq_q, seq_kv), dtype=bool)
    if is_causal:
        visible = visible & (j <= i)
    if local_window_size is not None:
        left, right = ((local_window_size, local_window_size)
                       if isinstance(local_window_size, int) else local_window_size)
        visible = visible & (j >= i - left) & (j <= i + right)
    if query_seq_lengths is not None:
        visible = visible & (i[None] < jnp.asarray(query_seq_lengths)[:, None, None])
    if key_value_seq_lengths is not None:
        visible = visible & (j[None] < jnp.asarray(key_value_seq_lengths)[:, None, None])
    if query_segment_ids is not None:
        visible = visible & (jnp.asarray(query_segment_ids)[:, :, None]
                             == jnp.asarray(key_value_segment_ids)[:, None, :])
    return visible


def _probabilities(q, k, scale, mask, compute_dtype):
    """Masked logits [B, H, Sq, Sk], the visibility mask [B, 1, Sq, Sk] and, with a soft cap, the
    tanh of the capped logits (for the backward)."""
    q = q.astype(compute_dtype)
    k = _expand_kv(k, q.shape[2]).astype(compute_dtype)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * jnp.asarray(scale, compute_dtype)
    cap = mask.get("logits_soft_cap")
    tanh = None
    if cap is not None:
        tanh = jnp.tanh(scores / jnp.asarray(cap, compute_dtype))
        scores = jnp.asarray(cap, compute_dtype) * tanh
    dense = {name: value for name, value in mask.items() if name != "logits_soft_cap"}
    visible = visible_mask(q.shape[1], k.shape[1], batch=q.shape[0], **dense)[:, None]
    return jnp.where(visible, scores, -jnp.inf), visible, tanh


def _default_scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def reference_forward(q, k, v, *, scale=None, is_causal=False, compute_dtype=jnp.float32,
                      **mask):
    """Returns ``(out, lse)`` in ``compute_dtype``. Rows that see no key give out 0, lse -inf.
    ``mask``: the structured mask arguments of ``jax_dash.attention`` (query_seq_lengths,
    key_value_seq_lengths, local_window_size, query_segment_ids, key_value_segment_ids,
    logits_soft_cap)."""
    scale = _default_scale(q, scale)
    scores, _, _ = _probabilities(q, k, scale, dict(mask, is_causal=is_causal), compute_dtype)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    safe_max = jnp.where(jnp.isneginf(row_max), jnp.zeros_like(row_max), row_max)
    weights = jnp.exp(scores - safe_max)
    row_sum = jnp.sum(weights, axis=-1, keepdims=True)
    empty = row_sum == 0
    probs = weights / jnp.where(empty, jnp.ones_like(row_sum), row_sum)
    v = _expand_kv(v, q.shape[2]).astype(compute_dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    lse = jnp.where(empty, -jnp.inf, safe_max + jnp.log(row_sum))[..., 0]
    return out, lse


def reference_backward(q, k, v, out, lse, dout, *, scale=None, is_causal=False,
                       compute_dtype=jnp.float32, **mask):
    """Returns ``(dq, dk, dv)`` in ``compute_dtype`` from the forward's ``out`` and ``lse``."""
    scale = _default_scale(q, scale)
    num_heads, num_kv_heads = q.shape[2], k.shape[2]
    scores, visible, tanh = _probabilities(q, k, scale, dict(mask, is_causal=is_causal),
                                           compute_dtype)
    lse = lse.astype(compute_dtype)[..., None]
    live = visible & ~jnp.isneginf(lse)
    probs = jnp.where(live, jnp.exp(scores - jnp.where(jnp.isneginf(lse), 0, lse)), 0)
    dout = dout.astype(compute_dtype)
    qc, oc = q.astype(compute_dtype), out.astype(compute_dtype)
    kc = _expand_kv(k, num_heads).astype(compute_dtype)
    vc = _expand_kv(v, num_heads).astype(compute_dtype)
    dv = jnp.einsum("bhqk,bqhd->bkhd", probs, dout)
    dp = jnp.einsum("bqhd,bkhd->bhqk", dout, vc)
    dsum = jnp.einsum("bqhd,bqhd->bhq", dout, oc)[..., None]
    ds = jnp.where(live, probs * (dp - dsum), 0)  # masked pairs contribute no gradient
    if tanh is not None:  # d(c * tanh(x / c)) / dx = 1 - tanh^2
        ds = ds * (1 - tanh * tanh)
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds, kc) * scale
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds, qc) * scale

    def fold_groups(x):  # [B, Sk, H, D] -> [B, Sk, Hkv, D], summing the heads of each group
        b, s, _, d = x.shape
        return x.reshape(b, s, num_kv_heads, num_heads // num_kv_heads, d).sum(axis=3)

    return dq, fold_groups(dk), fold_groups(dv)


def reference_attention(q, k, v, *, scale=None, is_causal=False, compute_dtype=jnp.float32,
                        **mask):
    """Differentiable reference output (autodiff through the plain formula)."""
    return reference_forward(q, k, v, scale=scale, is_causal=is_causal,
                             compute_dtype=compute_dtype, **mask)[0]
