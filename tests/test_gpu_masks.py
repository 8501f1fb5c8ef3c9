"""Structured masks on the Hopper kernels (issue 13).

The warp-specialized Hopper kernels carry the mask policy of ``cuda/mask.h`` (windows, sequence
lengths, segment ids, the soft cap); these tests first passed on an H100 on 2026-11-23 (head_dim
64 and 128; head_dim 256 on 2026-11-25). Accuracy against the dense-mask reference and bitwise
repetition per schedule at head_dim 64, 96 (the head_dim-128 kernels on zero-padded operands,
jax_dash/_ffi.py), 128 and 256, and 136 (the head_dim-256 kernels on zero-padded operands).
Every test here is marked ``gpu`` and needs a CUDA GPU of compute capability 9.0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from helpers import (GPU_MARKS, assert_close_to_reference, attention_and_grads, hopper_devices,
                     random_inputs, references)
from test_masks import CASES, DETERMINISTIC, _mask_args, _segments


HOPPER = (hopper_devices() or [None])[0]
pytestmark = GPU_MARKS
ATOL = {jnp.bfloat16: 1e-3, jnp.float16: 1e-3}
# The Hopper kernels' head dims, and 96 (run zero-padded to 128).
HEAD_DIMS = (64, 96, 128, 256)


@pytest.mark.parametrize("schedule", ["descending", "shift"])
def test_masks_above_head_dim_128(schedule):
    """136 runs the head_dim-256 kernels on zero-padded operands: forward and gradients with every
    part of the mask at once, against the reference."""
    with jax.default_device(HOPPER):
        q, k, v, dout = random_inputs(0, 2, 500, 500, 4, 2, 136, jnp.bfloat16)
        mask = _mask_args("all", 2, 500, 500)
        ours = attention_and_grads(lambda q, k, v: jax_dash.attention(
            q, k, v, schedule=schedule, **mask), q, k, v, dout)
        ref, naive = references(q, k, v, dout, **mask)
        for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
            assert_close_to_reference(name, o, r, n, ATOL[jnp.bfloat16])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("case", CASES)
def test_masks_match_reference(case, head_dim, dtype):
    shape = (2, 1000, 1000, 4, 2, head_dim)
    with jax.default_device(HOPPER):
        q, k, v, dout = random_inputs(0, *shape, dtype)
        mask = _mask_args(case, 2, 1000, 1000)
        ours = attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, **mask),
                                   q, k, v, dout)
        ref, naive = references(q, k, v, dout, **mask)
        for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
            assert_close_to_reference(name, o, r, n, ATOL[dtype])


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("schedule", DETERMINISTIC + ("auto",))
def test_masks_bitwise_over_repetitions(schedule, head_dim):
    shape = (2, 2048, 2048, 4, 2, head_dim)
    mask = _mask_args("all", 2, 2048, 2048)
    with jax.default_device(HOPPER):
        q, k, v, dout = random_inputs(5, *shape, jnp.bfloat16)
        grad_fn = jax.jit(jax.vjp(lambda q, k, v: jax_dash.attention(
            q, k, v, schedule=schedule, **mask), q, k, v)[1])
        first = [np.asarray(g) for g in grad_fn(dout)]
        for _ in range(100):
            for a, b in zip(first, grad_fn(dout)):
                np.testing.assert_array_equal(a, np.asarray(b))


@pytest.mark.parametrize("head_dim", (64, 128, 256))
def test_dropped_hidden_pairs_keep_the_band_order(head_dim):
    """The Hopper backward leaves the tile pairs that lengths and segment ids hide out of its
    visit order and gives a kept pair the ticket of its rank among its dQ tile's visible
    contributors: the adds keep the band's order, so ascending and descending (the same band
    tickets, opposite visit orders) still give the same dQ bits. And auto, given segment ids on a
    causal call, runs mirror (the same bits), whose gradients are not descending's (its dK/dV sum
    the Q tiles ascending; its dQ order differs too, which bf16 may round away)."""
    shape = (2, 1000, 1000, 4, 2, head_dim)
    mask = dict(is_causal=True, local_window_size=(600, 0),
                query_seq_lengths=jnp.asarray([990, 700], jnp.int32),
                key_value_seq_lengths=jnp.asarray([900, 1000], jnp.int32),
                query_segment_ids=_segments(15, 2, 1000, 5),
                key_value_segment_ids=_segments(15, 2, 1000, 5))
    with jax.default_device(HOPPER):
        q, k, v, dout = random_inputs(7, *shape, jnp.bfloat16)
        grads = {s: [np.asarray(x) for x in attention_and_grads(
            lambda q, k, v: jax_dash.attention(q, k, v, schedule=s, **mask), q, k, v, dout)]
            for s in ("ascending", "descending", "mirror", "auto")}
    np.testing.assert_array_equal(grads["ascending"][1], grads["descending"][1])
    for a, b in zip(grads["auto"], grads["mirror"]):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(grads["mirror"][1:],
                                                        grads["descending"][1:]))
