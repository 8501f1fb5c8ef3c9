"""Batching and partitioning of the raw FFI calls.

Two layers wrap each raw call (``_ffi.fwd_call`` / ``_ffi.bwd_call``):

* ``custom_vmap``: a vmapped call folds the mapped axis into the batch axis and calls the kernel
  once (nested vmaps fold one after another). Unmapped operands are broadcast along the new axis.
* ``custom_partitioning`` (GSPMD and Shardy): batch and heads shard with no communication. Heads
  shard only when the mesh axes divide ``num_kv_heads`` too, so every shard holds whole GQA groups;
  otherwise heads are gathered. The sequence and head_dim axes are always gathered (replicated)
  before the call: attention needs every key for every query, so an input sharded along the
  sequence is all-gathered and the result is still exact.

The mask operands (lengths ``[B]`` and segment ids ``[B, Sq]`` / ``[B, Sk]``, int32) ride along:
vmap folds them into the batch like the rest, and they shard with the batch (their sequence axis,
like the others', is gathered).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from jax_dash import _ffi

# Shardy rules. b: batch, s/t: query/key sequence, h/k: query/kv heads, d: head_dim.
# The four mask operands follow q, k, v (and dout): q_seq_lengths, kv_seq_lengths [b],
# q_segment_ids [b s], kv_segment_ids [b t].
_MASK_RULE = "b, b, b s, b t"
_FWD_RULE = f"b s h d, b t k d, b t k d, {_MASK_RULE} -> b s h d, b h s"
_BWD_RULE = (f"b s h d, b t k d, b t k d, b s h d, b h s, b s h d, {_MASK_RULE} "
             "-> b s h d, b t k d, b t k d")
# Listed in order of first appearance in the rules, as Shardy requires.
_REPLICATED_FACTORS = ("s", "d", "t")


def _axes_size(mesh, axes) -> int:
    if axes is None:
        return 1
    if isinstance(axes, str):
        axes = (axes,)
    return math.prod(mesh.shape[a] for a in axes)


def _spec_entry(sharding, dim):
    if not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * 8
    return spec[dim]


def _plan(mesh, q_shape, k_shape, q_sharding):
    """Mesh axes for (batch, heads), taken from the query's sharding; None = replicated."""
    batch_axes = _spec_entry(q_sharding, 0)
    head_axes = _spec_entry(q_sharding, 2)
    if batch_axes is not None and q_shape[0] % _axes_size(mesh, batch_axes):
        batch_axes = None
    heads_split = _axes_size(mesh, head_axes)
    if head_axes is not None and (q_shape[2] % heads_split or k_shape[2] % heads_split):
        head_axes = None  # a shard must hold whole GQA groups
    return batch_axes, head_axes


def _seq_spec(mesh, batch_axes, head_axes):
    """[B, S, H, D] arrays."""
    return NamedSharding(mesh, PartitionSpec(batch_axes, None, head_axes, None))


def _lse_spec(mesh, batch_axes, head_axes):
    """[B, H, S] arrays."""
    return NamedSharding(mesh, PartitionSpec(batch_axes, head_axes, None))


def _mask_specs(mesh, batch_axes):
    """Lengths [B] and segment ids [B, S]: sharded with the batch."""
    lengths = NamedSharding(mesh, PartitionSpec(batch_axes))
    segments = NamedSharding(mesh, PartitionSpec(batch_axes, None))
    return (lengths, lengths, segments, segments)


def _fold_vmapped(axis_size, in_batched, args):
    """Moves a vmapped axis (leading, per custom_vmap) into the batch axis of every operand."""
    folded = []
    for x, batched in zip(args, in_batched):
        if not batched:
            x = jnp.broadcast_to(x[None], (axis_size,) + x.shape)
        folded.append(x.reshape((axis_size * x.shape[1],) + x.shape[2:]))
    return folded


