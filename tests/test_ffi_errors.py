"""The FFI handlers' own checks (cuda/ffi_common.h, cuda/ffi.cc), reached by calling the registered
targets directly with ``jax.ffi.ffi_call`` (the public op never passes such buffers): every wrong
buffer gets an InvalidArgument naming the buffer, what it is and what is allowed."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_dash import _ffi

pytestmark = pytest.mark.usefixtures("on_cpu")  # the CPU handlers: conftest.py

B, SQ, SK, H, HKV, D = 1, 16, 24, 4, 2, 32
Q_SHAPE, KV_SHAPE, LSE_SHAPE = (B, SQ, H, D), (B, SK, HKV, D), (B, H, SQ)


def _mask_operands(q_lengths=(B,), kv_lengths=(B,), q_segments=(B, SQ), kv_segments=(B, SK),
                   **attributes):
    """The four mask operands (shapes may be overridden) and the mask attributes."""
    arrays = (jnp.full(q_lengths, SQ, jnp.int32), jnp.full(kv_lengths, SK, jnp.int32),
              jnp.zeros(q_segments, jnp.int32), jnp.zeros(kv_segments, jnp.int32))
    attrs = dict(window_left=np.int64(-1), window_right=np.int64(-1),
                 logits_soft_cap=np.float32(0), has_seq_lengths=False, has_segment_ids=False)
    attrs.update(attributes)
    return arrays, attrs


def _bwd(dtype=jnp.bfloat16, *, out=None, dout=None, dq=None, dk=None, dv=None, lse=LSE_SHAPE,
         schedule=1, key_dtype=None, f32_grads=False, mask=None):
    """Raw backward call; each buffer override is a dtype (or, for lse, a shape)."""
    q = jnp.ones(Q_SHAPE, dtype)
    k = jnp.ones(KV_SHAPE, key_dtype or dtype)
    v = jnp.ones(KV_SHAPE, key_dtype or dtype)
    out_ = jnp.ones(Q_SHAPE, out or dtype)
    dout_ = jnp.ones(Q_SHAPE, dout or dtype)
    lse_ = jnp.zeros(lse, jnp.float32)
    f32_size, i32_size = _ffi._ext.bwd_workspace_size(B, SQ, SK, H, HKV, D)
    grad_dtype = jnp.float32 if f32_grads else dtype
    result_types = (jax.ShapeDtypeStruct(Q_SHAPE, dq or grad_dtype),
                    jax.ShapeDtypeStruct(KV_SHAPE, dk or grad_dtype),
                    jax.ShapeDtypeStruct(KV_SHAPE, dv or grad_dtype),
                    jax.ShapeDtypeStruct((f32_size,), jnp.float32),
                    jax.ShapeDtypeStruct((i32_size,), jnp.int32))
    mask_arrays, mask_attrs = _mask_operands(**(mask or {}))
    results = jax.ffi.ffi_call("jax_dash_bwd", result_types)(
        q, k, v, out_, lse_, dout_, *mask_arrays, jnp.asarray(0.5, jnp.float32), is_causal=True,
        schedule=np.int32(schedule), f32_grads=bool(f32_grads), **mask_attrs)
    return jax.block_until_ready(results)


def _fwd(dtype=jnp.bfloat16, *, out=None, lse=LSE_SHAPE, query_dtype=None,
         scale=jnp.asarray(0.5, jnp.float32), q_shape=Q_SHAPE, kv_shape=KV_SHAPE, mask=None):
    q = jnp.ones(q_shape, query_dtype or dtype)
    k = jnp.ones(kv_shape, dtype)
    v = jnp.ones(kv_shape, dtype)
    result_types = (jax.ShapeDtypeStruct(q_shape, out or dtype),
                    jax.ShapeDtypeStruct(lse, jnp.float32))
    shapes = dict(q_lengths=q_shape[:1], kv_lengths=q_shape[:1], q_segments=q_shape[:2],
                  kv_segments=(q_shape[0], kv_shape[1]))
    mask_arrays, mask_attrs = _mask_operands(**{**shapes, **(mask or {})})
    results = jax.ffi.ffi_call("jax_dash_fwd", result_types)(
        q, k, v, *mask_arrays, scale, is_causal=False, **mask_attrs)
    return jax.block_until_ready(results)


def test_direct_calls_with_right_buffers_run():
    dq, dk, dv, _, _ = _bwd()
    assert dq.dtype == dk.dtype == dv.dtype == jnp.bfloat16
    out, lse = _fwd()
    assert out.shape == Q_SHAPE and lse.shape == LSE_SHAPE


@pytest.mark.parametrize("buffer, owner", [
    ("out", "query"), ("dout", "query"), ("dq", "query"), ("dk", "key"), ("dv", "key")])
@pytest.mark.parametrize("dtype, wrong", [(jnp.bfloat16, jnp.float16),
                                          (jnp.float16, jnp.float32),
                                          (jnp.float32, jnp.bfloat16)])
def test_backward_buffer_with_wrong_dtype(buffer, owner, dtype, wrong):
    expected = (f"{buffer} has dtype {jnp.dtype(wrong).name}, expected the {owner}'s dtype "
                f"{jnp.dtype(dtype).name}")
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=re.escape("INVALID_ARGUMENT: jax_dash: " + expected)):
        _bwd(dtype, **{buffer: wrong})


def test_f32_grads_writes_float32_gradients_with_the_same_values():
    """f32_grads (the ring's carried accumulators) writes the unrounded gradients: rounding them
    to bfloat16 gives exactly the bfloat16 call's results."""
    low = _bwd(jnp.bfloat16)[:3]
    wide = _bwd(jnp.bfloat16, f32_grads=True)[:3]
    for name, a, b in zip(("dq", "dk", "dv"), low, wide):
        assert b.dtype == jnp.float32, name
        assert np.array_equal(np.asarray(b.astype(jnp.bfloat16), np.float32),
                              np.asarray(a, np.float32)), name


@pytest.mark.parametrize("buffer, owner", [("dq", "query"), ("dk", "key"), ("dv", "key")])
def test_f32_grads_with_a_gradient_in_the_input_dtype(buffer, owner):
    expected = (f"{buffer} has dtype bfloat16, expected float32 (f32_grads) and the {owner}'s "
                "dtype float32")
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(expected)):
        _bwd(jnp.bfloat16, f32_grads=True, **{buffer: jnp.bfloat16})


