"""Attention dropout on a Hopper GPU (issue 33): the Hopper forward and backward apply exactly the
keep mask of ``jax_dash.dropout_keep_mask`` (read out of the results), so forward and gradients
match a float32 reference built from it, at every head dim (96 on the zero-padded head_dim-128
kernels), both dtypes, causal or not, GQA, offsets on and off the 16-element Philox blocks, and
with the structured masks (against the CPU kernels); every deterministic schedule repeats its
bits. Every test here is marked ``gpu`` and needs a CUDA GPU of compute capability 9.0."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from helpers import (GPU_MARKS, attention_and_grads, dropout_readout_inputs, hopper_devices,
                     kept_by_backward, kept_by_forward, random_inputs)
from test_masks import _mask_args

HOPPER = (hopper_devices() or [None])[0]
pytestmark = GPU_MARKS
TOL = {jnp.bfloat16: 2e-2, jnp.float16: 4e-3}  # of max |reference| (the driver's criterion)


def _on_gpu(*xs):
    return [jax.device_put(x, HOPPER) for x in xs]


def _reference(q, k, v, rng, rate, *, is_causal=False, offsets=(0, 0, 0, 0)):
    """float32 attention whose probabilities get the keep mask of dropout_keep_mask at the
    global coordinates ``offsets + (b, h, i, j)``."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    batch, seq_q, heads, head_dim = q.shape
    seq_kv, kv_heads = k.shape[1], k.shape[2]
    k, v = (jnp.repeat(x, heads // kv_heads, axis=2) for x in (k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
    if is_causal:
        s = jnp.where(np.arange(seq_kv)[None] <= np.arange(seq_q)[:, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    keep = jax_dash.dropout_keep_mask(rng, rate, (batch, heads, seq_q, seq_kv),
                                      batch_offset=offsets[0], head_offset=offsets[1],
                                      q_offset=offsets[2], kv_offset=offsets[3])
    return jnp.einsum("bhqk,bkhd->bqhd", jnp.where(keep, p / (1 - rate), 0.0), v)


def _assert_close(got, want, dtype):
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        a = np.asarray(jnp.asarray(a, jnp.float32))
        b = np.asarray(b)
        assert np.all(np.isfinite(a)), f"{name}: non-finite values"
        err, scale = float(np.max(np.abs(a - b))), float(np.max(np.abs(b)))
        assert err <= TOL[dtype] * scale + 1e-5, f"{name}: max error {err:.3e}, max |ref| {scale:.3e}"


@functools.lru_cache(maxsize=None)
def _jitted(rate, is_causal, schedule, offsets):
    rng = jax.random.key(7)

    def fn(q, k, v):
        return jax_dash.attention(q, k, v, is_causal=is_causal, schedule=schedule,
                                  dropout_rate=rate, dropout_rng=rng,
                                  dropout_offsets=offsets)

    return jax.jit(functools.partial(attention_and_grads, fn))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_the_reference_with_the_keep_mask(is_causal, head_dim, dtype):
    q, k, v, dout = random_inputs(1, 2, 300, 300 if is_causal else 420, 4, 2, head_dim, dtype)
    got = _jitted(0.1, is_causal, "auto", None)(*_on_gpu(q, k, v, dout))
    want = attention_and_grads(functools.partial(_reference, rng=jax.random.key(7), rate=0.1,
                                                 is_causal=is_causal),
                               *(x.astype(jnp.float32) for x in (q, k, v, dout)))
    _assert_close(got, want, dtype)


@pytest.mark.parametrize("offsets", [(1, 3, 16, 32), (0, 1, 7, 5), (2, 0, 64, 13)])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_offsets_and_rates(offsets, rate):
    """Offsets on the Philox blocks (one call per 8 elements, a lane-pair shuffle in the
    backward) and off them (one call per element)."""
    q, k, v, dout = random_inputs(2, 1, 256, 256, 2, 1, 128, jnp.bfloat16)
    got = _jitted(rate, True, "descending", offsets)(*_on_gpu(q, k, v, dout))
    want = attention_and_grads(functools.partial(_reference, rng=jax.random.key(7), rate=rate,
                                                 is_causal=True, offsets=offsets),
                               *(x.astype(jnp.float32) for x in (q, k, v, dout)))
    _assert_close(got, want, jnp.bfloat16)


@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("offsets", [(0, 0, 0, 0), (1, 2, 48, 16), (0, 1, 7, 5)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_kernels_keep_exactly_the_mask(is_causal, offsets, head_dim):
    """Inputs whose out and dV show which elements each kernel kept: both equal
    dropout_keep_mask (restricted to the visible elements)."""
    seq = head_dim
    q, k, v, dout = (x.astype(jnp.bfloat16)
                     for x in dropout_readout_inputs(2, seq, seq, 2, head_dim))
    rate, rng = 0.3, jax.random.key(11)
    fn = jax.jit(functools.partial(attention_and_grads, lambda q, k, v: jax_dash.attention(
        q, k, v, is_causal=is_causal, dropout_rate=rate, dropout_rng=rng,
        dropout_offsets=offsets)))
    out, _, _, dv = fn(*_on_gpu(q, k, v, dout))
    want = np.asarray(jax_dash.dropout_keep_mask(
        rng, rate, (2, 2, seq, seq), batch_offset=offsets[0], head_offset=offsets[1],
        q_offset=offsets[2], kv_offset=offsets[3]))
    if is_causal:
        want = want & np.tril(np.ones((seq, seq), bool))
    np.testing.assert_array_equal(kept_by_forward(out, seq), want)
    np.testing.assert_array_equal(kept_by_backward(dv, seq), want)


@pytest.mark.parametrize("schedule", ["ascending", "descending", "shift", "symmetric_shift"])
def test_every_schedule_repeats_its_bits(schedule):
    q, k, v, dout = _on_gpu(*random_inputs(3, 2, 1024, 1024, 4, 2, 128, jnp.bfloat16))
    fn = _jitted(0.1, True, schedule, None)
    first = fn(q, k, v, dout)
    for _ in range(2):
        again = fn(q, k, v, dout)
        for name, a, b in zip(("out", "dq", "dk", "dv"), first, again):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def test_keys_and_rate_zero():
    q, k, v, dout = _on_gpu(*random_inputs(4, 1, 256, 256, 2, 2, 64, jnp.bfloat16))

    def run(rate, rng):
        fn = lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True,  # noqa: E731
                                                dropout_rate=rate, dropout_rng=rng)
        return attention_and_grads(fn, q, k, v, dout)

    plain = attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True),
                                q, k, v, dout)
    for a, b in zip(run(0.0, jax.random.key(0)), plain):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    one, other = run(0.2, jax.random.key(1)), run(0.2, jax.random.key(2))
    for a, b in zip(one, other):
        assert not np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("case", ["window_left_right", "segments", "soft_cap", "all"])
def test_structured_masks_match_the_cpu_kernels(case):
    """The masked instantiation with dropout against the CPU kernels (float32, the same
    bfloat16 inputs): the same mask, the same elements dropped."""
    q, k, v, dout = random_inputs(5, 2, 500, 500, 4, 2, 128, jnp.bfloat16)
    mask = _mask_args(case, 2, 500, 500)
    rng = jax.random.key(9)

    def run(q, k, v, dout, mask):
        fn = lambda q, k, v: jax_dash.attention(q, k, v, dropout_rate=0.2,  # noqa: E731
                                                dropout_rng=rng, **mask)
        return jax.jit(functools.partial(attention_and_grads, fn))(q, k, v, dout)

    gpu_mask = {name: jax.device_put(x, HOPPER) if isinstance(x, jax.Array) else x
                for name, x in mask.items()}
    got = run(*_on_gpu(q, k, v, dout), gpu_mask)
    cpu = jax.devices("cpu")[0]
    cpu_mask = {name: jax.device_put(x, cpu) if isinstance(x, jax.Array) else x
                for name, x in mask.items()}
    want = run(*(jax.device_put(x.astype(jnp.float32), cpu) for x in (q, k, v, dout)), cpu_mask)
    _assert_close(got, [np.asarray(x) for x in want], jnp.bfloat16)
