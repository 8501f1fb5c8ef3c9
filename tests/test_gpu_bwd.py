"""Hopper backward kernels (cuda/sm90/bwd_*): accuracy, bitwise determinism, batch invariance,
coverage of every output element, and grids far larger than the GPU.

The raw FFI backward is fed the fp32 reference forward's out (cast to the input dtype) and lse, so
these tests judge the backward kernels alone. Skipped unless an sm_90 GPU is present.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import GPU_MARKS, assert_close_to_reference, random_inputs
from jax_dash.reference import reference_backward, reference_forward


pytestmark = GPU_MARKS

DETERMINISTIC = ("ascending", "descending", "shift", "symmetric_shift", "mirror")
ALL_SCHEDULES = DETERMINISTIC + ("atomic",)


def _ffi():
    from jax_dash import _ffi  # imported lazily: collecting this file must not need the build

    if not _ffi.built_with_cuda:
        pytest.fail("jax_dash was built without its CUDA kernels on a machine with a Hopper GPU")
    return _ffi


@functools.lru_cache(maxsize=None)
def _bwd_fn(scale, is_causal, schedule):
    ffi = _ffi()
    return jax.jit(lambda q, k, v, o, lse, do: ffi.bwd_call(q, k, v, o, lse, do, scale, is_causal,
                                                            schedule))


def _gpu_inputs(seed, batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype, is_causal):
    """Inputs on the GPU plus the fp32 forward (out cast to dtype, lse fp32)."""
    gpu = jax.devices("gpu")[0]
    q, k, v, dout = (jax.device_put(x, gpu) for x in
                     random_inputs(seed, batch, seq_q, seq_kv, heads, kv_heads, head_dim, dtype))
    scale = 1.0 / np.sqrt(head_dim)
    out, lse = _ref_forward(q, k, v, scale, is_causal)
    return q, k, v, dout, out, lse, scale


@functools.partial(jax.jit, static_argnums=(3, 4))
def _ref_forward(q, k, v, scale, is_causal):
    return reference_forward(q, k, v, scale=scale, is_causal=is_causal)


@functools.partial(jax.jit, static_argnums=(6, 7))
def _ref_and_naive_backward(q, k, v, dout, out, lse, scale, is_causal):
    ref = reference_backward(q, k, v, out, lse, dout, scale=scale, is_causal=is_causal)
    dtype = q.dtype
    naive_out, naive_lse = reference_forward(q, k, v, scale=scale, is_causal=is_causal,
                                             compute_dtype=dtype)
    naive = reference_backward(q, k, v, naive_out, naive_lse, dout, scale=scale,
                               is_causal=is_causal, compute_dtype=dtype)
    return ref, naive


def _check_against_reference(q, k, v, dout, out, lse, scale, is_causal, grads, *, tag):
    dtype = q.dtype
    ref, naive = _ref_and_naive_backward(q, k, v, dout, out, lse, scale, is_causal)
    rel = 4e-3 if dtype == jnp.bfloat16 else 1e-3  # about one output rounding of the dtype
    for name, ours, r, nv in zip(("dq", "dk", "dv"), grads, ref, naive):
        assert ours.shape == r.shape and ours.dtype == dtype, (tag, name, ours.shape, ours.dtype)
        atol = rel * float(jnp.max(jnp.abs(r))) + 1e-5
        assert_close_to_reference(f"{tag} {name}", ours, r, nv, atol)


# (batch, seq_q, seq_kv, heads, kv_heads, head_dim): every required seq length, both head dims,
# seq_q != seq_kv both ways, GQA ratios 1/2/8.
ACCURACY_SHAPES = [
    (2, 1, 1, 2, 2, 64),
    (2, 1, 1, 2, 2, 128),
    (1, 97, 97, 4, 4, 64),
    (1, 97, 97, 4, 4, 128),
    (2, 129, 129, 2, 2, 64),
    (2, 129, 129, 2, 2, 128),
    (1, 1000, 1000, 2, 2, 64),
    (1, 1000, 1000, 2, 2, 128),
    (1, 4096, 4096, 2, 2, 64),
    (1, 4096, 4096, 2, 2, 128),
    (1, 97, 300, 4, 2, 128),
    (1, 300, 97, 4, 2, 64),
    (1, 129, 1000, 8, 1, 128),
    (1, 1000, 129, 8, 1, 64),
    (2, 257, 513, 8, 4, 64),
    (1, 1, 700, 2, 1, 128),
    # head_dim 256 (64-row tiles, the head dim split between the math warpgroups)
    (2, 1, 1, 2, 2, 256),
    (1, 97, 97, 4, 4, 256),
    (1, 1000, 1000, 2, 2, 256),
    (1, 97, 300, 4, 2, 256),
    (1, 300, 97, 8, 1, 256),
    # head dims the kernels lack, run zero-padded to 64 / 128 / 256 (jax_dash/_ffi.py
    # hopper_head_dim)
    (1, 300, 300, 4, 2, 96),
    (2, 129, 257, 2, 2, 32),
    (1, 1000, 1000, 2, 2, 80),
    (1, 300, 300, 4, 2, 192),
    (2, 129, 257, 2, 2, 136),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", ACCURACY_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_accuracy_descending(shape, is_causal, dtype):
    q, k, v, dout, out, lse, scale = _gpu_inputs(0, *shape, dtype, is_causal)
    grads = _bwd_fn(scale, is_causal, "descending")(q, k, v, out.astype(dtype), lse, dout)
    _check_against_reference(q, k, v, dout, out, lse, scale, is_causal, grads,
                             tag=f"{shape} causal={is_causal}")


@pytest.mark.parametrize("schedule", ALL_SCHEDULES)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 4, 128), (1, 1024, 1024, 8, 2, 64),
                                   (1, 700, 700, 4, 2, 256),
                                   (1, 513, 1100, 4, 4, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_accuracy_every_schedule(shape, is_causal, schedule):
    dtype = jnp.bfloat16
    q, k, v, dout, out, lse, scale = _gpu_inputs(1, *shape, dtype, is_causal)
    grads = _bwd_fn(scale, is_causal, schedule)(q, k, v, out.astype(dtype), lse, dout)
    _check_against_reference(q, k, v, dout, out, lse, scale, is_causal, grads,
                             tag=f"{schedule} {shape} causal={is_causal}")


@pytest.mark.parametrize("schedule", DETERMINISTIC)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_bitwise_identical_over_100_runs(schedule, is_causal, head_dim):
    # Many items per dQ tile and GQA so that both ticket protocols are exercised.
    shape = (2, 1000, 1000, 8, 2, head_dim)
    dtype = jnp.bfloat16
    q, k, v, dout, out, lse, scale = _gpu_inputs(2, *shape, dtype, is_causal)
    fn = _bwd_fn(scale, is_causal, schedule)
    args = (q, k, v, out.astype(dtype), lse, dout)
    first = [np.asarray(x) for x in jax.block_until_ready(fn(*args))]
    for rep in range(99):
        again = jax.block_until_ready(fn(*args))
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert np.array_equal(a.view(np.uint16), np.asarray(b).view(np.uint16)), (
                f"{schedule}: {name} differs bitwise on repetition {rep + 1}")


@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("schedule", DETERMINISTIC)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_batch_invariance(schedule, is_causal, head_dim):
    # A sequence's gradients must not depend on the batch size or its position in the batch.
    dtype = jnp.bfloat16
    # Batch 8 x 4 heads x 6 KV tiles = 192 items: more than one wave of 132 CTAs, so heads
    # straddle the global waves (shift/symmetric_shift must cut their slices per head).
    q, k, v, dout, out, lse, scale = _gpu_inputs(3, 8, 700, 700, 4, 2, head_dim, dtype,
                                                 is_causal)
    fn = _bwd_fn(scale, is_causal, schedule)
    full = [np.asarray(x) for x in fn(q, k, v, out.astype(dtype), lse, dout)]
    for i in (0, 3, 5, 7):
        sl = slice(i, i + 1)
        single = fn(q[sl], k[sl], v[sl], out[sl].astype(dtype), lse[sl], dout[sl])
        for name, a, b in zip(("dq", "dk", "dv"), full, single):
            assert np.array_equal(a[sl].view(np.uint16), np.asarray(b).view(np.uint16)), (
                f"{schedule}: {name} of sequence {i} differs between batch 8 and batch 1")


def test_poisoned_outputs_are_fully_written():
    # Fill (and free) device memory with NaN first so that the output buffers XLA hands to the
    # kernel are likely to hold NaN; every element must then be overwritten. Causal with
    # seq_kv > seq_q leaves whole KV tiles without any query: their dK/dV must be exact zeros.
    dtype = jnp.bfloat16
    batch, seq_q, seq_kv, heads, kv_heads, head_dim = 1, 200, 600, 4, 4, 128
    gpu = jax.devices("gpu")[0]
    for _ in range(3):
        poison = jax.device_put(jnp.full((1 << 24,), jnp.nan, jnp.float32), gpu)
        poison.block_until_ready()
        del poison
    q, k, v, dout, out, lse, scale = _gpu_inputs(4, batch, seq_q, seq_kv, heads, kv_heads,
                                                 head_dim, dtype, True)
    dq, dk, dv = _bwd_fn(scale, True, "shift")(q, k, v, out.astype(dtype), lse, dout)
    for name, x in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert bool(jnp.all(jnp.isfinite(x.astype(jnp.float32)))), f"{name} has unwritten NaN"
    # Keys >= seq_q are seen by no query under the top-left causal mask.
    assert bool(jnp.all(dk[:, seq_q:] == 0)) and bool(jnp.all(dv[:, seq_q:] == 0))
    _check_against_reference(q, k, v, dout, out, lse, scale, True, (dq, dk, dv), tag="poisoned")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule", ["ascending", "shift", "atomic"])
@pytest.mark.parametrize(
    "shape,is_causal",
    [((1, 20000, 20000, 2, 2, 64), False),  # Nkv = 157 KV tiles per head: more than the SMs
     ((1024, 256, 256, 4, 2, 64), True)],  # 4096 (batch, head) pairs, 8192 items
    ids=["long_sequence", "thousands_of_heads"])
def test_grid_far_larger_than_gpu(shape, is_causal, schedule):
    dtype = jnp.bfloat16
    q, k, v, dout, out, lse, scale = _gpu_inputs(5, *shape, dtype, is_causal)
    grads = jax.block_until_ready(
        _bwd_fn(scale, is_causal, schedule)(q, k, v, out.astype(dtype), lse, dout))
    _check_against_reference(q, k, v, dout, out, lse, scale, is_causal, grads,
                             tag=f"{schedule} {shape}")


def test_small_case_for_sanitizer():
    """Tiny case meant to run under compute-sanitizer (memcheck / racecheck) on the device."""
    dtype = jnp.bfloat16
    for is_causal, schedule, shape in ((True, "descending", (1, 150, 150, 2, 1, 64)),
                                       (False, "ascending", (1, 70, 200, 2, 2, 128))):
        q, k, v, dout, out, lse, scale = _gpu_inputs(6, *shape, dtype, is_causal)
        grads = _bwd_fn(scale, is_causal, schedule)(q, k, v, out.astype(dtype), lse, dout)
        _check_against_reference(q, k, v, dout, out, lse, scale, is_causal, grads,
                                 tag=f"sanitizer {shape}")


@pytest.mark.parametrize("head_dim, seq", [(128, 300_000), (128, 1 << 20), (256, 1 << 20)])
def test_backward_too_long_for_shared_memory_is_refused_before_launch(head_dim, seq):
    """The main kernel's per-Q-tile tables live in shared memory, so a query beyond about 254k
    tokens at head_dim 128 cannot fit (the first, "classic" kernel that ran such queries with
    smaller tables is deleted): the handler says so (InvalidArgument naming seq_q, the limit and
    ring_attention) before it enqueues anything, and the next backward on the stream runs
    normally."""
    gpu = jax.devices("gpu")[0]
    q = jax.device_put(jnp.zeros((1, seq, 1, head_dim), jnp.bfloat16), gpu)
    lse = jax.device_put(jnp.zeros((1, 1, seq), jnp.float32), gpu)
    with pytest.raises(jax.errors.JaxRuntimeError, match=(
            r"INVALID_ARGUMENT: jax_dash: the GPU backward supports seq_q up to \d+ at "
            rf"head_dim={head_dim} on this GPU .* got seq_q={seq}; shard the sequence over "
            r"devices with jax_dash.ring_attention")):
        jax.block_until_ready(_bwd_fn(0.1, False, "descending")(q, q, q, q, lse, q))
    q, k, v, dout, out, lse, scale = _gpu_inputs(0, 1, 256, 256, 2, 2, 64, jnp.bfloat16, True)
    dq, dk, dv = _bwd_fn(scale, True, "descending")(q, k, v, out.astype(q.dtype), lse, dout)
    assert all(bool(jnp.all(jnp.isfinite(g.astype(jnp.float32)))) for g in (dq, dk, dv))


@pytest.mark.parametrize("schedule", ["descending", "shift", "atomic"])
def test_without_unit_tables_the_bits_are_the_same(schedule):
    """A long key sequence over one head gets no unit tables in the workspace (params.h: they would
    exceed 1/4 of dQ's float32 accumulator), so the backward runs its masked instantiation, which
    builds each unit's visit order and tickets in the kernel. The head's gradients must be the bits
    of the same head computed beside a second one (tables present), and match the reference."""
    ffi = _ffi()
    shape = (1, 640, 160_000)
    assert not ffi._ext.bwd_has_unit_tables(*shape, 1, 1, 128)
    assert ffi._ext.bwd_has_unit_tables(*shape, 2, 2, 128)
    q, k, v, dout, out, lse, scale = _gpu_inputs(12, *shape, 2, 2, 128, jnp.bfloat16, False)
    out = out.astype(q.dtype)
    fn = _bwd_fn(scale, False, schedule)
    two = fn(q, k, v, out, lse, dout)
    head = (slice(None), slice(None), slice(0, 1))
    args = (q[head], k[head], v[head], out[head], lse[:, :1], dout[head])
    one = fn(*args)
    if schedule != "atomic":
        for name, a, b in zip(("dq", "dk", "dv"), two, one):
            assert np.array_equal(np.asarray(a)[head].view(np.uint16),
                                  np.asarray(b).view(np.uint16)), name
    _check_against_reference(*args[:3], args[5], args[3], args[4], scale, False, one,
                             tag=f"no unit tables, {schedule}")


@pytest.mark.parametrize("var,value,allowed", [
    ("JAX_DASH_SM90_FWD", "ws-rs", "use ws, ws-persistent or ws-persistent-narrow"),
    # A variant deleted after losing its A/B test (maintainers/perf-notes.md, 2026-11-26).
    ("JAX_DASH_SM90_FWD", "classic", "use ws, ws-persistent or ws-persistent-narrow")])
def test_unknown_kernel_variant_is_a_clear_error(monkeypatch, var, value, allowed):
    """An unknown kernel name in the environment (a deleted variant's too) is refused before
    anything runs, naming the variable and the names allowed; the next call with a valid name runs
    normally."""
    q, k, v, dout, out, lse, scale = _gpu_inputs(8, 1, 256, 256, 2, 2, 64, jnp.bfloat16, False)
    out = out.astype(q.dtype)
    monkeypatch.setenv(var, value)
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=rf"INVALID_ARGUMENT: jax_dash: {var}='{value}' names no .*{allowed}"):
        jax.block_until_ready(_bwd_fn(scale, False, "descending")(q, k, v, out, lse, dout))
    monkeypatch.delenv(var)
    grads = _bwd_fn(scale, False, "descending")(q, k, v, out, lse, dout)
    assert all(bool(jnp.all(jnp.isfinite(g.astype(jnp.float32)))) for g in grads)


def test_the_backward_reads_no_kernel_variable(monkeypatch):
    """The backward has one kernel: JAX_DASH_SM90_BWD (which chose the deleted classic kernel)
    changes nothing, so a stale setting cannot select or break anything."""
    q, k, v, dout, out, lse, scale = _gpu_inputs(9, 1, 256, 256, 2, 2, 64, jnp.bfloat16, True)
    out = out.astype(q.dtype)
    monkeypatch.delenv("JAX_DASH_SM90_BWD", raising=False)
    plain = _bwd_fn(scale, True, "descending")(q, k, v, out, lse, dout)
    monkeypatch.setenv("JAX_DASH_SM90_BWD", "classic")
    again = _bwd_fn(scale, True, "descending")(q, k, v, out, lse, dout)
    for name, a, b in zip(("dq", "dk", "dv"), plain, again):
        assert np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16)), name
