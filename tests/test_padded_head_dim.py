"""Head dims the Hopper kernels lack run them on operands zero-padded along head_dim
(``jax_dash/_ffi.py``: ``hopper_head_dim``, ``PAD_PLATFORMS``).

On the GPU that path is chosen at lowering (``lax.platform_dependent``) and checked by the GPU
tests; here the CPU kernels (which take every multiple of 8 natively) run the same padded path by
adding "cpu" to ``PAD_PLATFORMS``, so the padding, slicing and scale handling are checked against
the native CPU call: zero columns add exact zeros, so the results must be the same bits.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from jax_dash import _ffi
from helpers import random_inputs


@pytest.fixture
def padded_on_cpu(monkeypatch):
    """Runs the padded path on the CPU too; jit caches are cleared on entry and exit so that no
    trace of one mode is reused by the other."""
    jax.clear_caches()
    monkeypatch.setattr(_ffi, "PAD_PLATFORMS", ("cuda", "cpu"))
    yield
    jax.clear_caches()


@pytest.mark.parametrize("head_dim, width", [(8, 64), (32, 64), (64, 64), (72, 128), (96, 128),
                                             (128, 128), (136, 256), (192, 256), (256, 256)])
def test_hopper_head_dim(head_dim, width):
    assert _ffi.hopper_head_dim(head_dim) == width


def _custom_call_head_dims(fn, *args):
    text = jax.jit(fn).lower(*args).as_text()
    calls = [line for line in text.splitlines() if "custom_call" in line and "jax_dash" in line]
    assert calls, "no jax_dash custom call lowered"
    return {int(d) for line in calls for d in re.findall(r"tensor<\d+x\d+x\d+x(\d+)x", line)}


def test_cpu_lowering_is_not_padded():
    q = jnp.zeros((1, 64, 2, 96), jnp.bfloat16)
    assert _custom_call_head_dims(lambda q: _ffi.fwd_call(q, q, q, 0.1, True), q) == {96}


def test_padded_lowering_runs_the_wide_kernel(padded_on_cpu):
    q = jnp.zeros((1, 64, 2, 96), jnp.bfloat16)
    assert _custom_call_head_dims(lambda q: _ffi.fwd_call(q, q, q, 0.1, True), q) == {128}
    q = jnp.zeros((1, 64, 2, 40), jnp.bfloat16)
    assert _custom_call_head_dims(lambda q: _ffi.fwd_call(q, q, q, 0.1, True), q) == {64}


def _raw_forward_and_backward(q, k, v, dout, scale, is_causal, schedule, f32_grads, mask,
                              mask_arrays):
    out, lse = jax.jit(lambda q, k, v: _ffi.fwd_call(
        q, k, v, scale, is_causal, mask=mask, mask_arrays=mask_arrays))(q, k, v)
    grads = jax.jit(lambda q, k, v, out, lse, dout: _ffi.bwd_call(
        q, k, v, out, lse, dout, scale, is_causal, schedule, f32_grads, mask=mask,
        mask_arrays=mask_arrays))(q, k, v, out, lse, dout)
    return [np.asarray(x) for x in (out, lse, *grads)]


CASES = [  # (batch, seq_q, seq_kv, heads, kv_heads, head_dim, causal, schedule, f32 grads, masks)
    (2, 100, 100, 4, 2, 96, True, "descending", False, False),
    (1, 130, 70, 2, 2, 32, False, "shift", False, False),
    (2, 90, 150, 6, 3, 80, True, "symmetric_shift", True, False),
    (2, 120, 120, 4, 1, 48, True, "atomic", False, False),
    (2, 128, 128, 2, 2, 96, True, "descending", False, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"hd{c[5]}-{c[7]}{'-masks' * c[9]}")
def test_padded_path_gives_the_native_bits(monkeypatch, case):
    batch, seq_q, seq_kv, heads, kv_heads, head_dim, causal, schedule, f32_grads, masks = case
    q, k, v, dout = random_inputs(3, batch, seq_q, seq_kv, heads, kv_heads, head_dim,
                                  jnp.bfloat16)
    scale = 1.0 / np.sqrt(head_dim)
    mask, mask_arrays = _ffi.NO_MASK, None
    if masks:
        mask = _ffi.StaticMask(window=(40, 0), logits_soft_cap=20.0, has_seq_lengths=True,
                               has_segment_ids=True)
        segments = (jnp.arange(seq_q)[None, :] // 50 + jnp.arange(batch)[:, None]).astype(
            jnp.int32)
        mask_arrays = (jnp.asarray([seq_q, 77], jnp.int32), jnp.asarray([100, seq_kv], jnp.int32),
                       segments, segments)
    args = (q, k, v, dout, scale, causal, schedule, f32_grads, mask, mask_arrays)
    jax.clear_caches()
    native = _raw_forward_and_backward(*args)
    monkeypatch.setattr(_ffi, "PAD_PLATFORMS", ("cuda", "cpu"))
    jax.clear_caches()
    padded = _raw_forward_and_backward(*args)
    jax.clear_caches()
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), native, padded):
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape)
        if schedule == "atomic" and name in ("dq",):
            np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=2e-2)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_public_op_with_padding_matches_the_native_op(padded_on_cpu):
    """jax_dash.attention and its gradients under jit and vmap through the padded path: the same
    bits as the native CPU call (computed after the fixture's caches are cleared again)."""
    q, k, v, dout = random_inputs(4, 3, 70, 70, 4, 2, 96, jnp.bfloat16)

    def loss(q, k, v, dout):  # one batch element: [seq, heads, head_dim]
        return jnp.vdot(jax_dash.attention(q, k, v, is_causal=True).astype(jnp.float32),
                        dout.astype(jnp.float32))

    def run():
        return jax.tree.leaves(jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1, 2))))(
            q, k, v, dout))

    padded = run()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_ffi, "PAD_PLATFORMS", ("cuda",))
        jax.clear_caches()
        native = run()
    for a, b in zip(native, padded):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
