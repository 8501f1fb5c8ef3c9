"""Hopper (sm_90) forward kernel against the pure-JAX reference.

Accuracy is judged relative to a naive low-precision run of the same math:
``max|ours - ref_fp32| <= 2 * max|naive_lowp - ref_fp32| + atol``. Every test here is marked ``gpu``
and is skipped unless a CUDA device of compute capability 9.0 is present.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from jax_dash import _ffi
from helpers import (GPU_MARKS, assert_close_to_reference, attention_and_grads, hopper_devices,
                     random_inputs, references)
from jax_dash.reference import reference_forward


HOPPER = (hopper_devices() or [None])[0]
pytestmark = GPU_MARKS

OUT_ATOL = 1e-3
LSE_ATOL = 1e-3

_fwd = jax.jit(_ffi.fwd_call, static_argnames=("scale", "is_causal"))
# Jitted once per shape: run eagerly, the reference compiles every op separately and dominates the
# suite's time.
_reference = jax.jit(reference_forward, static_argnames=("scale", "is_causal", "compute_dtype"))


def _inputs(key, batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim, dtype):
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (batch, seq_q, num_heads, head_dim), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (batch, seq_kv, num_kv_heads, head_dim), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (batch, seq_kv, num_kv_heads, head_dim), jnp.float32).astype(dtype)
    return jax.device_put((q, k, v), HOPPER)


def _max_err(x, ref):
    return float(jnp.max(jnp.abs(x.astype(jnp.float32) - ref.astype(jnp.float32))))


def _check_against_reference(q, k, v, scale, is_causal):
    out, lse = _fwd(q, k, v, scale=scale, is_causal=is_causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == jnp.float32
    with jax.default_matmul_precision("highest"):
        ref_out, ref_lse = _reference(q, k, v, scale=scale, is_causal=is_causal)
        naive_out, naive_lse = _reference(q, k, v, scale=scale, is_causal=is_causal,
                                          compute_dtype=q.dtype)
    assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32)))), "non-finite output"
    assert bool(jnp.all(jnp.isfinite(lse))), "non-finite lse"
    err_out, naive_err_out = _max_err(out, ref_out), _max_err(naive_out, ref_out)
    err_lse, naive_err_lse = _max_err(lse, ref_lse), _max_err(naive_lse, ref_lse)
    assert err_out <= 2 * naive_err_out + OUT_ATOL, (err_out, naive_err_out)
    assert err_lse <= 2 * naive_err_lse + LSE_ATOL, (err_lse, naive_err_lse)
    return out, lse


# (seq_q, seq_kv): one token, partial tiles, one tile + 1, long, and seq_q != seq_kv both ways.
SEQS = [(1, 1), (97, 97), (129, 129), (1000, 1000), (4096, 4096), (97, 1000), (1000, 97),
        (129, 4096), (4096, 129)]
# (num_heads, num_kv_heads): MHA, GQA 2, GQA 8 (MQA-like with one kv head).
HEADS = [(4, 4), (4, 2), (8, 1)]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqs", SEQS, ids=[f"{a}x{b}" for a, b in SEQS])
def test_forward_matches_reference(seqs, is_causal, head_dim, dtype):
    seq_q, seq_kv = seqs
    case = SEQS.index(seqs)
    num_heads, num_kv_heads = HEADS[case % len(HEADS)]
    batch = 2 if seq_q * seq_kv <= 1000 * 1000 else 1
    q, k, v = _inputs(jax.random.key(1000 + case), batch, seq_q, seq_kv, num_heads, num_kv_heads,
                      head_dim, dtype)
    _check_against_reference(q, k, v, 1.0 / math.sqrt(head_dim), is_causal)


# The forward takes its query tiles in groups of about ceil(SMs / Nq) heads (cuda/sm90/fwd/scheduler.cuh, FwdTileOrder):
# 64 (batch, head) pairs of 16 query tiles make 8 groups on a 132-SM GPU, the last one partial;
# every output row is checked, so a tile computed twice or never would show.
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_forward_over_many_head_groups(is_causal, head_dim):
    q, k, v = _inputs(jax.random.key(15), 4, 2048, 2048, 16, 4, head_dim, jnp.bfloat16)
    _check_against_reference(q, k, v, 1.0 / math.sqrt(head_dim), is_causal)


# 32 and 96 run the head_dim-64/128 kernels on zero-padded operands (jax_dash/_ffi.py).
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128])
@pytest.mark.parametrize("gqa", [(3, 3), (6, 3), (16, 2)], ids=["mha", "gqa2", "gqa8"])
def test_forward_gqa_and_odd_heads(gqa, head_dim):
    num_heads, num_kv_heads = gqa
    q, k, v = _inputs(jax.random.key(7), 3, 333, 271, num_heads, num_kv_heads, head_dim,
                      jnp.bfloat16)
    for is_causal in (False, True):
        _check_against_reference(q, k, v, 1.0 / math.sqrt(head_dim), is_causal)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("scale", [0.5, -0.25, 2.0, 0.0])
def test_forward_any_scale(scale, head_dim):
    # A negative scale flips which score is the row max: the kernel must take the max after scaling.
    # A positive one is folded into the exponent's FFMA (raw scores masked to -inf); zero and
    # negative scales take the scale-first path (cuda/sm90/fwd/mainloop.cuh, softmax_scores).
    q, k, v = _inputs(jax.random.key(11), 1, 300, 300, 2, 2, head_dim, jnp.bfloat16)
    for is_causal in (False, True):
        _check_against_reference(q, k, v, scale, is_causal)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seq", [1000, 4096, 4224, 8192, 8320])
def test_forward_kernels_give_the_same_bits(monkeypatch, seq, head_dim):
    """The default forward picks ws-persistent or the one-tile ws kernel by length (the cut at 8192
    keys, cuda/sm90/fwd/launch.cu), and at head_dim 64 causal up to 1024 keys ws-persistent-narrow
    (128-row tiles): either side of the cuts, the default, ws, ws-persistent and
    ws-persistent-narrow give the same bits (GQA, causal and full, a partial last tile; from 4096
    tokens on more query tiles than the H100's 132 SMs, so the persistent kernel's CTAs take
    several tiles each from its tile counter, in an order that changes from run to run)."""
    q, k, v = _inputs(jax.random.key(21), 1, seq, seq, 4, 2, head_dim, jnp.bfloat16)
    scale = 1.0 / math.sqrt(head_dim)
    for is_causal in (False, True):
        runs = {}
        for name in ("", "ws", "ws-persistent", "ws-persistent-narrow"):
            monkeypatch.setenv("JAX_DASH_SM90_FWD", name)
            out, lse = _fwd(q, k, v, scale=scale, is_causal=is_causal)
            runs[name or "default"] = (np.asarray(out.view(jnp.uint16)),
                                       np.asarray(lse.view(jnp.uint32)))
        default = runs.pop("default")
        for name, (out, lse) in runs.items():
            where = f"{name} (seq {seq}, causal {is_causal})"
            assert np.array_equal(out, default[0]), f"out of {where} differs from the default"
            assert np.array_equal(lse, default[1]), f"lse of {where} differs from the default"
    monkeypatch.delenv("JAX_DASH_SM90_FWD")
    _check_against_reference(q, k, v, scale, True)


def test_forward_without_its_workspace_is_a_clear_error():
    """The forward's third result is one int32 of workspace (the persistent kernel's tile counter,
    cuda/sm90/fwd/scheduler.cuh; _ffi.fwd_call drops it). A direct FFI call that declares it empty
    is refused, naming it, before anything runs; a call with it runs normally."""
    q, k, v = _inputs(jax.random.key(23), 1, 1024, 1024, 2, 2, 128, jnp.bfloat16)
    b, s = q.shape[:2]
    operands = (q, k, v, jnp.full((b,), s, jnp.int32), jnp.full((b,), s, jnp.int32),
                jnp.zeros((b, s), jnp.int32), jnp.zeros((b, s), jnp.int32),
                jnp.asarray(0.125, jnp.float32))
    attrs = dict(is_causal=True, window_left=np.int64(-1), window_right=np.int64(-1),
                 logits_soft_cap=np.float32(0), has_seq_lengths=False, has_segment_ids=False)

    def call(workspace):
        types = (jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, q.shape[2], s), jnp.float32),
                 jax.ShapeDtypeStruct((workspace,), jnp.int32))
        return jax.block_until_ready(jax.ffi.ffi_call("jax_dash_fwd", types)(*operands, **attrs))

    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(
            "INVALID_ARGUMENT: jax_dash: the forward's workspace must hold one int32, got (0)")):
        call(0)
    out, lse, _ = call(1)
    ref_out, ref_lse = _fwd(q, k, v, scale=0.125, is_causal=True)
    assert np.array_equal(np.asarray(out.view(jnp.uint16)), np.asarray(ref_out.view(jnp.uint16)))
    assert np.array_equal(np.asarray(lse.view(jnp.uint32)), np.asarray(ref_lse.view(jnp.uint32)))


def _poisoned_call(q, k, v, is_causal, poison):
    """Runs the forward right after freeing a buffer of out's size filled with `poison`, so that the
    allocator hands (very likely) the poisoned memory to the kernel's output."""
    for _ in range(2):
        junk = jax.device_put(np.full(q.shape, poison, dtype=q.dtype), HOPPER)
        junk.block_until_ready()
        junk.delete()
    out, lse = _fwd(q, k, v, scale=0.125, is_causal=is_causal)
    return np.asarray(out.astype(jnp.float32)), np.asarray(lse)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_forward_writes_every_output_element(is_causal):
    q, k, v = _inputs(jax.random.key(3), 2, 197, 77, 4, 2, 64, jnp.bfloat16)
    _fwd(q, k, v, scale=0.125, is_causal=is_causal)  # compile outside the poisoned window
    out_a, lse_a = _poisoned_call(q, k, v, is_causal, np.nan)
    out_b, lse_b = _poisoned_call(q, k, v, is_causal, 12345.0)
    assert np.all(np.isfinite(out_a)) and np.all(np.isfinite(lse_a))
    assert np.all(np.abs(out_b) < 1000) and np.all(np.abs(lse_b) < 1000)
    np.testing.assert_array_equal(out_a, out_b)
    np.testing.assert_array_equal(lse_a, lse_b)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_forward_is_bitwise_repeatable(is_causal):
    q, k, v = _inputs(jax.random.key(5), 2, 1500, 1500, 8, 2, 128, jnp.bfloat16)
    first_out, first_lse = _fwd(q, k, v, scale=0.1, is_causal=is_causal)
    for _ in range(10):
        out, lse = _fwd(q, k, v, scale=0.1, is_causal=is_causal)
        assert bool(jnp.array_equal(out, first_out))
        assert bool(jnp.array_equal(lse, first_lse))


