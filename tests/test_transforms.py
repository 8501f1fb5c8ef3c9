"""jit, grad, vmap (nested, any axis), pmap, shard_map and GSPMD on 8 virtual CPU devices.

Sharded and transformed results must be bitwise equal to the plain call.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_dash
from helpers import random_inputs

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU kernels (float32, any head_dim): conftest.py

try:
    from jax import shard_map as _shard_map

    def shard_map(f, mesh, in_specs, out_specs):
        return _shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
except ImportError:  # jax < 0.7 spells it jax.experimental.shard_map
    from jax.experimental.shard_map import shard_map as _shard_map

    def shard_map(f, mesh, in_specs, out_specs):
        return _shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def loss(q, k, v):
    return jnp.sum(jax_dash.attention(q, k, v, is_causal=True).astype(jnp.float32) ** 2)


grad_all = jax.grad(loss, argnums=(0, 1, 2))


def _on_cpu0(fn, *args):
    """Runs fn on the first CPU device whatever the default device: module-scoped fixtures are
    set up before the function-scoped ``on_cpu`` pin (conftest.py), so they pin themselves."""
    with jax.default_device(jax.devices("cpu")[0]):
        return fn(*args)


def _make_inputs():
    q, k, v, _ = random_inputs(0, 8, 64, 64, 8, 4, 32, jnp.float32)
    return q, k, v


def _make_expected(q, k, v):
    return (np.asarray(jax_dash.attention(q, k, v, is_causal=True)),
            [np.asarray(g) for g in grad_all(q, k, v)])


@pytest.fixture(scope="module")
def inputs():
    return _on_cpu0(_make_inputs)


@pytest.fixture(scope="module")
def expected(inputs):
    return _on_cpu0(_make_expected, *inputs)


def test_module_inputs_are_made_on_the_cpu_whatever_the_default_device():
    # Another default device stands in for a GPU: the arrays must still land on CPU 0.
    with jax.default_device(jax.devices("cpu")[3]):
        arrays = _on_cpu0(_make_inputs)
    for x in arrays:
        assert x.devices() == {jax.devices("cpu")[0]}, x.devices()


def assert_all_equal(actual, expected):
    for a, b in zip(actual, expected):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_jit_matches_eager(inputs, expected):
    q, k, v = inputs
    out = jax.jit(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True))(q, k, v)
    np.testing.assert_array_equal(out, expected[0])
    assert_all_equal(jax.jit(grad_all)(q, k, v), expected[1])


def test_second_call_with_other_options_is_not_confused(inputs):
    q, k, v = inputs
    causal = jax_dash.attention(q, k, v, is_causal=True)
    full = jax_dash.attention(q, k, v, is_causal=False)
    half = jax_dash.attention(q, k, v, is_causal=True, scale=0.5)
    assert not np.array_equal(causal, full)
    assert not np.array_equal(causal, half)


def test_vmap_over_batch(inputs, expected):
    q, k, v = inputs
    out = jax.vmap(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True))(q, k, v)
    np.testing.assert_array_equal(out, expected[0])
    grads = jax.vmap(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    assert_all_equal(grads, expected[1])


def test_nested_vmap(inputs, expected):
    q, k, v = inputs
    split = lambda x: x.reshape((2, 4) + x.shape[1:])  # noqa: E731
    fn = jax.vmap(jax.vmap(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True)))
    out = fn(split(q), split(k), split(v))
    np.testing.assert_array_equal(out.reshape(expected[0].shape), expected[0])
    grads = jax.vmap(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(split(q), split(k), split(v))
    assert_all_equal([g.reshape(e.shape) for g, e in zip(grads, expected[1])], expected[1])


def test_vmap_over_a_non_leading_axis(inputs, expected):
    q, k, v = inputs
    # Put the batch axis in the middle: [S, B, H, D], mapped over axis 1.
    moved = [jnp.moveaxis(x, 0, 1) for x in (q, k, v)]
    out = jax.vmap(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True),
                   in_axes=1, out_axes=1)(*moved)
    np.testing.assert_array_equal(jnp.moveaxis(out, 1, 0), expected[0])


def test_vmap_with_unmapped_key_value(inputs):
    q, k, v = inputs
    out = jax.vmap(lambda q: jax_dash.attention(q, k[0], v[0]))(q[0:3, :, :, :])
    for i in range(3):
        np.testing.assert_array_equal(out[i], jax_dash.attention(q[i], k[0], v[0]))


@pytest.mark.parametrize("is_causal", [False, True])
def test_vmap_over_an_empty_axis_gives_empty_results(is_causal):
    q, k, v, _ = random_inputs(5, 3, 16, 24, 4, 2, 32, jnp.float32)
    empty = [x[:0] for x in (q, k, v)]  # vmap over the batch axis of size 0

    def both(fn):
        fwd = jax.vmap(lambda q, k, v: fn(q, k, v, is_causal=is_causal))(*empty)
        grads = jax.vmap(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, is_causal=is_causal)),
                                  argnums=(0, 1, 2)))(*empty)
        return fwd, grads

    (out, grads), (ref_out, ref_grads) = both(jax_dash.attention), both(
        jax.nn.dot_product_attention)
    assert (out.shape, out.dtype) == (ref_out.shape, ref_out.dtype) == ((0, 16, 4, 32), q.dtype)
    for g, r, x in zip(grads, ref_grads, (q, k, v)):
        assert (g.shape, g.dtype) == (r.shape, r.dtype) == ((0,) + x.shape[1:], x.dtype)


def test_vmap_over_an_empty_axis_nested_and_with_unmapped_operands():
    q, k, v, _ = random_inputs(6, 3, 16, 16, 2, 1, 16, jnp.bfloat16)
    # Outer axis empty, inner axis 3; and the other way round.
    outer = jax.vmap(jax.vmap(jax_dash.attention))(q[None, :0], k[None, :0], v[None, :0])
    assert outer.shape == (1, 0, 16, 2, 16)
    inner = jax.vmap(jax.vmap(jax_dash.attention))(q[:0, None], k[:0, None], v[:0, None])
    assert inner.shape == (0, 1, 16, 2, 16)
    both_empty = jax.vmap(jax.vmap(jax_dash.attention))(*[jnp.zeros((0, 0) + x.shape[1:],
                                                                    x.dtype) for x in (q, k, v)])
    assert both_empty.shape == (0, 0, 16, 2, 16)
    # Unmapped key/value: gradients of the unmapped operands are per mapped element, so empty.
    loss = lambda q, k, v: jnp.sum(jax_dash.attention(q, k, v).astype(jnp.float32))  # noqa: E731
    dq, dk, dv = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, None, None)))(
        q[:0], k[0], v[0])
    assert (dq.shape, dk.shape, dv.shape) == ((0, 16, 2, 16), (0, 16, 1, 16), (0, 16, 1, 16))
    assert dq.dtype == dk.dtype == dv.dtype == jnp.bfloat16


def test_pmap(inputs, expected):
    q, k, v = inputs
    out = jax.pmap(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True),
                   devices=jax.devices("cpu")[:8])(
        q[:, None], k[:, None], v[:, None])
    np.testing.assert_array_equal(out[:, 0], expected[0])
    grads = jax.pmap(grad_all, devices=jax.devices("cpu")[:8])(q[:, None], k[:, None], v[:, None])
    assert_all_equal([g[:, 0] for g in grads], expected[1])


def _mesh():
    return Mesh(np.array(jax.devices("cpu")[:8]).reshape(4, 2), ("data", "model"))


def test_shard_map_over_batch_and_heads(inputs, expected):
    q, k, v = inputs
    spec = P("data", None, "model", None)
    fn = jax.jit(shard_map(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True),
                           _mesh(), (spec, spec, spec), spec))
    np.testing.assert_array_equal(fn(q, k, v), expected[0])
    grad_fn = jax.jit(shard_map(grad_all, _mesh(), (spec, spec, spec), (spec, spec, spec)))
    assert_all_equal(grad_fn(q, k, v), expected[1])


@pytest.mark.parametrize("spec, communicates", [
    (P("data"), False),
    (P("data", None, "model"), False),
    (P(("data", "model")), False),
    # A sequence-sharded input runs as a ring (close, not bitwise): tests/test_ring.py.
])
def test_gspmd_sharding(inputs, expected, spec, communicates):
    assert len(jax.devices("cpu")) >= 8, "conftest.py sets 8 virtual CPU devices"
    q, k, v = inputs
    sharding = NamedSharding(_mesh(), spec)
    args = [jax.device_put(x, sharding) for x in (q, k, v)]
    fwd = jax.jit(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True))
    grad_fn = jax.jit(grad_all)
    np.testing.assert_array_equal(np.asarray(fwd(*args)), expected[0])
    grads = grad_fn(*args)
    assert_all_equal(grads, expected[1])
    hlo = grad_fn.lower(*args).compile().as_text()
    has_collective = any(c in hlo for c in ("all-gather", "all-to-all", "collective-permute"))
    assert has_collective == communicates, f"unexpected communication pattern for {spec}"
    if not communicates:  # the op keeps the batch/head sharding of its inputs
        for g in grads:
            assert g.sharding.is_equivalent_to(sharding, g.ndim), (g.sharding, sharding)


def test_mqa_heads_cannot_split_and_are_gathered():
    # num_kv_heads = 1 cannot be divided across 2 devices: heads are replicated, still exact.
    q, k, v, _ = random_inputs(1, 4, 32, 32, 4, 1, 16, jnp.float32)
    expected = [np.asarray(g) for g in grad_all(q, k, v)]
    sharding = NamedSharding(_mesh(), P("data", None, "model"))
    grads = jax.jit(grad_all)(*[jax.device_put(x, sharding) if x.shape[2] % 2 == 0
                                else jax.device_put(x, NamedSharding(_mesh(), P("data")))
                                for x in (q, k, v)])
    assert_all_equal(grads, expected)



@pytest.mark.parametrize("is_causal", [False, True])
def test_shard_map_tensor_parallel_mqa_with_replicated_key_value(is_causal):
    """Tensor-parallel MQA: the query's heads are split over 'tp', K/V (one kv head) and the
    scale are not (``in_specs=(P(None, None, 'tp'), P(), P(), P())``). Gradients trace, and
    dK/dV/dscale come back replicated like K/V/scale: summed over 'tp', as jax.nn's are."""
    q, k, v, _ = random_inputs(8, 2, 32, 24, 8, 1, 16, jnp.float32)
    scale = jnp.float32(0.4)
    mesh = Mesh(np.array(jax.devices("cpu")[:4]), ("tp",))

    def ours(q, k, v, s):
        return jax_dash.attention(q, k, v, scale=s, is_causal=is_causal)

    def theirs(q, k, v, s):
        return jax.nn.dot_product_attention(q, k, v, scale=s, is_causal=is_causal)

    def loss(fn, q, k, v, s):
        sharded = shard_map(fn, mesh, (P(None, None, "tp"), P(), P(), P()), P(None, None, "tp"))
        return jnp.sum(jnp.sin(sharded(q, k, v, s)))

    grads = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4)), static_argnums=0)
    ours_g, ref_g = grads(ours, q, k, v, scale), grads(theirs, q, k, v, scale)
    plain = jax.grad(lambda q, k, v, s: jnp.sum(jnp.sin(ours(q, k, v, s))),
                     argnums=(0, 1, 2, 3))(q, k, v, scale)
    for name, a, ref, unsharded, x in zip(("dq", "dk", "dv", "dscale"), ours_g, ref_g, plain,
                                          (q, k, v, scale)):
        assert a.shape == x.shape, name
        np.testing.assert_allclose(a, ref, rtol=2e-5, atol=2e-5, err_msg=name)
        # The sum over 'tp' is the sum over the query heads of the kv head: the unsharded op's.
        np.testing.assert_allclose(a, unsharded, rtol=2e-5, atol=2e-5, err_msg=name)
