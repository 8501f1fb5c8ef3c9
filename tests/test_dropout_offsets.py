"""Dropout at global coordinates (issue 33): jax_dash.attention(..., dropout_offsets=,
dropout_axes=) on the CPU kernels. The offsets move the mask exactly (read out of the kernels'
results), a block of a larger problem gets that problem's bits, traced and vmapped offsets work,
and inside shard_map the call sharded over batch and heads gives the unsharded call's bits; bad
offsets and axes are refused with errors naming the argument."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jax_dash
from helpers import (attention_and_grads, dropout_readout_inputs, kept_by_backward,
                     kept_by_forward, random_inputs)

pytestmark = pytest.mark.usefixtures("on_cpu")

RATE = 0.3
RNG = jax.random.key(21)


def _mesh(shape, names):
    count = int(np.prod(shape))
    return Mesh(np.array(jax.devices("cpu")[:count]).reshape(shape), names)


def ours(**kwargs):
    return lambda q, k, v: jax_dash.attention(q, k, v, dropout_rate=RATE, dropout_rng=RNG,
                                              **kwargs)


def _assert_equal(actual, expected, names=("out", "dq", "dk", "dv")):
    for name, a, b in zip(names, actual, expected):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


# ---- the offsets move the mask ----------------------------------------------------------------

@pytest.mark.parametrize("offsets", [(3, 0, 0, 0), (0, 5, 0, 0), (0, 0, 17, 0), (0, 0, 0, 40),
                                     (2, 7, 33, 9)])
def test_offsets_move_the_mask_exactly(offsets):
    """The forward's and the backward's masks, read out of the results, are dropout_keep_mask at
    the offsets."""
    q, k, v, dout = dropout_readout_inputs(2, 24, 32, 2, 32)
    out, dq, dk, dv = jax.jit(functools.partial(
        attention_and_grads, ours(dropout_offsets=offsets)))(q, k, v, dout)
    expected = np.asarray(jax_dash.dropout_keep_mask(
        RNG, RATE, (2, 2, 24, 32), batch_offset=offsets[0], head_offset=offsets[1],
        q_offset=offsets[2], kv_offset=offsets[3]))
    np.testing.assert_array_equal(kept_by_forward(out, 32), expected)
    np.testing.assert_array_equal(kept_by_backward(dv, 24), expected)


def test_zero_offsets_are_the_default_bits():
    q, k, v, dout = random_inputs(1, 2, 32, 32, 4, 2, 16, jnp.float32)
    plain = attention_and_grads(ours(is_causal=True), q, k, v, dout)
    zero = attention_and_grads(ours(is_causal=True, dropout_offsets=(0, 0, 0, 0)), q, k, v, dout)
    _assert_equal(zero, plain)


@pytest.mark.parametrize("is_causal", [False, True])
def test_a_batch_and_head_block_has_the_bits_of_the_larger_problem(is_causal):
    """Batch rows and heads are independent, so a block of them with its offsets gives exactly
    the larger call's bits there (GQA: query heads 2..3 read key/value head 1)."""
    q, k, v, dout = random_inputs(2, 4, 40, 40, 4, 2, 16, jnp.float32)
    run = jax.jit(lambda q, k, v, dout, offsets: attention_and_grads(
        ours(is_causal=is_causal, dropout_offsets=offsets), q, k, v, dout))
    full = run(q, k, v, dout, jnp.zeros(4, jnp.int32))
    rows, heads, kv_heads = slice(1, 3), slice(2, 4), slice(1, 2)
    block = run(q[rows, :, heads], k[rows, :, kv_heads], v[rows, :, kv_heads],
                dout[rows, :, heads], jnp.array([1, 2, 0, 0], jnp.int32))
    _assert_equal(block, (full[0][rows, :, heads], full[1][rows, :, heads]), ("out", "dq"))
    # dK/dV of key/value head 1 are the sums over query heads 2 and 3: both in the block.
    _assert_equal(block[2:], (full[2][rows, :, kv_heads], full[3][rows, :, kv_heads]),
                  ("dk", "dv"))