def test_forward_grid_far_larger_than_the_gpu():
    # 4096 CTAs (31 waves on 132 SMs), then a batch beyond the 65535 limit of gridDim.y/z.
    q, k, v = _inputs(jax.random.key(9), 32, 1024, 1024, 16, 4, 64, jnp.bfloat16)
    _check_against_reference(q, k, v, 0.125, True)
    q, k, v = _inputs(jax.random.key(10), 70000, 1, 3, 1, 1, 64, jnp.bfloat16)
    _check_against_reference(q, k, v, 0.125, False)


def test_public_attention_runs_the_kernel():
    q, k, v = _inputs(jax.random.key(12), 2, 256, 256, 4, 4, 128, jnp.bfloat16)
    out = jax.jit(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True))(q, k, v)
    raw, _ = _fwd(q, k, v, scale=1.0 / math.sqrt(128), is_causal=True)
    assert bool(jnp.array_equal(out, raw))


# 136 and 192 run the head_dim-256 forward on zero-padded operands (jax_dash/_ffi.py).
@pytest.mark.parametrize("head_dim", [136, 192, 256])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqs", [(97, 97), (1000, 1000), (129, 700), (700, 129)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_forward_head_dim_up_to_256(seqs, is_causal, head_dim):
    q, k, v = _inputs(jax.random.key(14), 2, seqs[0], seqs[1], 4, 2, head_dim, jnp.bfloat16)
    _check_against_reference(q, k, v, 1.0 / math.sqrt(head_dim), is_causal)


@pytest.mark.parametrize("head_dim", [160, 256])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gradients_above_head_dim_128(is_causal, head_dim):
    # The backward runs head_dim 256 (160: zero-padded to it) since 2026-11-25: the public op's
    # output and gradients against the float32 reference, within the naive bf16 run's error.
    with jax.default_device(HOPPER):
        q, k, v, dout = random_inputs(13, 2, 300, 300, 4, 2, head_dim, jnp.bfloat16)
        ours = attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v,
                                                                      is_causal=is_causal),
                                   q, k, v, dout)
        ref, naive = references(q, k, v, dout, is_causal=is_causal)
    for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
        assert o.shape == r.shape and o.dtype == jnp.bfloat16, name
        assert_close_to_reference(name, o, r, n, OUT_ATOL)
