"""Structured masks on the CPU kernels (issue 13): local windows, sequence lengths, segment ids
(packed sequences) and the logits soft cap, alone and combined with each other and with is_causal,
against the reference that builds the dense mask (jax_dash/reference.py); fully masked queries;
every schedule bitwise over repetitions; jit, vmap, shard_map and GSPMD; bad arguments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_dash
from helpers import (assert_close_to_reference, attention_and_grads, random_inputs,
                     references)

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU kernels: conftest.py

ATOL = {jnp.float32: 5e-5, jnp.float16: 1e-3, jnp.bfloat16: 1e-3}
DETERMINISTIC = ("ascending", "descending", "shift", "symmetric_shift", "mirror")

# head_dim 256 has the smallest tiles (forward 128 x 64, backward 64 x 64), so short sequences
# span several tiles and windows cut whole tiles; head_dim 64 has 128 x 128 tiles.
# (batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim)
SHAPES = {
    "square_gqa2": (2, 203, 203, 4, 2, 256),
    "q_longer_mqa": (2, 261, 150, 2, 1, 256),
    "kv_longer": (2, 90, 333, 2, 2, 64),
}


def _segments(seed, batch, seq, num_docs):
    """Sorted random document ids per row (packed sequences), int32 [batch, seq]."""
    rng = np.random.RandomState(seed)
    return jnp.asarray(np.sort(rng.randint(0, num_docs, (batch, seq)), axis=1), jnp.int32)


def _mask_args(case, batch, seq_q, seq_kv):
    """The structured-mask keyword arguments of one named case."""
    q_lengths = jnp.asarray([seq_q - 37, 1][:batch] + [seq_q] * (batch - 2), jnp.int32)
    kv_lengths = jnp.asarray([seq_kv - 5, seq_kv // 2 + 1][:batch] + [seq_kv] * (batch - 2),
                             jnp.int32)
    segments = dict(query_segment_ids=_segments(1, batch, seq_q, 4),
                    key_value_segment_ids=_segments(2, batch, seq_kv, 4))
    cases = {
        "causal": dict(is_causal=True),
        "window_int": dict(local_window_size=50),
        "window_left_right": dict(local_window_size=(70, 9)),
        "window_causal": dict(is_causal=True, local_window_size=(64, 200)),
        "q_lengths": dict(query_seq_lengths=q_lengths),
        "kv_lengths": dict(key_value_seq_lengths=kv_lengths),
        "both_lengths_causal": dict(is_causal=True, query_seq_lengths=q_lengths,
                                    key_value_seq_lengths=kv_lengths),
        "segments": segments,
        "soft_cap": dict(logits_soft_cap=1.5),
        "all": dict(is_causal=True, local_window_size=(80, 3), query_seq_lengths=q_lengths,
                    key_value_seq_lengths=kv_lengths, logits_soft_cap=2.0, **segments),
    }
    return cases[case]


CASES = ("causal", "window_int", "window_left_right", "window_causal", "q_lengths",
         "kv_lengths", "both_lengths_causal", "segments", "soft_cap", "all")


def _check_against_reference(shape, mask, dtype, schedule="auto", scale=None):
    q, k, v, dout = random_inputs(0, *shape, dtype)
    fn = lambda q, k, v: jax_dash.attention(q, k, v, scale=scale, schedule=schedule,  # noqa
                                            **mask)
    ours = attention_and_grads(fn, q, k, v, dout)
    ref, naive = references(q, k, v, dout, scale=scale, **mask)
    for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
        assert o.dtype == jnp.dtype(dtype) and o.shape == r.shape, name
        assert_close_to_reference(name, o, r, n, ATOL[dtype])
    return ours


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("shape_name", SHAPES)
def test_each_mask_and_all_combined_match_reference(shape_name, case):
    shape = SHAPES[shape_name]
    _check_against_reference(shape, _mask_args(case, shape[0], shape[1], shape[2]), jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("case", ["window_causal", "segments", "all"])
def test_low_precision_relative_to_naive(case, dtype):
    shape = SHAPES["square_gqa2"]
    _check_against_reference(shape, _mask_args(case, shape[0], shape[1], shape[2]), dtype)


@pytest.mark.parametrize("schedule", DETERMINISTIC + ("atomic",))
def test_every_schedule_matches_reference_on_a_band(schedule):
    """Windows cut whole tiles (a band): every schedule runs there (shift and symmetric_shift on
    their fallback) and gives the reference's function."""
    shape = (1, 300, 300, 2, 1, 256)
    _check_against_reference(shape, dict(is_causal=True, local_window_size=70), jnp.float32,
                             schedule=schedule)
    _check_against_reference(shape, dict(local_window_size=(40, 90)), jnp.float32,
                             schedule=schedule)


