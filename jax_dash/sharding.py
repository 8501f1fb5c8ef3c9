"""Batching and partitioning of the raw FFI calls.

Two layers wrap each raw call (``_ffi.fwd_call`` / ``_ffi.bwd_call``):

* ``custom_vmap``: a vmapped call folds the mapped axis into the batch axis and calls the kernel
  once (nested vmaps fold one after another). Unmapped operands are broadcast along the new axis.
  A vmapped ``scale`` (one per element) cannot share one call: the elements then run in turn.
* ``custom_partitioning`` (GSPMD and Shardy): batch and heads shard with no communication. Heads
  shard only when the mesh axes divide ``num_kv_heads`` too, so every shard holds whole GQA groups;
  otherwise heads are gathered. A query sharded along the sequence runs as a ring
  (``jax_dash.ring``, contiguous layout) over the query's sequence mesh axes: key/value blocks
  travel with ``collective-permute``, nothing is all-gathered. The ring needs both sequences to
  divide evenly over those axes (and, causal, equal lengths), devices whose kernels' float32 block
  gradients have been verified (``_ffi.F32_GRADS_PLATFORMS``: the CPU kernels and the Hopper
  kernels, checked on an H100 by tests/test_gpu_ring.py) and, for now, no mask beyond
  ``is_causal``; otherwise the sequence is gathered (replicated) before the call, which is exact
  too. head_dim is always replicated.

The mask operands (lengths ``[B]`` and segment ids ``[B, Sq]`` / ``[B, Sk]``, int32) ride along:
vmap folds them into the batch like the rest, and they shard with the batch (their sequence axis
is gathered).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from jax_dash import _ffi, ring

# Shardy rules. b: batch, s/t: query/key sequence, h/k: query/kv heads, d: head_dim. The four
# mask operands follow q, k, v (and out, lse, dout): q_seq_lengths, kv_seq_lengths [b],
# q_segment_ids [b s], kv_segment_ids [b t]; the last operand is the 0-d scale (an empty mapping).
_MASK_RULE = "b, b, b s, b t"
_FWD_RULE = f"b s h d, b t k d, b t k d, {_MASK_RULE}, -> b s h d, b h s"
_BWD_RULE = (f"b s h d, b t k d, b t k d, b s h d, b h s, b s h d, {_MASK_RULE}, "
             "-> b s h d, b t k d, b t k d")
# Listed in order of first appearance in the rules, as Shardy requires. The sequences (s, t) may
# arrive sharded: partition() runs a ring over them, or asks for them replicated.
_REPLICATED_FACTORS = ("d",)
# forward_op/backward_op are keyed by (is_causal[, schedule], static mask): bounded, since
# windows and caps are user numbers.
_OP_CACHE_SIZE = 64


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


def _plan(mesh, q_shape, k_shape, q_sharding, is_causal, mask):
    """Mesh axes for (batch, heads, sequence), taken from the query's sharding; None =
    replicated. A sharded sequence means a ring over those axes (which knows no mask beyond
    is_causal yet)."""
    batch_axes = _spec_entry(q_sharding, 0)
    head_axes = _spec_entry(q_sharding, 2)
    seq_axes = _spec_entry(q_sharding, 1)
    if batch_axes is not None and q_shape[0] % _axes_size(mesh, batch_axes):
        batch_axes = None
    heads_split = _axes_size(mesh, head_axes)
    if head_axes is not None and (q_shape[2] % heads_split or k_shape[2] % heads_split):
        head_axes = None  # a shard must hold whole GQA groups
    ring_size = _axes_size(mesh, seq_axes)
    if seq_axes is not None and (ring_size == 1 or q_shape[1] % ring_size
                                 or k_shape[1] % ring_size
                                 or (is_causal and q_shape[1] != k_shape[1])
                                 or mask != _ffi.NO_MASK or not _ring_runs_on(mesh)):
        seq_axes = None  # no even ring: gather the sequence
    return batch_axes, head_axes, seq_axes


def _ring_runs_on(mesh) -> bool:
    """Whether the ring's backward (float32 block gradients) is verified on the mesh's devices
    (``_ffi.F32_GRADS_PLATFORMS``); elsewhere (an abstract mesh, another platform) a sharded
    sequence is gathered instead."""
    try:
        device = np.asarray(mesh.devices).flat[0]
    except (AttributeError, IndexError, TypeError, ValueError):  # an abstract mesh: no devices
        return False
    return getattr(device, "platform", None) in _ffi.F32_GRADS_PLATFORMS


def _seq_spec(mesh, batch_axes, head_axes, seq_axes):
    """[B, S, H, D] arrays."""
    return NamedSharding(mesh, PartitionSpec(batch_axes, seq_axes, head_axes, None))


def _lse_spec(mesh, batch_axes, head_axes, seq_axes):
    """[B, H, S] arrays."""
    return NamedSharding(mesh, PartitionSpec(batch_axes, head_axes, seq_axes))


def _mask_specs(mesh, batch_axes):
    """Lengths [B] and segment ids [B, S]: sharded with the batch (sequence replicated)."""
    lengths = NamedSharding(mesh, PartitionSpec(batch_axes))
    segments = NamedSharding(mesh, PartitionSpec(batch_axes, None))
    return (lengths, lengths, segments, segments)


def _ring_config(mesh, seq_axes, is_causal, schedule):
    """The ring over the sequence's mesh axes, or None where the sequence is not sharded."""
    if seq_axes is None:
        return None
    return ring.RingConfig.contiguous(seq_axes, _axes_size(mesh, seq_axes), is_causal, schedule)


