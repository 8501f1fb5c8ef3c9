"""Dropout in the ring (issue 33): jax_dash.ring_attention / ring.simulate with dropout_rate and
dropout_rng on 8 virtual CPU devices apply exactly the mask jax_dash.attention applies to the
global problem (read out of the results, forward and backward, both layouts), so they match the
single-device op with dropout to the ring's usual float32 rounding (the ring merges per-block
results: close, not bitwise, with or without dropout; docs/ring.md). Run to run, over head groups,
and between shard_map and simulate the bits are identical; a ring of one device is the single op
bitwise (contiguous)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jax_dash
from jax_dash import ring
from helpers import (attention_and_grads, dropout_readout_inputs, kept_by_backward,
                     kept_by_forward, random_inputs)

pytestmark = pytest.mark.usefixtures("on_cpu")

FP32_ATOL = 2e-5  # the ring's tolerance against the single op (tests/test_ring.py)
RATE = 0.3
RNG = jax.random.key(31)


def _mesh(shape, names):
    count = int(np.prod(shape))
    return Mesh(np.array(jax.devices("cpu")[:count]).reshape(shape), names)


@functools.lru_cache(maxsize=None)
def _ring_vjp(mesh_shape, mesh_names, spec, is_causal, layout, **kwargs):
    """jit(shard_map) of (q, k, v, dout) -> (out, dq, dk, dv) through ring_attention with
    dropout; the ring's axis is the mesh's last."""
    kwargs = dict(kwargs)
    mesh = _mesh(mesh_shape, mesh_names)

    def run(q, k, v, dout):
        fn = functools.partial(jax_dash.ring_attention, axis_name=mesh_names[-1],
                               is_causal=is_causal, layout=layout, dropout_rate=RATE,
                               dropout_rng=RNG, **kwargs)
        return attention_and_grads(fn, q, k, v, dout)

    return jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec,) * 4))


def _single(q, k, v, dout, **kwargs):
    fn = functools.partial(jax_dash.attention, dropout_rate=RATE, dropout_rng=RNG, **kwargs)
    return jax.jit(functools.partial(attention_and_grads, fn))(q, k, v, dout)


def _simulated(q, k, v, dout, ring_size, **kwargs):
    fn = functools.partial(ring.simulate, ring_size=ring_size, dropout_rate=RATE,
                           dropout_rng=RNG, **kwargs)
    return jax.jit(functools.partial(attention_and_grads, fn))(q, k, v, dout)


def _placed(args, layout, ring_size):
    return [ring.zigzag(x, ring_size) for x in args] if layout == "zigzag" else list(args)


def _natural(results, layout, ring_size):
    return [ring.unzigzag(x, ring_size) for x in results] if layout == "zigzag" else results


def _assert_close(actual, expected, atol=FP32_ATOL):
    for name, a, b in zip(("out", "dq", "dk", "dv"), actual, expected):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol, err_msg=name)


def _assert_equal(actual, expected):
    for name, a, b in zip(("out", "dq", "dk", "dv"), actual, expected):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("ring_size", [2, 4])
def test_the_ring_applies_the_global_mask_exactly(layout, is_causal, ring_size):
    """The masks the ring's forward and backward kernels applied, read out of out and dV: those
    of dropout_keep_mask over the global positions (and the causal mask), element for element."""
    q, k, v, dout = dropout_readout_inputs(2, 32, 32, 2, 32)
    placed = _placed((q, k, v, dout), layout, ring_size)
    out, _, _, dv = _natural(_simulated(*placed, ring_size, is_causal=is_causal, layout=layout),
                             layout, ring_size)
    expected = np.asarray(jax_dash.dropout_keep_mask(RNG, RATE, (2, 2, 32, 32)))
    if is_causal:
        expected = expected & np.tril(np.ones((32, 32), bool))
    np.testing.assert_array_equal(kept_by_forward(out, 32), expected)
    np.testing.assert_array_equal(kept_by_backward(dv, 32), expected)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("num_kv_heads", [2, 1])  # GQA, MQA
def test_matches_the_single_device_op_with_dropout(layout, is_causal, num_kv_heads):
    args = random_inputs(40, 2, 64, 64, 4, num_kv_heads, 32, jnp.float32)
    fn = _ring_vjp((4,), ("seq",), P(None, "seq"), is_causal, layout)
    ours = _natural(fn(*_placed(args, layout, 4)), layout, 4)
    _assert_close(ours, _single(*args, is_causal=is_causal))


def test_longer_keys_without_a_mask():
    args = random_inputs(41, 2, 32, 64, 4, 2, 16, jnp.float32)
    for layout in ("contiguous", "zigzag"):
        fn = _ring_vjp((4,), ("seq",), P(None, "seq"), False, layout)
        placed = [ring.zigzag(x, 4) if layout == "zigzag" else x for x in args]
        ours = _natural(fn(*placed), layout, 4)
        _assert_close(ours, _single(*args))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_batch_heads_and_sequence_sharded_together(layout):
    """A 2 x 2 x 2 mesh: batch over 'data', heads over 'model', the ring over 'seq';
    dropout_axes=('data', 'model') gives the blocks their batch and head offsets."""
    args = random_inputs(42, 4, 64, 64, 4, 2, 16, jnp.float32)
    fn = _ring_vjp((2, 2, 2), ("data", "model", "seq"), P("data", "seq", "model"), True, layout,
                   dropout_axes=("data", "model"))
    ours = _natural(fn(*_placed(args, layout, 2)), layout, 2)
    _assert_close(ours, _single(*args, is_causal=True))


def test_dropout_offsets_place_the_rings_problem():
    """dropout_offsets: the global coordinates of the ring's problem's origin, as for
    jax_dash.attention (here: a block of batch rows, heads and positions of a larger problem)."""
    args = random_inputs(43, 2, 64, 64, 2, 2, 16, jnp.float32)
    offsets = (3, 1, 128, 64)
    fn = _ring_vjp((4,), ("seq",), P(None, "seq"), False, "zigzag", dropout_offsets=offsets)
    ours = _natural(fn(*_placed(args, "zigzag", 4)), "zigzag", 4)
    _assert_close(ours, _single(*args, dropout_offsets=offsets))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_repeats_head_groups_and_simulate_give_the_same_bits(layout):
    """Run to run, two head groups against one (the group's head offset), and shard_map against
    the simulated ring: bitwise (GQA, causal)."""
    args = _placed(random_inputs(44, 2, 64, 64, 4, 2, 16, jnp.float32), layout, 4)
    one_group = _ring_vjp((4,), ("seq",), P(None, "seq"), True, layout, head_groups=1)
    first = one_group(*args)
    _assert_equal(one_group(*args), first)
    two_groups = _ring_vjp((4,), ("seq",), P(None, "seq"), True, layout, head_groups=2)
    _assert_equal(two_groups(*args), first)
    _assert_equal(_simulated(*args, 4, is_causal=True, layout=layout, head_groups=1), first)
    _assert_equal(_simulated(*args, 4, is_causal=True, layout=layout, head_groups=2), first)


def test_a_ring_of_one_device_is_the_single_op_bitwise():
    args = random_inputs(45, 2, 32, 32, 4, 2, 16, jnp.float32)
    _assert_equal(_simulated(*args, 1, is_causal=True), _single(*args, is_causal=True))


def test_rate_zero_is_the_ring_without_dropout():
    args = random_inputs(46, 1, 64, 64, 2, 2, 16, jnp.float32)
    placed = _placed(args, "zigzag", 4)
    plain = jax.jit(functools.partial(attention_and_grads, functools.partial(
        ring.simulate, ring_size=4, is_causal=True, layout="zigzag")))(*placed)
    zero = jax.jit(functools.partial(attention_and_grads, functools.partial(
        ring.simulate, ring_size=4, is_causal=True, layout="zigzag", dropout_rate=0.0,
        dropout_rng=RNG)))(*placed)
    _assert_equal(zero, plain)


def test_bfloat16_close_to_the_float32_op():
    args = random_inputs(47, 1, 64, 64, 2, 2, 32, jnp.bfloat16)
    ours = _natural(_simulated(*_placed(args, "zigzag", 4), 4, is_causal=True, layout="zigzag"),
                    "zigzag", 4)
    want = _single(*[x.astype(jnp.float32) for x in args], is_causal=True)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, want):
        assert a.dtype == jnp.bfloat16, name
        err = float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)))
        assert err <= 0.05 * float(jnp.max(jnp.abs(b))) + 1e-2, (name, err)


def test_compiled_dropout_ring_permutes_and_gathers_nothing():
    args = random_inputs(48, 2, 64, 64, 4, 2, 16, jnp.float32)
    hlo = _ring_vjp((4,), ("seq",), P(None, "seq"), True, "zigzag").lower(*args).compile()
    text = hlo.as_text()
    assert "collective-permute" in text
    assert "all-gather" not in text and "all-to-all" not in text


# ---- refusals ---------------------------------------------------------------------------------

def _ring_in_shard_map(args, mesh_shape, names, spec, **kwargs):
    fn = jax.shard_map(functools.partial(jax_dash.ring_attention, axis_name=names[-1],
                                         dropout_rate=RATE, dropout_rng=RNG, **kwargs),
                       mesh=_mesh(mesh_shape, names), in_specs=(spec,) * 3, out_specs=spec)
    return jax.jit(fn)(*args)


def test_batch_sharded_beside_the_ring_needs_dropout_axes():
    args = random_inputs(49, 2, 32, 32, 2, 2, 16, jnp.float32)[:3]
    with pytest.raises(ValueError, match=r"mesh axes \('data',\).*Pass dropout_axes"):
        _ring_in_shard_map(args, (2, 4), ("data", "seq"), P("data", "seq"))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(dropout_axes=("data", None, None, None)), TypeError,
     "ring_attention derives the sequence's offsets from axis_name"),
    (dict(dropout_axes=("data", None), dropout_offsets=(0, 0, 0, 0)), ValueError,
     "pass dropout_offsets or dropout_axes, not both"),
    (dict(dropout_axes=("seq", None)), ValueError, "dropout_axes=('seq', None) names the ring's "
                                                   "axis 'seq'"),
    (dict(layout="zigzag"), ValueError, "layout='zigzag' with dropout draws the mask chunk by "
                                        "chunk"),
])
def test_bad_ring_dropout_arguments(kwargs, error, message):
    seq = 12 if kwargs.get("layout") == "zigzag" else 16  # 3 tokens per device: odd
    args = random_inputs(50, 2, seq, seq, 2, 2, 16, jnp.float32)[:3]
    with pytest.raises(error, match=re.escape(message)):
        _ring_in_shard_map(args, (4,), ("seq",), P(None, "seq"), **kwargs)


def test_the_earlier_backward_is_refused_with_dropout(monkeypatch):
    monkeypatch.setattr(ring, "_ACCUMULATE", False)
    args = random_inputs(51, 1, 16, 16, 2, 2, 16, jnp.float32)[:3]
    with pytest.raises(ValueError, match="accumulating backward only"):
        ring.simulate(*args, 2, dropout_rate=RATE, dropout_rng=RNG)


def test_docs_dropout_example_runs():
    """docs/ring.md's dropout example, as written (it asserts the single op's output)."""
    import pathlib
    text = (pathlib.Path(__file__).parents[1] / "docs" / "ring.md").read_text()
    example = text.split("## Dropout", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "dropout_rate" in example and "assert" in example
    exec(compile(example, "docs/ring.md", "exec"), {})
