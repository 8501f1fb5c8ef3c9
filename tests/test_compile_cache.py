"""Eager calls compile once per shape, dtype and static arguments and keep nothing per call.

Outside ``jit`` every primitive runs as its own small program, cached by its parameters. A function
built anew on every call and handed to ``cond`` / ``platform_dependent`` / ``lax.map`` made those
parameters new every call: each call compiled again and kept the program (issue 34: 1000 eager calls
at head_dim 32 grew the process by 1.5 GB). Compiles are counted with ``jax.monitoring``'s backend
compile event; memory is the resident set of this process.
"""

from __future__ import annotations

import contextlib
import importlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from jax_dash import _args, _ffi, ring
from helpers import hopper_devices

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU kernels but for the gpu test (conftest.py)

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_WARM_UP_CALLS = 3
# Before the fix one eager call at head_dim 32 kept about 1.5 MB and one eager grad 3.1 MB, so the
# measured loops below would have grown by hundreds of MB; allocator noise is a few MB.
_RSS_GROWTH_LIMIT = 48 << 20


@contextlib.contextmanager
def _counting_compiles():
    """Yields a list whose length is the number of XLA compiles since entering."""
    compiles = []

    def listener(event, duration_secs, **kwargs):
        if event == _COMPILE_EVENT:
            compiles.append(duration_secs)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield compiles
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def _rss_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _inputs(head_dim, seq=64, heads=2, kv_heads=1):
    keys = jax.random.split(jax.random.PRNGKey(head_dim), 3)
    q = jax.random.normal(keys[0], (1, seq, heads, head_dim), jnp.float32)
    k = jax.random.normal(keys[1], (1, seq, kv_heads, head_dim), jnp.float32)
    v = jax.random.normal(keys[2], (1, seq, kv_heads, head_dim), jnp.float32)
    return q, k, v


def _compiles_after_warm_up(call, calls):
    """Runs ``call`` for warm-up, then ``calls`` more times; returns the compiles of the latter."""
    for _ in range(_WARM_UP_CALLS):
        jax.block_until_ready(call())
    with _counting_compiles() as compiles:
        for _ in range(calls):
            jax.block_until_ready(call())
    return len(compiles)


def _check_eager_calls_and_grads(q, k, v, rounds=100):
    """``rounds`` eager calls and grads after warm-up: no compile, little memory."""
    def forward():
        return jax_dash.attention(q, k, v, is_causal=True)

    def grad():
        return jax.grad(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True)
                        .astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)

    for call in (forward, grad):
        for _ in range(_WARM_UP_CALLS):
            jax.block_until_ready(call())
    before = _rss_bytes()
    with _counting_compiles() as compiles:
        for _ in range(rounds):
            jax.block_until_ready(forward())
            jax.block_until_ready(grad())
    grown = _rss_bytes() - before
    assert len(compiles) == 0 and grown < _RSS_GROWTH_LIMIT, (
        f"{rounds} eager calls and grads compiled {len(compiles)} times and grew the process by "
        f"{grown / 2**20:.1f} MiB")


_READS_STATM = pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                                  reason="reads /proc/self/statm")


@_READS_STATM
@pytest.mark.parametrize("head_dim", [32, 96, 64])  # padded on the GPU (32, 96) and native (64)
def test_eager_calls_and_grads_compile_once_and_keep_nothing(head_dim):
    _check_eager_calls_and_grads(*_inputs(head_dim))


@pytest.mark.gpu
@pytest.mark.skipif(not hopper_devices(), reason="needs a CUDA GPU of compute capability 9.0")
@_READS_STATM
@pytest.mark.parametrize("head_dim", [32, 96, 64])
def test_eager_gpu_calls_and_grads_compile_once_and_keep_nothing(head_dim):
    """On the Hopper kernels, where 32 and 96 take platform_dependent's padded branch."""
    q, k, v = (x.astype(jnp.bfloat16) for x in _inputs(head_dim))
    assert q.devices() == {hopper_devices()[0]}
    _check_eager_calls_and_grads(q, k, v, rounds=50)