def _replicated(mesh):
    """The 0-d scale: on every device."""
    return NamedSharding(mesh, PartitionSpec())


def _fold_vmapped(axis_size, in_batched, args):
    """Moves a vmapped axis (leading, per custom_vmap) into the batch axis of every operand but the
    scale (last, passed through: callers fold only when it is not batched)."""
    *arrays, scale = args
    folded = []
    for x, batched in zip(arrays, in_batched):
        if not batched:
            x = jnp.broadcast_to(x[None], (axis_size,) + x.shape)
        folded.append(x.reshape((axis_size * x.shape[1],) + x.shape[2:]))
    return folded + [scale]


def _unfold(axis_size, outs):
    return tuple(o.reshape((axis_size, o.shape[0] // axis_size) + o.shape[1:]) for o in outs)


def _vmapped_call(op, axis_size, in_batched, args):
    """``op`` over a vmapped axis: folded into the batch, called once, unfolded. A size-0 axis
    runs no kernel (its batch size could not be unfolded again) and gives empty results shaped
    like ``op`` on one element. A vmapped scale (one per element) cannot share a call, so then
    the elements run one after another (``lax.map``)."""
    if axis_size == 0:
        one = [jax.ShapeDtypeStruct(x.shape[1:] if batched else x.shape, x.dtype)
               for x, batched in zip(args, in_batched)]
        return tuple(jnp.zeros((0,) + o.shape, o.dtype) for o in jax.eval_shape(op, *one))
    if in_batched[-1]:
        stacked = [x if batched else jnp.broadcast_to(x[None], (axis_size,) + x.shape)
                   for x, batched in zip(args, in_batched)]
        return _map_elements(op, stacked)
    return _unfold(axis_size, op(*_fold_vmapped(axis_size, in_batched, args)))


@functools.partial(jax.jit, static_argnums=0)
def _map_elements(op, stacked):
    """``op`` on one element after another (``lax.map``), jitted: eagerly, ``lax.map`` compiles a
    new program on every call (jax 0.10), a jitted one once per op and shapes."""
    return tuple(jax.lax.map(lambda xs: op(*xs), stacked))


def _with_default_mask(op, num_tensor_args):
    """``op(q, k, v, ..., *mask_arrays, scale)`` where the four mask operands may be left out
    (callers without lengths or segments)."""
    def call(*args):
        if len(args) == num_tensor_args + 1:
            args = (args[:-1] + tuple(_ffi.default_mask_arrays(args[0], args[1]))
                    + (args[-1],))
        return op(*args)
    return call


@functools.lru_cache(maxsize=_OP_CACHE_SIZE)
def forward_op(is_causal: bool, mask: _ffi.StaticMask = _ffi.NO_MASK):
    """``(q, k, v[, q_lengths, kv_lengths, q_segment_ids, kv_segment_ids], scale) -> (out, lse)``
    for 4-D inputs and a 0-d float32 scale, batchable and partitionable."""

    @custom_partitioning
    def partitioned(q, k, v, *rest):
        *mask_arrays, scale = rest
        return _ffi.fwd_call(q, k, v, scale, is_causal, mask=mask, mask_arrays=mask_arrays)

    def infer(mesh, arg_shapes, result_shape):
        axes = _plan(mesh, arg_shapes[0].shape, arg_shapes[1].shape, arg_shapes[0].sharding,
                     is_causal, mask)
        return (_seq_spec(mesh, *axes), _lse_spec(mesh, *axes))

    def partition(mesh, arg_shapes, result_shape):
        axes = _plan(mesh, arg_shapes[0].shape, arg_shapes[1].shape, arg_shapes[0].sharding,
                     is_causal, mask)
        seq = _seq_spec(mesh, *axes)
        outs = (seq, _lse_spec(mesh, *axes))
        ring_config = _ring_config(mesh, axes[2], is_causal, "auto")

        def lower(q, k, v, *rest):
            *mask_arrays, scale = rest
            if ring_config is not None:  # no mask beyond is_causal (_plan)
                return ring.ring_forward(q, k, v, scale, ring_config)
            return _ffi.fwd_call(q, k, v, scale, is_causal, mask=mask, mask_arrays=mask_arrays)

        return (mesh, lower, outs,
                (seq, seq, seq) + _mask_specs(mesh, axes[0]) + (_replicated(mesh),))

    partitioned.def_partition(
        partition=partition, infer_sharding_from_operands=infer, sharding_rule=_FWD_RULE,
        need_replication_factors=_REPLICATED_FACTORS)

    @jax.custom_batching.custom_vmap
    def op(q, k, v, q_lengths, kv_lengths, q_segments, kv_segments, scale):
        return partitioned(q, k, v, q_lengths, kv_lengths, q_segments, kv_segments, scale)

    @op.def_vmap
    def op_vmap(axis_size, in_batched, *args):
        return _vmapped_call(op, axis_size, in_batched, args), (True, True)

    return _with_default_mask(op, 3)


@functools.lru_cache(maxsize=_OP_CACHE_SIZE)
def backward_op(is_causal: bool, schedule: str, mask: _ffi.StaticMask = _ffi.NO_MASK):
    """``(q, k, v, out, lse, dout[, mask arrays], scale) -> (dq, dk, dv)`` for 4-D inputs."""

    @custom_partitioning
    def partitioned(q, k, v, out, lse, dout, *rest):
        *mask_arrays, scale = rest
        return _ffi.bwd_call(q, k, v, out, lse, dout, scale, is_causal, schedule, mask=mask,
                             mask_arrays=mask_arrays)

    def infer(mesh, arg_shapes, result_shape):
        axes = _plan(mesh, arg_shapes[0].shape, arg_shapes[1].shape, arg_shapes[0].sharding,
                     is_causal, mask)
        seq = _seq_spec(mesh, *axes)
        return (seq, seq, seq)

    def partition(mesh, arg_shapes, result_shape):
        axes = _plan(mesh, arg_shapes[0].shape, arg_shapes[1].shape, arg_shapes[0].sharding,
                     is_causal, mask)
        seq = _seq_spec(mesh, *axes)
        lse = _lse_spec(mesh, *axes)
        ring_config = _ring_config(mesh, axes[2], is_causal, schedule)

        def lower(q, k, v, out, lse_, dout, *rest):
            *mask_arrays, scale = rest
            if ring_config is not None:  # no mask beyond is_causal (_plan)
                return ring.ring_backward(q, k, v, out, lse_, dout, scale, ring_config)
            return _ffi.bwd_call(q, k, v, out, lse_, dout, scale, is_causal, schedule, mask=mask,
                                 mask_arrays=mask_arrays)

        return (mesh, lower, (seq, seq, seq),
                (seq, seq, seq, seq, lse, seq) + _mask_specs(mesh, axes[0]) + (_replicated(mesh),))

    partitioned.def_partition(
        partition=partition, infer_sharding_from_operands=infer, sharding_rule=_BWD_RULE,
        need_replication_factors=_REPLICATED_FACTORS)

    @jax.custom_batching.custom_vmap
    def op(q, k, v, out, lse, dout, q_lengths, kv_lengths, q_segments, kv_segments, scale):
        return partitioned(q, k, v, out, lse, dout, q_lengths, kv_lengths, q_segments,
                           kv_segments, scale)

    @op.def_vmap
    def op_vmap(axis_size, in_batched, *args):
        return _vmapped_call(op, axis_size, in_batched, args), (True, True, True)

    return _with_default_mask(op, 6)
