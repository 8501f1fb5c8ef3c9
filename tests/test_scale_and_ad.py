"""A traced ``scale`` (an operand, as in jax.nn), its gradient, bounded caches, and the clear
errors of the AD modes the op does not support."""

import functools
import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from jax_dash import schedules, sharding
from helpers import random_inputs

attention_module = importlib.import_module("jax_dash.attention")  # the module, not the op

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU kernels (float32, any head_dim): conftest.py


def _expand_kv(q, x):
    return jnp.repeat(x, q.shape[-2] // x.shape[-2], axis=-2)


def _loss(fn, q, k, v, scale, is_causal):
    # sin: a loss whose cotangent is not a constant, so every term of the gradient matters.
    return jnp.sum(jnp.sin(fn(q, k, v, scale, is_causal)))


def _ours(q, k, v, scale, is_causal):
    return jax_dash.attention(q, k, v, scale=scale, is_causal=is_causal)


def _jax_nn(q, k, v, scale, is_causal):
    return jax.nn.dot_product_attention(q, _expand_kv(q, k), _expand_kv(q, v), scale=scale,
                                        is_causal=is_causal)


@pytest.mark.parametrize("scale, is_causal", [(0.3, False), (0.0, True), (-1.2, True)])
def test_gradient_of_a_traced_scale_matches_jax_nn(scale, is_causal):
    """dL/dscale = <Q, dQ> / scale, and at scale 0 a second backward (see _scale_cotangent)."""
    q, k, v, _ = random_inputs(0, 2, 40, 33, 4, 2, 32, jnp.float32)
    grad = functools.partial(jax.grad(_loss, argnums=(1, 2, 3, 4)), is_causal=is_causal)
    ours = jax.jit(grad, static_argnums=0)(_ours, q, k, v, jnp.float32(scale))
    ref = grad(_jax_nn, q, k, v, jnp.float32(scale))
    for name, a, b in zip(("dq", "dk", "dv", "dscale"), ours, ref):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5, err_msg=name)
    assert ours[3].shape == () and ours[3].dtype == jnp.float32
    assert abs(float(ours[3])) > 1e-3  # a real check: the cotangent is not silently zero


def test_scale_gradient_keeps_the_scale_dtype_and_flows_through_a_computation():
    q, k, v, _ = random_inputs(1, 1, 24, 24, 2, 1, 16, jnp.float32)
    log_scale = jnp.asarray(-1.0, jnp.bfloat16)

    def loss(fn, log_scale):
        return _loss(fn, q, k, v, jnp.exp(log_scale.astype(jnp.float32)), True)

    ours = jax.grad(functools.partial(loss, _ours))(log_scale)
    ref = jax.grad(functools.partial(loss, _jax_nn))(log_scale)
    assert ours.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(ours), np.float32(ref), rtol=1e-2)


def test_vmap_over_the_scale():
    q, k, v, _ = random_inputs(2, 1, 16, 16, 2, 2, 16, jnp.float32)
    scales = jnp.asarray([0.1, 0.5, -2.0], jnp.float32)
    out = jax.vmap(lambda s: jax_dash.attention(q, k, v, scale=s))(scales)
    for i, s in enumerate([0.1, 0.5, -2.0]):
        np.testing.assert_array_equal(out[i], jax_dash.attention(q, k, v, scale=s))
    dscale = jax.vmap(jax.grad(lambda s: _loss(_ours, q, k, v, s, False)))(scales)
    ref = jax.vmap(jax.grad(lambda s: _loss(_jax_nn, q, k, v, s, False)))(scales)
    np.testing.assert_allclose(dscale, ref, rtol=1e-4, atol=1e-5)


def test_traced_and_python_scales_give_the_same_bits():
    q, k, v, dout = random_inputs(3, 2, 48, 48, 4, 2, 32, jnp.float32)
    fn = lambda q, k, v, s: jax_dash.attention(q, k, v, scale=s, is_causal=True)  # noqa: E731
    python = jax.vjp(lambda q, k, v: fn(q, k, v, 0.37), q, k, v)
    traced = jax.jit(lambda q, k, v, s: jax.vjp(lambda q, k, v: fn(q, k, v, s), q, k, v)[1](
        dout))(q, k, v, jnp.float32(0.37))
    np.testing.assert_array_equal(python[0], jax.jit(fn)(q, k, v, jnp.float32(0.37)))
    for a, b in zip(python[1](dout), traced):
        np.testing.assert_array_equal(a, b)


