"""Attention dropout's keep mask, as a reference: ``dropout_keep_mask`` computes, with jnp, exactly
the function ``cuda/dropout.h`` defines for the kernels. Whether element ``(b, h, i, j)`` of the
attention probabilities is kept depends only on the key and the element's global coordinates
(batch row, head, query position, key position): counter-based Philox4x32-10, no state, so a mask
does not depend on tiles, schedules, sharding over batch or heads, or where a ring's block sits
(the offsets). ``jax_dash.attention(..., dropout_rate, dropout_rng)`` applies it in the CPU and
the Hopper kernels, forward and backward.

A call that computes a block of a larger problem (inside ``shard_map``, a ring's block pair) draws
that problem's mask at its global coordinates: ``block_offsets`` turns ``jax_dash.attention``'s
``dropout_offsets`` / ``dropout_axes`` into the kernels' int32 ``[4]`` offsets operand.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from jax_dash import _ffi

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


# ---- the global coordinates of a call's block (shard_map, the ring) --------------------------

OFFSET_NAMES = ("batch", "head", "q", "kv")
_MAX_OFFSET = 2 ** 31 - 1  # the kernels' operand is int32
_OFFSETS_ALLOWED = ("a tuple (batch, head, q, kv) of non-negative ints or integer scalar arrays "
                    "(traced values work, e.g. from jax.lax.axis_index), or an integer array of "
                    "shape (4,)")


def _is_traced(x):
    return isinstance(x, jax.core.Tracer)


def _offset_entry(value, index):
    """One entry of ``dropout_offsets`` as an int32 scalar (TypeError / ValueError naming it)."""
    label = f"dropout_offsets[{index}] (the {OFFSET_NAMES[index]} offset)"
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{label} must be an int, got {value!r}; dropout_offsets must be "
                        f"{_OFFSETS_ALLOWED}")
    if isinstance(value, (int, np.integer)):
        if not 0 <= value <= _MAX_OFFSET:
            raise ValueError(f"{label} must be in [0, 2^31), got {value}")
        return jnp.int32(value)
    if isinstance(value, (jax.Array, np.ndarray)):
        if value.shape != () or not jnp.issubdtype(value.dtype, jnp.integer):
            raise TypeError(f"{label} must be an int or an integer scalar array, got an array of "
                            f"shape {value.shape} and dtype {value.dtype}")
        if not _is_traced(value) and not 0 <= int(value) <= _MAX_OFFSET:
            raise ValueError(f"{label} must be in [0, 2^31), got {int(value)}")
        return jnp.asarray(value).astype(jnp.int32)
    raise TypeError(f"{label} must be an int or an integer scalar array, got {value!r} "
                    f"(type {type(value).__name__})")


def check_offsets(offsets):
    """``dropout_offsets`` as an int32 ``[4]`` array (batch, head, q, kv), checked: a TypeError
    or ValueError naming the entry that is wrong. Traced values are checked by the kernels when
    the call runs (an offset < 0 is an error there)."""
    if isinstance(offsets, (jax.Array, np.ndarray)):
        if offsets.shape != (4,) or not jnp.issubdtype(offsets.dtype, jnp.integer):
            raise TypeError(f"dropout_offsets must be {_OFFSETS_ALLOWED}; got an array of shape "
                            f"{offsets.shape} and dtype {offsets.dtype}")
        if not _is_traced(offsets):
            for index, value in enumerate(np.asarray(offsets).tolist()):
                if not 0 <= value <= _MAX_OFFSET:
                    raise ValueError(f"dropout_offsets[{index}] (the {OFFSET_NAMES[index]} "
                                     f"offset) must be in [0, 2^31), got {value}")
        return jnp.asarray(offsets).astype(jnp.int32)
    if not isinstance(offsets, (tuple, list)) or len(offsets) != 4:
        got = (f"a {type(offsets).__name__} of {len(offsets)}"
               if isinstance(offsets, (tuple, list)) else repr(offsets))
        raise TypeError(f"dropout_offsets must be {_OFFSETS_ALLOWED}; got {got}")
    return jnp.stack([_offset_entry(value, index) for index, value in enumerate(offsets)])


def check_axes(axes, *, ring=False):
    """``dropout_axes`` as 4 entries (batch, head, q, kv), each None or a tuple of mesh axis
    names. ``ring_attention`` takes ``(batch_axis, head_axis)`` only (its ring gives the
    sequence's)."""
    lengths = (2,) if ring else (2, 4)
    allowed = ("(batch_axis, head_axis)" if ring else
               "(batch_axis, head_axis) or (batch_axis, head_axis, q_axis, kv_axis)")
    if not isinstance(axes, (tuple, list)) or len(axes) not in lengths:
        got = (f"a {type(axes).__name__} of {len(axes)}" if isinstance(axes, (tuple, list))
               else repr(axes))
        hint = (" (ring_attention derives the sequence's offsets from axis_name)"
                if ring and isinstance(axes, (tuple, list)) and len(axes) == 4 else "")
        raise TypeError(f"dropout_axes must be {allowed}, each None, a mesh axis name or a tuple "
                        f"of names; got {got}{hint}")
    entries = []
    for index, entry in enumerate(axes):
        names = (entry,) if isinstance(entry, str) else entry
        if entry is not None and (not isinstance(names, (tuple, list)) or not names
                                  or not all(isinstance(n, str) for n in names)):
            raise TypeError(f"dropout_axes[{index}] (the {OFFSET_NAMES[index]} axis) must be None, "
                            f"a mesh axis name or a non-empty tuple of names, got {entry!r}")
        entries.append(None if entry is None else tuple(names))
    entries += [None] * (4 - len(entries))
    for operand, dims in (("query", (0, 1, 2)), ("key", (0, 1, 3))):
        named = [n for d in dims if entries[d] for n in entries[d]]
        repeated = sorted({n for n in named if named.count(n) > 1})
        if repeated:
            raise ValueError(f"dropout_axes={tuple(axes)!r} names mesh axis {repeated[0]!r} for "
                             f"two dimensions of the {operand}: a mesh axis shards one dimension")
    return tuple(entries)


def check_offset_arguments(offsets, axes, *, ring=False):
    """The form of ``dropout_offsets`` and ``dropout_axes`` (at most one of them), without binding
    any axis: for calls that do not draw a mask (``dropout_rate`` 0)."""
    if offsets is not None and axes is not None:
        raise ValueError("pass dropout_offsets or dropout_axes, not both: dropout_axes derives the "
                         "offsets from the mesh axes the dimensions are sharded over, "
                         "dropout_offsets gives them outright")
    if offsets is not None:
        check_offsets(offsets)
    if axes is not None:
        check_axes(axes, ring=ring)


def _axis_start(names, local_size, dim):
    """This block's first coordinate along a dimension sharded evenly over mesh axes ``names``."""
    try:
        index = jax.lax.axis_index(names if len(names) > 1 else names[0])
    except NameError as exc:
        raise ValueError(
            f"dropout_axes names mesh axis {names if len(names) > 1 else names[0]!r} for the "
            f"{dim}, which is not bound here: dropout_axes is for calls inside shard_map over a "
            "mesh with that axis (outside it, pass dropout_offsets, or nothing)") from exc
    return index.astype(jnp.int32) * jnp.int32(local_size)


def block_offsets(query, key, offsets, axes, *, ring_axes=()):
    """The int32 ``[4]`` dropout offsets (batch, head, q, kv) of a call on 4-D ``query`` /
    ``key`` blocks, from ``dropout_offsets`` (``offsets``) or ``dropout_axes`` (``axes``: a
    sharded dimension's offset is ``axis_index(axis) * local size``), zeros with neither; for
    ``ring_attention`` (``ring_axes``: its sequence axes, whose offsets the ring adds itself).

    Inside ``shard_map`` (the operands vary over mesh axes other than ``ring_axes``) one of the
    two is required: without it every block would draw the mask of the block at the origin. With
    ``dropout_axes`` the axes it names must be those the operands vary over (where JAX tracks
    that): an axis named for the query's batch, heads or sequence must be one the query varies
    over, one named for the key's sequence one the key varies over, and no axis the operands vary
    over may be left out."""
    check_offset_arguments(offsets, axes, ring=bool(ring_axes))
    q_axes, kv_axes = _ffi._varying_axes(query), _ffi._varying_axes(key)
    varying = (q_axes | kv_axes) - set(ring_axes)
    if offsets is not None:
        return check_offsets(offsets)
    if axes is None:
        if varying:
            raise ValueError(
                f"dropout_rate > 0 inside shard_map needs the global coordinates of this block: "
                f"the operands vary over mesh axes {tuple(sorted(varying))}, so each block would "
                "otherwise draw its mask from its own coordinates, not the global ones. Pass "
                "dropout_axes=(batch_axis, head_axis) naming the mesh axes the batch and heads are "
                "sharded over (None for an unsharded one), or dropout_offsets=(batch, head, q, "
                "kv); or call jax_dash.attention under jit on sharded arrays (the mask is then "
                "the unsharded one)")
        return jnp.zeros((4,), jnp.int32)
    entries = check_axes(axes, ring=bool(ring_axes))
    for names in entries:
        for name in names or ():
            if name in ring_axes:
                raise ValueError(f"dropout_axes={axes!r} names the ring's axis {name!r}: the ring "
                                 "gives the sequence its offsets itself; name the axes the batch "
                                 "and heads are sharded over")
    if varying:  # JAX tracks which axes the operands vary over: they must match the names
        for index, names in enumerate(entries):
            if names is None:
                continue
            operand, operand_axes = ("key", kv_axes) if index == 3 else ("query", q_axes)
            for name in names:
                if name not in operand_axes:
                    raise ValueError(
                        f"dropout_axes names mesh axis {name!r} for the {OFFSET_NAMES[index]}, "
                        f"but the {operand} does not vary over it (its {OFFSET_NAMES[index]} is "
                        f"not sharded over {name!r}); name the axes of the in_specs")
        named = {n for names in entries if names for n in names}
        unnamed = sorted(varying - named)
        if unnamed:
            raise ValueError(
                f"the operands vary over mesh axis {unnamed[0]!r}, which dropout_axes={axes!r} "
                "does not name: blocks along it would draw the same mask. Name the axis their "
                "batch or heads are sharded over, or pass dropout_offsets")
    sizes = (query.shape[0], query.shape[2], query.shape[1], key.shape[1])
    return jnp.stack([jnp.int32(0) if names is None else _axis_start(names, size, dim)
                      for names, size, dim in zip(entries, sizes, OFFSET_NAMES)])
