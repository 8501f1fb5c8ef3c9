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
         schedule=1, key_dtype=None, f32_grads=False, mask=None, accumulate=False, sums=None,
         aliased=True):
    """Raw backward call; each buffer override is a dtype (or, for lse, a shape). ``sums``: the
    three accumulate operands (default: empty, as calls without accumulate pass them), aliased to
    dq, dk, dv unless ``aliased`` is False."""
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
    if sums is None:
        sums = (jnp.zeros((0,), jnp.float32),) * 3
    aliases = {11: 0, 12: 1, 13: 2} if sums[0].size and aliased else {}
    results = jax.ffi.ffi_call("jax_dash_bwd", result_types, input_output_aliases=aliases)(
        q, k, v, out_, lse_, dout_, *mask_arrays, jnp.asarray(0.5, jnp.float32), *sums,
        is_causal=True, schedule=np.int32(schedule), f32_grads=bool(f32_grads),
        accumulate=bool(accumulate), **mask_attrs)
    return jax.block_until_ready(results)


def _fwd(dtype=jnp.bfloat16, *, out=None, lse=LSE_SHAPE, query_dtype=None,
         scale=jnp.asarray(0.5, jnp.float32), q_shape=Q_SHAPE, kv_shape=KV_SHAPE, mask=None):
    q = jnp.ones(q_shape, query_dtype or dtype)
    k = jnp.ones(kv_shape, dtype)
    v = jnp.ones(kv_shape, dtype)
    result_types = (jax.ShapeDtypeStruct(q_shape, out or dtype),
                    jax.ShapeDtypeStruct(lse, jnp.float32),
                    jax.ShapeDtypeStruct((1,), jnp.int32))  # the GPU's tile counter
    shapes = dict(q_lengths=q_shape[:1], kv_lengths=q_shape[:1], q_segments=q_shape[:2],
                  kv_segments=(q_shape[0], kv_shape[1]))
    mask_arrays, mask_attrs = _mask_operands(**{**shapes, **(mask or {})})
    results = jax.ffi.ffi_call("jax_dash_fwd", result_types)(
        q, k, v, *mask_arrays, scale, is_causal=False, **mask_attrs)
    return jax.block_until_ready(results)


def test_direct_calls_with_right_buffers_run():
    dq, dk, dv, _, _ = _bwd()
    assert dq.dtype == dk.dtype == dv.dtype == jnp.bfloat16
    out, lse, _ = _fwd()
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


