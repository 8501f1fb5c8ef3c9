"""jax_dash.attention on the CPU kernels: accuracy, shapes, determinism, batch invariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from helpers import (assert_close_to_reference, attention_and_grads, random_inputs,
                     references)

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU kernels (float32, any head_dim): conftest.py

ATOL = {jnp.float32: 5e-5, jnp.float16: 1e-3, jnp.bfloat16: 1e-3}
DETERMINISTIC = ("ascending", "descending", "shift", "symmetric_shift", "mirror")

# (batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim)
SHAPES = [
    (2, 1, 1, 2, 2, 64),        # one token
    (1, 97, 97, 2, 1, 64),      # partial tiles, MQA
    (2, 129, 129, 4, 2, 32),    # one row past a tile, GQA 2
    (1, 1000, 1000, 2, 2, 64),  # long, many tiles
    (1, 200, 77, 8, 1, 16),     # seq_q > seq_kv, GQA 8
    (1, 77, 200, 2, 2, 128),    # seq_q < seq_kv
    (1, 130, 130, 2, 2, 256),   # largest head_dim
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(shape, is_causal, dtype):
    q, k, v, dout = random_inputs(0, *shape, dtype)
    ours = attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=is_causal),
                               q, k, v, dout)
    ref, naive = references(q, k, v, dout, is_causal=is_causal)
    for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
        assert o.dtype == jnp.dtype(dtype), f"{name} dtype {o.dtype}"
        assert_close_to_reference(name, o, r, n, ATOL[dtype])


@pytest.mark.parametrize("is_causal", [False, True])
def test_agrees_with_jax_nn_xla_in_float32(is_causal):
    q, k, v, dout = random_inputs(1, 2, 150, 150, 4, 2, 64, jnp.float32)
    ours = attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=is_causal),
                               q, k, v, dout)
    theirs = attention_and_grads(
        lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=is_causal,
                                                     implementation="xla"), q, k, v, dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, theirs):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5, err_msg=name)


def test_custom_scale():
    q, k, v, dout = random_inputs(2, 1, 64, 80, 2, 2, 32, jnp.float32)
    ours = attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, scale=0.3), q, k, v,
                               dout)
    ref, naive = references(q, k, v, dout, scale=0.3)
    for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
        assert_close_to_reference(name, o, r, n, ATOL[jnp.float32])


def test_unbatched_inputs_match_batched():
    q, k, v, dout = random_inputs(3, 1, 70, 70, 4, 2, 32, jnp.bfloat16)
    batched = attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True),
                                  q, k, v, dout)
    unbatched = attention_and_grads(
        lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True), q[0], k[0], v[0], dout[0])
    for a, b in zip(batched, unbatched):
        assert b.shape == a.shape[1:]
        np.testing.assert_array_equal(a[0], b)


@pytest.mark.parametrize("schedule", DETERMINISTIC + ("atomic",))
def test_gradients_bitwise_identical_over_20_runs(schedule):
    q, k, v, dout = random_inputs(4, 2, 300, 300, 4, 2, 64, jnp.bfloat16)
    grad_fn = jax.jit(jax.vjp(lambda q, k, v: jax_dash.attention(
        q, k, v, is_causal=True, schedule=schedule), q, k, v)[1])
    first = [np.asarray(g) for g in grad_fn(dout)]
    for _ in range(19):
        again = grad_fn(dout)
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, np.asarray(b))


def test_bits_do_not_depend_on_cpu_thread_count(monkeypatch):
    q, k, v, dout = random_inputs(5, 2, 257, 257, 4, 1, 64, jnp.float32)
    fn = lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True)  # noqa: E731
    results = []
    for threads in ("1", "2", "7"):
        monkeypatch.setenv("JAX_DASH_CPU_THREADS", threads)
        results.append([np.asarray(x) for x in attention_and_grads(fn, q, k, v, dout)])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("is_causal", [False, True])
def test_batch_invariance(is_causal):
    """A sequence's bits do not depend on the batch around it or its position in it."""
    q, k, v, dout = random_inputs(6, 5, 190, 190, 4, 2, 64, jnp.bfloat16)
    fn = lambda q, k, v: jax_dash.attention(q, k, v, is_causal=is_causal)  # noqa: E731
    whole = attention_and_grads(fn, q, k, v, dout)
    for index in (0, 3):
        alone = attention_and_grads(fn, q[index:index + 1], k[index:index + 1],
                                    v[index:index + 1], dout[index:index + 1])
        for a, b in zip(whole, alone):
            np.testing.assert_array_equal(np.asarray(a[index]), np.asarray(b[0]))


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 1000, 1000, 2, 2, 64), (2, 768, 768, 4, 2, 32)],
                         ids=lambda s: "x".join(map(str, s)))
