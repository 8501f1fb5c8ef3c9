"""``schedule="auto"`` reads the device the computation runs on (not the default device): that of
concrete inputs, or, for traced inputs, the platform the computation is lowered for."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU kernels: conftest.py

from jax_dash import _args

# Causal, seq 2048, head_dim 128: Nkv = 16 tiles (more than _args.MIRROR_MAX_KV_TILES), 8
# symmetric_shift items per head. A wave of 132 holds a head (symmetric_shift); a wave of 1 does
# not (descending: head_dim 128's tiles are not square). head_dim 64's auto is mirror on any wave.
SHAPE = (1, 2048, 1, 128)


def _grads(schedule):
    q = jax.random.normal(jax.random.PRNGKey(0), SHAPE, jnp.float32)
    fn = jax.jit(jax.grad(lambda q: jnp.sum(jnp.sin(
        jax_dash.attention(q, q, q, is_causal=True, schedule=schedule)))))
    return fn, q


def test_concrete_inputs_choose_by_their_own_device(monkeypatch):
    # Stand-in for two GPU models: device 3 has a wave of 1, every other device 132.
    monkeypatch.setattr(_args, "_device_wave", lambda d: 1 if d.id == 3 else 132)
    cpus = jax.devices("cpu")
    q = jnp.zeros(SHAPE, jnp.float32)
    on_3, on_0 = jax.device_put(q, cpus[3]), jax.device_put(q, cpus[0])
    with jax.default_device(cpus[0]):
        assert _args._auto_schedule(on_3, on_3, True) == "descending"
    with jax.default_device(cpus[3]):
        assert _args._auto_schedule(on_0, on_0, True) == "symmetric_shift"


def test_traced_inputs_choose_by_the_platform_they_lower_for(monkeypatch):
    # A GPU whose wave would choose differently: the choice is left to lowering, and a CPU
    # lowering runs the CPU's choice (the cuda branch is not even emitted).
    monkeypatch.setattr(_args, "_gpu_wave", lambda: 1)
    spec = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    assert _args._auto_schedule(spec, spec, True) == (
        ("cpu", "symmetric_shift"), ("cuda", "descending"))
    auto, q = _grads("auto")
    assert re.findall(r"schedule = \d+", auto.lower(q).as_text()) == ["schedule = 3"]
    expected, _ = _grads("symmetric_shift")
    other, _ = _grads("descending")
    np.testing.assert_array_equal(auto(q), expected(q))
    assert not np.array_equal(other(q), expected(q))  # the check above can fail


def test_without_a_gpu_backend_the_traced_choice_is_the_cpus():
    if _args._gpu_wave() is not None:
        pytest.skip("this process has a CUDA backend")
    spec = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    assert _args._auto_schedule(spec, spec, True) == "symmetric_shift"