def test_agrees_with_jax_nn_on_windows_and_lengths():
    """The arguments jax.nn.dot_product_attention shares mean the same there (float32, XLA's
    implementation). Every query keeps at least one key: XLA averages the values of a row that
    sees none instead of giving 0, so such rows are left out here."""
    q, k, v, dout = random_inputs(3, 2, 150, 150, 4, 2, 64, jnp.float32)
    for kwargs in (dict(local_window_size=(20, 5)), dict(local_window_size=13, is_causal=True),
                   dict(query_seq_lengths=jnp.asarray([150, 77], jnp.int32),
                        key_value_seq_lengths=jnp.asarray([99, 150], jnp.int32))):
        ours = attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, **kwargs),
                                   q, k, v, dout)
        theirs = attention_and_grads(lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, implementation="xla", **kwargs), q, k, v, dout)
        for name, a, b in zip(("out", "dq", "dk", "dv"), ours, theirs):
            np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5, err_msg=f"{kwargs} {name}")


def test_fully_masked_queries_output_zero_and_get_zero_gradient():
    """Rows that see no key: past query_seq_lengths, in a row with key_value_seq_lengths 0, in a
    segment no key has, and before the window reaches any key (seq_q > seq_kv + left)."""
    batch, seq_q, seq_kv, heads, head_dim = 3, 150, 70, 2, 256
    q, k, v, dout = random_inputs(4, batch, seq_q, seq_kv, heads, 1, head_dim, jnp.float32)
    q_segments = np.zeros((batch, seq_q), np.int32)
    q_segments[2, 100:] = 7  # segment 7 has no key
    mask = dict(query_seq_lengths=jnp.asarray([120, 150, 150], jnp.int32),
                key_value_seq_lengths=jnp.asarray([70, 0, 70], jnp.int32),
                query_segment_ids=jnp.asarray(q_segments),
                key_value_segment_ids=jnp.zeros((batch, seq_kv), jnp.int32),
                local_window_size=(40, 0))
    out, dq, dk, dv = [np.asarray(x) for x in attention_and_grads(
        lambda q, k, v: jax_dash.attention(q, k, v, **mask), q, k, v, dout)]
    for x in (out, dq, dk, dv):
        assert np.isfinite(x).all()
    blind = np.zeros((batch, seq_q), bool)
    blind[0, 120:] = True          # past the query length
    blind[1, :] = True             # no keys at all
    blind[2, 100:] = True          # segment without keys
    blind[:, seq_kv + 40:] = True  # the window (40 back, 0 ahead) has left every key
    assert blind.any(axis=1).all() and not blind.all(axis=1)[[0, 2]].any()
    assert not out[blind].any() and not dq[blind].any()
    assert np.abs(out[~blind]).max() > 0 and np.abs(dq[~blind]).max() > 0
    assert not dk[1].any() and not dv[1].any()  # row 1 has no visible key
    _check_against_reference((batch, seq_q, seq_kv, heads, 1, head_dim), mask, jnp.float32)


