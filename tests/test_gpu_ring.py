"""Ring attention's pieces on one Hopper GPU: the ring simulated on one device
(``jax_dash.ring.simulate``: the ring's own code under ``vmap`` with a named axis, so every block
pair runs the GPU kernels in ring order and the transfers become permutations in memory) against
the single-call op and the fp32 reference, and repeated runs bitwise.

The gradient tests need the backward's float32 block gradients (the ``f32_grads`` FFI attribute),
which the Hopper backward writes since 2026-11-23 (these tests passed on an H100 that day;
tests/sm90_check.cu checks that they round to the 16-bit gradients exactly). Skipped unless an sm_90 GPU is present. The two-GPU run is benchmarks/bench_ring.py (issue 16).

The accumulating backward (``_ffi.bwd_call(..., sums=...)``: the kernels add the float32 gradients
into the ring's sums in place) must give the bits of the sums plus the non-accumulating call's
float32 gradients, in every epilogue that writes float32 gradients: the dQ postprocess, the
warp-specialized kernel's staged float32 dK/dV epilogue (with and without GQA, head_dim
64/128/256), the masked instantiation's direct store_dk_dv.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from helpers import (GPU_MARKS, assert_close_to_reference, attention_and_grads, hopper_devices,
                     random_inputs, references, ring_sums)
from jax_dash import _ffi, ring


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


# ---- accumulating backward --------------------------------------------------------------------

# head_dim, is_causal, kv_heads, window (the masked kernel)
ACCUMULATE_CASES = [
    (128, True, 2, None),         # ws-rs: GQA, the last group member writes sum * scale
    (128, False, 4, None),        # ws-rs: no GQA, the partial goes out directly
    (64, True, 2, None),          # two dQ buffers at head_dim 64
    (64, False, 4, None),
    (256, True, 2, None),         # kSplitD
    (256, True, 4, None),
    (128, True, 2, (96, 0)),      # masked instantiation: its direct store_dk_dv (GQA)
    (128, False, 4, (96, 32)),    # ... and without GQA
]
ACCUMULATE_IDS = [f"hd{d}-{'causal' if c else 'full'}-kv{kv}{'-window' if w else ''}"
                  for d, c, kv, w in ACCUMULATE_CASES]


def _f32_bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("head_dim, is_causal, kv_heads, window", ACCUMULATE_CASES,
                         ids=ACCUMULATE_IDS)
def test_accumulating_backward_adds_the_float32_gradients_bitwise(head_dim, is_causal, kv_heads,
                                                                  window):
    q, k, v, dout = (jax.device_put(x, HOPPER[0]) for x in
                     random_inputs(4, 2, 600, 600, HEADS, kv_heads, head_dim, jnp.bfloat16))
    scale = 1.0 / np.sqrt(head_dim)
    mask = _ffi.StaticMask(window=window) if window else _ffi.NO_MASK
    out, lse = jax.jit(lambda q, k, v: _ffi.fwd_call(q, k, v, scale, is_causal, mask=mask))(
        q, k, v)
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    sums = tuple(jax.device_put(jax.random.normal(key, x.shape, jnp.float32), HOPPER[0])
                 for key, x in zip(keys, (q, k, v)))

    @jax.jit
    def grads(args, sums=None):
        return _ffi.bwd_call(*args, scale, is_causal, "descending", True, mask=mask, sums=sums)

    args = (q, k, v, out, lse, dout)
    alone = grads(args)
    expected = jax.jit(lambda s, g: [a + b for a, b in zip(s, g)])(sums, alone)
    added = grads(args, sums)
    for name, a, b in zip(("dq", "dk", "dv"), added, expected):
        assert a.dtype == jnp.float32 and a.devices() == {HOPPER[0]}, name
        np.testing.assert_array_equal(_f32_bits(a), _f32_bits(b), err_msg=name)
    # Repeats bitwise (the sums are not consumed: XLA copies them before the in-place call).
    for name, a, b in zip(("dq", "dk", "dv"), grads(args, sums), added):
        np.testing.assert_array_equal(_f32_bits(a), _f32_bits(b), err_msg=name)
    # A raw call whose sums are not aliased to its outputs: the handler copies them into the
    # outputs on the GPU before the kernels add (its device-to-device copy), same bits.
    raw = _unaliased_accumulating_call(args, scale, is_causal, mask, sums)
    for name, a, b in zip(("dq", "dk", "dv"), raw, added):
        assert a.devices() == {HOPPER[0]}, name
        np.testing.assert_array_equal(_f32_bits(a), _f32_bits(b), err_msg=name)
    for name, s, s_after in zip(("dq_sum", "dk_sum", "dv_sum"), sums,
                                (jax.random.normal(key, x.shape, jnp.float32)
                                 for key, x in zip(keys, (q, k, v)))):
        np.testing.assert_array_equal(_f32_bits(s), _f32_bits(s_after), err_msg=name)


def _unaliased_accumulating_call(args, scale, is_causal, mask, sums):
    """The backward FFI call with accumulate and no input_output_aliases (the public op always
    aliases): (dq_sum + dq, dk_sum + dk, dv_sum + dv), the sums left as they were."""
    @jax.jit
    def call(args, sums):
        q, k = args[:2]
        return _ffi._bwd_call(*args, scale, is_causal, "descending", True, mask,
                              _ffi.default_mask_arrays(q, k), sums, True, alias_sums=False)

    return call(args, sums)


@pytest.mark.parametrize("head_dim, is_causal, layout", CASES, ids=CASE_IDS)
def test_simulated_ring_accumulates_with_the_earlier_bits(head_dim, is_causal, layout):
    """The ring's float32 sums (before the cast to bf16) with the kernels adding in place are the
    bits of the earlier formulation (XLA adding each step's contributions), GQA included."""
    _, placed = _inputs(head_dim, layout, seed=6)
    ours, earlier = (ring_sums(*placed, RING_SIZE, is_causal=is_causal, layout=layout,
                               accumulate=accumulate) for accumulate in (True, False))
    for name, a, b in zip(("dq", "dk", "dv"), ours, earlier):
        assert a.dtype == jnp.float32, name
        np.testing.assert_array_equal(_f32_bits(a), _f32_bits(b), err_msg=name)


@pytest.mark.skipif(len(HOPPER) < 2, reason="needs two Hopper GPUs")
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_two_gpu_ring_copies_no_sum_and_needs_less_memory(monkeypatch, layout):
    """The GPU compiler's program of the ring on two GPUs (compiled, not run): no float32 block
    is copied in zigzag and at most one in contiguous (XLA keeps the sums in place), and its
    buffer assignment holds at least 1.5 float32 blocks less than the earlier formulation's (three contributions fewer; the CPU compiler's
    assignment saves 2.0 at P = 2 contiguous, 1.98 zigzag, whose half-block slices remain)."""
    import re

    from jax.sharding import Mesh, PartitionSpec

    mesh = Mesh(np.array(HOPPER[:2]), ("seq",))
    spec = PartitionSpec(None, "seq")
    block = (1, 8192, 8, 128)  # per device
    shape = jax.ShapeDtypeStruct((1, 2 * block[1]) + block[2:], jnp.bfloat16)

    def compiled():
        fn = functools.partial(jax_dash.ring_attention, axis_name="seq", is_causal=True,
                               layout=layout)
        program = jax.jit(jax.shard_map(
            lambda q, k, v, dout: attention_and_grads(fn, q, k, v, dout), mesh=mesh,
            in_specs=(spec,) * 4, out_specs=(spec,) * 4))
        return program.lower(shape, shape, shape, shape).compile()

    ours = compiled()
    with monkeypatch.context() as m:
        m.setattr(ring, "_ACCUMULATE", False)
        earlier = compiled()
    full = r"f32\[1,%d,%d,%d\]\{[0-9,]+\} copy\(" % block[1:]
    copies = re.findall(r".*" + full + r".*", ours.as_text())
    # The GPU compiler (jaxlib 0.11.2, two H100s, round 10 call 5) keeps one whole-block copy in
    # the contiguous ring (none in zigzag); the peak per GPU was the same for both layouts there.
    assert len(copies) <= (1 if layout == "contiguous" else 0), copies[:4]
    f32_block = 4 * int(np.prod(block))
    before = earlier.memory_analysis().temp_size_in_bytes
    after = ours.memory_analysis().temp_size_in_bytes
    assert before - after >= 1.5 * f32_block, (
        f"temporaries {before} -> {after} bytes: {(before - after) / f32_block:.2f} float32 "
        "blocks saved")


@pytest.mark.parametrize("head_dim, is_causal, layout", CASES, ids=CASE_IDS)
def test_simulated_ring_in_head_groups_gives_the_bits_of_one_ring(monkeypatch, head_dim,
                                                                  is_causal, layout):
    """The ring's heads in two groups (one kv head and its two query heads each), one after the
    other: out, dq, dk, dv are the bits of all heads in one ring (the GPU kernels' results per
    head do not depend on how many heads a call has)."""
    _, placed = _inputs(head_dim, layout, seed=7)
    results = {}
    for groups in (1, 2):
        with monkeypatch.context() as m:
            m.setattr(ring, "_HEAD_GROUPS", groups)
            fn = functools.partial(ring.simulate, ring_size=RING_SIZE, is_causal=is_causal,
                                   layout=layout)
            results[groups] = jax.jit(functools.partial(attention_and_grads, fn))(*placed)
    for name, a, b in zip(("out", "dq", "dk", "dv"), results[2], results[1]):
        np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=name)


