"""segment_sum and embed against jax.ops.segment_sum / jnp.take: values, gradients, bits,
transformations and bad input (CPU; GPU twins in test_gpu_embedding.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_dash

pytestmark = pytest.mark.usefixtures("on_cpu")

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def _reference_segment_sum(data, ids, num_segments):
    """float32 sums in ascending row order (numpy, one row at a time), cast once: the bits the
    kernels promise."""
    data = np.asarray(jnp.asarray(data, jnp.float32))
    out = np.zeros((num_segments,) + data.shape[1:], np.float32)
    for row, s in enumerate(np.asarray(ids)):
        if 0 <= s < num_segments:
            out[s] = out[s] + data[row]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,num_segments", [((1,), 1), ((37,), 5), ((64, 3), 9),
                                                ((50, 2, 4), 50), ((33, 7), 1)])
def test_segment_sum_matches_ordered_float32_sums(dtype, shape, num_segments):
    rng = np.random.default_rng(sum(shape) + num_segments)
    data = jnp.asarray(rng.normal(size=shape), dtype)
    ids = jnp.asarray(rng.integers(-3, num_segments + 3, size=shape[0]), jnp.int32)
    ours = jax_dash.segment_sum(data, ids, num_segments)
    assert ours.shape == (num_segments,) + shape[1:] and ours.dtype == jnp.dtype(dtype)
    expected = jnp.asarray(_reference_segment_sum(data, ids, num_segments)).astype(dtype)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(expected))
    # jax.ops.segment_sum on the CPU adds in the same order when it sums in float32.
    ops = jax.ops.segment_sum(data.astype(jnp.float32), ids, num_segments).astype(dtype)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(ops))


@pytest.mark.parametrize("dtype", DTYPES)
def test_segment_sum_sorted_and_unsorted_agree(dtype):
    rng = np.random.default_rng(1)
    data = jnp.asarray(rng.normal(size=(80, 6)), dtype)
    ids = jnp.sort(jnp.asarray(rng.integers(-4, 14, size=80), jnp.int32))
    sorted_path = jax_dash.segment_sum(data, ids, 10, indices_are_sorted=True)
    unsorted_path = jax_dash.segment_sum(data, ids, 10)
    np.testing.assert_array_equal(np.asarray(sorted_path), np.asarray(unsorted_path))


def test_segment_sum_empty_inputs():
    empty_rows = jax_dash.segment_sum(jnp.zeros((0, 4)), jnp.zeros((0,), jnp.int32), 3)
    np.testing.assert_array_equal(np.asarray(empty_rows), np.zeros((3, 4)))
    no_segments = jax_dash.segment_sum(jnp.ones((5, 4)), jnp.arange(5), 0)
    assert no_segments.shape == (0, 4)
    empty_row_size = jax_dash.segment_sum(jnp.ones((5, 0)), jnp.arange(5), 2)
    assert empty_row_size.shape == (2, 0)
    none_in_range = jax_dash.segment_sum(jnp.ones((4, 2)), jnp.array([-1, 7, 8, -9]), 3)
    np.testing.assert_array_equal(np.asarray(none_in_range), np.zeros((3, 2)))


def test_segment_sum_multi_axis_ids_and_int64():
    rng = np.random.default_rng(2)
    data = jnp.asarray(rng.normal(size=(3, 5, 4)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 6, size=(3, 5)))
    ours = jax_dash.segment_sum(data, ids, 6)
    expected = jax.ops.segment_sum(data.reshape(15, 4), ids.reshape(15), 6)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(expected))


def test_segment_sum_gradient_is_a_gather():
    rng = np.random.default_rng(3)
    data = jnp.asarray(rng.normal(size=(30, 4)), jnp.float32)
    ids = jnp.asarray(rng.integers(-2, 9, size=30), jnp.int32)
    weights = jnp.asarray(rng.normal(size=(7, 4)), jnp.float32)

    def loss(fn, d):
        return jnp.sum(jnp.sin(fn(d, ids, 7)) * weights)

    ours = jax.grad(lambda d: loss(jax_dash.segment_sum, d))(data)
    expected = jax.grad(lambda d: loss(jax.ops.segment_sum, d))(data)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(ours)[(np.asarray(ids) < 0) | (np.asarray(ids) >= 7)],
                                  0.0)


def test_segment_sum_vmap():
    rng = np.random.default_rng(4)
    data = jnp.asarray(rng.normal(size=(3, 11, 2)), jnp.float32)
    ids = jnp.asarray(rng.integers(-1, 5, size=(3, 11)), jnp.int32)
    both = jax.vmap(lambda d, i: jax_dash.segment_sum(d, i, 4))(data, ids)
    ids_only = jax.vmap(lambda i: jax_dash.segment_sum(data[0], i, 4))(ids)
    data_only = jax.vmap(lambda d: jax_dash.segment_sum(d, ids[0], 4))(data)
    for b in range(3):
        np.testing.assert_array_equal(np.asarray(both[b]),
                                      np.asarray(jax_dash.segment_sum(data[b], ids[b], 4)))
        np.testing.assert_array_equal(np.asarray(ids_only[b]),
                                      np.asarray(jax_dash.segment_sum(data[0], ids[b], 4)))
        np.testing.assert_array_equal(np.asarray(data_only[b]),
                                      np.asarray(jax_dash.segment_sum(data[b], ids[0], 4)))
    nested = jax.vmap(jax.vmap(lambda d, i: jax_dash.segment_sum(d, i, 4)))(
        data[None], ids[None])
    np.testing.assert_array_equal(np.asarray(nested[0]), np.asarray(both))


@pytest.mark.parametrize("dtype", DTYPES)
def test_embed_forward_is_take(dtype):
    rng = np.random.default_rng(5)
    table = jnp.asarray(rng.normal(size=(20, 6)), dtype)
    ids = jnp.asarray([[1, -1, 3, 25], [0, 19, -20, -21]], jnp.int32)  # wraps and out of range
    np.testing.assert_array_equal(np.asarray(jax_dash.embed(table, ids), np.float32),
                                  np.asarray(jnp.take(table, ids, axis=0), np.float32))
    assert np.isnan(np.asarray(jax_dash.embed(table, ids), np.float32)[0, 3]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_embed_gradient_is_takes(dtype):
    rng = np.random.default_rng(6)
    table = jnp.asarray(rng.normal(size=(16, 5)), dtype)
    ids = jnp.asarray(rng.integers(-20, 20, size=(4, 9)), jnp.int32)
    cotangent = jnp.asarray(rng.normal(size=(4, 9, 5)), dtype)

    def grad_of(fn, table, cotangent):
        _, vjp = jax.vjp(lambda t: fn(t, ids), table)
        return vjp(cotangent)[0]

    ours = grad_of(jax_dash.embed, table, cotangent)
    assert ours.dtype == jnp.dtype(dtype)
    # jnp.take's gradient summed in float32 (the CPU's scatter-add goes in row order), rounded
    # once: in 16-bit dtypes XLA's own scatter would round after every add.
    expected = grad_of(lambda t, i: jnp.take(t, i, axis=0), table.astype(jnp.float32),
                       cotangent.astype(jnp.float32)).astype(dtype)
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(expected, np.float32))
    jitted = jax.jit(lambda t, c: grad_of(jax_dash.embed, t, c))(table, cotangent)
    np.testing.assert_array_equal(np.asarray(jitted, np.float32), np.asarray(ours, np.float32))


def test_embed_gradient_bits_repeat_and_vmap():
    rng = np.random.default_rng(7)
    table = jnp.asarray(rng.normal(size=(32, 8)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 4, size=(6, 40)), jnp.int32)  # many repeats

    def loss(t):
        return jnp.sum(jnp.cos(jax.vmap(lambda i: jax_dash.embed(t, i))(ids)))

    grad = jax.jit(jax.grad(loss))
    first = np.asarray(grad(table))
    for _ in range(5):
        np.testing.assert_array_equal(np.asarray(grad(table)), first)
    # One call on the whole ids array: the same gradient up to the order of the sums (under vmap
    # JAX sums the per-element gradients afterwards).
    unbatched = jax.grad(lambda t: jnp.sum(jnp.cos(jax_dash.embed(t, ids))))(table)
    np.testing.assert_allclose(np.asarray(unbatched), first, rtol=1e-5, atol=1e-6)
    # A vmapped table: one gradient per table.
    tables = jnp.stack([table, 2 * table])
    per_table = jax.grad(lambda ts: jnp.sum(jnp.cos(jax.vmap(jax_dash.embed)(ts, ids[:2]))))(
        tables)
    for b in range(2):
        one = jax.grad(lambda t: jnp.sum(jnp.cos(jax_dash.embed(t, ids[b]))))(tables[b])
        np.testing.assert_array_equal(np.asarray(per_table[b]), np.asarray(one))


def _mesh():
    devices = np.array(jax.devices("cpu"))
    if devices.size < 8:
        pytest.skip("needs 8 CPU devices (conftest sets --xla_force_host_platform_device_count)")
    return Mesh(devices[:8].reshape(4, 2), ("data", "model"))


@pytest.mark.parametrize("table_spec", [P(), P("model", None), P(None, "model"),
                                        P("data", "model")])
def test_embed_gspmd_bits_match_one_device(table_spec):
    mesh = _mesh()
    rng = np.random.default_rng(8)
    table = jnp.asarray(rng.normal(size=(64, 16)), jnp.float32)
    ids = jnp.asarray(rng.integers(-5, 70, size=(8, 12)), jnp.int32)

    def loss(t, i):
        return jnp.sum(jnp.sin(jnp.nan_to_num(jax_dash.embed(t, i))) ** 2)

    reference = jax.jit(jax.grad(loss))(table, ids)
    sharded = jax.jit(jax.grad(loss))(jax.device_put(table, NamedSharding(mesh, table_spec)),
                                      jax.device_put(ids, NamedSharding(mesh, P("data", None))))
    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(reference))


def test_embed_shard_map_local_gradients():
    mesh = _mesh()
    rng = np.random.default_rng(9)
    table = jnp.asarray(rng.normal(size=(24, 4)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 24, size=(8, 5)), jnp.int32)

    def local(t, i):
        return jax.grad(lambda t: jnp.sum(jax_dash.embed(t, i) ** 2))(t)[None]

    per_shard = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data", None)),
                                      out_specs=P("data"), check_vma=False))(table, ids)
    for shard in range(4):
        rows = ids[2 * shard: 2 * shard + 2]
        expected = jax.grad(lambda t: jnp.sum(jax_dash.embed(t, rows) ** 2))(table)
        np.testing.assert_array_equal(np.asarray(per_shard[shard]), np.asarray(expected))


@pytest.mark.parametrize("call,match", [
    (lambda: jax_dash.segment_sum(jnp.ones((3, 2)), jnp.ones(3), 2), "segment_ids must be an int"),
    (lambda: jax_dash.segment_sum(jnp.ones((3, 2), jnp.int32), jnp.arange(3), 2), "data must be"),
    (lambda: jax_dash.segment_sum(jnp.ones((3, 2)), jnp.arange(3), 2.0), "num_segments must be"),
    (lambda: jax_dash.segment_sum(jnp.ones((3, 2)), jnp.arange(3), None), "num_segments must be"),
    (lambda: jax_dash.segment_sum(jnp.ones((3, 2)), jnp.arange(3), -1), "num_segments must be"),
    (lambda: jax_dash.segment_sum(jnp.ones((3, 2)), jnp.arange(4), 2), "segment_ids must have"),
    (lambda: jax_dash.segment_sum(jnp.ones((3, 2)), jnp.int32(1), 2), "segment_ids must have"),
    (lambda: jax_dash.segment_sum(jnp.ones((3, 2)), jnp.arange(3), 2, indices_are_sorted=1),
     "indices_are_sorted must be"),
    (lambda: jax_dash.embed(jnp.ones((4, 2)), jnp.ones(3)), "ids must be an integer"),
    (lambda: jax_dash.embed(jnp.float32(1.0), jnp.arange(3)), "table must have"),
    (lambda: jax_dash.embed(jnp.ones((4, 2), jnp.int32), jnp.arange(3)), "table must be"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()


def test_flax_embed_is_a_drop_in_for_nnx_embed():
    nnx = pytest.importorskip("flax.nnx")
    from jax_dash.flax import Embed
    ours, theirs = Embed(100, 8, rngs=nnx.Rngs(0)), nnx.Embed(100, 8, rngs=nnx.Rngs(0))
    assert isinstance(ours, nnx.Embed)
    np.testing.assert_array_equal(np.asarray(ours.embedding[...]),
                                  np.asarray(theirs.embedding[...]))
    ids = jnp.array([[1, 2, 3, 1], [99, 0, 1, 1]])
    np.testing.assert_array_equal(np.asarray(ours(ids)), np.asarray(theirs(ids)))
    grads = [nnx.grad(lambda m: jnp.sum(jnp.sin(m(ids))))(m) for m in (ours, theirs)]
    np.testing.assert_array_equal(np.asarray(grads[0]["embedding"][...]),
                                  np.asarray(grads[1]["embedding"][...]))
    np.testing.assert_array_equal(np.asarray(ours.attend(jnp.ones((2, 8)))),
                                  np.asarray(theirs.attend(jnp.ones((2, 8)))))
    with pytest.raises(ValueError, match="integer"):
        ours(jnp.ones((2,)))


def test_equinox_embedding_is_a_drop_in():
    eqx = pytest.importorskip("equinox")
    from jax_dash.equinox import Embedding
    key = jax.random.key(0)
    ours, theirs = Embedding(50, 4, key=key), eqx.nn.Embedding(50, 4, key=key)
    np.testing.assert_array_equal(np.asarray(ours.weight), np.asarray(theirs.weight))
    ids = jnp.array([3, 3, 7, 1, 49])

    def loss(m):
        return jnp.sum(jnp.sin(jax.vmap(m)(ids)))

    np.testing.assert_array_equal(np.asarray(jax.vmap(ours)(ids)),
                                  np.asarray(jax.vmap(theirs)(ids)))
    np.testing.assert_array_equal(np.asarray(eqx.filter_grad(loss)(ours).weight),
                                  np.asarray(eqx.filter_grad(loss)(theirs).weight))
    # It also takes the whole ids array: one call, one gradient (no vmap).
    np.testing.assert_array_equal(np.asarray(ours(ids)), np.asarray(jax.vmap(theirs)(ids)))
    whole = eqx.filter_grad(lambda m: jnp.sum(jnp.sin(m(ids))))(ours).weight
    np.testing.assert_array_equal(np.asarray(whole),
                                  np.asarray(eqx.filter_grad(loss)(theirs).weight))
    with pytest.raises(ValueError, match="integer index"):
        ours(jnp.ones(3))


def test_per_example_gradients_and_jacrev_of_embed():
    """vmap(grad) gives each example its own gradient (a shared table must not sum them), and
    jacrev (vmap over cotangents) agrees with jnp.take's."""
    rng = np.random.default_rng(10)
    table = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
    ids = jnp.array([[0, 1], [1, 2], [3, 3]])
    for f in (lambda t, i: jnp.sum(jnp.sin(jax_dash.embed(t, i))),):
        ours = jax.vmap(jax.grad(f), in_axes=(None, 0))(table, ids)
        theirs = jax.vmap(jax.grad(lambda t, i: jnp.sum(jnp.sin(jnp.take(t, i, axis=0)))),
                          in_axes=(None, 0))(table, ids)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    jac = jax.jacrev(lambda t: jax_dash.embed(t, ids))(table)
    np.testing.assert_array_equal(np.asarray(jac),
                                  np.asarray(jax.jacrev(lambda t: jnp.take(t, ids, axis=0))(table)))
    # grad(vmap) with one table: the sum of the per-example gradients.
    summed = jax.grad(lambda t: jnp.sum(jnp.sin(jax.vmap(lambda i: jax_dash.embed(t, i))(ids))))(
        table)
    np.testing.assert_allclose(np.asarray(summed), np.asarray(ours).sum(0), rtol=1e-6)