def test_forward_out_with_wrong_dtype():
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(
            "jax_dash: out has dtype float32, expected the query's dtype bfloat16")):
        _fwd(out=jnp.float32)


@pytest.mark.parametrize("call, message", [
    (lambda: _bwd(lse=(B, SQ, H)),
     f"lse has shape {(B, SQ, H)}, expected [batch, num_heads, seq_q] = {LSE_SHAPE}"),
    (lambda: _fwd(lse=(B, H, SQ + 1)),
     f"lse has shape {(B, H, SQ + 1)}, expected [batch, num_heads, seq_q] = {LSE_SHAPE}"),
    (lambda: _bwd(schedule=7), "unknown schedule id 7; allowed: 0 (ascending) to 4 (atomic)"),
    (lambda: _fwd(jnp.float32, query_dtype=jnp.int32),
     "query has dtype int32; allowed: float32, float16, bfloat16"),
    (lambda: _bwd(jnp.float16, key_dtype=jnp.bfloat16),
     "query, key and value must have the same dtype, got float16, bfloat16, bfloat16"),
    (lambda: _fwd(scale=jnp.ones((1,), jnp.float32)),
     "scale must be a 0-d float32 array, got shape (1)"),
], ids=["bwd_lse_shape", "fwd_lse_shape", "schedule_id", "query_dtype", "key_dtype",
        "scale_shape"])
def test_other_buffers_and_attributes(call, message):
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(message)):
        call()


def test_scale_operand_of_another_dtype_is_refused():
    with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT"):
        _fwd(scale=jnp.asarray(0.5, jnp.bfloat16))

@pytest.mark.parametrize("call, message", [
    (lambda: _fwd(mask=dict(q_lengths=(B + 1,))),
     f"query_seq_lengths has shape ({B + 1}), expected [batch] = ({B})"),
    (lambda: _bwd(mask=dict(kv_lengths=(B, 1))),
     f"key_value_seq_lengths has shape {(B, 1)}, expected [batch] = ({B})"),
    (lambda: _fwd(mask=dict(q_segments=(B, SK))),
     f"query_segment_ids has shape {(B, SK)}, expected [batch, seq_q] = {(B, SQ)}"),
    (lambda: _bwd(mask=dict(kv_segments=(B, SQ))),
     f"key_value_segment_ids has shape {(B, SQ)}, expected [batch, seq_kv] = {(B, SK)}"),
    (lambda: _fwd(mask=dict(window_left=np.int64(-2))),
     "window_left=-2, window_right=-1: each must be >= 0, or -1 for no limit"),
    (lambda: _bwd(mask=dict(logits_soft_cap=np.float32(-1))),
     "logits_soft_cap=-1.000000 must be finite and > 0 (0 = no cap)"),
], ids=["fwd_q_lengths", "bwd_kv_lengths", "fwd_q_segments", "bwd_kv_segments", "window",
        "soft_cap"])
def test_mask_operands_and_attributes(call, message):
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(message)):
        call()
