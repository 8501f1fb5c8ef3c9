"""Attention dropout on a Hopper GPU: not in the kernels yet (issue 33), so a call must fail with
the reason, eagerly (arrays on the GPU) and under jit (the GPU's FFI handler)."""

import jax
import jax.numpy as jnp
import pytest

import jax_dash
from helpers import GPU_MARKS, hopper_devices, random_inputs

HOPPER = hopper_devices()
pytestmark = GPU_MARKS


def _inputs():
    return [jax.device_put(x, HOPPER[0])
            for x in random_inputs(0, 1, 128, 128, 2, 2, 64, jnp.bfloat16)[:3]]


def test_dropout_on_gpu_arrays_is_refused():
    with pytest.raises(NotImplementedError, match="CPU kernels only"):
        jax_dash.attention(*_inputs(), dropout_rate=0.1, dropout_rng=jax.random.key(0))


def test_dropout_under_jit_on_the_gpu_is_refused_by_the_handler():
    fn = jax.jit(lambda q, k, v, rng: jax_dash.attention(q, k, v, dropout_rate=0.1,
                                                         dropout_rng=rng))
    with pytest.raises(Exception, match="runs on the CPU kernels only"):
        jax.block_until_ready(fn(*_inputs(), jax.random.key(0)))


def test_rate_zero_runs_on_the_gpu():
    q, k, v = _inputs()
    out = jax_dash.attention(q, k, v, dropout_rate=0.0, dropout_rng=jax.random.key(0))
    assert bool(jnp.array_equal(out, jax_dash.attention(q, k, v)))