def test_every_schedule_computes_the_same_function(shape, is_causal):
    """Every schedule, with shapes where each really runs as itself: an even Nkv >= 4 (8 with a
    partial last tile; 6 with GQA) and seq_q == seq_kv, so shift (full mask) and symmetric_shift
    (causal) do not fall back to descending. Checked through the effective schedule that
    schedule.h reports for the CPU kernels' tiles and wave, and through dQ's bits."""
    from jax_dash import _ffi, schedules
    batch, seq_q, seq_kv, heads, kv_heads, head_dim = shape
    p = schedules.make_problem(batch=batch, num_heads=heads, num_kv_heads=kv_heads, seq_q=seq_q,
                               seq_kv=seq_kv, head_dim=head_dim, is_causal=is_causal,
                               wave=_ffi.CPU_WAVE)
    assert p.num_kv_tiles >= 4 and p.num_kv_tiles % 2 == 0
    own = "symmetric_shift" if is_causal else "shift"
    for name in ("ascending", "descending", own, "atomic"):
        assert schedules.effective_schedule(name, p) == name, name

    q, k, v, dout = random_inputs(7, *shape, jnp.float32)
    ref, naive = references(q, k, v, dout, is_causal=is_causal)
    dq = {}
    for schedule in jax_dash.SCHEDULES:
        ours = attention_and_grads(lambda q, k, v: jax_dash.attention(
            q, k, v, is_causal=is_causal, schedule=schedule), q, k, v, dout)
        for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
            assert_close_to_reference(f"{schedule} {name}", o, r, n, ATOL[jnp.float32])
        dq[schedule] = np.asarray(ours[1])
    # Its own tickets, not descending's (= ascending's): the fp32 sums come out in another order.
    np.testing.assert_array_equal(dq["ascending"], dq["descending"])
    assert not np.array_equal(dq[own], dq["descending"])