@pytest.mark.skipif(len(HOPPER) < 2, reason="needs two Hopper GPUs")
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_on_gpus_in_head_groups_gives_the_bits_and_needs_less_memory(monkeypatch, layout):
    """The ring in shard_map over up to four GPUs with its heads in four groups (a while loop):
    the bits of one ring over all heads, and the GPU compiler's temporaries at most half of one
    ring's (one group's float32 sums alive at a time)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    size = min(4, len(HOPPER))
    mesh = Mesh(np.array(HOPPER[:size]), ("seq",))
    spec = PartitionSpec(None, "seq")
    args = random_inputs(8, 1, 8192 * size, 8192 * size, 8, 4, 128, jnp.bfloat16)
    if layout == "zigzag":
        args = [ring.zigzag(x, size) for x in args]
    args = [jax.device_put(x, NamedSharding(mesh, spec)) for x in args]

    def compiled(groups):
        with monkeypatch.context() as m:
            m.setattr(ring, "_HEAD_GROUPS", groups)
            fn = functools.partial(jax_dash.ring_attention, axis_name="seq", is_causal=True,
                                   layout=layout)
            program = jax.jit(jax.shard_map(
                lambda q, k, v, dout: attention_and_grads(fn, q, k, v, dout), mesh=mesh,
                in_specs=(spec,) * 4, out_specs=(spec,) * 4))
            return program.lower(*args).compile()

    one, grouped = compiled(1), compiled(4)
    for name, a, b in zip(("out", "dq", "dk", "dv"), grouped(*args), one(*args)):
        np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=name)
    before = one.memory_analysis().temp_size_in_bytes
    after = grouped.memory_analysis().temp_size_in_bytes
    assert after <= 0.5 * before, (before, after)
