"""jax_dash.attention as a drop-in: jax.nn.dot_product_attention's ``implementation`` and
``return_residual``, Flax's keywords and decoding refused by name, the dense-mask message."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from helpers import hopper_devices

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU kernels (conftest.py)


def _qkv(shape=(2, 40, 4, 2, 32), dtype=jnp.float32, seed=0):
    batch, seq, heads, kv_heads, head_dim = shape
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(keys[0], (batch, seq, heads, head_dim), dtype)
    k = jax.random.normal(keys[1], (batch, seq + 8, kv_heads, head_dim), dtype)
    v = jax.random.normal(keys[2], (batch, seq + 8, kv_heads, head_dim), dtype)
    return q, k, v


# ---- implementation= ------------------------------------------------------------------------

def test_implementation_none_is_the_default():
    q, k, v = _qkv()
    np.testing.assert_array_equal(jax_dash.attention(q, k, v, implementation=None),
                                  jax_dash.attention(q, k, v))


@pytest.mark.parametrize("implementation", ["xla", "cudnn", "jax_dash"])
def test_other_implementations_are_refused_saying_what_jax_dash_is(implementation):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=(
            r"jax_dash.attention is its own implementation \(Hopper kernels on GPU, C\+\+ "
            rf"kernels on CPU\); implementation must be None, got '{implementation}'")):
        jax_dash.attention(q, k, v, implementation=implementation)


# ---- return_residual= -----------------------------------------------------------------------

_MASKS = {
    "none": {},
    "causal": dict(is_causal=True),
    "window and scale": dict(local_window_size=(6, 2), scale=0.3),
    "causal window": dict(is_causal=True, local_window_size=5),
    "kv lengths": dict(key_value_seq_lengths=jnp.array([13, 48], jnp.int32)),
}


@pytest.mark.parametrize("mask", list(_MASKS))
def test_residual_is_jax_nns_log_sum_exp(mask):
    q, k, v = _qkv()
    out, residual = jax_dash.attention(q, k, v, return_residual=True, **_MASKS[mask])
    nn_out, nn_residual = jax.nn.dot_product_attention(q, k, v, return_residual=True,
                                                       implementation="xla", **_MASKS[mask])
    assert residual.shape == nn_residual.shape == q.shape[:-1]
    assert residual.dtype == nn_residual.dtype == q.dtype
    np.testing.assert_allclose(residual, nn_residual, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, nn_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out, jax_dash.attention(q, k, v, **_MASKS[mask]))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_residual_has_the_inputs_dtype_and_jax_nns_values(dtype):
    q, k, v = _qkv(dtype=dtype)
    _, residual = jax_dash.attention(q, k, v, is_causal=True, return_residual=True)
    _, nn_residual = jax.nn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    assert residual.dtype == nn_residual.dtype == dtype
    # Both round the float32 log-sum-exp to the dtype; the logits differ by float32 rounding.
    np.testing.assert_allclose(np.asarray(residual, np.float32),
                               np.asarray(nn_residual, np.float32), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not hopper_devices(), reason="needs a CUDA GPU of compute capability 9.0")
@pytest.mark.parametrize("head_dim", [64, 96])  # native and zero-padded on the Hopper kernels
def test_residual_on_the_gpu_is_jax_nns(head_dim):
    q, k, v = _qkv((2, 256, 4, 2, head_dim), dtype=jnp.bfloat16)
    out, residual = jax_dash.attention(q, k, v, is_causal=True, return_residual=True)
    _, nn_residual = jax.nn.dot_product_attention(q, k, v, is_causal=True, return_residual=True,
                                                  implementation="xla")
    assert residual.shape == q.shape[:-1] and residual.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(residual, np.float32),
                               np.asarray(nn_residual, np.float32), rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(out, jax_dash.attention(q, k, v, is_causal=True))


def test_residual_without_a_batch_axis():
    q, k, v = (x[0] for x in _qkv())
    out, residual = jax_dash.attention(q, k, v, return_residual=True)
    _, nn_residual = jax.nn.dot_product_attention(q, k, v, return_residual=True)
    assert out.shape == q.shape and residual.shape == q.shape[:-1] == nn_residual.shape
    np.testing.assert_allclose(residual, nn_residual, rtol=1e-5, atol=1e-5)


def test_residual_of_a_query_that_sees_nothing_is_minus_infinity():
    q, k, v = _qkv()
    lengths = jnp.array([5, 40], jnp.int32)
    _, residual = jax_dash.attention(q, k, v, query_seq_lengths=lengths, return_residual=True)
    _, nn_residual = jax.nn.dot_product_attention(q, k, v, query_seq_lengths=lengths,
                                                  return_residual=True)
    assert np.all(np.isneginf(residual[0, 5:]))
    np.testing.assert_allclose(residual[0, :5], nn_residual[0, :5], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(residual[1], nn_residual[1], rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(nn_residual[0, 5:]) < -1e37)  # jax.nn: a large negative number


def test_no_gradient_flows_through_the_residual():
    q, k, v = _qkv()

    def with_residual(q, k, v):
        out, residual = jax_dash.attention(q, k, v, is_causal=True, return_residual=True)
        return jnp.sum(jnp.sin(out)) + jnp.sum(residual)

    def without(q, k, v):
        return jnp.sum(jnp.sin(jax_dash.attention(q, k, v, is_causal=True)))

    for transform in (lambda f: f, jax.jit):
        ours = transform(jax.grad(with_residual, argnums=(0, 1, 2)))(q, k, v)
        plain = transform(jax.grad(without, argnums=(0, 1, 2)))(q, k, v)
        for a, b in zip(ours, plain):
            np.testing.assert_array_equal(a, b)


def test_residual_under_vmap_and_jit():
    q, k, v = _qkv()
    fn = jax.jit(jax.vmap(lambda q, k, v: jax_dash.attention(q, k, v, return_residual=True)))
    out, residual = fn(q[None], k[None], v[None])
    expected_out, expected_residual = jax_dash.attention(q, k, v, return_residual=True)
    np.testing.assert_array_equal(out[0], expected_out)
    np.testing.assert_array_equal(residual[0], expected_residual)


def test_return_residual_must_be_a_bool():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="return_residual must be a Python bool, got 'yes'"):
        jax_dash.attention(q, k, v, return_residual="yes")


# ---- Flax's keywords, unknown keywords, dense masks --------------------------------------------

FLAX_HINT = r"jax_dash.flax.make_attention_fn\(...\)"


# (dropout_rng and dropout_rate are jax_dash.attention's own: tests/test_dropout_attention.py)
@pytest.mark.parametrize("keyword", ["deterministic", "broadcast_dropout", "dtype", "precision",
                                     "module"])
def test_flax_keywords_point_to_the_flax_adapter(keyword):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=rf"Flax's attention_fn keyword\(s\) {keyword}:.*"
                                        + FLAX_HINT):
        jax_dash.attention(q, k, v, **{keyword: None})


def test_an_unknown_keyword_is_pythons_type_error():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="attention\\(\\) got an unexpected keyword argument "
                                        "'is_casual'"):
        jax_dash.attention(q, k, v, is_casual=True)


@pytest.mark.parametrize("name,plural", [("bias", "biases"), ("mask", "masks")])
def test_dense_masks_are_named_in_good_english(name, plural):
    q, k, v = _qkv()
    dense = jnp.ones((1, 1, q.shape[1], k.shape[1]), bool if name == "mask" else jnp.float32)
    with pytest.raises(ValueError, match=f"dense {plural} are not implemented"):
        jax_dash.attention(q, k, v, **{name: dense})


def test_nnx_given_jax_dash_attention_directly_points_to_the_adapter():
    nnx = pytest.importorskip("flax.nnx")
    mha = nnx.MultiHeadAttention(2, 16, qkv_features=32, decode=False,
                                 attention_fn=jax_dash.attention, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=FLAX_HINT):
        mha(jnp.ones((1, 8, 16)))


# ---- Flax decoding -------------------------------------------------------------------------------

DECODING = (r"decoding \(decode=True\) is not supported by jax_dash's attention_fn; use "
            r"jax.nn.dot_product_attention for decoding")


def _flax_adapters():
    jdf = pytest.importorskip("jax_dash.flax")
    return {"attention_fn": jdf.attention_fn,
            "make_attention_fn(is_causal=True)": jdf.make_attention_fn(is_causal=True)}


@pytest.mark.parametrize("adapter", ["attention_fn", "make_attention_fn(is_causal=True)"])
@pytest.mark.parametrize("jitted", [False, True])
def test_nnx_decoding_is_refused_by_name(adapter, jitted):
    nnx = pytest.importorskip("flax.nnx")
    mha = nnx.MultiHeadAttention(2, 16, qkv_features=32, decode=True,
                                 attention_fn=_flax_adapters()[adapter], rngs=nnx.Rngs(0))
    mha.init_cache((1, 8, 16))
    step = nnx.jit(lambda m, x: m(x)) if jitted else (lambda m, x: m(x))
    with pytest.raises(ValueError, match=DECODING):
        for _ in range(3):  # refused at the first step, whatever the step
            jax.block_until_ready(step(mha, jnp.ones((1, 1, 16))))


def test_linen_decoding_is_refused_by_name():
    nn = pytest.importorskip("flax.linen")
    jdf = pytest.importorskip("jax_dash.flax")
    module = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=32, decode=True,
                                             attention_fn=jdf.attention_fn)
    variables = module.init(jax.random.PRNGKey(0), jnp.ones((1, 8, 16)))
    with pytest.raises(ValueError, match=DECODING):
        module.apply(variables, jnp.ones((1, 1, 16)), mutable=["cache"])


def test_a_cache_mask_at_a_later_step_is_refused_by_name():
    """The mask decode=True builds at step 3 (keys 0..3 of 8), called directly."""
    jdf = pytest.importorskip("jax_dash.flax")
    q, k, v = _qkv((1, 1, 2, 2, 16))
    k, v = k[:, :8], v[:, :8]
    mask = jnp.broadcast_to(jnp.arange(8) <= 3, (1, 1, 1, 8))
    with pytest.raises(ValueError, match=DECODING):
        jdf.attention_fn(q, k, v, mask=np.asarray(mask))


def test_one_query_with_an_all_true_mask_still_runs():
    """Not decoding: one query that sees every key (all True) is the unmasked attention."""
    jdf = pytest.importorskip("jax_dash.flax")
    q, k, v = _qkv((1, 1, 2, 2, 16))
    mask = np.ones((1, 1, 1, k.shape[1]), bool)
    np.testing.assert_allclose(jdf.attention_fn(q, k, v, mask=mask),
                               jax.nn.dot_product_attention(q, k, v), rtol=1e-5, atol=1e-6)
