"""jax_dash.ring_attention (context parallelism) on 8 virtual CPU devices: forward and gradients
against the single-device op, contiguous and zigzag layouts, 1-D and 2-D meshes, run-to-run bits,
the compiled communication, and bad input."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jax_dash
from jax_dash import ring
from helpers import assert_close_to_reference, random_inputs, references, ring_sums

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU kernels (float32): conftest.py

FP32_ATOL = 2e-5  # the ring merges per-block results: equal to the single op up to fp32 rounding


def shard_map(f, mesh, in_specs, out_specs):
    try:
        from jax import shard_map as _shard_map
    except ImportError:  # jax < 0.7
        from jax.experimental.shard_map import shard_map as _shard_map
    return _shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def _mesh(shape, names):
    count = int(np.prod(shape))
    return Mesh(np.array(jax.devices("cpu")[:count]).reshape(shape), names)


@functools.lru_cache(maxsize=None)
def _ring_vjp(mesh_shape, mesh_names, spec, axis_name, is_causal, layout, schedule="auto"):
    """jit(shard_map) of (q, k, v, dout) -> (out, dq, dk, dv) through ring_attention."""
    mesh = _mesh(mesh_shape, mesh_names)

    def run(q, k, v, dout):
        fn = functools.partial(jax_dash.ring_attention, axis_name=axis_name, is_causal=is_causal,
                               layout=layout, schedule=schedule)
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(dout))

    return jax.jit(shard_map(run, mesh, (spec,) * 4, (spec,) * 4))


@functools.lru_cache(maxsize=None)
def _single_vjp(is_causal, schedule="auto"):
    def run(q, k, v, dout):
        fn = functools.partial(jax_dash.attention, is_causal=is_causal, schedule=schedule)
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(dout))

    return jax.jit(run)


def _run_ring(fn, args, layout, ring_size):
    """Runs fn on args placed for the layout, results back in sequence order."""
    if layout == "zigzag":
        args = [ring.zigzag(x, ring_size) for x in args]
    results = fn(*args)
    if layout == "zigzag":
        results = [ring.unzigzag(x, ring_size) for x in results]
    return results


def _assert_close(actual, expected, atol=FP32_ATOL):
    for name, a, b in zip(("out", "dq", "dk", "dv"), actual, expected):
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, a.dtype, b.dtype)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol, err_msg=name)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("num_kv_heads", [2, 1])  # GQA, MQA (MHA: test_ring_over_two_mesh_axes)
def test_matches_single_device_op(layout, is_causal, num_kv_heads):
    args = random_inputs(0, 2, 64, 64, 4, num_kv_heads, 32, jnp.float32)
    fn = _ring_vjp((4,), ("seq",), P(None, "seq"), "seq", is_causal, layout)
    ours = _run_ring(fn, args, layout, 4)
    _assert_close(ours, _single_vjp(is_causal)(*args))


@pytest.mark.parametrize("ring_size", [2, 8])
def test_other_ring_sizes(ring_size):
    args = random_inputs(1, 1, 64, 64, 2, 1, 16, jnp.float32)
    fn = _ring_vjp((ring_size,), ("seq",), P(None, "seq"), "seq", True, "zigzag")
    _assert_close(_run_ring(fn, args, "zigzag", ring_size), _single_vjp(True)(*args))


def test_full_mask_with_longer_keys():
    # Without a mask the query and key blocks may differ in length.
    args = list(random_inputs(2, 2, 32, 64, 4, 2, 16, jnp.float32))
    fn = _ring_vjp((4,), ("seq",), P(None, "seq"), "seq", False, "contiguous")
    _assert_close(fn(*args), _single_vjp(False)(*args))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_2d_mesh_batch_by_sequence(layout):
    args = random_inputs(3, 4, 64, 64, 4, 2, 16, jnp.float32)
    fn = _ring_vjp((2, 4), ("data", "seq"), P("data", "seq"), "seq", True, layout)
    _assert_close(_run_ring(fn, args, layout, 4), _single_vjp(True)(*args))


def test_ring_over_two_mesh_axes():
    # axis_name may be a tuple: the ring runs over the 2 x 4 = 8 devices of both axes.
    args = random_inputs(4, 1, 64, 64, 2, 2, 16, jnp.float32)
    fn = _ring_vjp((2, 4), ("a", "b"), P(None, ("a", "b")), ("a", "b"), True, "contiguous")
    _assert_close(fn(*args), _single_vjp(True)(*args))


def test_unbatched_inputs():
    q, k, v, dout = (x[0] for x in random_inputs(5, 1, 32, 32, 2, 1, 16, jnp.float32))
    mesh = _mesh((4,), ("seq",))
    spec = P("seq")
    fn = jax.jit(shard_map(lambda q, k, v: jax_dash.ring_attention(q, k, v, axis_name="seq",
                                                                   is_causal=True),
                           mesh, (spec,) * 3, spec))
    expected = jax_dash.attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(fn(q, k, v), expected, rtol=0, atol=FP32_ATOL)


@pytest.mark.parametrize("layout, is_causal", [("contiguous", False), ("zigzag", True)])
def test_bfloat16_close_to_reference(layout, is_causal):
    """bf16: the ring meets the accuracy criterion the single-device op meets (tests/helpers.py)."""
    q, k, v, dout = random_inputs(6, 2, 64, 64, 4, 2, 32, jnp.bfloat16)
    fn = _ring_vjp((4,), ("seq",), P(None, "seq"), "seq", is_causal, layout)
    ours = _run_ring(fn, (q, k, v, dout), layout, 4)
    refs, naive = references(q, k, v, dout, is_causal=is_causal)
    for name, a, r, n in zip(("out", "dq", "dk", "dv"), ours, refs, naive):
        assert a.dtype == jnp.bfloat16, name
        assert_close_to_reference(name, a, r, n, atol=1e-2)


@pytest.mark.parametrize("layout, schedule", [("contiguous", "descending"),
                                              ("zigzag", "symmetric_shift"), ("zigzag", "shift")])
def test_repeated_runs_are_bitwise_identical(layout, schedule):
    args = random_inputs(7, 2, 64, 64, 4, 2, 16, jnp.bfloat16)
    fn = _ring_vjp((4,), ("seq",), P(None, "seq"), "seq", True, layout, schedule)
    first = _run_ring(fn, args, layout, 4)
    # Runs 2 and 3: the same executable, then a fresh trace and compile.
    again = _run_ring(fn, args, layout, 4)
    _ring_vjp.cache_clear()
    fresh = _run_ring(_ring_vjp((4,), ("seq",), P(None, "seq"), "seq", True, layout, schedule),
                      args, layout, 4)
    for other in (again, fresh):
        for a, b in zip(first, other):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_ring_of_one_device_is_the_single_op_bitwise():
    # One device: one block, the single-device kernels on the whole sequence.
    args = random_inputs(8, 2, 32, 32, 4, 2, 16, jnp.bfloat16)
    fn = _ring_vjp((1,), ("seq",), P(None, "seq"), "seq", True, "contiguous")
    for a, b in zip(fn(*args), _single_vjp(True)(*args)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_compiled_ring_permutes_and_gathers_nothing():
    args = random_inputs(9, 2, 64, 64, 4, 2, 16, jnp.float32)
    fn = _ring_vjp((4,), ("seq",), P(None, "seq"), "seq", True, "zigzag")
    hlo = fn.lower(*args).compile().as_text()
    assert "collective-permute" in hlo
    assert "all-gather" not in hlo and "all-to-all" not in hlo


# ---- accumulating backward: the sums added in place by the kernels ----------------------------

def _f32_bits(results):
    return [np.asarray(x, np.float32).view(np.uint32) for x in results]


def _without_accumulate(monkeypatch, build):
    """What ``build()`` returns when the ring is traced in its earlier formulation (the kernels
    return each block pair's float32 contributions and XLA adds them): the reference bits."""
    with monkeypatch.context() as m:
        m.setattr(ring, "_ACCUMULATE", False)
        return jax.block_until_ready(build())


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("num_kv_heads", [4, 2])  # MHA, GQA
def test_accumulating_backward_gives_the_earlier_bits(monkeypatch, layout, is_causal,
                                                      num_kv_heads):
    """The kernels' in-place sums (_ffi.bwd_call(sums=...)) give exactly the bits of adding the
    float32 contributions outside (float32 inputs: the results are the float32 sums)."""
    args = random_inputs(30, 2, 64, 64, 4, num_kv_heads, 16, jnp.float32)

    def run():  # a fresh trace each time (_ACCUMULATE is read when tracing)
        fn = _ring_vjp.__wrapped__((4,), ("seq",), P(None, "seq"), "seq", is_causal, layout)
        return _run_ring(fn, args, layout, 4)

    assert ring._ACCUMULATE
    earlier = _without_accumulate(monkeypatch, run)
    for name, a, b in zip(("out", "dq", "dk", "dv"), _f32_bits(run()), _f32_bits(earlier)):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("layout, ring_size, schedule", [("contiguous", 8, "shift"),
                                                         ("zigzag", 2, "symmetric_shift")])
def test_accumulating_backward_gives_the_earlier_bits_through_simulate(monkeypatch, layout,
                                                                       ring_size, schedule):
    args = random_inputs(31, 1, 128, 128, 4, 2, 16, jnp.float32)
    placed = [ring.zigzag(x, ring_size) for x in args] if layout == "zigzag" else list(args)

    def run():
        fn = functools.partial(ring.simulate, ring_size=ring_size, is_causal=True, layout=layout,
                               schedule=schedule)

        def vjp(q, k, v, dout):
            out, pullback = jax.vjp(fn, q, k, v)
            return (out, *pullback(dout))

        return jax.jit(vjp)(*placed)

    earlier = _without_accumulate(monkeypatch, run)
    for name, a, b in zip(("out", "dq", "dk", "dv"), _f32_bits(run()), _f32_bits(earlier)):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_accumulating_backward_gives_the_earlier_float32_sums_from_bfloat16(layout):
    """bf16 inputs (the GPU's case): the float32 sums themselves, before the cast, are the
    earlier formulation's bits (GQA, causal)."""
    args = random_inputs(33, 1, 128, 128, 4, 2, 32, jnp.bfloat16)
    if layout == "zigzag":
        args = [ring.zigzag(x, 4) for x in args]
    ours, earlier = (ring_sums(*args, 4, is_causal=True, layout=layout, accumulate=accumulate)
                     for accumulate in (True, False))
    for name, a, b in zip(("dq", "dk", "dv"), ours, earlier):
        assert a.dtype == jnp.float32, name
        np.testing.assert_array_equal(_f32_bits([a])[0], _f32_bits([b])[0], err_msg=name)


def test_accumulating_backward_gives_the_earlier_bits_on_the_jit_path(monkeypatch):
    from jax.sharding import NamedSharding
    args = random_inputs(32, 2, 64, 64, 4, 2, 16, jnp.float32)
    sharding = NamedSharding(_mesh((4,), ("seq",)), P(None, "seq"))
    placed = [jax.device_put(x, sharding) for x in args]

    def run():
        return _single_vjp.__wrapped__(True)(*placed)

    earlier = _without_accumulate(monkeypatch, run)
    for name, a, b in zip(("out", "dq", "dk", "dv"), _f32_bits(run()), _f32_bits(earlier)):
        np.testing.assert_array_equal(a, b, err_msg=name)


def _compiled_ring(layout, ring_size, block_shape):
    """The compiled forward + backward of a causal bf16 ring (shapes only, nothing runs)."""
    batch, seq, heads, head_dim = block_shape
    shape = jax.ShapeDtypeStruct((batch, seq * ring_size, heads, head_dim), jnp.bfloat16)
    fn = _ring_vjp.__wrapped__((ring_size,), ("seq",), P(None, "seq"), "seq", True, layout)
    return fn.lower(shape, shape, shape, shape).compile()


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_accumulating_backward_copies_no_sum(layout):
    """The sums are updated in place: the compiled program copies no float32 block (a copy of a
    sum would bring back the buffer the in-place add saves; only the zigzag halves a kernel
    accumulates into are cut out, as half blocks)."""
    block = (1, 256, 4, 64)  # per device
    hlo = _compiled_ring(layout, 4, block).as_text()
    full = r"f32\[1,256,4,64\]\{[0-9,]+\} copy\("
    assert not re.search(full, hlo), re.findall(r".*" + full + r".*", hlo)[:4]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_accumulating_backward_needs_less_memory(monkeypatch, layout):
    """The CPU compiler's buffer assignment of the ring, per device: without the step's separate
    float32 contributions the temporaries shrink (measured 0.72x at P = 2, 0.45x-0.52x at P = 4;
    the CPU schedule runs the transfers early, so P > 2 saves more than three blocks)."""
    block = (1, 1024, 4, 64)  # per device
    for ring_size, most in ((2, 0.75), (4, 0.6)):
        earlier = _without_accumulate(
            monkeypatch, lambda: _compiled_ring(layout, ring_size, block)).memory_analysis()
        ours = _compiled_ring(layout, ring_size, block).memory_analysis()
        ratio = ours.temp_size_in_bytes / earlier.temp_size_in_bytes
        assert ratio <= most, (ring_size, earlier.temp_size_in_bytes, ours.temp_size_in_bytes)


# ---- head groups ------------------------------------------------------------------------------

def _with_head_groups(monkeypatch, groups, build):
    """What ``build()`` returns when the ring is traced with its heads in ``groups`` groups."""
    with monkeypatch.context() as m:
        m.setattr(ring, "_HEAD_GROUPS", groups)
        return jax.block_until_ready(build())


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("num_kv_heads, groups", [(4, 2), (4, 4), (2, 2)])  # MHA, GQA
def test_head_groups_give_the_bits_of_one_ring(monkeypatch, layout, is_causal, num_kv_heads,
                                               groups):
    """The heads run group after group (a while loop): the output and every gradient are the
    bits of all heads in one ring (every sum is within one head)."""
    args = random_inputs(34, 2, 64, 64, 4, num_kv_heads, 16, jnp.float32)

    def run():  # a fresh trace each time (_HEAD_GROUPS is read when tracing)
        fn = _ring_vjp.__wrapped__((4,), ("seq",), P(None, "seq"), "seq", is_causal, layout)
        return _run_ring(fn, args, layout, 4)

    def loops():
        fn = _ring_vjp.__wrapped__((4,), ("seq",), P(None, "seq"), "seq", is_causal, layout)
        return fn.lower(*args).as_text().count("stablehlo.while")

    one = _with_head_groups(monkeypatch, 1, run)
    grouped = _with_head_groups(monkeypatch, groups, run)
    assert _with_head_groups(monkeypatch, groups, loops) == 2  # forward and backward
    assert _with_head_groups(monkeypatch, 1, loops) == 0
    for name, a, b in zip(("out", "dq", "dk", "dv"), _f32_bits(grouped), _f32_bits(one)):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_head_groups_give_the_bits_of_one_ring_from_bfloat16(monkeypatch):
    """bf16 inputs (the GPU's case), through simulate: the casts per group change nothing."""
    args = [ring.zigzag(x, 4) for x in random_inputs(35, 1, 128, 128, 4, 2, 32, jnp.bfloat16)]

    def run():
        fn = functools.partial(ring.simulate, ring_size=4, is_causal=True, layout="zigzag")

        def vjp(q, k, v, dout):
            out, pullback = jax.vjp(fn, q, k, v)
            return (out, *pullback(dout))

        return jax.jit(vjp)(*args)

    one, grouped = (_with_head_groups(monkeypatch, g, run) for g in (1, 2))

    def barriers():
        lowered = jax.jit(lambda *a: ring.simulate(*a[:3], 4, is_causal=True, layout="zigzag")
                          ).lower(*args[:3])
        return lowered.as_text().count("stablehlo.optimization_barrier")

    # Unrolled in simulate, the second group after a barrier (simulate is cached per
    # _HEAD_GROUPS, so this also shows the grouped ring is not the cached ungrouped one).
    assert _with_head_groups(monkeypatch, 2, barriers) == 2 * _with_head_groups(
        monkeypatch, 1, barriers) + 1
    for name, a, b in zip(("out", "dq", "dk", "dv"), grouped, one):
        assert a.dtype == jnp.bfloat16, name
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16),
                                      np.asarray(b).view(np.uint16), err_msg=name)