def test_nan_and_inf_propagate_without_crash():
    """Non-finite inputs give non-finite outputs exactly where the reference has them. (The NaN
    is in the last query, which sees every key, and the Inf in key 0, which every query sees: the
    reference, like jax.nn, multiplies masked probabilities by zero and so lets non-finite values
    of masked pairs through, which the CPU kernels do not; see
    test_non_finite_masked_keys_never_reach_the_results.)"""
    q, k, v, dout = random_inputs(8, 1, 64, 64, 2, 2, 32, jnp.float32)
    q = q.at[0, 63, 0, 3].set(jnp.nan)
    v = v.at[0, 0, 1, 0].set(jnp.inf)
    ours = attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True),
                               q, k, v, dout)
    ref, _ = references(q, k, v, dout, is_causal=True)
    assert np.isnan(ours[0][0, 63, 0]).all()        # the NaN query row
    assert not np.isfinite(ours[0][0, :, 1, 0]).any()  # rows that see the Inf value
    for name, o, r in zip(("out", "dq", "dk", "dv"), ours, ref):
        o, r = np.asarray(o), np.asarray(r)
        np.testing.assert_array_equal(np.isfinite(o), np.isfinite(r), err_msg=name)
        finite = np.isfinite(r)
        np.testing.assert_allclose(o[finite], r[finite], atol=5e-5, err_msg=name)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_non_finite_masked_keys_never_reach_the_results(dtype):
    """Keys a query cannot see are skipped, not multiplied by a zero probability: NaN/Inf in
    masked keys and values leave the results of the rows that do not see them bitwise unchanged
    (they share a tile with them: one 128-row tile here). The GPU kernels do multiply by zero
    inside the diagonal tile (README, "What is supported")."""
    q, k, v, dout = random_inputs(10, 2, 40, 64, 4, 2, 32, dtype)
    fn = lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True)  # noqa: E731
    clean = [np.asarray(x) for x in attention_and_grads(fn, q, k, v, dout)]
    # Top-left causal with seq_kv > seq_q: no query sees keys 40..63.
    k_bad = k.at[:, 40:, 0].set(jnp.nan).at[:, 50:, 1].set(jnp.inf)
    v_bad = v.at[:, 40:, 1].set(jnp.nan).at[:, 60:, 0].set(-jnp.inf)
    out, dq, dk, dv = [np.asarray(x) for x in attention_and_grads(fn, q, k_bad, v_bad, dout)]
    np.testing.assert_array_equal(out, clean[0])
    np.testing.assert_array_equal(dq, clean[1])
    np.testing.assert_array_equal(dk, clean[2])
    np.testing.assert_array_equal(dv, clean[3])
    assert not dk[:, 40:].any() and not dv[:, 40:].any()

    # Key 30 is masked for queries 0..29 and seen by 30..39 (all in one tile): the forward rows
    # before it keep their bits, the rows that see it become non-finite.
    v_bad = v.at[:, 30, 0].set(jnp.inf)
    k_bad = k.at[:, 30, 1].set(jnp.nan)
    out = np.asarray(fn(q, k_bad, v_bad).astype(jnp.float32))
    np.testing.assert_array_equal(out[:, :30], clean[0][:, :30].astype(np.float32))
    assert not np.isfinite(out[:, 30:, 0:2]).any()  # heads 0, 1 read kv head 0 (Inf value)
    assert np.isnan(out[:, 30:, 2:4]).all()         # heads 2, 3 read kv head 1 (NaN key)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("schedule", ("auto",) + DETERMINISTIC)
def test_batch_invariance_across_waves(schedule, is_causal):
    """4 heads x 10 KV tiles (seq 1200, 128-key tiles) x batch 8 = 320 items (160 symmetric_shift
    pairs) > the CPU's wave of 132: heads straddle the global waves [132k, 132(k + 1)) from which
    shift and symmetric_shift once took their tickets. Tickets now come from per-head slices, so
    every deterministic schedule, these two included (each running as itself under its mask),
    gives every sequence the bits it has alone."""
    import importlib
    from jax_dash import _ffi, schedules
    batch, seq, heads, head_dim = 8, 1200, 4, 32
    ran = schedule
    if schedule == "auto":
        shape = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), jnp.float32)
        ran = importlib.import_module("jax_dash.attention")._auto_schedule(shape, shape,
                                                                           is_causal)
    p = schedules.make_problem(batch=batch, num_heads=heads, seq_q=seq, seq_kv=seq,
                               head_dim=head_dim, is_causal=is_causal, wave=_ffi.CPU_WAVE)
    effective = schedules.effective_schedule(ran, p)
    if (ran, is_causal) in (("shift", False), ("symmetric_shift", True)):
        assert effective == ran
    per_head = int(schedules.head_tables(ran, p, 0)["items_per_head"])
    first = np.arange(batch * heads) * per_head
    straddling = first // _ffi.CPU_WAVE != (first + per_head - 1) // _ffi.CPU_WAVE
    assert straddling.any(), "the shape must put heads across the old global wave boundaries"

    q, k, v, dout = random_inputs(9, batch, seq, seq, heads, heads, head_dim, jnp.float32)
    fn = lambda q, k, v: jax_dash.attention(q, k, v, is_causal=is_causal,  # noqa: E731
                                            schedule=schedule)
    whole = attention_and_grads(fn, q, k, v, dout)
    changed = []
    for b in range(batch):
        alone = attention_and_grads(fn, q[b:b + 1], k[b:b + 1], v[b:b + 1], dout[b:b + 1])
        if not all(np.array_equal(np.asarray(a[b]), np.asarray(x[0]))
                   for a, x in zip(whole, alone)):
            changed.append(b)
    assert not changed, (f"{schedule} (runs as {effective}): sequences whose bits change in a "
                         f"batch of {batch}: {changed}")