@pytest.mark.parametrize("schedule", DETERMINISTIC + ("auto",))
def test_every_schedule_bitwise_over_repetitions(schedule):
    shape = (2, 203, 203, 4, 2, 256)
    mask = _mask_args("all", 2, 203, 203)
    q, k, v, dout = random_inputs(5, *shape, jnp.bfloat16)
    grad_fn = jax.jit(jax.vjp(lambda q, k, v: jax_dash.attention(
        q, k, v, schedule=schedule, **mask), q, k, v)[1])
    first = [np.asarray(g) for g in grad_fn(dout)]
    for _ in range(4):
        for a, b in zip(first, grad_fn(dout)):
            np.testing.assert_array_equal(a, np.asarray(b))


def test_batch_invariance_with_data_masks():
    """A row's bits do not depend on the other rows' lengths and segments."""
    shape = (3, 203, 203, 2, 1, 256)
    q, k, v, dout = random_inputs(6, *shape, jnp.float32)
    mask = dict(local_window_size=(60, 0), is_causal=True,
                query_seq_lengths=jnp.asarray([200, 150, 203], jnp.int32),
                key_value_seq_lengths=jnp.asarray([190, 203, 100], jnp.int32),
                query_segment_ids=_segments(7, 3, 203, 3),
                key_value_segment_ids=_segments(7, 3, 203, 3))
    fn = lambda q, k, v, m: jax_dash.attention(q, k, v, **m)  # noqa: E731
    whole = attention_and_grads(lambda q, k, v: fn(q, k, v, mask), q, k, v, dout)
    for b in (0, 2):
        row = {name: (value[b:b + 1] if hasattr(value, "shape") else value)
               for name, value in mask.items()}
        alone = attention_and_grads(lambda q, k, v: fn(q, k, v, row), q[b:b + 1], k[b:b + 1],
                                    v[b:b + 1], dout[b:b + 1])
        for a, x in zip(whole, alone):
            np.testing.assert_array_equal(np.asarray(a[b]), np.asarray(x[0]))


def test_unbatched_inputs_take_unbatched_masks():
    shape = (1, 100, 120, 2, 2, 64)
    q, k, v, dout = random_inputs(8, *shape, jnp.float32)
    seg_q, seg_kv = _segments(9, 1, 100, 2), _segments(10, 1, 120, 2)
    batched = attention_and_grads(lambda q, k, v: jax_dash.attention(
        q, k, v, query_seq_lengths=jnp.asarray([90]), key_value_seq_lengths=jnp.asarray([101]),
        query_segment_ids=seg_q, key_value_segment_ids=seg_kv), q, k, v, dout)
    unbatched = attention_and_grads(lambda q, k, v: jax_dash.attention(
        q, k, v, query_seq_lengths=90, key_value_seq_lengths=jnp.asarray(101),
        query_segment_ids=seg_q[0], key_value_segment_ids=seg_kv[0]),
        q[0], k[0], v[0], dout[0])
    for a, b in zip(batched, unbatched):
        np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b))


# ---- transformations ---------------------------------------------------------------------------

def _transform_inputs():
    q, k, v, dout = random_inputs(11, 8, 96, 96, 4, 2, 256, jnp.float32)
    mask = dict(query_seq_lengths=jnp.asarray([96, 50, 1, 96, 80, 33, 96, 95], jnp.int32),
                key_value_seq_lengths=jnp.asarray([96, 96, 40, 0, 96, 70, 12, 95], jnp.int32),
                query_segment_ids=_segments(12, 8, 96, 3),
                key_value_segment_ids=_segments(12, 8, 96, 3))
    return q, k, v, dout, mask


def _grads(q, k, v, dout, q_len, kv_len, q_seg, kv_seg):
    fn = lambda q, k, v: jax_dash.attention(  # noqa: E731
        q, k, v, is_causal=True, local_window_size=(40, 0), logits_soft_cap=3.0,
        query_seq_lengths=q_len, key_value_seq_lengths=kv_len, query_segment_ids=q_seg,
        key_value_segment_ids=kv_seg)
    return attention_and_grads(fn, q, k, v, dout)


