"""Numerical deviation from an fp64 reference, after Golden et al., "Is Flash Attention Stable?".

For bf16 inputs (rounded once, then shared by every implementation and the reference), each
implementation's out, dq, dk and dv are compared with an fp64 numpy computation of the same
attention on the same rounded inputs. The reference runs on the host in float64 numpy, so the
timing processes never switch on jax_enable_x64. The command line is
`python benchmarks/bench_attention.py --numerics --skip-timing` (or `bench_numerics.py`).
"""

from __future__ import annotations

import numpy as np

import _grid
import _peers

NUMERICS_SEQS = (512, 1024, 2048, 4096, 8192)
NUMERICS_HEADS = 2  # the error depends on seq and head_dim, not on how many heads are averaged
NUMERICS_IMPLS = ("jax_dash", "cudnn", "xla")
TENSORS = ("out", "dq", "dk", "dv")
ROUNDING_FLOOR = "ref rounded"


def numerics_points(seqs, head_dims, masks, *, heads=NUMERICS_HEADS):
    return [_grid.Point(head_dim=d, seq=s, mask=m, batch=1, heads=heads)
            for d in head_dims for m in masks for s in seqs]


def reference_fp64(q, k, v, dout, *, is_causal: bool):
    """Textbook attention forward and backward in float64, one (batch, head) at a time.

    Inputs [B, S, H, D] float64; returns out, dq, dk, dv of the same shape. Causal is top-left:
    query i sees key j iff j <= i.
    """
    batch, seq_q, heads, head_dim = q.shape
    seq_k = k.shape[1]
    scale = 1.0 / np.sqrt(head_dim)
    out, dq, dk, dv = (np.zeros_like(x) for x in (q, q, k, v))
    visible = np.tril(np.ones((seq_q, seq_k), dtype=bool)) if is_causal else None
    for b in range(batch):
        for h in range(heads):
            qh, kh, vh, doh = q[b, :, h], k[b, :, h], v[b, :, h], dout[b, :, h]
            logits = (qh @ kh.T) * scale
            if visible is not None:
                logits = np.where(visible, logits, -np.inf)
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            oh = probs @ vh
            dv[b, :, h] = probs.T @ doh
            dprobs = doh @ vh.T
            dlogits = probs * (dprobs - np.sum(doh * oh, axis=1, keepdims=True))
            dq[b, :, h] = (dlogits @ kh) * scale
            dk[b, :, h] = (dlogits.T @ qh) * scale
            out[b, :, h] = oh
    return out, dq, dk, dv


def deviation(x: np.ndarray, ref: np.ndarray) -> dict:
    diff = x.astype(np.float64) - ref
    ref_norm = float(np.linalg.norm(ref))
    return {
        "max_abs": float(np.max(np.abs(diff))),
        "rel_rms": float(np.linalg.norm(diff) / ref_norm) if ref_norm > 0 else None,
        "finite": bool(np.all(np.isfinite(x))),
    }


def run_numerics_item(item: dict) -> dict:
    import jax
    import jax.numpy as jnp
    point = _grid.Point.from_json(item["point"])
    rng = np.random.default_rng(item.get("seed", 0))
    shape = (point.batch, point.seq, point.heads, point.head_dim)
    lowp = jnp.dtype(item.get("dtype", "bfloat16"))
    inputs_lowp = [rng.standard_normal(shape).astype(lowp) for _ in range(4)]  # q, k, v, dout
    ref = reference_fp64(*(x.astype(np.float64) for x in inputs_lowp), is_causal=point.is_causal)
    result = {"dtype": str(lowp), "impls": {}}
    # The floor: no implementation returning bf16 can beat rounding the exact answer to bf16.
    result["impls"][ROUNDING_FLOOR] = {
        name: deviation(r.astype(lowp).astype(np.float64), r) for name, r in zip(TENSORS, ref)}
    for impl in item["impls"]:
        try:
            fn = _peers.attention_fn(impl, is_causal=point.is_causal, schedule=item.get("schedule"))

            def fwd_bwd(q, k, v, dout, fn=fn):
                out, vjp = jax.vjp(fn, q, k, v)
                return (out, *vjp(dout))

            got = jax.jit(fwd_bwd)(*(jnp.asarray(x) for x in inputs_lowp))
            got = [np.asarray(x).astype(np.float64) for x in got]
            result["impls"][impl] = {name: deviation(g, r) for name, g, r in zip(TENSORS, got, ref)}
        except _peers.Unavailable as e:
            result["impls"][impl] = {"skipped": str(e)}
        except Exception as e:
            result["impls"][impl] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    return result