def test_query_rows_with_a_q_offset_have_the_larger_problems_output():
    """Query rows are independent in the forward (each runs over all keys in the same order):
    rows 16..47 called alone with q offset 16 give the full call's output rows bitwise, and
    gradients equal to rounding (dK/dV then miss the other rows' terms: compared on the rows'
    own share, against a call with the other rows' dout zeroed)."""
    q, k, v, dout = random_inputs(3, 2, 64, 48, 2, 2, 16, jnp.float32)
    rows = slice(16, 48)
    full = attention_and_grads(ours(), q, k, v, dout.at[:, :16].set(0).at[:, 48:].set(0))
    part = attention_and_grads(ours(dropout_offsets=(0, 0, 16, 0)), q[:, rows], k, v,
                               dout[:, rows])
    np.testing.assert_array_equal(np.asarray(part[0]), np.asarray(full[0][:, rows]))
    for name, a, b in zip(("dq", "dk", "dv"), part[1:], (full[1][:, rows], full[2], full[3])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5, err_msg=name)


def test_traced_offsets_give_the_bits_of_concrete_ones():
    q, k, v, dout = random_inputs(4, 1, 32, 32, 2, 2, 16, jnp.float32)
    concrete = attention_and_grads(ours(dropout_offsets=(5, 3, 64, 96)), q, k, v, dout)
    traced = jax.jit(lambda b, h, i, j: attention_and_grads(
        ours(dropout_offsets=(b, h, i, j)), q, k, v, dout))(5, 3, 64, 96)
    as_array = jax.jit(lambda o: attention_and_grads(ours(dropout_offsets=o), q, k, v, dout))(
        jnp.array([5, 3, 64, 96], jnp.uint32))
    _assert_equal(traced, concrete)
    _assert_equal(as_array, concrete)


def test_vmapped_offsets_are_each_elements_own():
    """Under vmap each element is its own call; batched offsets give each element its own."""
    q, k, v, _ = random_inputs(5, 3, 16, 16, 2, 2, 16, jnp.float32)
    offsets = jnp.array([[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 16, 16]], jnp.int32)
    mapped = jax.vmap(lambda q, k, v, o: ours(dropout_offsets=o)(q, k, v))(
        q[:, None], k[:, None], v[:, None], offsets)
    for i in range(3):
        alone = ours(dropout_offsets=tuple(int(x) for x in offsets[i]))(
            q[i:i + 1], k[i:i + 1], v[i:i + 1])
        np.testing.assert_array_equal(np.asarray(mapped[i]), np.asarray(alone))
    assert not np.array_equal(np.asarray(mapped[0]), np.asarray(mapped[1]))


def test_a_negative_traced_offset_fails_when_the_call_runs():
    q, k, v, _ = random_inputs(6, 1, 16, 16, 2, 2, 16, jnp.float32)
    run = jax.jit(lambda h: ours(dropout_offsets=(0, h, 0, 0))(q, k, v))
    with pytest.raises(Exception, match=re.escape("dropout_offsets has head offset -3")):
        jax.block_until_ready(run(-3))


# ---- shard_map --------------------------------------------------------------------------------

def _sharded_vjp(mesh, spec, **kwargs):
    def run(q, k, v, dout):
        return attention_and_grads(ours(**kwargs), q, k, v, dout)

    return jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec,) * 4))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mesh_shape, names, spec, axes", [
    ((4,), ("data",), P("data"), ("data", None)),
    ((2,), ("model",), P(None, None, "model"), (None, "model")),
    ((2, 2), ("data", "model"), P("data", None, "model"), ("data", "model")),
    ((2, 2), ("a", "b"), P(("a", "b")), (("a", "b"), None)),
    ((2, 2), ("data", "model"), P("data", None, "model"), ("data", "model", None, None)),
])
def test_shard_map_over_batch_and_heads_gives_the_unsharded_bits(is_causal, mesh_shape, names,
                                                                 spec, axes):
    q, k, v, dout = random_inputs(7, 4, 32, 32, 4, 2, 16, jnp.float32)  # GQA
    single = jax.jit(functools.partial(attention_and_grads, ours(is_causal=is_causal)))(
        q, k, v, dout)
    sharded = _sharded_vjp(_mesh(mesh_shape, names), spec, is_causal=is_causal,
                           dropout_axes=axes)(q, k, v, dout)
    _assert_equal(sharded, single)