def _mask_operands(mask):
    return (mask["query_seq_lengths"], mask["key_value_seq_lengths"],
            mask["query_segment_ids"], mask["key_value_segment_ids"])


def test_jit_traces_lengths_and_segment_ids():
    q, k, v, dout, mask = _transform_inputs()
    eager = _grads(q, k, v, dout, *_mask_operands(mask))
    jitted = jax.jit(_grads)
    for a, b in zip(eager, jitted(q, k, v, dout, *_mask_operands(mask))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Other lengths, same compiled function: the lengths are data, not constants.
    other = dict(mask, query_seq_lengths=mask["query_seq_lengths"] // 2)
    again = jitted(q, k, v, dout, *_mask_operands(other))
    for a, b in zip(_grads(q, k, v, dout, *_mask_operands(other)), again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_vmap_batches_the_mask_operands():
    """vmap over a leading axis of 2, with per-example lengths and segment ids (the op folds the
    mapped axis into the batch): equal to the loop."""
    q, k, v, dout, mask = _transform_inputs()
    split = lambda x: x.reshape((2, x.shape[0] // 2) + x.shape[1:])  # noqa: E731
    operands = [split(x) for x in (q, k, v, dout, *_mask_operands(mask))]
    vmapped = jax.vmap(_grads)(*operands)
    for i in range(2):
        looped = _grads(*[x[i] for x in operands])
        for a, b in zip(vmapped, looped):
            np.testing.assert_array_equal(np.asarray(a[i]), np.asarray(b))
    # Unmapped mask operands are broadcast.
    shared = jax.vmap(_grads, in_axes=(0, 0, 0, 0, None, None, None, None))(
        *operands[:4], *[x[0] for x in operands[4:]])
    looped = _grads(*[x[1] for x in operands[:4]], *[x[0] for x in operands[4:]])
    for a, b in zip(shared, looped):
        np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b))


def _mesh():
    return Mesh(np.array(jax.devices("cpu")[:8]).reshape(4, 2), ("data", "model"))


def test_shard_map_and_gspmd_shard_the_mask_with_the_batch():
    try:
        from jax import shard_map as _shard_map
    except ImportError:  # jax < 0.7
        from jax.experimental.shard_map import shard_map as _shard_map
    q, k, v, dout, mask = _transform_inputs()
    operands = _mask_operands(mask)
    expected = [np.asarray(x) for x in _grads(q, k, v, dout, *operands)]

    seq_spec, len_spec, seg_spec = P("data", None, "model"), P("data"), P("data", None)
    specs = (seq_spec,) * 4 + (len_spec, len_spec, seg_spec, seg_spec)
    mapped = jax.jit(_shard_map(_grads, mesh=_mesh(), in_specs=specs,
                                out_specs=(seq_spec,) * 4))
    for a, b in zip(expected, mapped(q, k, v, dout, *operands)):
        np.testing.assert_array_equal(a, np.asarray(b))

    placed = [jax.device_put(x, NamedSharding(_mesh(), s))
              for x, s in zip((q, k, v, dout, *operands), specs)]
    gspmd = jax.jit(_grads)
    results = gspmd(*placed)
    for a, b in zip(expected, results):
        np.testing.assert_array_equal(a, np.asarray(b))
    hlo = gspmd.lower(*placed).compile().as_text()
    assert not any(c in hlo for c in ("all-gather", "all-to-all", "collective-permute")), \
        "batch-sharded masks must not communicate"


# ---- bad arguments -----------------------------------------------------------------------------

def _small():
    q, k, v, _ = random_inputs(13, 2, 16, 24, 2, 2, 32, jnp.float32)
    return q, k, v


@pytest.mark.parametrize("name", ["bias", "mask"])
def test_dense_bias_and_mask_are_refused_with_directions(name):
    q, k, v = _small()
    dense = jnp.zeros((2, 2, 16, 24), jnp.bool_ if name == "mask" else jnp.float32)
    with pytest.raises(ValueError, match=rf"^{name} is not supported .*shape \(2, 2, 16, 24\).*"
                                         "local_window_size.*query_segment_ids"):
        jax_dash.attention(q, k, v, **{name: dense})
    with pytest.raises(ValueError, match=f"^{name} is not supported"):  # positional, as jax.nn
        jax_dash.attention(q, k, v, *((dense,) if name == "bias" else (None, dense)))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(local_window_size=-1), ValueError, r"local_window_size=\(-1, -1\) must not be negative"),
    (dict(local_window_size=(3, -2)), ValueError, r"local_window_size=\(3, -2\) must not be"),
    (dict(local_window_size=2.5), TypeError, r"local_window_size must be None, an int >= 0.*2\.5"),
    (dict(local_window_size=True), TypeError, r"local_window_size must be .*got True"),
    (dict(local_window_size=(1, 2, 3)), TypeError, r"local_window_size must be .*\(1, 2, 3\)"),
    (dict(local_window_size=jnp.asarray(4)), TypeError, "local_window_size must be"),
    (dict(local_window_size=2 ** 41), ValueError, "local_window_size=.* is too large"),
    (dict(logits_soft_cap=0.0), ValueError, r"logits_soft_cap=0\.0 must be a finite number > 0"),
    (dict(logits_soft_cap=-3), ValueError, "logits_soft_cap=-3 must be a finite number > 0"),
    (dict(logits_soft_cap=float("inf")), ValueError, "logits_soft_cap=inf must be a finite"),
    (dict(logits_soft_cap=1e39), ValueError, "logits_soft_cap=1e.39 must be a finite"),
    (dict(logits_soft_cap=True), TypeError, "logits_soft_cap must be None or a Python number"),
    (dict(logits_soft_cap=jnp.asarray(2.0)), TypeError, "logits_soft_cap must be None or a"),
    (dict(query_seq_lengths=jnp.asarray([1.0, 2.0])), TypeError,
     "query_seq_lengths must have an integer dtype .*got float32"),
    (dict(key_value_seq_lengths=jnp.asarray([3])), ValueError,
     r"key_value_seq_lengths has shape \(1,\); expected \[batch\] = \[2\]"),
    (dict(query_seq_lengths=jnp.asarray([[3, 3]])), ValueError,
     r"query_seq_lengths has shape \(1, 2\); expected \[batch\] = \[2\]"),
    (dict(key_value_seq_lengths=object()), TypeError,
     "key_value_seq_lengths must be an array, got object"),
    (dict(query_segment_ids=jnp.zeros((2, 16), jnp.int32)), ValueError,
     "query_segment_ids was given without key_value_segment_ids: pass both or neither"),
    (dict(key_value_segment_ids=jnp.zeros((2, 24), jnp.int32)), ValueError,
     "key_value_segment_ids was given without query_segment_ids"),
    (dict(query_segment_ids=jnp.zeros((2, 24), jnp.int32),
          key_value_segment_ids=jnp.zeros((2, 24), jnp.int32)), ValueError,
     r"query_segment_ids has shape \(2, 24\); expected \[batch, seq\] = \[2, 16\]"),
    (dict(query_segment_ids=jnp.zeros((2, 16), jnp.int32),
          key_value_segment_ids=jnp.zeros((2, 24), jnp.float32)), TypeError,
     "key_value_segment_ids must have an integer dtype"),
    (dict(query_segment_ids=jnp.zeros((2, 16), jnp.bool_),
          key_value_segment_ids=jnp.zeros((2, 24), jnp.int32)), TypeError,
     "query_segment_ids must have an integer dtype .*got bool"),
])
def test_bad_mask_arguments(kwargs, error, message):
    q, k, v = _small()
    with pytest.raises(error, match=message):
        jax_dash.attention(q, k, v, **kwargs)