def test_a_changing_scale_compiles_once():
    q, k, v, _ = random_inputs(4, 1, 16, 16, 2, 2, 16, jnp.float32)
    step = jax.jit(jax.grad(lambda q, s: _loss(_ours, q, k, v, s, True), argnums=(0, 1)))
    for s in (0.1, 0.2, 0.3, 0.4):
        step(q, jnp.float32(s))
    assert step._cache_size() == 1


def test_python_scales_do_not_grow_the_op_caches():
    q, k, v, _ = random_inputs(5, 1, 16, 16, 2, 2, 16, jnp.float32)
    jax_dash.attention(q, k, v, scale=0.5)
    before = sharding.forward_op.cache_info().currsize
    for i in range(20):
        jax_dash.attention(q, k, v, scale=0.01 * (i + 1))
    assert sharding.forward_op.cache_info().currsize == before


@pytest.mark.parametrize("cached", [
    sharding.forward_op, sharding.backward_op, attention_module._forward_op,
    attention_module._backward_op,
    schedules.choose_schedule, schedules.head_tables, schedules.dkv_tickets],
    ids=lambda f: f.__name__)
def test_every_cache_is_bounded(cached):
    assert cached.cache_info().maxsize is not None


def test_non_finite_traced_scale_gives_non_finite_output_like_jax_nn():
    q, k, v, _ = random_inputs(6, 1, 8, 8, 2, 2, 16, jnp.float32)
    fn = jax.jit(lambda s: jax_dash.attention(q, k, v, scale=s))
    ref = jax.jit(lambda s: _jax_nn(q, k, v, s, False))
    for s in (jnp.inf, jnp.nan):
        ours, theirs = fn(jnp.float32(s)), ref(jnp.float32(s))
        assert not np.all(np.isfinite(ours))
        assert not np.all(np.isfinite(theirs))


# ---- AD modes that are not supported say so --------------------------------------------------

FIRST_ORDER = re.escape("jax_dash.attention supports first-order reverse-mode differentiation "
                        "only")


def _simple():
    q, k, v, _ = random_inputs(7, 1, 16, 16, 2, 2, 16, jnp.float32)
    return q, k, v


def _jvp(q, k, v):
    return jax.jvp(lambda q: jax_dash.attention(q, k, v), (q,), (jnp.ones_like(q),))


def test_forward_mode_says_first_order_only():
    with pytest.raises(TypeError, match=FIRST_ORDER):
        _jvp(*_simple())


def test_forward_mode_under_jit_is_a_clear_type_error():
    # Under jit JAX reports it while lowering, after the op's code has run: its own message,
    # which names forward mode and the custom_vjp (the op cannot reword it).
    with pytest.raises(TypeError, match=re.escape("can't apply forward-mode autodiff (jvp) to a "
                                                  "custom_vjp function")):
        jax.jit(_jvp)(*_simple())


def test_jacfwd_says_first_order_only():
    q, k, v = _simple()
    with pytest.raises(TypeError, match=FIRST_ORDER):
        jax.jacfwd(lambda q: jax_dash.attention(q[None], k[:1], v[:1]))(q[0])


@pytest.mark.parametrize("jit", [False, True])
def test_grad_of_grad_says_first_order_only(jit):
    q, k, v = _simple()

    def inner(q):
        return jnp.sum(jax.grad(lambda q: jnp.sum(jax_dash.attention(q, k, v) ** 2))(q) ** 2)

    outer = jax.grad(inner)
    with pytest.raises(TypeError, match=FIRST_ORDER):
        (jax.jit(outer) if jit else outer)(q)


def test_hessian_says_first_order_only():
    q, k, v = _simple()
    with pytest.raises(TypeError, match=FIRST_ORDER):
        jax.hessian(lambda s: jnp.sum(jax_dash.attention(q, k, v, scale=s)))(jnp.float32(0.5))