def test_nested_vmap_keeps_elements_apart():
    data = jnp.arange(24.0).reshape(2, 3, 2, 2)
    ids = jnp.array([[0, 1], [1, 1], [0, 0]])
    nested = jax.vmap(jax.vmap(lambda d, i: jax_dash.segment_sum(d, i, 2)),
                      in_axes=(0, None))(data, ids)
    expected = jax.vmap(jax.vmap(lambda d, i: jax.ops.segment_sum(d, i, 2)),
                        in_axes=(0, None))(data, ids)
    np.testing.assert_array_equal(np.asarray(nested), np.asarray(expected))
    tables = jnp.asarray(np.random.default_rng(11).normal(size=(2, 3, 5, 2)), jnp.float32)

    def loss(fn):
        return lambda ts: jnp.sum(jnp.sin(jax.vmap(jax.vmap(fn))(ts, jnp.array([[[0, 4]] * 3] * 2))))

    np.testing.assert_allclose(
        np.asarray(jax.grad(loss(jax_dash.embed))(tables)),
        np.asarray(jax.grad(loss(lambda t, i: jnp.take(t, i, axis=0)))(tables)), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.uint8, jnp.int16, jnp.uint32])
def test_narrow_and_unsigned_ids_against_wide_num_segments(dtype):
    data = jnp.arange(10.0).reshape(5, 2)
    ids = jnp.array([1, 2, 3, 7, 100]).astype(dtype)
    for num_segments in (50, 200, 300):
        ours = jax_dash.segment_sum(data, ids, num_segments)
        expected = jax.ops.segment_sum(data, ids.astype(jnp.int32), num_segments)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(expected))
        grad = jax.grad(lambda d: jnp.sum(jax_dash.segment_sum(d, ids, num_segments)
                                          * jnp.arange(num_segments)[:, None]))(data)
        expected_grad = jax.grad(lambda d: jnp.sum(
            jax.ops.segment_sum(d, ids.astype(jnp.int32), num_segments)
            * jnp.arange(num_segments)[:, None]))(data)
        np.testing.assert_array_equal(np.asarray(grad), np.asarray(expected_grad))


def test_shard_map_with_replicated_table_checks_types():
    """Inside shard_map (check_vma on, the default) a replicated table's gradient is summed over
    the shards, as jnp.take's is."""
    mesh = _mesh()
    rng = np.random.default_rng(12)
    table = jnp.asarray(rng.normal(size=(24, 4)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 24, size=(8, 5)), jnp.int32)

    def local(fn):
        def body(t, i):
            return jax.grad(lambda t: jnp.sum(fn(t, i) ** 2))(t)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data", None)),
                                     out_specs=P()))

    ours = local(jax_dash.embed)(table, ids)
    theirs = local(lambda t, i: jnp.take(t, i, axis=0))(table, ids)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6)
    summed = jax.jit(jax.shard_map(
        lambda d, i: jax_dash.segment_sum(d, i, 6), mesh=mesh, in_specs=(P(), P("data")),
        out_specs=P("data")))(jnp.ones((2, 2)), jnp.arange(8) % 6)  # data replicated
    expected = np.concatenate([np.asarray(jax.ops.segment_sum(jnp.ones((2, 2)), ids, 6))
                               for ids in np.split(np.arange(8) % 6, 4)])
    np.testing.assert_array_equal(np.asarray(summed), expected)
