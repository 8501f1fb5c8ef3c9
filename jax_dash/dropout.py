"""Attention dropout's keep mask, as a reference: ``dropout_keep_mask`` computes, with jnp, exactly
the function ``cuda/dropout.h`` defines for the kernels. Whether element ``(b, h, i, j)`` of the
attention probabilities is kept depends only on the key and the element's global coordinates
(batch row, head, query position, key position): counter-based Philox4x32-10, no state, so a mask
does not depend on tiles, schedules, sharding over batch or heads, or where a ring's block sits
(the offsets). ``jax_dash.attention(..., dropout_rate, dropout_rng)`` applies it on the CPU
kernels; the Hopper kernels do not yet (issue 33).
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def _mulhilo(a, b):
    """(high, low) 32-bit words of the 64-bit product of uint32 arrays, in 32-bit arithmetic (JAX
    runs without 64-bit integers by default)."""
    mask = jnp.uint32(0xFFFF)
    a_lo, a_hi = a & mask, a >> 16
    b_lo, b_hi = b & mask, b >> 16
    lo_lo, lo_hi, hi_lo = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo
    middle = (lo_lo >> 16) + (lo_hi & mask) + (hi_lo & mask)
    high = a_hi * b_hi + (lo_hi >> 16) + (hi_lo >> 16) + (middle >> 16)
    return high, a * b


def _philox4x32_10(counter, key):
    """Philox4x32-10 of uint32 counters (a 4-tuple of arrays) under key (2 uint32 scalars): four
    uint32 arrays (cuda/dropout.h's philox4x32_10, elementwise)."""
    c0, c1, c2, c3 = (jnp.asarray(c, jnp.uint32) for c in counter)
    k0, k1 = (jnp.asarray(k, jnp.uint32) for k in key)
    m0, m1 = jnp.uint32(_PHILOX_M[0]), jnp.uint32(_PHILOX_M[1])
    for round_ in range(10):
        if round_:
            k0, k1 = k0 + jnp.uint32(_PHILOX_W[0]), k1 + jnp.uint32(_PHILOX_W[1])
        hi0, lo0 = _mulhilo(m0, c0)
        hi1, lo1 = _mulhilo(m1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def dropout_threshold(rate: float) -> int:
    """The 16-bit threshold of ``rate``: a draw is kept iff it is >= this, so the rate is quantized
    to 1/65536 (``min(65535, floor(rate * 65536 + 0.5))``)."""
    return min(65535, math.floor(_check_rate(rate) * 65536 + 0.5))


def _check_rate(rate) -> float:
    if isinstance(rate, jax.core.Tracer):
        raise TypeError("dropout_rate must be a Python float, not a traced value (it is compiled "
                        "into the kernels); pass it as a static argument")
    if isinstance(rate, (bool, np.bool_)) or not isinstance(rate, numbers.Real):
        raise TypeError(f"dropout_rate must be a float in [0, 1), got {rate!r} "
                        f"(type {type(rate).__name__})")
    rate = float(rate)
    if not 0.0 <= rate < 1.0:  # NaN fails too
        raise ValueError(f"dropout_rate must be in [0, 1), got {rate!r}")
    return rate


def dropout_key_words(rng):
    """The two uint32 words that key Philox: the first two of ``jax.random.bits(rng, (2,))``, so
    any JAX PRNG key (typed, or a raw ``uint32[2]`` threefry key) works."""
    if rng is None:
        raise ValueError("dropout_rng is required when dropout_rate > 0: pass a JAX PRNG key "
                         "(jax.random.key(seed))")
    is_typed = isinstance(rng, jax.Array) and jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
    if not is_typed:
        raw = rng if isinstance(rng, jax.Array) else np.asarray(rng)
        if raw.dtype != np.uint32 or raw.shape != (2,):
            raise TypeError(f"dropout_rng must be a JAX PRNG key (jax.random.key(seed), or a raw "
                            f"uint32[2] key), got {type(rng).__name__} with shape "
                            f"{getattr(raw, 'shape', None)} and dtype {getattr(raw, 'dtype', None)}")
    elif rng.shape != ():
        raise TypeError(f"dropout_rng must be one key (shape ()), got keys of shape {rng.shape}")
    words = jax.random.bits(rng, (2,), jnp.uint32)
    return words[0], words[1]


def _check_extent(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return int(value)


def dropout_keep_mask(rng, rate, shape, *, batch_offset=0, head_offset=0, q_offset=0,
                      kv_offset=0):
    """The boolean keep mask ``[batch, heads, seq_q, seq_kv]`` that attention dropout with key
    ``rng`` and ``rate`` applies: True where the probability is kept (and scaled by
    ``1 / (1 - rate)``). A pure function of (key, global batch row, global head, query position,
    key position); the offsets address the block of a larger problem that starts there, so
    ``dropout_keep_mask(rng, rate, big)[b0:b0+B, h0:h0+H, i0:i0+S, j0:j0+T]`` equals
    ``dropout_keep_mask(rng, rate, (B, H, S, T), batch_offset=b0, head_offset=h0, q_offset=i0,
    kv_offset=j0)``. ``rate`` is a Python float in ``[0, 1)``, quantized to 1/65536
    (``dropout_threshold``); rate 0 keeps everything. Materializes the whole mask: a reference
    for tests and small problems (the kernels compute it tile by tile)."""
    threshold = dropout_threshold(rate)
    if not isinstance(shape, (tuple, list)) or len(shape) != 4:
        raise ValueError(f"shape must be (batch, heads, seq_q, seq_kv), got {shape!r}")
    names = ("batch", "heads", "seq_q", "seq_kv")
    sizes = [_check_extent(s, f"shape's {n}") for s, n in zip(shape, names)]
    offsets = [_check_extent(o, n) for o, n in zip(
        (batch_offset, head_offset, q_offset, kv_offset),
        ("batch_offset", "head_offset", "q_offset", "kv_offset"))]
    for size, offset, name in zip(sizes, offsets, names):
        if size + offset > 2 ** 32:
            raise ValueError(f"{name}: {size} positions from offset {offset} go past 2^32 (the "
                             "mask's coordinates are uint32)")
    key = dropout_key_words(rng)
    b, h, i, j = (jnp.uint32(o) + jnp.arange(s, dtype=jnp.uint32).reshape(
        [s if d == axis else 1 for d in range(4)])
        for axis, (s, o) in enumerate(zip(sizes, offsets)))
    counter = (jnp.uint32(4) * (j // 16) + (j % 8) // 2, jnp.uint32(8) * (i // 16) + i % 8, h, b)
    counter = jnp.broadcast_arrays(*counter)
    words = _philox4x32_10(counter, key)
    row_half, col_half = (i % 16) // 8, (j % 16) // 8
    index = jnp.broadcast_to(row_half + 2 * col_half, counter[0].shape)
    word = jnp.select([index == w for w in range(4)], list(words))
    draw = jnp.where(jnp.broadcast_to(j % 2 == 1, word.shape), word >> 16, word & 0xFFFF)
    return draw >= jnp.uint32(threshold)