def test_lengths_out_of_range_keep_their_meaning():
    """Lengths are data (they cannot be checked under jit): a negative length keeps nothing and a
    length past the sequence keeps everything, as the predicate i < length says."""
    q, k, v = _small()
    out = jax_dash.attention(q, k, v, query_seq_lengths=jnp.asarray([-5, 1000]))
    full = jax_dash.attention(q, k, v)
    assert not np.asarray(out[0]).any()
    np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(full[1]))


def test_hidden_pairs_keep_the_ticket_order():
    """Pairs the data hides (lengths, segments) give up their ticket without adding: the real
    adds keep the band's order, so ascending and descending (same tickets) still give the same dQ
    bits, and dK/dV (summed in visit order) still differ in order only, not in value."""
    shape = (2, 300, 300, 2, 2, 256)
    q, k, v, dout = random_inputs(14, *shape, jnp.float32)
    mask = dict(is_causal=True, local_window_size=(150, 0),
                query_seq_lengths=jnp.asarray([290, 170], jnp.int32),
                key_value_seq_lengths=jnp.asarray([250, 300], jnp.int32),
                query_segment_ids=_segments(15, 2, 300, 3),
                key_value_segment_ids=_segments(15, 2, 300, 3))
    grads = {s: [np.asarray(x) for x in attention_and_grads(
        lambda q, k, v: jax_dash.attention(q, k, v, schedule=s, **mask), q, k, v, dout)]
        for s in ("ascending", "descending")}
    np.testing.assert_array_equal(grads["ascending"][1], grads["descending"][1])
    np.testing.assert_allclose(grads["ascending"][2], grads["descending"][2], rtol=1e-5,
                               atol=1e-6)