def _sums(seed=0):
    """Float32 accumulate operands shaped like dq, dk, dv."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    return tuple(jax.random.normal(key, shape, jnp.float32)
                 for key, shape in zip(keys, (Q_SHAPE, KV_SHAPE, KV_SHAPE)))


def _bits(x):
    return np.asarray(x).view(np.uint32)


@pytest.mark.parametrize("aliased", [True, False], ids=["aliased", "unaliased"])
def test_accumulate_adds_the_float32_gradients_to_the_sums(aliased):
    """accumulate writes sum + g, g the float32 gradient of the call without it: the bits of the
    float32 add XLA makes of the two (the ring's earlier formulation). Without aliasing (a raw
    call) the handler copies the sums into the outputs first."""
    sums = _sums()
    alone = _bwd(jnp.bfloat16, f32_grads=True)[:3]
    added = _bwd(jnp.bfloat16, f32_grads=True, accumulate=True, sums=sums, aliased=aliased)[:3]
    expected = jax.jit(lambda a, b: [x + y for x, y in zip(a, b)])(sums, alone)
    for name, a, b in zip(("dq", "dk", "dv"), added, expected):
        assert a.dtype == jnp.float32, name
        np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=name)


def test_accumulate_needs_f32_grads():
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(
            "INVALID_ARGUMENT: jax_dash: accumulate needs f32_grads (it adds float32 gradients "
            "to float32 sums)")):
        _bwd(jnp.bfloat16, accumulate=True, sums=_sums(), aliased=False)


@pytest.mark.parametrize("index, name, owner", [(0, "dq_sum", "query"), (1, "dk_sum", "key"),
                                                (2, "dv_sum", "value")])
def test_accumulate_operand_with_wrong_shape_or_dtype(index, name, owner):
    good = Q_SHAPE if index == 0 else KV_SHAPE
    wrong = (B, SQ + SK, H, D)
    sums = list(_sums())
    sums[index] = jnp.zeros(wrong, jnp.float32)
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(
            f"jax_dash: {name} has shape {wrong}, expected the {owner}'s shape {good}")):
        _bwd(jnp.bfloat16, f32_grads=True, accumulate=True, sums=sums, aliased=False)
    sums[index] = jnp.zeros(good, jnp.bfloat16)
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(
            f"jax_dash: {name} has dtype bfloat16, expected float32 (accumulate adds float32 "
            "gradients into it)")):
        _bwd(jnp.bfloat16, f32_grads=True, accumulate=True, sums=sums, aliased=False)


def test_bwd_call_checks_its_sums():
    """_ffi.bwd_call(sums=...) refuses bad sums before any call, naming the argument."""
    q = jnp.ones(Q_SHAPE, jnp.bfloat16)
    k = v = jnp.ones(KV_SHAPE, jnp.bfloat16)
    lse = jnp.zeros(LSE_SHAPE, jnp.float32)
    dq_sum, dk_sum, dv_sum = _sums()

    def call(sums, f32_grads=True):
        return _ffi.bwd_call(q, k, v, q, lse, q, 0.5, True, "descending", f32_grads, sums=sums)

    with pytest.raises(ValueError, match=re.escape("bwd_call(sums=...) needs f32_grads=True")):
        call((dq_sum, dk_sum, dv_sum), f32_grads=False)
    with pytest.raises(ValueError, match=re.escape(
            f"dv_sum must be float32 with the value's shape {KV_SHAPE}, got float32 {Q_SHAPE}")):
        call((dq_sum, dk_sum, dq_sum))
    with pytest.raises(ValueError, match=re.escape(
            f"dq_sum must be float32 with the query's shape {Q_SHAPE}, got bfloat16 {Q_SHAPE}")):
        call((q, dk_sum, dv_sum))
    with pytest.raises(ValueError, match=re.escape("sums must be (dq_sum, dk_sum, dv_sum)")):
        call((dq_sum, dk_sum))


def test_forward_out_with_wrong_dtype():
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(
            "jax_dash: out has dtype float32, expected the query's dtype bfloat16")):
        _fwd(out=jnp.float32)


@pytest.mark.parametrize("call, message", [
    (lambda: _bwd(lse=(B, SQ, H)),
     f"lse has shape {(B, SQ, H)}, expected [batch, num_heads, seq_q] = {LSE_SHAPE}"),
    (lambda: _fwd(lse=(B, H, SQ + 1)),
     f"lse has shape {(B, H, SQ + 1)}, expected [batch, num_heads, seq_q] = {LSE_SHAPE}"),
    (lambda: _bwd(schedule=7), "unknown schedule id 7; allowed: 0 (ascending) to 5 (mirror)"),
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


def test_unit_tables_only_where_they_stay_small():
    """The backward workspace's unit tables (quadratic in the sequence, shared by every head) are
    laid out only while they stay within 1/4 of dQ's float32 accumulator: about seq_kv <= 128k x
    batch x heads at head_dim 128. Without them the workspace is smaller by exactly their size."""
    has, size = _ffi._ext.bwd_has_unit_tables, _ffi._ext.bwd_workspace_size
    assert has(8, 2048, 2048, 16, 16, 128) and has(1, 131072, 131072, 16, 16, 128)
    assert has(1, 131072, 131072, 4, 4, 128)  # the ring's head groups at 128k per device
    assert has(1, 640, 40_000, 1, 1, 128)
    assert not has(1, 640, 160_000, 1, 1, 128)
    assert has(1, 640, 160_000, 2, 2, 128)  # twice the heads: twice the accumulator
    assert not has(1, 1_000_000, 1_000_000, 1, 1, 64)
    # 640 query rows at 64 a tile, 160000 keys at 128 a tile: 10 x 1250 tiles.
    nq, nkv = 10, 1250
    assert size(1, 640, 160_000, 1, 1, 128)[1] + nkv + 2 * nq * nkv == \
        size(1, 640, 160_000, 2, 2, 128)[1] - 10  # the second head's dq semaphores


def _fwd_dropout(offsets):
    """Raw dropout forward with the given offsets operand (the key and attributes valid)."""
    q = jnp.ones(Q_SHAPE, jnp.float32)
    k = jnp.ones(KV_SHAPE, jnp.float32)
    mask_arrays, mask_attrs = _mask_operands()
    result_types = (jax.ShapeDtypeStruct(Q_SHAPE, jnp.float32),
                    jax.ShapeDtypeStruct(LSE_SHAPE, jnp.float32))
    return jax.block_until_ready(jax.ffi.ffi_call("jax_dash_fwd_dropout", result_types)(
        q, k, k, *mask_arrays, jnp.asarray(0.5, jnp.float32), jnp.zeros(2, jnp.uint32),
        jnp.asarray(offsets, jnp.int32), is_causal=False, dropout_threshold=np.int64(6554),
        dropout_scale=np.float32(1 / 0.9), **mask_attrs))


@pytest.mark.parametrize("offsets, message", [
    ((0, 0, 0), "dropout_offsets has shape (3), expected [4] (batch, head, q, kv)"),
    ((0, 0, -1, 0), "dropout_offsets has q offset -1 for 16 positions; offsets must be >= 0"),
    ((0, 2 ** 31 - 1, 0, 0), None),  # within 2^32 with the call's 4 heads
])
def test_dropout_offsets_operand(offsets, message):
    if message is None:
        out, _ = _fwd_dropout(offsets)
        assert np.isfinite(np.asarray(out)).all()
        return
    with pytest.raises(jax.errors.JaxRuntimeError, match=re.escape(message)):
        _fwd_dropout(offsets)
