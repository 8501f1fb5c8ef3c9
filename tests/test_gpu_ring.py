"""Ring attention's pieces on one Hopper GPU: the ring simulated on one device
(``jax_dash.ring.simulate``: the ring's own code under ``vmap`` with a named axis, so every block
pair runs the GPU kernels in ring order and the transfers become permutations in memory) against
the single-call op and the fp32 reference, and repeated runs bitwise.

The gradient tests need the backward's float32 block gradients (the ``f32_grads`` FFI attribute),
which the Hopper backward writes since 2026-11-23 (these tests passed on an H100 that day;
tests/sm90_check.cu checks that they round to the 16-bit gradients exactly). Skipped unless an sm_90 GPU is present. The two-GPU run is benchmarks/bench_ring.py (issue 16).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from helpers import (GPU_MARKS, assert_close_to_reference, attention_and_grads, hopper_devices,
                     random_inputs, references)
from jax_dash import ring


HOPPER = hopper_devices()
pytestmark = GPU_MARKS

RING_SIZE = 4
# batch, seq, heads, kv_heads: GQA; seq / (2 * RING_SIZE) = 128 tokens per zigzag chunk.
BATCH, SEQ, HEADS, KV_HEADS = 1, 1024, 4, 2
CASES = [(64, False, "contiguous"), (128, True, "contiguous"), (128, True, "zigzag"),
         (64, True, "zigzag"), (256, True, "zigzag")]  # 256: the float32 dK/dV epilogue at 256
CASE_IDS = [f"hd{d}-{'causal' if c else 'full'}-{layout}" for d, c, layout in CASES]


def _bits(x):
    return np.asarray(x).view(np.uint16)


def _inputs(head_dim, layout, seed=0):
    """(q, k, v, dout) on the GPU in natural token order, and the same placed for the layout."""
    args = random_inputs(seed, BATCH, SEQ, SEQ, HEADS, KV_HEADS, head_dim, jnp.bfloat16)
    args = tuple(jax.device_put(x, HOPPER[0]) for x in args)
    placed = tuple(ring.zigzag(x, RING_SIZE) for x in args) if layout == "zigzag" else args
    return args, placed


def _unplace(results, layout):
    if layout == "zigzag":
        return tuple(ring.unzigzag(x, RING_SIZE) for x in results)
    return tuple(results)


@functools.lru_cache(maxsize=None)
def _simulated_forward(is_causal, layout):
    return jax.jit(functools.partial(ring.simulate, ring_size=RING_SIZE, is_causal=is_causal,
                                     layout=layout))


@functools.lru_cache(maxsize=None)
def _simulated_vjp(is_causal, layout):
    fn = functools.partial(ring.simulate, ring_size=RING_SIZE, is_causal=is_causal, layout=layout)
    return jax.jit(lambda q, k, v, dout: attention_and_grads(fn, q, k, v, dout))


@pytest.mark.parametrize("head_dim, is_causal, layout", CASES, ids=CASE_IDS)
def test_simulated_ring_forward_matches_the_single_call(head_dim, is_causal, layout):
    (q, k, v, dout), placed = _inputs(head_dim, layout)
    ours = _unplace([_simulated_forward(is_causal, layout)(*placed[:3])], layout)[0]
    assert ours.dtype == jnp.bfloat16 and ours.devices() == {HOPPER[0]}
    single = jax.jit(functools.partial(jax_dash.attention, is_causal=is_causal))(q, k, v)
    ref, naive = jax.jit(lambda q, k, v, d: references(q, k, v, d, is_causal=is_causal))(
        q, k, v, dout)
    assert_close_to_reference("out", ours, ref[0], naive[0], atol=1e-3)
    # The ring and the single call differ by rounding only (bf16 outputs: a few ulps).
    diff = jnp.max(jnp.abs(ours.astype(jnp.float32) - single.astype(jnp.float32)))
    assert float(diff) <= 2 * float(jnp.max(jnp.abs(naive[0] - ref[0]))) + 1e-3


@pytest.mark.parametrize("head_dim, is_causal, layout", CASES[1:2], ids=CASE_IDS[1:2])
def test_simulated_ring_forward_repeats_bitwise(head_dim, is_causal, layout):
    _, placed = _inputs(head_dim, layout, seed=1)
    fn = _simulated_forward(is_causal, layout)
    first = fn(*placed[:3])
    for _ in range(10):
        assert np.array_equal(_bits(fn(*placed[:3])), _bits(first))


@pytest.mark.parametrize("head_dim, is_causal, layout", CASES, ids=CASE_IDS)
def test_simulated_ring_gradients_match_the_reference(head_dim, is_causal, layout):
    (q, k, v, dout), placed = _inputs(head_dim, layout, seed=2)
    ours = _unplace(_simulated_vjp(is_causal, layout)(*placed), layout)
    ref, naive = jax.jit(lambda q, k, v, d: references(q, k, v, d, is_causal=is_causal))(
        q, k, v, dout)
    for name, x, r, nv in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
        assert x.dtype == jnp.bfloat16, name
        assert_close_to_reference(name, x, r, nv, atol=1e-2)


@pytest.mark.parametrize("schedule", ["descending", "symmetric_shift"])
def test_simulated_ring_gradients_repeat_bitwise(schedule):
    _, placed = _inputs(128, "zigzag", seed=3)
    fn = functools.partial(ring.simulate, ring_size=RING_SIZE, is_causal=True, layout="zigzag",
                           schedule=schedule)
    run = jax.jit(lambda q, k, v, dout: attention_and_grads(fn, q, k, v, dout))
    first = run(*placed)
    for _ in range(10):
        for name, x, y in zip(("out", "dq", "dk", "dv"), run(*placed), first):
            assert np.array_equal(_bits(x), _bits(y)), f"{name} differs bitwise"