def test_head_groups_give_the_bits_of_one_ring_on_the_jit_path(monkeypatch):
    from jax.sharding import NamedSharding
    args = random_inputs(36, 2, 64, 64, 4, 2, 16, jnp.float32)
    sharding = NamedSharding(_mesh((4,), ("seq",)), P(None, "seq"))
    placed = [jax.device_put(x, sharding) for x in args]

    def run():  # compiled anew: the partitioning rule reads _HEAD_GROUPS when it lowers
        compiled = _single_vjp.__wrapped__(True).lower(*placed).compile()
        return compiled.as_text(), compiled(*placed)

    (one_hlo, one), (grouped_hlo, grouped) = (_with_head_groups(monkeypatch, g, run)
                                              for g in (1, 2))
    assert " while(" in grouped_hlo and " while(" not in one_hlo  # the groups' loop ran
    for name, a, b in zip(("out", "dq", "dk", "dv"), _f32_bits(grouped), _f32_bits(one)):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_head_groups_choice():
    """The fewest groups dividing the kv heads that bring the float32 state (2 * heads + 4 *
    kv_heads float32 heads) under 1.5 query blocks, keeping >= 2^17 query rows per group."""
    assert ring.head_groups((1, 65536, 16, 128), (1, 65536, 16, 128)) == 4   # 128k over 2
    assert ring.head_groups((1, 32768, 16, 128), (1, 32768, 16, 128)) == 4   # 128k over 4
    assert ring.head_groups((1, 65536, 16, 128), (1, 65536, 8, 128)) == 4    # GQA: 64 / 24
    assert ring.head_groups((1, 65536, 16, 128), (1, 65536, 2, 128)) == 2    # GQA: 40 / 24
    assert ring.head_groups((1, 65536, 16, 128), (1, 65536, 1, 128)) == 1    # MQA: one group
    assert ring.head_groups((1, 65536, 12, 128), (1, 65536, 6, 128)) == 3    # 48 / 18 -> 3
    assert ring.head_groups((1, 16384, 16, 128), (1, 16384, 16, 128)) == 2   # rows: at most 2
    assert ring.head_groups((2, 8192, 8, 64), (2, 8192, 8, 64)) == 1         # small: one ring