def test_dropout_offsets_in_shard_map_give_the_bits_of_dropout_axes():
    """The same offsets written out: axis_index times the local size."""
    q, k, v, dout = random_inputs(8, 4, 32, 32, 4, 4, 16, jnp.float32)
    mesh = _mesh((2, 2), ("data", "model"))
    spec = P("data", None, "model")

    def run(q, k, v, dout):
        offsets = (jax.lax.axis_index("data") * q.shape[0],
                   jax.lax.axis_index("model") * q.shape[2], 0, 0)
        return attention_and_grads(ours(is_causal=True, dropout_offsets=offsets), q, k, v, dout)

    by_hand = jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(spec,) * 4,
                                    out_specs=(spec,) * 4))(q, k, v, dout)
    by_axes = _sharded_vjp(mesh, spec, is_causal=True, dropout_axes=("data", "model"))(
        q, k, v, dout)
    _assert_equal(by_hand, by_axes)


def test_shard_map_tensor_parallel_mqa():
    """Query heads split over 'tp', the one key/value head replicated: the output and dQ are the
    unsharded call's bits; dK/dV (summed over 'tp' by JAX) equal them to rounding."""
    q, k, v, _ = random_inputs(9, 2, 32, 32, 4, 1, 16, jnp.float32)
    mesh = _mesh((2,), ("tp",))
    fn = jax.shard_map(ours(is_causal=True, dropout_axes=(None, "tp")), mesh=mesh,
                       in_specs=(P(None, None, "tp"), P(), P()), out_specs=P(None, None, "tp"))

    def loss(fn, q, k, v):
        return jnp.sum(jnp.sin(fn(q, k, v)))

    sharded = jax.jit(jax.value_and_grad(functools.partial(loss, fn), argnums=(0, 1, 2)))(q, k, v)
    single = jax.jit(jax.value_and_grad(functools.partial(loss, ours(is_causal=True)),
                                        argnums=(0, 1, 2)))(q, k, v)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(q, k, v)),
                                  np.asarray(ours(is_causal=True)(q, k, v)))
    np.testing.assert_array_equal(np.asarray(sharded[1][0]), np.asarray(single[1][0]))
    for name, a, b in zip(("dk", "dv"), sharded[1][1:], single[1][1:]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5, err_msg=name)


def test_shard_map_with_the_queries_split_and_the_keys_gathered():
    """The sequence split by the user: each device's queries against all keys (K/V all-gathered),
    dropout_axes=(None, None, 'seq', None). The output is the unsharded call's bits (query rows
    are independent); the gradients equal it to rounding (dK/dV sum over the devices)."""
    q, k, v, dout = random_inputs(10, 2, 64, 64, 2, 2, 16, jnp.float32)
    mesh = _mesh((4,), ("seq",))

    def run(q, k, v, dout):
        def attend(q, k, v):
            return ours(dropout_axes=(None, None, "seq", None))(q, k, v)

        k_all, v_all = (jax.lax.all_gather(x, "seq", axis=1, tiled=True) for x in (k, v))
        out, pullback = jax.vjp(attend, q, k_all, v_all)
        dq, dk, dv = pullback(dout)
        dk, dv = (jax.lax.psum_scatter(x, "seq", scatter_dimension=1, tiled=True)
                  for x in (dk, dv))
        return out, dq, dk, dv

    spec = P(None, "seq")
    sharded = jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(spec,) * 4,
                                    out_specs=(spec,) * 4))(q, k, v, dout)
    single = attention_and_grads(ours(), q, k, v, dout)
    np.testing.assert_array_equal(np.asarray(sharded[0]), np.asarray(single[0]))
    for name, a, b in zip(("dq", "dk", "dv"), sharded[1:], single[1:]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5, err_msg=name)


# ---- refusals ---------------------------------------------------------------------------------

def _in_shard_map(mesh_shape, names, spec, **kwargs):
    q, k, v, _ = random_inputs(11, 4, 16, 16, 4, 4, 16, jnp.float32)
    fn = jax.shard_map(ours(**kwargs), mesh=_mesh(mesh_shape, names), in_specs=(spec,) * 3,
                       out_specs=spec)
    return jax.jit(fn)(q, k, v)


def test_shard_map_without_offsets_asks_for_them():
    with pytest.raises(ValueError, match=r"inside shard_map needs the global coordinates.*"
                                         r"mesh axes \('data',\).*Pass dropout_axes="):
        _in_shard_map((2,), ("data",), P("data"))