def test_auto_takes_mirror_for_causal_packed_rows():
    """Given segment ids, a causal call runs mirror even where a causal mask would get
    symmetric_shift (schedules.choose_schedule): the same bits as naming mirror."""
    shape = (1, 1024, 1024, 2, 2, 32)
    q, k, v, dout = random_inputs(21, *shape, jnp.float32)
    ids = _segments(22, 1, 1024, 2)
    mask = dict(is_causal=True, query_segment_ids=ids, key_value_segment_ids=ids)
    grads = {s: [np.asarray(x) for x in attention_and_grads(
        lambda q, k, v: jax_dash.attention(q, k, v, schedule=s, **mask), q, k, v, dout)]
        for s in ("auto", "mirror", "descending", "symmetric_shift")}
    for a, b in zip(grads["auto"], grads["mirror"]):
        np.testing.assert_array_equal(a, b)
    # The others add dQ in other orders here, so the check above can tell them apart.
    for other in ("descending", "symmetric_shift"):
        assert not np.array_equal(grads[other][1], grads["mirror"][1]), other


def test_hidden_tiles_are_skipped_not_computed():
    """Tiles no query can see cost nothing: a 256-key window (about a third of causal's tile
    pairs at seq 2048) and a 256-query length (3 of 136 pairs) run in a fraction of the causal
    call's time. Best of three runs; generous bounds against a noisy machine."""
    import time

    q, k, v, dout = random_inputs(16, 1, 2048, 2048, 1, 1, 64, jnp.float32)

    def best_time(**mask):
        grad = jax.jit(lambda q, k, v, d: jax.vjp(lambda q, k, v: jax_dash.attention(
            q, k, v, is_causal=True, **mask), q, k, v)[1](d))
        jax.block_until_ready(grad(q, k, v, dout))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            jax.block_until_ready(grad(q, k, v, dout))
            times.append(time.perf_counter() - start)
        return min(times)

    causal = best_time()
    window = best_time(local_window_size=(255, 0))
    short = best_time(query_seq_lengths=jnp.asarray([256], jnp.int32))
    assert window < 0.6 * causal, (window, causal)
    assert short < 0.3 * causal, (short, causal)
