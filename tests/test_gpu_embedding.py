"""segment_sum and embed on a Hopper GPU: the CPU kernels' bits, bitwise repetition, and XLA's
own scatter-add differing on an input where ours does not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from helpers import GPU_MARKS, hopper_devices

HOPPER = (hopper_devices() or [None])[0]
pytestmark = GPU_MARKS


def _gradient_problem(seed, rows, row_size, num_segments, dtype, hot_ids=8):
    """Rows whose ids crowd onto a few hot segments (as frequent tokens do) and spread over the
    rest, with some out of range."""
    rng = np.random.default_rng(seed)
    data = rng.normal(size=(rows, row_size)).astype(np.float32)
    ids = np.where(rng.random(rows) < 0.5, rng.integers(0, hot_ids, rows),
                   rng.integers(-2, num_segments + 2, rows)).astype(np.int32)
    return jnp.asarray(data, dtype), jnp.asarray(ids)


def _on(device, *arrays):
    return jax.device_put(arrays, device)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("row_size", [1, 12, 256, 1000])
def test_gpu_bits_equal_cpu_bits(dtype, row_size):
    data, ids = _gradient_problem(0, 3000, row_size, 700, dtype)
    cpu = jax.devices("cpu")[0]
    on_cpu = jax.jit(jax_dash.segment_sum, static_argnums=2)(*_on(cpu, data, ids), 700)
    on_gpu = jax.jit(jax_dash.segment_sum, static_argnums=2)(*_on(HOPPER, data, ids), 700)
    np.testing.assert_array_equal(np.asarray(on_gpu, np.float32), np.asarray(on_cpu, np.float32))
    expected = jax.ops.segment_sum(jnp.asarray(data, jnp.float32), ids, 700)
    np.testing.assert_allclose(np.asarray(on_gpu, np.float32), np.asarray(expected), rtol=2e-2,
                               atol=2e-2)


def test_gpu_sorted_path_and_empty_inputs():
    data, ids = _gradient_problem(1, 512, 64, 40, jnp.bfloat16)
    ids = jnp.sort(ids)
    sorted_path = jax_dash.segment_sum(*_on(HOPPER, data, ids), 40, indices_are_sorted=True)
    unsorted_path = jax_dash.segment_sum(*_on(HOPPER, data, ids), 40)
    np.testing.assert_array_equal(np.asarray(sorted_path, np.float32),
                                  np.asarray(unsorted_path, np.float32))
    empty = jax_dash.segment_sum(*_on(HOPPER, jnp.zeros((0, 8)), jnp.zeros((0,), jnp.int32)), 3)
    np.testing.assert_array_equal(np.asarray(empty), np.zeros((3, 8)))


def test_gpu_embed_gradient_matches_cpu_bits():
    rng = np.random.default_rng(2)
    table = jnp.asarray(rng.normal(size=(5000, 256)), jnp.float32)
    ids = jnp.asarray(rng.integers(-5000, 5100, size=(4, 1024)), jnp.int32)

    def loss(t, i):
        return jnp.sum(jnp.nan_to_num(jax_dash.embed(t.astype(jnp.bfloat16), i)
                                      .astype(jnp.float32)) ** 2)

    grad = jax.jit(jax.grad(loss))
    on_gpu = grad(*_on(HOPPER, table, ids))
    on_cpu = grad(*_on(jax.devices("cpu")[0], table, ids))
    np.testing.assert_array_equal(np.asarray(on_gpu), np.asarray(on_cpu))


def test_gpu_segment_sum_repeats_bitwise_where_xla_scatter_add_does_not():
    """100 runs of an embedding-sized gradient give one result; XLA's scatter-add of the same
    rows (the gradient of a gather, racing atomics) gives several."""
    data, ids = _gradient_problem(3, 32768, 512, 4096, jnp.float32, hot_ids=4)
    data, ids = _on(HOPPER, data, ids)
    ours = jax.jit(jax_dash.segment_sum, static_argnums=2)
    first = np.asarray(ours(data, ids, 4096))
    for _ in range(99):
        np.testing.assert_array_equal(np.asarray(ours(data, ids, 4096)), first)

    @jax.jit
    def xla_scatter_add(data, ids):
        return jnp.zeros((4096, 512), jnp.float32).at[ids].add(data, mode="drop")

    xla_results = {np.asarray(xla_scatter_add(data, ids)).tobytes() for _ in range(20)}
    assert len(xla_results) > 1, "XLA's scatter-add repeated its bits 20 times on this input"


def test_gpu_embed_gradient_repeats_bitwise():
    rng = np.random.default_rng(4)
    table = jnp.asarray(rng.normal(size=(32000, 512)), jnp.bfloat16)
    ids = jnp.asarray(rng.zipf(1.2, size=(8, 2048)) % 32000, jnp.int32)  # frequent tokens
    table, ids = _on(HOPPER, table, ids)
    grad = jax.jit(jax.grad(lambda t: jnp.sum(jax_dash.embed(t, ids).astype(jnp.float32) ** 2)))
    first = np.asarray(grad(table), np.float32)
    for _ in range(99):
        np.testing.assert_array_equal(np.asarray(grad(table), np.float32), first)