def _unfold(axis_size, outs):
    return tuple(o.reshape((axis_size, o.shape[0] // axis_size) + o.shape[1:]) for o in outs)


def _vmapped_call(op, axis_size, in_batched, args):
    """``op`` over a vmapped axis: folded into the batch, called once, unfolded. A size-0 axis
    runs no kernel (its batch size could not be unfolded again) and gives empty results shaped
    like ``op`` on one element."""
    if axis_size == 0:
        one = [jax.ShapeDtypeStruct(x.shape[1:] if batched else x.shape, x.dtype)
               for x, batched in zip(args, in_batched)]
        return tuple(jnp.zeros((0,) + o.shape, o.dtype) for o in jax.eval_shape(op, *one))
    return _unfold(axis_size, op(*_fold_vmapped(axis_size, in_batched, args)))


def _with_default_mask(op, num_tensor_args):
    """``op(q, k, v, ..., *mask_arrays)`` where the four mask operands may be left out (callers
    without lengths or segments, e.g. the ring)."""

    def call(*args):
        if len(args) == num_tensor_args:
            args = args + tuple(_ffi.default_mask_arrays(args[0], args[1]))
        return op(*args)

    return call


@functools.lru_cache(maxsize=None)
def forward_op(scale: float, is_causal: bool, mask: _ffi.StaticMask = _ffi.NO_MASK):
    """``(q, k, v[, q_lengths, kv_lengths, q_segment_ids, kv_segment_ids]) -> (out, lse)`` for
    4-D inputs, batchable and partitionable."""

    @custom_partitioning
    def partitioned(q, k, v, *mask_arrays):
        return _ffi.fwd_call(q, k, v, scale, is_causal, mask=mask, mask_arrays=mask_arrays)

    def infer(mesh, arg_shapes, result_shape):
        batch_axes, head_axes = _plan(mesh, arg_shapes[0].shape, arg_shapes[1].shape,
                                      arg_shapes[0].sharding)
        return (_seq_spec(mesh, batch_axes, head_axes), _lse_spec(mesh, batch_axes, head_axes))

    def partition(mesh, arg_shapes, result_shape):
        batch_axes, head_axes = _plan(mesh, arg_shapes[0].shape, arg_shapes[1].shape,
                                      arg_shapes[0].sharding)
        seq = _seq_spec(mesh, batch_axes, head_axes)
        outs = (seq, _lse_spec(mesh, batch_axes, head_axes))

        def lower(q, k, v, *mask_arrays):
            return _ffi.fwd_call(q, k, v, scale, is_causal, mask=mask, mask_arrays=mask_arrays)

        return mesh, lower, outs, (seq, seq, seq) + _mask_specs(mesh, batch_axes)

    partitioned.def_partition(
        partition=partition, infer_sharding_from_operands=infer, sharding_rule=_FWD_RULE,
        need_replication_factors=_REPLICATED_FACTORS)

    @jax.custom_batching.custom_vmap
    def op(q, k, v, q_lengths, kv_lengths, q_segments, kv_segments):
        return partitioned(q, k, v, q_lengths, kv_lengths, q_segments, kv_segments)

    @op.def_vmap
    def op_vmap(axis_size, in_batched, *args):
        return _vmapped_call(op, axis_size, in_batched, args), (True, True)

    return _with_default_mask(op, 3)


@functools.lru_cache(maxsize=None)
def backward_op(scale: float, is_causal: bool, schedule: str,
                mask: _ffi.StaticMask = _ffi.NO_MASK):
    """``(q, k, v, out, lse, dout[, mask arrays]) -> (dq, dk, dv)`` for 4-D inputs."""

    @custom_partitioning
    def partitioned(q, k, v, out, lse, dout, *mask_arrays):
        return _ffi.bwd_call(q, k, v, out, lse, dout, scale, is_causal, schedule, mask=mask,
                             mask_arrays=mask_arrays)

    def infer(mesh, arg_shapes, result_shape):
        batch_axes, head_axes = _plan(mesh, arg_shapes[0].shape, arg_shapes[1].shape,
                                      arg_shapes[0].sharding)
        seq = _seq_spec(mesh, batch_axes, head_axes)
        return (seq, seq, seq)

    def partition(mesh, arg_shapes, result_shape):
        batch_axes, head_axes = _plan(mesh, arg_shapes[0].shape, arg_shapes[1].shape,
                                      arg_shapes[0].sharding)
        seq = _seq_spec(mesh, batch_axes, head_axes)
        lse = _lse_spec(mesh, batch_axes, head_axes)

        def lower(q, k, v, out, lse_, dout, *mask_arrays):
            return _ffi.bwd_call(q, k, v, out, lse_, dout, scale, is_causal, schedule, mask=mask,
                                 mask_arrays=mask_arrays)

        return (mesh, lower, (seq, seq, seq),
                (seq, seq, seq, seq, lse, seq) + _mask_specs(mesh, batch_axes))

    partitioned.def_partition(
        partition=partition, infer_sharding_from_operands=infer, sharding_rule=_BWD_RULE,
        need_replication_factors=_REPLICATED_FACTORS)

    @jax.custom_batching.custom_vmap
    def op(q, k, v, out, lse, dout, q_lengths, kv_lengths, q_segments, kv_segments):
        return partitioned(q, k, v, out, lse, dout, q_lengths, kv_lengths, q_segments,
                           kv_segments)

    @op.def_vmap
    def op_vmap(axis_size, in_batched, *args):
        return _vmapped_call(op, axis_size, in_batched, args), (True, True, True)

    return _with_default_mask(op, 6)
