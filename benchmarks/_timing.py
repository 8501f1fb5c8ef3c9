"""Wall-clock timing of jitted JAX functions, the matmul peak, and the bitwise-repeat check."""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

# A sample must be long enough that host dispatch latency is noise. The device waits for the
# first call's dispatch of every sample (0.1-0.45 ms for a jitted attention call on an H100
# host, jax_dash and cuDNN alike: benchmarks/probe_dispatch.py, 2026-11-24); the later calls'
# dispatch overlaps the device's work. Up to 2026-11-24 this was 2 ms, which timed any call of
# >= 2 ms alone with its dispatch (5-20% more than back to back), and a call of 1.0-2.0 ms
# as two: the bias depended on which side of 2 ms a call fell. At 20 ms the first dispatch is
# <= ~2% of a sample.
MIN_SAMPLE_S = 20e-3
MAX_CALLS_PER_SAMPLE = 64


def _block(tree):
    import jax
    return jax.block_until_ready(tree)


def time_function(fn, input_sets, *, iters: int, time_budget_s: float = 15.0,
                  block=None) -> dict:
    """Median seconds per call of `fn(*args)`, rotating through `input_sets`.

    Every input set is run once first (compile + warm-up). A sample dispatches `calls` calls
    back to back and blocks on the last one, so dispatch overlaps device work as in a training
    step; `calls` is chosen so a sample lasts >= MIN_SAMPLE_S. `iters` drops (to >= 3) when
    `iters` samples would exceed `time_budget_s`: slow implementations get fewer samples.
    `block(result)` waits for a result (default: jax.block_until_ready; a PyTorch peer passes
    one that synchronizes its stream).
    """
    wait = block or _block
    if iters < 1:
        raise ValueError(f"iters={iters} must be >= 1")
    if not input_sets:
        raise ValueError("input_sets is empty; time_function needs at least one argument tuple")
    for args in input_sets:
        wait(fn(*args))
    start = time.perf_counter()
    wait(fn(*input_sets[0]))
    estimate = max(time.perf_counter() - start, 1e-7)
    calls = int(min(MAX_CALLS_PER_SAMPLE, max(1, math.ceil(MIN_SAMPLE_S / estimate))))
    samples_wanted = iters
    if estimate * calls * iters > time_budget_s:
        samples_wanted = max(min(3, iters), int(time_budget_s / (estimate * calls)))
    samples = []
    call_index = 0
    for _ in range(samples_wanted):
        start = time.perf_counter()
        result = None
        for _ in range(calls):
            result = fn(*input_sets[call_index % len(input_sets)])
            call_index += 1
        wait(result)
        samples.append((time.perf_counter() - start) / calls)
        del result
    return {
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "samples": len(samples),
        "calls_per_sample": calls,
        "min_sample_s": MIN_SAMPLE_S,
    }


def bitwise_repeatable(fn, args, *, repeats: int = 3) -> dict:
    """Run `fn(*args)` `repeats` times; compare every output leaf bit for bit with the first run."""
    import jax
    first = [np.asarray(x) for x in jax.tree_util.tree_leaves(_block(fn(*args)))]
    differing = set()
    for _ in range(repeats - 1):
        again = [np.asarray(x) for x in jax.tree_util.tree_leaves(_block(fn(*args)))]
        for i, (a, b) in enumerate(zip(first, again)):
            # Compare raw bytes: np.array_equal on floats treats NaN != NaN and -0 == +0.
            if not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
                differing.add(i)
    return {"repeatable": not differing, "repeats": repeats, "differing_outputs": sorted(differing)}


def matmul_peak_tflops(size: int, dtype_name: str = "bfloat16", iters: int = 20,
                       warmup_s: float = 1.0) -> dict:
    """Measured dense matmul throughput: the denominator of the '% of peak' columns.

    `warmup_s` of matmuls run first so that the GPU is at its loaded clocks when timed.
    """
    import jax
    import jax.numpy as jnp
    dtype = jnp.dtype(dtype_name)
    keys = jax.random.split(jax.random.key(1234), 4)
    # Random data: zeros toggle fewer bits and run measurably faster on Hopper.
    a = [jax.random.normal(keys[i], (size, size), dtype) for i in range(2)]
    b = [jax.random.normal(keys[i + 2], (size, size), dtype) for i in range(2)]
    matmul = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=dtype))
    _block(matmul(a[0], b[0]))
    deadline = time.perf_counter() + warmup_s
    while time.perf_counter() < deadline:
        _block(matmul(a[0], b[0]))
    timing = time_function(matmul, [(a[0], b[0]), (a[1], b[1])], iters=iters)
    flops = 2.0 * size ** 3
    return {"size": size, "dtype": dtype_name, "tflops": flops / timing["median_s"] / 1e12,
            "timing": timing}
