"""Bad input gets a ValueError/TypeError that names the argument, the value and what is allowed."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU kernels (float32, any head_dim): conftest.py


def arrays(q_shape=(2, 16, 4, 32), kv_shape=(2, 16, 2, 32), dtype=jnp.float32,
           v_shape=None, k_dtype=None, v_dtype=None):
    q = jnp.ones(q_shape, dtype)
    k = jnp.ones(kv_shape, k_dtype or dtype)
    v = jnp.ones(v_shape or kv_shape, v_dtype or dtype)
    return q, k, v


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(q_shape=(16, 32), kv_shape=(16, 32)), ValueError, r"query must be 4-D .* got shape \(16, 32\)"),
    (dict(q_shape=(1, 2, 16, 4, 32)), ValueError, r"query must be 4-D .*\(1, 2, 16, 4, 32\)"),
    (dict(q_shape=(16, 4, 32)), ValueError, r"all be 4-D or all be 3-D"),
    (dict(v_shape=(2, 16, 2, 16)), ValueError, r"key and value must have the same shape"),
    (dict(kv_shape=(3, 16, 2, 32)), ValueError, r"same batch size.*\(2, 16, 4, 32\).*\(3, 16, 2, 32\)"),
    (dict(kv_shape=(2, 16, 2, 64)), ValueError, r"same head_dim"),
    (dict(kv_shape=(2, 16, 3, 32)), ValueError, r"num_heads \(4\) must be a positive multiple of num_kv_heads \(3\)"),
    (dict(q_shape=(2, 16, 4, 12), kv_shape=(2, 16, 2, 12)), ValueError, r"head_dim=12 is not supported: .*multiple of 8 up to 256"),
    (dict(q_shape=(2, 16, 4, 264), kv_shape=(2, 16, 2, 264)), ValueError, r"head_dim=264"),
    (dict(q_shape=(2, 0, 4, 32)), ValueError, r"sequence lengths must be at least 1, got seq_q=0"),
    (dict(kv_shape=(2, 0, 2, 32)), ValueError, r"seq_kv=0"),
    (dict(q_shape=(0, 16, 4, 32), kv_shape=(0, 16, 2, 32)), ValueError, r"batch must be at least 1"),
    (dict(dtype=jnp.int32), TypeError, r"query has dtype int32; allowed: bfloat16, float16 .* float32"),
    (dict(dtype=jnp.complex64), TypeError, r"dtype complex64"),
    (dict(k_dtype=jnp.bfloat16), TypeError, r"same dtype, got float32, bfloat16, float32"),
])
def test_bad_arrays(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        jax_dash.attention(*arrays(**kwargs))


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(schedule="fastest"), ValueError, r"schedule='fastest' is not one of auto, ascending"),
    (dict(schedule=None), ValueError, r"schedule=None"),
    (dict(is_causal="yes"), TypeError, r"is_causal must be a Python bool, got 'yes'"),
    (dict(is_causal=jnp.array(True)), TypeError, r"is_causal must be a Python bool"),
    (dict(scale="0.5"), TypeError, r"scale must be a real number or a 0-d array .* got '0.5'"),
    (dict(scale=jnp.ones((2,))), ValueError, r"scale must be 0-d .* shape \(2,\)"),
    (dict(scale=jnp.array(True)), TypeError, r"scale must be .* dtype bool"),
    (dict(scale=jnp.array(1 + 2j)), TypeError, r"scale must be .* dtype complex64"),
    (dict(scale=float("nan")), ValueError, r"scale must be finite, got nan"),
    (dict(scale=np.array(np.inf)), ValueError, r"scale must be finite, got inf"),
    (dict(scale=True), TypeError, r"scale must be a real number"),
])
def test_bad_options(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        jax_dash.attention(*arrays(), **kwargs)


@pytest.mark.parametrize("scale", [1e39, -1e39, 3.5e38, 10**400, np.float64(1e300)],
                         ids=lambda scale: repr(scale)[:24])
def test_scale_must_be_finite_in_float32(scale):
    # The kernels take the scale as float32: these are finite in float64 but inf there.
    with pytest.raises(ValueError, match=r"scale must be finite, got .*float32.*3\.4028235e\+38"):
        jax_dash.attention(*arrays(), scale=scale)


@pytest.mark.parametrize("scale", [float(np.finfo(np.float32).max), -2.0, 0.0, 1e-50], ids=repr)
def test_scales_finite_in_float32_are_accepted(scale):
    out = jax_dash.attention(*arrays(), scale=scale)
    assert out.shape == (2, 16, 4, 32)


def test_numpy_and_python_scalars_are_accepted():
    q, k, v = arrays()
    a = jax_dash.attention(np.asarray(q), np.asarray(k), np.asarray(v), scale=np.float32(0.5),
                           is_causal=np.bool_(True))
    b = jax_dash.attention(q, k, v, scale=0.5, is_causal=True)
    np.testing.assert_array_equal(a, b)


def test_not_an_array():
    with pytest.raises(TypeError, match=re.escape("query must be an array, got object")):
        jax_dash.attention(object(), *arrays()[1:])


@pytest.mark.parametrize("name", ["query", "key", "value"])
@pytest.mark.parametrize("bad, pattern", [
    (None, r"{name} must be an array, got None"),
    ([[1.0, 2.0], [3.0]], r"{name} must be an array, got list that jnp.asarray cannot convert"),
    (jax.ShapeDtypeStruct((2, 16, 4, 32), jnp.float32),
     r"{name} is a jax.ShapeDtypeStruct \(2, 16, 4, 32\) float32, which describes an array but "
     r"holds no values"),
], ids=["None", "ragged", "ShapeDtypeStruct"])
def test_non_arrays_are_named(name, bad, pattern):
    args = dict(zip(("query", "key", "value"), arrays()))
    args[name] = bad
    with pytest.raises(TypeError, match=pattern.format(name=name)):
        jax_dash.attention(args["query"], args["key"], args["value"])


def test_eval_shape_works_as_the_shape_dtype_struct_message_says():
    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in arrays()]
    out = jax.eval_shape(jax_dash.attention, *shapes)
    assert (out.shape, out.dtype) == ((2, 16, 4, 32), jnp.float32)


def test_numpy_float64_is_converted_as_jax_nn_does_with_or_without_jit():
    """x64 off: jax.nn converts NumPy float64 to float32 (jnp.asarray); so does the op, in a plain
    call as under jit (where jit's argument conversion did it already)."""
    q, k, v = (np.asarray(x, np.float64) + 0.1 * i
               for i, x in enumerate(arrays(kv_shape=(2, 16, 4, 32))))
    plain = jax_dash.attention(q, k, v)
    jitted = jax.jit(jax_dash.attention)(q, k, v)
    as_f32 = jax_dash.attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)))
    reference = jax.nn.dot_product_attention(q, k, v)
    assert plain.dtype == jitted.dtype == reference.dtype == jnp.float32
    np.testing.assert_array_equal(plain, jitted)
    np.testing.assert_array_equal(plain, as_f32)
    np.testing.assert_allclose(plain, reference, rtol=1e-5, atol=1e-6)


def test_python_lists_are_converted():
    q, k, v = arrays()
    out = jax_dash.attention(np.asarray(q).tolist(), np.asarray(k).tolist(), v)
    np.testing.assert_array_equal(out, jax_dash.attention(q, k, v))