@pytest.mark.parametrize("axes, message", [
    (("data", "model"), "names mesh axis 'model' for the head, but the query does not vary"),
    ((None, None), "vary over mesh axis 'data', which dropout_axes=(None, None) does not name"),
    (("model", None), "names mesh axis 'model' for the batch, but the query does not vary"),
])
def test_dropout_axes_that_do_not_match_the_sharding_are_refused(axes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _in_shard_map((2, 2), ("data", "model"), P("data"), dropout_axes=axes)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(dropout_offsets=(0, 0, 0)), TypeError, "dropout_offsets must be a tuple (batch, head, "
                                                 "q, kv) of non-negative ints"),
    (dict(dropout_offsets=(0, -1, 0, 0)), ValueError,
     "dropout_offsets[1] (the head offset) must be in [0, 2^31), got -1"),
    (dict(dropout_offsets=(0, 0, 2 ** 31, 0)), ValueError,
     "dropout_offsets[2] (the q offset) must be in [0, 2^31), got 2147483648"),
    (dict(dropout_offsets=(0, 0, 1.5, 0)), TypeError,
     "dropout_offsets[2] (the q offset) must be an int or an integer scalar array, got 1.5"),
    (dict(dropout_offsets=(True, 0, 0, 0)), TypeError,
     "dropout_offsets[0] (the batch offset) must be an int, got True"),
    (dict(dropout_offsets=(np.zeros(2, np.int32), 0, 0, 0)), TypeError,
     "dropout_offsets[0] (the batch offset) must be an int or an integer scalar array, got an "
     "array of shape (2,)"),
    (dict(dropout_offsets=jnp.zeros(4, jnp.float32)), TypeError,
     "got an array of shape (4,) and dtype float32"),
    (dict(dropout_offsets=np.array([0, 0, 0, -2])), ValueError,
     "dropout_offsets[3] (the kv offset) must be in [0, 2^31), got -2"),
    (dict(dropout_offsets=(0, 0, 0, 0), dropout_axes=("data", None)), ValueError,
     "pass dropout_offsets or dropout_axes, not both"),
    (dict(dropout_axes="data"), TypeError, "dropout_axes must be (batch_axis, head_axis) or "
                                           "(batch_axis, head_axis, q_axis, kv_axis)"),
    (dict(dropout_axes=("data", None, None)), TypeError, "got a tuple of 3"),
    (dict(dropout_axes=(1, None)), TypeError,
     "dropout_axes[0] (the batch axis) must be None, a mesh axis name or a non-empty tuple"),
    (dict(dropout_axes=("data", "data")), ValueError,
     "names mesh axis 'data' for two dimensions of the query"),
    (dict(dropout_axes=("data", None)), ValueError,
     "dropout_axes names mesh axis 'data' for the batch, which is not bound here"),
])
def test_bad_offsets_and_axes(kwargs, error, message):
    q, k, v, _ = random_inputs(12, 1, 8, 8, 2, 2, 16, jnp.float32)
    with pytest.raises(error, match=re.escape(message)):
        ours(**kwargs)(q, k, v)


def test_without_dropout_the_offsets_are_checked_but_no_axis_is_bound():
    """dropout_rate 0 draws no mask: dropout_axes need not be bound (a model's evaluation
    outside shard_map), but a malformed argument is still refused."""
    q, k, v, _ = random_inputs(13, 1, 8, 8, 2, 2, 16, jnp.float32)
    plain = jax_dash.attention(q, k, v)
    np.testing.assert_array_equal(
        np.asarray(jax_dash.attention(q, k, v, dropout_axes=("data", "model"))),
        np.asarray(plain))
    with pytest.raises(ValueError, match=re.escape("dropout_offsets[0] (the batch offset)")):
        jax_dash.attention(q, k, v, dropout_offsets=(-1, 0, 0, 0))


def test_dropout_axes_without_varying_axes_tracked():
    """shard_map(check_vma=False): JAX does not track which axes the operands vary over, so
    dropout_axes cannot be checked against them and is trusted; the bits are still the
    unsharded call's."""
    q, k, v, _ = random_inputs(14, 4, 32, 32, 4, 4, 16, jnp.float32)
    spec = P("data", None, "model")
    fn = jax.shard_map(ours(is_causal=True, dropout_axes=("data", "model")),
                       mesh=_mesh((2, 2), ("data", "model")), in_specs=(spec,) * 3,
                       out_specs=spec, check_vma=False)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(q, k, v)),
                                  np.asarray(ours(is_causal=True)(q, k, v)))
