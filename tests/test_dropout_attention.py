"""jax_dash.attention(dropout_rate=..., dropout_rng=...) on the CPU kernels (issue 33): forward
and gradients against a reference built from jax_dash.dropout_keep_mask, rate 0, bits run to run,
keys, masks, GQA, vmap, GSPMD sharding, and the refusals (shard_map without offsets, bad
arguments). Offsets and shard_map: tests/test_dropout_offsets.py; the ring:
tests/test_ring_dropout.py."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_dash
from helpers import random_inputs

pytestmark = pytest.mark.usefixtures("on_cpu")


def reference(q, k, v, rng, rate, *, is_causal=False, window=None, scale=None):
    """float32 attention with the keep mask of dropout_keep_mask applied to the probabilities."""
    batch, seq_q, heads, head_dim = q.shape
    seq_kv, kv_heads = k.shape[1], k.shape[2]
    k, v = (jnp.repeat(x, heads // kv_heads, axis=2) for x in (k, v))
    scale = 1 / np.sqrt(head_dim) if scale is None else scale
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
    i, j = np.arange(seq_q)[:, None], np.arange(seq_kv)[None]
    visible = np.ones((seq_q, seq_kv), bool)
    if is_causal:
        visible &= j <= i
    if window is not None:
        visible &= (j >= i - window[0]) & (j <= i + window[1])
    p = jax.nn.softmax(jnp.where(visible, s, -jnp.inf), axis=-1)
    keep = jax_dash.dropout_keep_mask(rng, rate, (batch, heads, seq_q, seq_kv))
    p = jnp.where(keep, p / (1 - rate), 0.0)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def ours(rng, rate, **kwargs):
    return lambda q, k, v: jax_dash.attention(q, k, v, dropout_rate=rate, dropout_rng=rng,
                                              **kwargs)


def out_and_grads(fn, q, k, v, dout):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(dout))


@pytest.mark.parametrize("is_causal, kv_heads, window, rate", [
    (False, 4, None, 0.1), (True, 4, None, 0.5), (True, 2, None, 0.3), (True, 1, (7, 0), 0.2),
    (False, 2, (5, 9), 0.9)])
def test_matches_the_reference_with_the_keep_mask(is_causal, kv_heads, window, rate):
    q, k, v, dout = random_inputs(1, 2, 40, 48 if not is_causal else 40, 4, kv_heads, 16,
                                  jnp.float32)
    rng = jax.random.key(3)
    kwargs = dict(is_causal=is_causal, local_window_size=window)
    got = jax.jit(functools.partial(out_and_grads, ours(rng, rate, **kwargs)))(q, k, v, dout)
    want = out_and_grads(functools.partial(reference, rng=rng, rate=rate, is_causal=is_causal,
                                           window=window), q, k, v, dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5, err_msg=name)


def test_bfloat16_close_to_the_reference():
    q, k, v, dout = random_inputs(2, 1, 64, 64, 2, 2, 32, jnp.bfloat16)
    rng = jax.random.key(4)
    got = out_and_grads(ours(rng, 0.25, is_causal=True), q, k, v, dout)
    f32 = [x.astype(jnp.float32) for x in (q, k, v, dout)]
    want = out_and_grads(functools.partial(reference, rng=rng, rate=0.25, is_causal=True), *f32)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.dtype == jnp.bfloat16, name
        err = float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)))
        assert err <= 0.05 * float(jnp.max(jnp.abs(b))) + 1e-2, (name, err)


def test_rate_zero_is_the_op_without_dropout():
    q, k, v, dout = random_inputs(5, 2, 32, 32, 4, 2, 16, jnp.float32)
    plain = out_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True),
                          q, k, v, dout)
    zero = out_and_grads(ours(jax.random.key(0), 0.0, is_causal=True), q, k, v, dout)
    without_key = out_and_grads(ours(None, 0.0, is_causal=True), q, k, v, dout)
    for a, b, c in zip(plain, zero, without_key):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


@pytest.mark.parametrize("schedule", ["descending", "shift", "symmetric_shift"])
def test_same_key_same_bits_other_key_other_values(schedule):
    q, k, v, dout = random_inputs(6, 1, 64, 64, 2, 2, 16, jnp.float32)
    run = jax.jit(lambda rng, *a: out_and_grads(ours(rng, 0.2, is_causal=True,
                                                     schedule=schedule), *a))
    first, again = (run(jax.random.key(1), q, k, v, dout) for _ in range(2))
    other = run(jax.random.key(2), q, k, v, dout)
    for a, b, c in zip(first, again, other):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert not np.array_equal(np.asarray(a), np.asarray(c))


def test_traced_scale_gradient():
    q, k, v, dout = random_inputs(7, 1, 24, 24, 2, 2, 16, jnp.float32)
    rng = jax.random.key(8)

    def loss(fn, scale):
        return jnp.sum(fn(q, k, v, scale) * dout)

    ours_fn = lambda q, k, v, s: jax_dash.attention(q, k, v, scale=s, is_causal=True,  # noqa
                                                    dropout_rate=0.3, dropout_rng=rng)
    ref_fn = lambda q, k, v, s: reference(q, k, v, rng, 0.3, is_causal=True, scale=s)  # noqa
    for scale in (0.4, 0.0):
        got = jax.grad(functools.partial(loss, ours_fn))(jnp.float32(scale))
        want = jax.grad(functools.partial(loss, ref_fn))(jnp.float32(scale))
        np.testing.assert_allclose(float(got), float(want), rtol=1e-4, atol=1e-4)


def test_vmap_with_a_shared_key_is_each_call():
    """Under vmap each mapped element is its own call (coordinates from 0), so with one key every
    element gets the mask a separate call would: as jax.random with an unbatched key."""
    q, k, v, _ = random_inputs(9, 3, 16, 16, 2, 2, 16, jnp.float32)
    fn = ours(jax.random.key(10), 0.4, is_causal=True)
    mapped = jax.vmap(fn)(q[:, None], k[:, None], v[:, None])[:, 0]
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(mapped[i]),
                                      np.asarray(fn(q[i:i + 1], k[i:i + 1], v[i:i + 1])[0]))


def test_gspmd_sharding_keeps_the_unsharded_bits():
    """jit on inputs sharded over batch and heads (4 CPU devices): the mask is the unsharded
    one (global coordinates), so the bits are those of one device."""
    q, k, v, dout = random_inputs(11, 4, 32, 32, 4, 4, 16, jnp.float32)
    run = jax.jit(lambda *a: out_and_grads(ours(jax.random.key(12), 0.3, is_causal=True), *a))
    single = run(q, k, v, dout)
    mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("data", "model"))
    sharding = NamedSharding(mesh, P("data", None, "model"))
    sharded = run(*[jax.device_put(x, sharding) for x in (q, k, v, dout)])
    for a, b in zip(sharded, single):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_inside_shard_map_without_offsets_is_refused():
    """A block inside shard_map does not know its global coordinates: dropout_axes or
    dropout_offsets is required (tests/test_dropout_offsets.py runs them)."""
    mesh = Mesh(np.array(jax.devices("cpu")[:2]), ("data",))
    q, k, v, _ = random_inputs(13, 2, 16, 16, 2, 2, 16, jnp.float32)
    fn = jax.shard_map(ours(jax.random.key(0), 0.1), mesh=mesh, in_specs=(P("data"),) * 3,
                       out_specs=P("data"))
    with pytest.raises(ValueError, match="inside shard_map needs the global coordinates"):
        jax.jit(fn)(q, k, v)


def test_dropout_targets_have_both_platforms():
    """The dropout targets are registered for the CPU and CUDA (the Hopper kernels, or a handler
    that says they were not built; tests/test_gpu_dropout.py runs them on a Hopper GPU)."""
    from jax_dash import _ffi
    targets = _ffi._ext.registrations()
    assert set(targets["jax_dash_fwd_dropout"]) == {"cpu", "CUDA"}
    assert set(targets["jax_dash_bwd_dropout"]) == {"cpu", "CUDA"}


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(dropout_rate=1.0, dropout_rng=jax.random.key(0)), ValueError,
     "dropout_rate must be in [0, 1), got 1.0"),
    (dict(dropout_rate=-0.5), ValueError, "dropout_rate must be in [0, 1), got -0.5"),
    (dict(dropout_rate="0.1"), TypeError, "dropout_rate must be a float in [0, 1)"),
    (dict(dropout_rate=0.1), ValueError, "dropout_rng is required when dropout_rate > 0"),
    (dict(dropout_rate=0.1, dropout_rng=np.zeros(3, np.uint32)), TypeError,
     "dropout_rng must be a JAX PRNG key"),
])
def test_bad_dropout_arguments(kwargs, error, message):
    q, k, v, _ = random_inputs(14, 1, 8, 8, 2, 2, 16, jnp.float32)
    with pytest.raises(error, match=re.escape(message)):
        jax_dash.attention(q, k, v, **kwargs)


def test_traced_rate_is_refused():
    q, k, v, _ = random_inputs(15, 1, 8, 8, 2, 2, 16, jnp.float32)
    with pytest.raises(TypeError, match="dropout_rate must be a Python float, not a traced"):
        jax.jit(lambda r: jax_dash.attention(q, k, v, dropout_rate=r,
                                             dropout_rng=jax.random.key(0)))(0.1)