@pytest.mark.parametrize("head_groups, error, message", [
    (2, ValueError, "head_groups=2 must be a positive divisor of the 3 key/value heads"),
    (0, ValueError, "head_groups=0 must be a positive divisor"),
    (True, TypeError, "head_groups must be 'auto' or a positive int, got True"),
    ("all", TypeError, "head_groups must be 'auto' or a positive int, got 'all'"),
    (1.0, TypeError, "head_groups must be 'auto' or a positive int, got 1.0")])
def test_bad_head_groups(head_groups, error, message):
    args = random_inputs(37, 1, 32, 32, 6, 3, 16, jnp.float32)[:3]
    with pytest.raises(error, match=re.escape(message)):
        ring.simulate(*args, 2, head_groups=head_groups)
    with pytest.raises(error, match=re.escape(message)):
        _in_ring(functools.partial(jax_dash.ring_attention, axis_name="seq",
                                   head_groups=head_groups), *(x.shape for x in args),
                 mesh_size=2)


def test_head_groups_keyword_gives_the_bits_of_one_ring():
    """ring_attention(head_groups=3) (one kv head and its two query heads a group) in shard_map."""
    args = random_inputs(38, 1, 64, 64, 6, 3, 16, jnp.float32)
    mesh = _mesh((2,), ("seq",))
    results = []
    for groups in (1, 3):
        fn = functools.partial(jax_dash.ring_attention, axis_name="seq", is_causal=True,
                               head_groups=groups)
        program = jax.jit(shard_map(lambda q, k, v, d, fn=fn: (lambda o, f: (o, *f(d)))(
            *jax.vjp(fn, q, k, v)), mesh, (P(None, "seq"),) * 4, (P(None, "seq"),) * 4))
        assert (program.lower(*args).as_text().count("stablehlo.while") > 0) == (groups > 1)
        results.append(_f32_bits(program(*args)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("ring_size", [2, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_transfers_travel_in_packets_and_go_home_in_the_inputs_dtype(layout, ring_size):
    """Over more than two devices each hop is one collective permute: K and V in one packet, the
    float32 dK and dV sums in one (XLA's GPU scheduler overlaps one collective permute at a time
    with the kernels: a second one ran on the compute stream before the step's kernel, exposed);
    over two, they go apart (the packet's copy would raise the backward's peak memory). The
    backward's last dK/dV hop moves the inputs' dtype, not float32. P = 4: the forward's 3
    hops, the backward's 3 K/V hops and 3 dK/dV hops, then dK/dV home; P = 2: every array
    apart (2 + 2 + 2 + 2)."""
    shape = jax.ShapeDtypeStruct((1, ring_size * 64, 2, 32), jnp.bfloat16)
    fn = _ring_vjp((ring_size,), ("seq",), P(None, "seq"), "seq", True, layout)
    text = fn.lower(shape, shape, shape, shape).as_text()
    permutes = re.findall(r'"stablehlo.collective_permute"\(%[^)]*\)[^\n]*\(tensor<([^>]*)>\)',
                          text)
    hops = ring_size - 1
    pair = 2 * 64 * 2 * 32  # one device's K and V (or dK and dV), flat
    if ring_size > 2:
        assert len(permutes) == 3 * hops + 1, permutes
        assert permutes.count(f"{pair}xbf16") == 2 * hops + 1  # K/V packets, dK/dV home
        assert permutes.count(f"{pair}xf32") == hops  # the float32 sums' in-ring hops
        assert permutes[-1] == f"{pair}xbf16"
    else:
        assert len(permutes) == 8 and all(t.count("x") == 4 for t in permutes), permutes
        assert all(t.endswith("bf16") for t in permutes[-2:]), permutes


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("num_heads, num_kv_heads, groups", [(4, 4, 2), (4, 2, 2), (6, 6, 3),
                                                             (6, 3, 3)])  # MHA, GQA
def test_pipelined_head_groups_give_the_bits_of_one_ring(monkeypatch, layout, num_heads,
                                                         num_kv_heads, groups):
    """Over more than two devices each group's dK/dV hop home rides in the next group's first
    K/V packet (the last group's after the loop): the output and every gradient are still the
    bits of one ring, and the program has one packet more than one ring's (group 0 sends a zero
    pair)."""
    ring_size = 4
    args = random_inputs(39, 1, 64, 64, num_heads, num_kv_heads, 16, jnp.float32)

    def run():
        fn = _ring_vjp.__wrapped__((ring_size,), ("seq",), P(None, "seq"), "seq", True, layout)
        return _run_ring(fn, args, layout, ring_size)

    def permutes():  # the moved types of the bf16 program
        shapes = [jax.ShapeDtypeStruct(x.shape, jnp.bfloat16) for x in args]
        fn = _ring_vjp.__wrapped__((ring_size,), ("seq",), P(None, "seq"), "seq", True, layout)
        return re.findall(r'"stablehlo.collective_permute"\(%[^)]*\)[^\n]*\(tensor<([^>]*)>\)',
                          fn.lower(*shapes).as_text())

    one = _with_head_groups(monkeypatch, 1, run)
    grouped = _with_head_groups(monkeypatch, groups, run)
    for name, a, b in zip(("out", "dq", "dk", "dv"), _f32_bits(grouped), _f32_bits(one)):
        np.testing.assert_array_equal(a, b, err_msg=name)
    hops = ring_size - 1
    kv_packet = 2 * (64 // ring_size) * (num_kv_heads // groups) * 16  # a group's K and V
    one, grouped = (_with_head_groups(monkeypatch, g, permutes) for g in (1, groups))
    assert len(one) == 3 * hops + 1
    # The loop body holds one group's program, its first K/V packet carrying the previous
    # group's dK/dV home (twice a K/V packet); the last group's home hop follows the loop.
    assert len(grouped) == 3 * hops + 1, grouped
    assert grouped.count(f"{2 * kv_packet}xbf16") == 1, grouped
    assert grouped.count(f"{kv_packet}xbf16") == 2 * hops, grouped
    assert grouped.count(f"{kv_packet}xf32") == hops, grouped  # the sums' in-ring hops


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_head_groups_shrink_the_temporaries(monkeypatch, layout):
    """The CPU compiler's buffer assignment of the causal ring (float32; the bf16 inputs would be
    converted whole for the CPU kernels): with 8 groups one group's float32 state is alive at a
    time (measured 0.25x-0.35x of the temporaries of one ring at this size, P = 2)."""
    block = (1, 4096, 8, 64)  # per device

    def compiled():
        shape = jax.ShapeDtypeStruct((1, block[1] * 2) + block[2:], jnp.float32)
        fn = _ring_vjp.__wrapped__((2,), ("seq",), P(None, "seq"), "seq", True, layout)
        return fn.lower(shape, shape, shape, shape).compile().memory_analysis()

    one, grouped = (_with_head_groups(monkeypatch, g, compiled) for g in (1, 8))
    assert grouped.temp_size_in_bytes <= 0.4 * one.temp_size_in_bytes, (
        grouped.temp_size_in_bytes, one.temp_size_in_bytes)


# ---- zigzag placement and the load-balance model ----------------------------------------------

def test_zigzag_places_chunks_i_and_2p_minus_1_minus_i():
    tokens = jnp.arange(16)[None]  # [1, 16]: 2 * 4 chunks of 2
    placed = ring.zigzag(tokens, 4)
    np.testing.assert_array_equal(placed[0], [0, 1, 14, 15, 2, 3, 12, 13,
                                              4, 5, 10, 11, 6, 7, 8, 9])
    np.testing.assert_array_equal(ring.unzigzag(placed, 4), tokens)


def test_zigzag_on_another_axis_round_trips():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 24))  # [B, H, S] like lse
    placed = ring.zigzag(x, 3, seq_axis=-1)
    assert not np.array_equal(placed, x)
    np.testing.assert_array_equal(ring.unzigzag(placed, 3, seq_axis=2), x)


@pytest.mark.parametrize("ring_size", [2, 4, 8])
def test_zigzag_gives_every_device_the_same_visible_pairs(ring_size):
    """Counted from token positions: the (query, key) pairs a causal mask lets each device's
    queries see are the same on every device under zigzag, not under contiguous placement."""
    seq = 16 * ring_size
    positions = {"contiguous": np.arange(seq),
                 "zigzag": np.asarray(ring.zigzag(jnp.arange(seq)[None], ring_size)[0])}
    visible = {}
    for layout, placed in positions.items():
        per_device = placed.reshape(ring_size, -1)  # device i's tokens, as shard_map splits them
        visible[layout] = [int(np.sum(np.arange(seq)[None, :] <= tokens[:, None]))
                           for tokens in per_device]
    assert sum(visible["zigzag"]) == sum(visible["contiguous"]) == seq * (seq + 1) // 2
    assert len(set(visible["zigzag"])) == 1
    assert visible["contiguous"] == sorted(visible["contiguous"])
    assert visible["contiguous"][-1] > visible["zigzag"][0] > visible["contiguous"][0]


def test_block_work_balances_the_causal_ring():
    contiguous = ring.block_work(1024, 8, "contiguous")
    zigzag = ring.block_work(1024, 8, "zigzag")
    assert sum(contiguous) == sum(zigzag)  # the same total (a triangle at tile granularity)
    assert max(contiguous) / min(contiguous) == 15.0  # device 7: 7.5 blocks, device 0: 0.5
    assert max(zigzag) == min(zigzag)
    assert max(contiguous) / max(zigzag) == pytest.approx(15 / 8)


# ---- bad input --------------------------------------------------------------------------------

def _in_ring(fn, *shapes, spec=P(None, "seq"), mesh_size=4):
    """Traces fn inside shard_map over a 1-D mesh "seq" on zero inputs of the given shapes."""
    mesh = _mesh((mesh_size,), ("seq",))
    args = [jnp.zeros(s, jnp.float32) for s in shapes]
    return jax.jit(shard_map(fn, mesh, (spec,) * len(args), spec)).lower(*args)


QS, KS = (1, 32, 2, 16), (1, 32, 1, 16)


def test_missing_axis_name():
    with pytest.raises(TypeError, match="axis_name"):
        _in_ring(lambda q, k, v: jax_dash.ring_attention(q, k, v), QS, KS, KS)


@pytest.mark.parametrize("axis_name", [None, 3, (), ("seq", 1)])
def test_axis_name_of_the_wrong_type(axis_name):
    with pytest.raises(TypeError, match=re.escape(f"axis_name must name the mesh axis the "
                                                  f"sequence is sharded over (a str, or a tuple "
                                                  f"of str), got {axis_name!r}")):
        _in_ring(lambda q, k, v: jax_dash.ring_attention(q, k, v, axis_name=axis_name),
                 QS, KS, KS)


def test_unbound_axis_name_inside_shard_map():
    with pytest.raises(ValueError, match=re.escape("axis_name='sequence' is not bound here")):
        _in_ring(lambda q, k, v: jax_dash.ring_attention(q, k, v, axis_name="sequence"),
                 QS, KS, KS)


def test_unbound_axis_name_outside_shard_map():
    q, k, v = (jnp.zeros(s, jnp.float32) for s in (QS, KS, KS))
    with pytest.raises(ValueError, match="ring_attention must run inside shard_map"):
        jax_dash.ring_attention(q, k, v, axis_name="seq")


def test_causal_ring_with_blocks_of_different_lengths():
    with pytest.raises(ValueError, match=re.escape(
            "key has 16 tokens per device but query has 8: with is_causal=True the ring needs "
            "query and key blocks of the same length")):
        _in_ring(lambda q, k, v: jax_dash.ring_attention(q, k, v, axis_name="seq",
                                                         is_causal=True),
                 QS, (1, 64, 1, 16), (1, 64, 1, 16))


def test_zigzag_with_an_odd_block():
    shapes = ((1, 12, 2, 16), (1, 12, 1, 16), (1, 12, 1, 16))  # 3 tokens per device
    with pytest.raises(ValueError, match=re.escape(
            "layout='zigzag' puts two equal chunks on each device, so the per-device sequence "
            "must be even, got query with 3 tokens per device")):
        _in_ring(lambda q, k, v: jax_dash.ring_attention(q, k, v, axis_name="seq",
                                                         is_causal=True, layout="zigzag"),
                 *shapes)


def test_sequence_not_divisible_by_the_ring():
    # shard_map itself refuses a sequence that does not split evenly over the ring.
    with pytest.raises(ValueError, match="divisible"):
        _in_ring(lambda q, k, v: jax_dash.ring_attention(q, k, v, axis_name="seq"),
                 (1, 30, 2, 16), (1, 30, 1, 16), (1, 30, 1, 16))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(layout="striped"), ValueError, "layout='striped' is not one of contiguous, zigzag"),
    (dict(schedule="fast"), ValueError, "schedule='fast' is not one of"),
    (dict(is_causal=1), TypeError, "is_causal must be a Python bool, got 1"),
    (dict(scale="big"), TypeError, "scale must be a Python number"),
])
def test_bad_options(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        _in_ring(lambda q, k, v: jax_dash.ring_attention(q, k, v, axis_name="seq", **kwargs),
                 QS, KS, KS)


def test_query_and_key_that_disagree():
    # The blocks every device holds must fit together like the single op's inputs.
    with pytest.raises(ValueError, match=re.escape("query and key must have the same head_dim")):
        _in_ring(lambda q, k, v: jax_dash.ring_attention(q, k, v, axis_name="seq"),
                 QS, (1, 32, 1, 8), (1, 32, 1, 8))
    with pytest.raises(ValueError, match=re.escape("num_heads (2) must be a positive multiple "
                                                   "of num_kv_heads (3)")):
        _in_ring(lambda q, k, v: jax_dash.ring_attention(q, k, v, axis_name="seq"),
                 QS, (1, 32, 3, 16), (1, 32, 3, 16))


@pytest.mark.parametrize("fn", [ring.zigzag, ring.unzigzag])
def test_zigzag_helpers_reject_bad_input(fn):
    with pytest.raises(ValueError, match=re.escape(
            "x has 20 tokens on axis 1, not a multiple of 2 * axis_size = 8")):
        fn(jnp.zeros((1, 20, 2)), 4)
    with pytest.raises(ValueError, match=re.escape("axis_size must be a positive int")):
        fn(jnp.zeros((1, 16, 2)), 0)
    with pytest.raises(ValueError, match=re.escape("seq_axis=3 is not an axis of x")):
        fn(jnp.zeros((1, 16, 2)), 4, seq_axis=3)


# ---- jax.jit(jax_dash.attention) on sequence-sharded inputs: the partitioner's ring -----------

def _jit_grads(is_causal):
    def loss(q, k, v):
        return jnp.sum(jax_dash.attention(q, k, v, is_causal=is_causal) ** 2)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


@pytest.mark.parametrize("spec", [
    P(None, "seq"),                      # sequence only
    P("data", "seq"),                    # batch x sequence
    P(None, "seq", "data"),              # sequence x heads
    P(None, ("data", "seq")),            # one ring over both axes
])
def test_jit_of_sequence_sharded_inputs_runs_the_ring(spec):
    from jax.sharding import NamedSharding
    q, k, v, _ = random_inputs(10, 2, 64, 64, 4, 2, 16, jnp.float32)
    grads = _jit_grads(True)
    expected = grads(q, k, v)
    sharding = NamedSharding(_mesh((2, 4), ("data", "seq")), spec)
    args = [jax.device_put(x, sharding) for x in (q, k, v)]
    hlo = grads.lower(*args).compile().as_text()
    assert "collective-permute" in hlo
    assert "all-gather" not in hlo and "all-to-all" not in hlo
    loss, ours = grads(*args)
    np.testing.assert_allclose(loss, expected[0], rtol=1e-5)
    _assert_close([jnp.zeros(())] + list(ours), [jnp.zeros(())] + list(expected[1]))
    for g in ours:  # the gradients keep the inputs' sharding
        assert g.sharding.is_equivalent_to(sharding, g.ndim), (g.sharding, sharding)
    for a, b in zip(ours, grads(*args)[1]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_jit_without_an_even_ring_gathers_and_is_exact():
    # Causal with seq_q != seq_kv has no ring: the sequence is gathered, giving the single
    # device's bits.
    from jax.sharding import NamedSharding
    q, _, _, _ = random_inputs(11, 1, 64, 32, 2, 1, 16, jnp.float32)
    _, k, v, _ = random_inputs(12, 1, 32, 32, 2, 1, 16, jnp.float32)
    grads = _jit_grads(True)
    expected = grads(q, k, v)
    sharding = NamedSharding(_mesh((4,), ("seq",)), P(None, "seq"))
    args = [jax.device_put(x, sharding) for x in (q, k, v)]
    assert "collective-permute" not in grads.lower(*args).compile().as_text()
    for a, b in zip(grads(*args)[1], expected[1]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_batch_sharding_keeps_the_rings_bits():
    """A 2-D mesh (batch x sequence) gives the bits of the 1-D ring of the same size."""
    args = random_inputs(13, 4, 64, 64, 4, 2, 16, jnp.float32)
    one_d = _ring_vjp((4,), ("seq",), P(None, "seq"), "seq", True, "contiguous")(*args)
    two_d = _ring_vjp((2, 4), ("data", "seq"), P("data", "seq"), "seq", True, "contiguous")(*args)
    for a, b in zip(one_d, two_d):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # ... and a sequence's bits do not depend on the rest of the batch.
    alone = _ring_vjp((4,), ("seq",), P(None, "seq"), "seq", True, "contiguous")(
        *[x[1:2] for x in args])
    for a, b in zip(one_d, alone):
        np.testing.assert_array_equal(np.asarray(a)[1:2], np.asarray(b))


def test_jit_path_gives_the_bits_of_ring_attention_in_shard_map():
    from jax.sharding import NamedSharding
    args = random_inputs(14, 2, 64, 64, 4, 2, 16, jnp.float32)
    in_shard_map = _ring_vjp((4,), ("seq",), P(None, "seq"), "seq", True, "contiguous")(*args)
    sharding = NamedSharding(_mesh((4,), ("seq",)), P(None, "seq"))
    jitted = _single_vjp(True)(*[jax.device_put(x, sharding) for x in args])
    for a, b in zip(in_shard_map, jitted):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_docs_example_runs():
    """docs/ring.md's example, as written (it asserts bitwise repeats and the single op's grads)."""
    import pathlib
    text = (pathlib.Path(__file__).parents[1] / "docs" / "ring.md").read_text()
    example = text.split("## Example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "ring_attention" in example and "assert" in example
    exec(compile(example, "docs/ring.md", "exec"), {})


# ---- the ring simulated on one device ---------------------------------------------------------

@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_simulated_ring_gives_the_rings_bits(layout):
    """ring.simulate (vmap over a named axis on one device) runs the ring's own code: jitted, it
    gives the bits of the ring on 4 devices (the tests on one GPU rely on it)."""
    args = random_inputs(15, 2, 64, 64, 4, 2, 16, jnp.float32)
    placed = [ring.zigzag(x, 4) for x in args] if layout == "zigzag" else list(args)
    real = _ring_vjp((4,), ("seq",), P(None, "seq"), "seq", True, layout)(*placed)

    def simulated(q, k, v, dout):
        fn = functools.partial(ring.simulate, ring_size=4, is_causal=True, layout=layout)
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(dout))

    for a, b in zip(real, jax.jit(simulated)(*placed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_simulate_rejects_bad_input():
    x = jnp.zeros((1, 30, 2, 16))
    with pytest.raises(ValueError, match=re.escape(
            "query must be [batch, seq, heads, head_dim] with seq a multiple of ring_size=4, got "
            "shape (1, 30, 2, 16)")):
        ring.simulate(x, x, x, 4)
    with pytest.raises(ValueError, match=re.escape("ring_size must be a positive int, got 0")):
        ring.simulate(x, x, x, 0)


def test_bench_ring_dry_run(tmp_path):
    """benchmarks/bench_ring.py --dry-run: the two-GPU script's whole path on 4 CPU devices."""
    import json
    import os
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    out = tmp_path / "ring.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_ring.py"), "--dry-run",
                           "--layouts", "zigzag", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert [(r["ring_size"], r["layout"]) for r in report["ring"]] == [(2, "zigzag"),
                                                                        (4, "zigzag")]
    for result in report["ring"]:
        assert result["error"] is None and result["head_groups"] == 1  # tiny: one group
        assert result["repeats_not_bitwise"] == 0 and result["matches_one_device"]
        assert set(result["relative_rms_diff"]) == {"out", "dq", "dk", "dv"}
        assert result["compute_only_seconds"] > 0 and result["transfers_only_seconds"] > 0
        assert 0 <= result["hidden_fraction"] <= 1
    (single,) = report["single"]
    assert single["error"] is None and single["seconds"] > 0
    # Correctness: causal/full x MHA/GQA x (ring contiguous, ring zigzag, the jit path), and
    # the zigzag ring in two head groups where the kv heads split (MHA), all passing; the jit
    # path ran a ring (permutes, no all-gather) with ring_attention's bits; the groups gave the
    # bits of one ring.
    checks = report["correctness"]
    assert len(checks) == 14 and all(r["passed"] and r["error"] is None for r in checks), checks
    grouped = [r for r in checks if r["path"].endswith("head groups")]
    assert len(grouped) == 2 and all(r["bits_of_one_group"] and r["kv_heads"] == 4
                                     for r in grouped)
    jit_rows = [r for r in checks if r["path"].startswith("jit")]
    assert len(jit_rows) == 4 and all(r["bits_of_ring_attention"] and r["collective_permutes"] > 0
                                      and r["all_gathers"] == 0 for r in jit_rows)
    assert {(r["mask"], r["kv_heads"]) for r in checks} == {("causal", 4), ("causal", 1),
                                                            ("full", 4), ("full", 1)}
    assert "zigzag" in proc.stdout