def test_the_padded_branch_compiles_once(monkeypatch):
    """The branch the GPU runs for head_dims its kernels lack (zero-padded), run on the CPU."""
    monkeypatch.setattr(_ffi, "PAD_PLATFORMS", ("cuda", "cpu"))
    q, k, v = _inputs(40)

    def grad():
        return jax.grad(lambda q: jax_dash.attention(q, k, v).sum())(q)

    assert _compiles_after_warm_up(grad, 20) == 0


def _every_mask(q, k, v, scale=None):
    seq = q.shape[1]
    segments = (jnp.arange(seq) >= seq // 2).astype(jnp.int32)[None]
    return jax_dash.attention(q, k, v, scale=scale, is_causal=True, local_window_size=(17, 0),
                              logits_soft_cap=5.0, query_seq_lengths=jnp.array([seq - 3]),
                              key_value_seq_lengths=jnp.array([seq - 1]),
                              query_segment_ids=segments, key_value_segment_ids=segments)


def _eager_paths():
    q, k, v = _inputs(32)
    scale = jnp.float32(0.2)
    return {
        "every mask, grad": lambda: jax.grad(lambda q: _every_mask(q, k, v).sum())(q),
        "grad of a traced scale": lambda: jax.grad(
            lambda s: _every_mask(q, k, v, scale=s).sum())(scale),
        "grad at scale 0": lambda: jax.grad(
            lambda s: jax_dash.attention(q, k, v, scale=s).sum())(jnp.float32(0)),
        "vmap": lambda: jax.vmap(jax_dash.attention)(q[None], k[None], v[None]),
        "vmapped scale": lambda: jax.vmap(
            lambda s: jax_dash.attention(q, k, v, scale=s))(jnp.array([0.1, 0.2])),
        "grad of a vmapped scale": lambda: jax.grad(lambda q: jax.vmap(
            lambda s: jax_dash.attention(q, k, v, scale=s))(jnp.array([0.1, 0.2])).sum())(q),
        "simulated ring, grad": lambda: jax.grad(lambda q: ring.simulate(
            q, k, v, 4, is_causal=True, layout="zigzag").sum())(q),
    }


@pytest.mark.parametrize("path", list(_eager_paths()))
def test_other_eager_paths_compile_once(path):
    assert _compiles_after_warm_up(_eager_paths()[path], 4) == 0


def test_a_per_platform_schedule_choice_compiles_once(monkeypatch):
    """Traced inputs (an eager grad's) where auto chooses differently per platform: the backward
    is a platform_dependent of the two schedules' ops (here a GPU of wave 1 is pretended; at
    head_dim 128 and 2048 tokens auto's causal choice depends on the wave)."""
    monkeypatch.setattr(_args, "_gpu_wave", lambda: 1)
    q = jax.random.normal(jax.random.PRNGKey(1), (1, 2048, 1, 128), jnp.float32)
    assert isinstance(_args._auto_schedule(jax.ShapeDtypeStruct(q.shape, q.dtype),
                                           jax.ShapeDtypeStruct(q.shape, q.dtype), True), tuple)

    def grad():
        return jax.grad(lambda q: jax_dash.attention(q, q, q, is_causal=True).sum())(q)

    assert _compiles_after_warm_up(grad, 4) == 0


@pytest.mark.parametrize("cached", [
    _ffi._head_dim_branches, importlib.import_module("jax_dash.attention")._zero_scale_cotangent,
    ring._block_backward_call], ids=lambda f: f.__name__)
def test_the_branch_caches_are_bounded(cached):
    assert cached.cache_info().maxsize is not None


def test_new_shapes_and_static_arguments_do_compile():
    """The counter sees compiles (a test of the test): a new shape and a new window compile."""
    q, k, v = _inputs(32, seq=48)
    with _counting_compiles() as compiles:
        jax.block_until_ready(jax_dash.attention(q, k, v, local_window_size=(7, 3)))
    assert len(compiles) > 0
    assert np.isfinite(np.asarray(jax_dash.attention(q, k, v))).all()
