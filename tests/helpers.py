"""Shared test utilities: random inputs and the relative-to-naive accuracy criterion."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_dash.reference import reference_backward, reference_forward


def hopper_devices():
    """The CUDA devices of compute capability 9.0 (Hopper) JAX sees; [] without any."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        return []
    return [d for d in devices if str(getattr(d, "compute_capability", "")) == "9.0"]


GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not hopper_devices(), reason="needs a CUDA GPU of compute capability 9.0"),
]


def random_inputs(seed, batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim, dtype):
    """Random normal q, k, v, dout (never zeros: zeros hide unwritten outputs)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(keys[0], (batch, seq_q, num_heads, head_dim), jnp.float32)
    k = jax.random.normal(keys[1], (batch, seq_kv, num_kv_heads, head_dim), jnp.float32)
    v = jax.random.normal(keys[2], (batch, seq_kv, num_kv_heads, head_dim), jnp.float32)
    dout = jax.random.normal(keys[3], (batch, seq_q, num_heads, head_dim), jnp.float32)
    return tuple(x.astype(dtype) for x in (q, k, v, dout))


def max_abs_diff(a, b):
    return float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))))


def assert_close_to_reference(name, ours, ref_fp32, naive_lowp, atol):
    """max|ours - ref| <= 2 * max|naive_lowp - ref| + atol (the project's accuracy criterion)."""
    ours = np.asarray(jnp.asarray(ours, jnp.float32))
    assert np.all(np.isfinite(ours)), f"{name}: non-finite values"
    error = max_abs_diff(ours, ref_fp32)
    budget = 2 * max_abs_diff(naive_lowp, ref_fp32) + atol
    assert error <= budget, f"{name}: max error {error:.3e} exceeds 2 x naive + atol = {budget:.3e}"


def references(q, k, v, dout, *, scale=None, is_causal=False, **mask):
    """fp32 reference and naive low-precision (input dtype) results: (out, dq, dk, dv) each.
    ``mask``: the structured mask arguments of jax_dash.attention."""
    ref_out, ref_lse = reference_forward(q, k, v, scale=scale, is_causal=is_causal, **mask)
    ref_grads = reference_backward(q, k, v, ref_out, ref_lse, dout, scale=scale,
                                   is_causal=is_causal, **mask)
    lowp = q.dtype
    naive_out, naive_lse = reference_forward(q, k, v, scale=scale, is_causal=is_causal,
                                             compute_dtype=lowp, **mask)
    naive_grads = reference_backward(q, k, v, naive_out, naive_lse, dout, scale=scale,
                                     is_causal=is_causal, compute_dtype=lowp, **mask)
    return (ref_out, *ref_grads), (naive_out, *naive_grads)


def attention_and_grads(fn, q, k, v, dout):
    """(out, dq, dk, dv) of fn through jax.vjp."""
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(dout))


def ring_sums(q, k, v, dout, ring_size, *, is_causal, layout, accumulate, schedule="auto"):
    """The ring's float32 gradient sums ``(dq, dk, dv)`` before the cast to the inputs' dtype,
    over ``ring_size`` devices simulated on the current one (as ``jax_dash.ring.simulate``), with
    the kernels adding into the sums in place (``accumulate``) or XLA adding the contributions.
    Global arrays in, global arrays out (in the layout's token order). Jitted."""
    from jax_dash import ring
    axis = "ring_sums_axis"
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    if schedule == "auto":
        schedule = ring._auto_schedule(q, k, is_causal)
    config = ring.RingConfig(axis, ring_size, is_causal, schedule, layout, accumulate)

    def split(x):  # [B, S, ...] -> [P, B, S / P, ...]
        blocks = x.reshape((x.shape[0], ring_size, x.shape[1] // ring_size) + x.shape[2:])
        return jnp.moveaxis(blocks, 1, 0)

    def join(x):
        x = jnp.moveaxis(x, 0, 1)
        return x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])

    def device(q, k, v, dout):
        out, lse = ring.ring_forward(q, k, v, scale, config)
        (dq, dk, dv), _ = ring._backward_before_home(q, k, v, out, lse, dout, scale, config)
        if ring_size > 1:
            dk, dv = ring._send(config, dk, dv)  # home, in float32
        return dq, dk, dv

    def run(q, k, v, dout):
        sums = jax.vmap(device, axis_name=axis)(split(q), split(k), split(v), split(dout))
        return tuple(join(x) for x in sums)

    return jax.jit(run)(q, k, v, dout)


def dropout_readout_inputs(batch, seq_q, seq_kv, heads, head_dim):
    """Inputs that make attention with dropout show its keep mask exactly (MHA, ``head_dim`` >=
    both sequences): query 0 (every visible key equally likely, probability 1/count), value row
    ``j`` the unit vector ``e_j``, dout row ``i`` the unit vector ``e_i``. Then ``out[b, i, h, j]
    != 0`` iff element ``(b, h, i, j)`` is kept (and visible), and ``dV[b, j, h, i] != 0`` iff
    the backward kept it. Returns ``(q, k, v, dout)`` float32."""
    assert head_dim >= max(seq_q, seq_kv)
    q = jnp.zeros((batch, seq_q, heads, head_dim), jnp.float32)
    k = jax.random.normal(jax.random.PRNGKey(0), (batch, seq_kv, heads, head_dim), jnp.float32)

    def unit_rows(n):  # row r of every batch row and head: e_r
        return jnp.broadcast_to(jnp.eye(n, head_dim)[None, :, None], (batch, n, heads, head_dim))

    return q, k, unit_rows(seq_kv), unit_rows(seq_q)


def kept_by_forward(out, seq_kv):
    """The keep mask ``[b, h, i, j]`` that ``out`` of ``dropout_readout_inputs`` shows."""
    return np.transpose(np.asarray(out)[..., :seq_kv] != 0, (0, 2, 1, 3))


def kept_by_backward(dv, seq_q):
    """The keep mask ``[b, h, i, j]`` that ``dv`` of ``dropout_readout_inputs`` shows."""
    return np.transpose(np.asarray(dv)[..., :seq_q] != 0, (0, 2, 3, 1))
