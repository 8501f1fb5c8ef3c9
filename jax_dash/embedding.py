"""The rest of a reproducible training step: ``segment_sum`` and ``embed``.

On a GPU, XLA runs the gradient of a gather (``table[ids]``, ``jnp.take``) as a scatter-add with
atomics: rows of the same id land in a racing order and float32 addition is not associative, so
the embedding gradient changes from run to run. ``segment_sum`` adds the rows of each segment in
one fixed order instead, and ``embed`` is a lookup whose gradient goes through it.

How ``segment_sum`` computes (the same on the CPU and the GPU, ``cuda/segment_sum.h``):
ids outside ``[0, num_segments)`` are set aside, the (id, row) pairs are put in order with a
stable sort (skipped with ``indices_are_sorted=True``), and every output row is the float32 sum of
its rows added one after another in ascending row order, rounded once to the data's dtype. So the
bits depend only on the inputs, not on timing, and the CPU and the GPU kernels give the same bits.

Batching: ``vmap`` folds the mapped axis into one kernel call, one output per mapped element. So
``jax.grad`` of a function that vmaps ``embed`` over ids with one shared table builds a table-sized
gradient per element before JAX sums them (JAX's own gather avoids that): call ``embed`` on the
whole ids array instead of vmapping it. Under GSPMD the call runs on the
whole (gathered) rows on every device, so a data-parallel gradient is summed over the global batch
in global row order: its bits do not depend on the number of devices (the tokens' cotangents are
all-gathered, ``rows x row_size``, instead of all-reducing a ``num_segments x row_size`` table).
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from jax_dash import _ffi
from jax_dash._args import _as_array

_DATA_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_MAX_SEGMENTS = 2**31 - 2  # int32 ids, one value above the last segment for "none"


def segment_sum(data, segment_ids, num_segments, *, indices_are_sorted=False):
    """Sums the rows of ``data`` that share a segment id, bitwise reproducibly.

    The meaning of ``jax.ops.segment_sum``: ``out[s] = sum(data[i] for i if segment_ids[i] == s)``.

    Args:
      data: float32, bfloat16 or float16 ``[n, ...]`` (any trailing shape). Summed in float32;
        the result has ``data``'s dtype.
      segment_ids: integer ``[n]`` (or ``data.shape[:k]`` for some ``k >= 1``, flattened
        together with those axes of ``data``). Ids outside ``[0, num_segments)`` are dropped.
      num_segments: a Python int ``>= 0`` (static: it sets the output shape).
      indices_are_sorted: whether ``segment_ids`` is already in ascending order (skips a sort;
        as in ``jax.ops.segment_sum``, wrong results if it is not).

    Returns:
      ``[num_segments, ...]`` with ``data``'s trailing shape and dtype.

    Every output row is its rows added one after another in ascending row order: the bits depend
    only on the inputs, on every run, and the CPU and the GPU give the same bits. Its gradient is
    a gather. Works under ``jit``, ``grad``, ``vmap`` and sharding.
    """
    data, segment_ids = _check_segment_sum(data, segment_ids, num_segments, indices_are_sorted)
    return _segment_sum(data, segment_ids, int(num_segments), bool(indices_are_sorted))


def embed(table, ids):
    """``jnp.take(table, ids, axis=0)`` whose gradient with respect to ``table`` is reproducible.

    Args:
      table: ``[num_embeddings, ...]`` float32, bfloat16 or float16 (typically
        ``[vocab, features]``).
      ids: integer array of any shape. Negative ids count from the end and out-of-range ids give
        NaN rows, exactly as ``jnp.take`` does.

    Returns:
      ``ids.shape + table.shape[1:]``, ``table``'s dtype.

    The forward is ``jnp.take``; the gradient is the one ``jax.grad`` of ``jnp.take`` gives
    (out-of-range ids contribute nothing), computed by ``segment_sum``, so the same inputs give the
    same bits on every run. No gradient flows to ``ids``.
    """
    table = _as_array(table, "table")
    ids = _as_array(ids, "ids")
    if table.ndim < 1:
        raise ValueError(f"table must have at least one axis [num_embeddings, ...], got a scalar "
                         f"{table.dtype.name}")
    if table.dtype not in _DATA_DTYPES:
        raise TypeError(f"table must be float32, bfloat16 or float16, got {table.dtype.name}")
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"ids must be an integer array, got {ids.dtype.name}")
    if table.shape[0] > _MAX_SEGMENTS:
        raise ValueError(f"table has {table.shape[0]} rows; at most {_MAX_SEGMENTS} are supported")
    # Inside shard_map: the table varies over the ids' mesh axes too (JAX's transpose of the cast
    # sums the table's gradient over them, as it does for jnp.take).
    table, ids = _ffi._unify_varying(table, ids)
    return _embed(table.shape[0], table, ids)


# ---- argument checks ----------------------------------------------------------------------------

def _check_segment_sum(data, segment_ids, num_segments, indices_are_sorted):
    data = _as_array(data, "data")
    segment_ids = _as_array(segment_ids, "segment_ids")
    if data.dtype not in _DATA_DTYPES:
        raise TypeError(f"data must be float32, bfloat16 or float16, got {data.dtype.name}")
    if not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise TypeError(f"segment_ids must be an integer array, got {segment_ids.dtype.name}")
    if (not isinstance(num_segments, (numbers.Integral, np.integer))
            or isinstance(num_segments, (bool, np.bool_))):
        raise TypeError(f"num_segments must be a Python int (static: it sets the output shape), "
                        f"got {num_segments!r} (type {type(num_segments).__name__})")
    if not 0 <= int(num_segments) <= _MAX_SEGMENTS:
        raise ValueError(f"num_segments must be in [0, {_MAX_SEGMENTS}], got {num_segments}")
    if not isinstance(indices_are_sorted, (bool, np.bool_)):
        raise TypeError(f"indices_are_sorted must be a bool, got {indices_are_sorted!r}")
    k = segment_ids.ndim
    if k < 1 or data.ndim < k or data.shape[:k] != segment_ids.shape:
        raise ValueError(f"segment_ids must have shape data.shape[:k] for some k >= 1 (one id per "
                         f"row of data), got segment_ids {segment_ids.shape} and data "
                         f"{data.shape}")
    if k > 1:
        data = data.reshape((math.prod(data.shape[:k]),) + data.shape[k:])
        segment_ids = segment_ids.reshape(-1)
    return data, segment_ids


# ---- segment_sum --------------------------------------------------------------------------------

def _segment_sum(data, ids, num_segments, indices_are_sorted):
    """Checked operands; ``[n, ...]`` and ``[n]`` (any integer dtype)."""
    # Inside shard_map, data and ids vary over the same mesh axes (JAX's transpose of the cast
    # sums a replicated operand's cotangent over the others, as for jax.ops.segment_sum).
    data, ids = _ffi._unify_varying(data, _int32_ids(ids, num_segments))
    return _summed_op(num_segments, indices_are_sorted)(data, ids)


def _int32_ids(ids, num_segments):
    """int32 ids, those outside ``[0, num_segments)`` clipped to -1 below and num_segments above:
    they sort to the ends and belong to no segment, and sorted ids stay sorted. The comparisons
    run in a dtype that holds num_segments (narrow ids widen first, exactly)."""
    if ids.dtype.itemsize < 4:
        ids = ids.astype(jnp.int32)
    clipped = jnp.where(ids >= num_segments, num_segments, ids)
    if jnp.issubdtype(ids.dtype, jnp.signedinteger):
        clipped = jnp.where(ids < 0, -1, clipped)
    return clipped.astype(jnp.int32)


@functools.lru_cache(maxsize=256)
def _summed_op(num_segments: int, indices_are_sorted: bool):
    """``(data [n, ...], ids [n] int32) -> [num_segments, ...]``, differentiable in data."""

    @jax.custom_vjp
    def op(data, ids):
        return _raw_op(num_segments, indices_are_sorted)(data, ids)

    def op_fwd(data, ids):
        return op(data, ids), ids

    def op_bwd(ids, g):
        valid = (ids >= 0) & (ids < num_segments)
        rows = jnp.take(g, jnp.where(valid, ids, 0), axis=0)
        mask = valid.reshape(valid.shape + (1,) * (g.ndim - 1))
        return jnp.where(mask, rows, jnp.zeros((), g.dtype)), None

    op.defvjp(op_fwd, op_bwd)
    return op


@functools.lru_cache(maxsize=256)
def _raw_op(num_segments: int, indices_are_sorted: bool):

    @jax.custom_batching.custom_vmap
    def raw(data, ids):
        return _segment_sum_call(data, ids, num_segments, indices_are_sorted)

    @raw.def_vmap
    def raw_vmap(axis_size, in_batched, data, ids):
        # One output per mapped element: element b's segment s is segment b * num_segments + s of
        # one call; each element's rows keep their order, so it gets the bits of its own call.
        data_batched, ids_batched = in_batched
        if not data_batched:
            data = jnp.broadcast_to(data[None], (axis_size,) + data.shape)
        if not ids_batched:
            ids = jnp.broadcast_to(ids[None], (axis_size,) + ids.shape)
        if axis_size * num_segments > _MAX_SEGMENTS:
            raise ValueError(f"vmap of segment_sum over {axis_size} elements of {num_segments} "
                             f"segments exceeds {_MAX_SEGMENTS} segments in one call")
        rows = data.reshape((axis_size * data.shape[1],) + data.shape[2:])
        valid = (ids >= 0) & (ids < num_segments)
        offset = (jnp.arange(axis_size, dtype=jnp.int32) * num_segments)[:, None]
        folded = jnp.where(valid, ids + offset, -1)
        out = _raw_op(axis_size * num_segments, False)(rows, folded.reshape(-1))
        return out.reshape((axis_size, num_segments) + out.shape[1:]), True

    return raw


def _segment_sum_call(data, ids, num_segments, indices_are_sorted):
    """The FFI call on unbatched ``[n, ...]`` data and ``[n]`` ids clipped to
    ``[-1, num_segments]`` (``_int32_ids``)."""
    trailing = data.shape[1:]
    rows = data.reshape(data.shape[0], math.prod(trailing))
    if indices_are_sorted:
        sorted_ids, order = ids, jnp.zeros((0,), jnp.int32)
    else:
        positions = jnp.arange(ids.shape[0], dtype=jnp.int32)
        sorted_ids, order = jax.lax.sort((ids, positions), num_keys=1, is_stable=True)
    sorted_ids, order, rows = _ffi._unify_varying(sorted_ids, order, rows)
    result_types = (
        _ffi._result_type((num_segments, rows.shape[1]), rows.dtype, rows),
        _ffi._result_type((num_segments + 1,), jnp.int32, rows),
    )
    out, _ = jax.ffi.ffi_call("jax_dash_segment_sum", result_types, vmap_method="sequential")(
        rows, sorted_ids, order, has_order=not indices_are_sorted)
    return out.reshape((num_segments,) + trailing)


# ---- embed --------------------------------------------------------------------------------------

# The table's row count is static (nondiff): the backward sums into that many segments.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _embed(num_rows, table, ids):
    return jnp.take(table, ids, axis=0)


def _embed_fwd(num_rows, table, ids):
    return jnp.take(table, ids, axis=0), ids


def _embed_bwd(num_rows, ids, g):
    ids = jnp.where(ids < 0, ids + num_rows, ids)  # jnp.take's wrap; still out of range: dropped
    rows = g.reshape((ids.size,) + g.shape[ids.ndim:])
    return _segment_sum(rows, ids.reshape(-1), num_rows, False), None


_embed.defvjp(_embed_fwd, _embed_bwd)
