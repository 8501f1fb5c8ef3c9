"""Context parallelism: deterministic ring attention over a sequence-sharded mesh axis.

Each of the P devices on the ring axis holds one block of the sequence of the query, the key and
the value. The key/value blocks travel around the ring with ``ppermute`` (device ``i`` sends to
``i + 1``), so at step ``t`` device ``i`` holds the block that started on device ``i - t``. Every
step computes one block pair with the single-device kernels (``_ffi.fwd_call`` / ``_ffi.bwd_call``):

* forward: each block's output and log-sum-exp are merged into a float32 running output and lse,
  step 0 (the device's own, diagonal block) first, then the steps in ring order;
* backward: given the *global* output and lse, the backward of one block pair yields exactly that
  pair's dQ, dK and dV contributions (float32, ``f32_grads``), which its kernels add into the
  ring's float32 sums in place (``_ffi.bwd_call(..., sums=...)``: the sums are operands aliased to
  the gradients; same bits as adding the contributions outside, ``_ACCUMULATE = False``). dQ is
  summed on the device in step order; dK and dV sums travel with their key/value block around
  the ring and come home after P steps, having summed the contributions of devices
  ``j, j+1, ..., j-1`` in that order. Every sum has a fixed order, so the gradients are bitwise
  identical run to run.

The next block's ``ppermute`` is issued before the current block is computed, so XLA can overlap
that transfer with the kernel (a step's kernel waits for the dK/dV sums it adds into).

Causal masks use global positions. With ``layout="contiguous"`` device ``i`` holds tokens
``[i*L, (i+1)*L)``: step 0 uses the causal kernel, a block from an earlier device the full kernel,
and a block from a later device is skipped (``lax.cond`` on the device index), so device ``P-1``
computes P blocks and device 0 one. ``layout="zigzag"`` balances this: the sequence is cut into 2P
chunks and device ``i`` holds chunks ``i`` and ``2P-1-i`` (``zigzag`` / ``unzigzag`` reorder a
global array into and out of that placement); every step after the first is then half a block pair
of full-mask work on every device.

Dropout (``dropout_rate``/``dropout_rng``) gives every kernel call the global coordinates of its
first query and key (``_DeviceDropout``), so the ring applies ``jax_dash.attention``'s mask of the
global problem. Under zigzag a call's rows or columns must then lie in one chunk: a block pair
runs chunk pair by chunk pair (``_zigzag_pairs``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_dash import _ffi, dropout
from jax_dash._args import (SCHEDULES, _as_array, _auto_schedule, _check_dtypes, _check_scale,
                            _check_shapes)

LAYOUTS = ("contiguous", "zigzag")


def ring_attention(query, key, value, *, axis_name, is_causal=False, scale=None, schedule="auto",
                   layout="contiguous", head_groups="auto", dropout_rate=0.0, dropout_rng=None,
                   dropout_axes=None, dropout_offsets=None):
    """``jax_dash.attention`` of a sequence sharded over the mesh axis ``axis_name``, for use
    inside ``shard_map``; gradients are bitwise reproducible.

    Args:
      query: this device's block ``[batch, seq_q / P, num_heads, head_dim]`` (or without batch).
      key, value: this device's blocks ``[batch, seq_kv / P, num_kv_heads, head_dim]``.
      axis_name: the mesh axis (or tuple of axes) the sequence is sharded over; the ring has
        ``P = axis_size(axis_name)`` devices and device ``i`` holds block ``i``.
      is_causal: top-left causal mask over *global* positions; needs ``seq_q == seq_kv``.
      scale: softmax scale, default ``1 / sqrt(head_dim)``.
      schedule: the backward schedule of every block pair (``jax_dash.SCHEDULES``); ``"auto"``
        picks what ``jax_dash.attention`` picks for the global (unsharded) problem.
      layout: ``"contiguous"`` (device ``i`` holds tokens ``[i*L, (i+1)*L)``) or ``"zigzag"``
        (device ``i`` holds chunks ``i`` and ``2P-1-i`` of ``2P``; see ``zigzag``). The causal
        mask and the dropout mask's coordinates depend on it.
      head_groups: the heads run in this many groups, one group's ring after the other, so that
        one group's float32 state is alive at a time (less memory, a few percent more time; the
        same bits for every value). ``"auto"`` (``jax_dash.ring.head_groups``): enough groups to
        bring the ring's float32 state under 1.5 float32 copies of the query block, only for
        blocks of >= 2^18 query rows (batch x tokens x heads); 1 runs all heads at once (the
        fastest, the most memory). Must divide the key/value heads.
      dropout_rate, dropout_rng: attention dropout as in ``jax_dash.attention``: the mask is the
        one ``jax_dash.attention`` applies to the global (unsharded) problem with the same key
        and rate (``jax_dash.dropout_keep_mask`` at global positions: each block pair's kernels
        get its global query and key offsets, per zigzag chunk), on the CPU and Hopper kernels. With
        ``layout="zigzag"`` every block pair is computed chunk pair by chunk pair (so the
        per-device sequence must be even), which changes the bits against ``zigzag`` without
        dropout (not the mask).
      dropout_axes: ``(batch_axis, head_axis)``: the mesh axes (besides ``axis_name``) the batch
        and heads are sharded over, None for an unsharded one, as in ``jax_dash.attention``;
        needed where the blocks vary over such axes.
      dropout_offsets: ``(batch, head, q, kv)``: the global coordinates of the ring's problem's
        element ``(0, 0, 0, 0)`` (the ring adds each block's sequence offsets); instead of
        ``dropout_axes``.

    Returns:
      This device's block of the output, shaped and typed like ``query``.
    """
    return _ring_attention(query, key, value, axis_name, is_causal, scale, schedule, layout,
                           _ACCUMULATE, head_groups, dropout_rate, dropout_rng, dropout_axes,
                           dropout_offsets)


def _ring_attention(query, key, value, axis_name, is_causal, scale, schedule, layout, accumulate,
                    groups, dropout_rate=0.0, dropout_rng=None, dropout_axes=None,
                    dropout_offsets=None):
    query, key, value = (_as_array(x, name) for x, name in
                         ((query, "query"), (key, "key"), (value, "value")))
    _check_shapes(query, key, value)
    _check_dtypes(query, key, value)
    scale = _check_scale(scale, query.shape[-1], allowed=_SCALE_ALLOWED)
    _check_options(is_causal, schedule, layout)
    threshold = dropout.dropout_threshold(dropout_rate)  # checks the rate
    axis_name = _check_axis_name(axis_name)
    axis_size = _bound_axis_size(axis_name)
    _check_blocks(query.shape[-3], key.shape[-3], bool(is_causal), layout, dropout_rate > 0)
    groups = _check_head_groups(groups, key.shape[-2])

    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    ring_axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    if dropout_rate > 0:
        if not accumulate:
            raise ValueError("the ring applies dropout with the accumulating backward only "
                             "(jax_dash.ring._ACCUMULATE = True)")
        offsets = dropout.block_offsets(query, key, dropout_offsets, dropout_axes,
                                        ring_axes=ring_axes)
        key_words = jnp.stack(dropout.dropout_key_words(dropout_rng)).astype(jnp.uint32)
        drop = (key_words, offsets)
        drop_static = (threshold, 1.0 / (1.0 - float(dropout_rate)))
    else:  # unused, but a wrong argument is wrong at any rate
        dropout.check_offset_arguments(dropout_offsets, dropout_axes, ring=True)
        drop, drop_static = (), None
    if schedule == "auto":
        # Chosen from the global problem, as jit(attention) on sharded inputs chooses it, so the
        # two paths to the ring give the same bits.
        # A name, or ((platform, name), ...) when the choice depends on the platform.
        schedule = _auto_schedule(
            jax.ShapeDtypeStruct(_global_shape(query.shape, axis_size), query.dtype),
            jax.ShapeDtypeStruct(_global_shape(key.shape, axis_size), key.dtype), bool(is_causal))
    config = RingConfig(axis_name, axis_size, bool(is_causal), schedule, layout, accumulate,
                        groups, drop_static)
    out = _ring(query, key, value, drop, float(scale), config)
    return out[0] if unbatched else out


_SCALE_ALLOWED = "a Python number (ring_attention takes no traced scale)"


def _check_head_groups(head_groups, kv_heads):
    """``head_groups`` as RingConfig takes it: None for "auto" (or _HEAD_GROUPS where a test or
    benchmark set it), else a positive int dividing the key/value heads."""
    if isinstance(head_groups, str) and head_groups == "auto":
        return _HEAD_GROUPS
    if isinstance(head_groups, (bool, np.bool_)) or not isinstance(head_groups,
                                                                   (int, np.integer)):
        raise TypeError(f"head_groups must be 'auto' or a positive int, got {head_groups!r}")
    if head_groups < 1 or kv_heads % head_groups:
        raise ValueError(f"head_groups={head_groups} must be a positive divisor of the "
                         f"{kv_heads} key/value heads (a group keeps whole GQA groups), or 'auto'")
    return int(head_groups)


def _check_options(is_causal, schedule, layout):
    """The static options of ``ring_attention`` (TypeError / ValueError naming the argument)."""
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a Python bool, got {is_causal!r} "
                        f"(type {type(is_causal).__name__})")
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not one of {', '.join(SCHEDULES)}")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")


# Whether the backward's kernels add each block pair's gradients into the float32 sums in place
# (``_ffi.bwd_call(..., sums=...)``); False runs the earlier formulation (the kernels return the
# contributions, XLA adds them), which gives the same bits with more memory. Read when a ring is
# traced; private (the tests compare the two, a benchmark may).
_ACCUMULATE = True


@dataclasses.dataclass(frozen=True)
class RingConfig:
    """Everything about a ring call that is not an array (hashable: a custom_vjp static)."""
    axis_name: str | tuple[str, ...]
    axis_size: int
    is_causal: bool
    schedule: str | tuple  # a name, or ((platform, name), ...): "auto" chose per platform
    layout: str
    accumulate: bool = True  # the backward adds into the sums in place (_ACCUMULATE)
    head_groups: int | None = None  # None: head_groups() of the blocks; else _HEAD_GROUPS
    # Attention dropout: None, or (threshold, 1 / (1 - rate)); the key and the offsets of the
    # ring's problem are arrays, passed beside the config (``drop``).
    dropout: tuple[int, float] | None = None

    @classmethod
    def contiguous(cls, axis_name, axis_size: int, is_causal: bool, schedule) -> "RingConfig":
        """The ring the jit path runs over a sequence sharded on ``axis_name`` (``sharding.py``'s
        partitioning rule): contiguous layout, accumulating as ``ring_attention`` does."""
        return cls(axis_name, axis_size, bool(is_causal), schedule, "contiguous", _ACCUMULATE,
                   _HEAD_GROUPS)


def _global_shape(block_shape, axis_size):
    batch, seq, heads, head_dim = block_shape
    return (batch, seq * axis_size, heads, head_dim)


def _check_axis_name(axis_name):
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    if axis_name is None or not names or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"axis_name must name the mesh axis the sequence is sharded over (a str, or a tuple "
            f"of str), got {axis_name!r}; call ring_attention inside shard_map, e.g. "
            "ring_attention(q, k, v, axis_name='seq')")
    return axis_name


def _bound_axis_size(axis_name) -> int:
    try:
        return int(jax.lax.axis_size(axis_name))
    except NameError as exc:
        raise ValueError(
            f"axis_name={axis_name!r} is not bound here: ring_attention must run inside shard_map "
            "(or another map) over a mesh that has that axis, with the sequence sharded over it, "
            "e.g. shard_map(f, mesh=mesh, in_specs=P(None, 'seq'), out_specs=P(None, 'seq'))"
        ) from exc


def _check_blocks(seq_q: int, seq_kv: int, is_causal: bool, layout: str, has_dropout=False):
    """The ring's constraints on one device's blocks (ValueError naming the argument)."""
    if is_causal and seq_q != seq_kv:
        raise ValueError(
            f"key has {seq_kv} tokens per device but query has {seq_q}: with is_causal=True the "
            "ring needs query and key blocks of the same length (the causal mask compares global "
            "positions block by block); shard equal-length sequences")
    if layout == "zigzag" and is_causal and seq_q % 2:
        raise ValueError(
            f"layout='zigzag' puts two equal chunks on each device, so the per-device sequence "
            f"must be even, got query with {seq_q} tokens per device (the global sequence must be "
            "a multiple of 2 * axis_size)")
    if layout == "zigzag" and has_dropout and (seq_q % 2 or seq_kv % 2):
        raise ValueError(
            f"layout='zigzag' with dropout draws the mask chunk by chunk (each device holds two "
            f"chunks), so the per-device sequences must be even, got query with {seq_q} and key "
            f"with {seq_kv} tokens per device (the global sequences must be multiples of "
            "2 * axis_size)")


# ---- head groups ------------------------------------------------------------------------------

# Heads are independent: every sum of the ring is within one head (GQA: within one key/value head
# and its group of query heads). So the ring can run its heads in groups, one group's whole ring
# after the other (a while loop: the next group starts when the previous one is done), and the
# float32 state of a ring (the forward's running output; the backward's dQ/dK/dV sums, the dK/dV
# sums in transit, the kernel's dQ accumulator) is alive for one group at a time. The bits are
# those of one ring over all heads: the same kernels with the same schedule run on the same
# per-head data, with fewer heads per call (tests/test_ring.py checks it bitwise).
#
# Each group costs time: measured on 4 x H200 (zigzag, 128k tokens, 16 heads,
# benchmarks/results/2026-11-26-4xgpu-ring/): 2 / 4 / 8 groups took 1.045x / 1.025x / 1.17x the
# time of one at P = 2 and 1.045x / 1.07x at P = 4 (2 and 4 groups), for peak memory per GPU
# 0.79x / 0.59x / 0.49x one GPU's (one ring: 0.89x) at P = 2 and 0.41x / 0.30x (0.50x) at P = 4.
# So "auto" takes the fewest groups that bring the ring's float32 state (the backward's dQ sum and
# the kernel's dQ accumulator, two query blocks; the dK/dV sums and those in transit, four key
# blocks) under _FLOAT32_BLOCKS float32 query blocks, and groups only blocks of at least
# 2 * _GROUP_ROWS query rows (batch x tokens x heads), each group keeping _GROUP_ROWS.
_FLOAT32_BLOCKS = 1.5
_GROUP_ROWS = 1 << 17

# The number of head groups of head_groups="auto" when not None (tests of the jit path, whose
# partitioning rule runs "auto", and benchmarks; read when a ring is traced).
_HEAD_GROUPS = None


def head_groups(q_shape, k_shape) -> int:
    """The number of head groups ``head_groups="auto"`` runs for blocks shaped ``q_shape`` /
    ``k_shape`` (``[batch, tokens, heads, head_dim]`` per device): the fewest that divide the
    key/value heads and bring the ring's float32 state (about ``2 * heads + 4 * kv_heads`` float32
    heads of the block) to at most 1.5 float32 query blocks, keeping 2^17 query rows per group;
    1 below 2^18 query rows."""
    batch, seq, heads, _ = q_shape
    kv_heads = k_shape[2]
    rows = batch * seq * heads
    if rows < 2 * _GROUP_ROWS:
        return 1
    allowed = [g for g in range(1, kv_heads + 1)
               if kv_heads % g == 0 and rows // g >= _GROUP_ROWS]
    enough = [g for g in allowed if 2 * heads + 4 * kv_heads <= _FLOAT32_BLOCKS * heads * g]
    return min(enough) if enough else max(allowed)


def _groups_for(config, q_shape, k_shape) -> int:
    groups = config.head_groups or head_groups(q_shape, k_shape)
    if k_shape[2] % groups:
        raise ValueError(f"head_groups={groups} does not divide the {k_shape[2]} key/value heads")
    return groups


_HEAD_AXIS = {"q": 2, "kv": 2, "lse": 1}  # query heads of out/dout too; lse is [B, H, S]


def _in_head_groups(config, groups, fn, args, kinds, results, result_kinds, homeward=0):
    """``fn`` run on ``groups`` groups of heads one after another: ``fn(g, *parts)`` gets group
    g's index (traced in the loop) and its part of every array of ``args`` (whose head axes
    ``kinds`` names: "q", "kv" or "lse") and returns its part of every result (``results``:
    ShapeDtypeStructs of the whole results, head axes named by ``result_kinds``), written in place
    into the whole results.

    ``homeward`` > 0 pipelines the last hop of the last ``homeward`` results (the backward's dK/dV
    on their way home) into the next group: ``fn(g, *parts, pending)`` also gets the previous
    group's parts of those results as it returned them (``pending``; zeros for group 0, whose
    transfer is wasted), sends them one device along the ring in its first K/V packet, and
    returns ``(*parts, arrived)``; ``arrived`` (``pending`` after the hop) is written at the
    previous group's place, and the last group's pending parts go home after the loop. So group
    g's hop home overlaps group g + 1's first kernel instead of ending g's iteration with nothing
    to hide it.

    A while loop, except in ``simulate``: there the ring's axis is a ``vmap`` axis, which JAX
    (0.10) does not bind inside a loop traced in a custom_vjp's forward under ``vjp``; the groups
    are then unrolled, each one's operands cut after an optimization barrier on the previous
    group's results (the same computations, so the same bits)."""
    def part(x, kind, group):
        axis = _HEAD_AXIS[kind]
        size = x.shape[axis] // groups
        return jax.lax.dynamic_slice_in_dim(x, group * size, size, axis)

    def put(whole, parts, kinds, group):
        return tuple(
            jax.lax.dynamic_update_slice_in_dim(w, p, group * p.shape[_HEAD_AXIS[kind]],
                                                _HEAD_AXIS[kind])
            for w, p, kind in zip(whole, parts, kinds))

    split = len(results) - homeward
    home_kinds = result_kinds[split:]

    def body(group, state):
        whole, pending = state
        parts = tuple(part(x, kind, group) for x, kind in zip(args, kinds))
        if not homeward:
            return put(whole, fn(group, *parts), result_kinds, group), ()
        *parts, arrived = fn(group, *parts, pending)
        # (group 0 writes the zeros' hop at group - 1 = the last group's place, overwritten
        # after the loop)
        whole = put(whole[:split], parts[:split], result_kinds[:split], group) + put(
            whole[split:], arrived, home_kinds, (group - 1) % groups)
        return whole, tuple(parts[split:])

    zeros = tuple(jnp.zeros(r.shape, r.dtype) for r in results)
    pending = tuple(part(z, kind, 0) for z, kind in zip(zeros[split:], home_kinds))
    # varying like the parts (shard_map)
    zeros, pending = (_ffi._unify_varying(*args, *x)[len(args):] for x in (zeros, pending))
    if config.axis_name != _SIMULATED_AXIS:
        whole, pending = jax.lax.fori_loop(0, groups, body, (zeros, pending))
    else:
        state = (zeros, pending)
        for group in range(groups):
            if group:
                args, state = jax.lax.optimization_barrier((args, state))
            state = body(group, state)
        whole, pending = state
    if homeward:
        whole = whole[:split] + put(whole[split:], _send(config, *pending), home_kinds,
                                    groups - 1)
    return whole


# ---- the custom_vjp ---------------------------------------------------------------------------

# ``scale`` is a Python float here (ring_attention's); the jit path's partitioning rule calls
# ring_forward/ring_backward with the op's 0-d scale operand instead.
# ``drop``: () without dropout, else (the uint32 [2] key, the int32 [4] offsets of the ring's
# problem), which have no cotangent.
@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _ring(q, k, v, drop, scale, config):
    return ring_forward(q, k, v, scale, config, drop)[0]


def _ring_fwd(q, k, v, drop, scale, config):
    out, lse = ring_forward(q, k, v, scale, config, drop)
    return out, (q, k, v, drop, out, lse)


def _ring_bwd(scale, config, residuals, dout):
    q, k, v, drop, out, lse = residuals
    grads = ring_backward(q, k, v, out, lse, dout.astype(out.dtype), scale, config, drop)
    return (*grads, jax.tree_util.tree_map(lambda _: None, drop))


_ring.defvjp(_ring_fwd, _ring_bwd)


# ---- pieces -----------------------------------------------------------------------------------

def _schedule_for(config, q_block, k_block, is_causal):
    if config.schedule != "auto":
        return config.schedule
    return _auto_schedule(q_block, k_block, is_causal)


def _send(config, *arrays):
    """Every array moves one device along the ring (device i -> i + 1). Over more than two
    devices, several arrays of one dtype travel as one packet (``_packs``)."""
    n = config.axis_size
    perm = [(i, (i + 1) % n) for i in range(n)]
    if _packs(config, *arrays) and len(arrays) > 1:
        return _unpack(jax.lax.ppermute(_pack(*arrays), config.axis_name, perm), *arrays)
    return tuple(jax.lax.ppermute(x, config.axis_name, perm) for x in arrays)


def _packs(config, *arrays):
    """Whether ``arrays`` travel as one packet: over more than two devices, one dtype. XLA's GPU
    scheduler overlaps one collective permute at a time with the computation, so a second one
    (V sent apart from K) ran on the compute stream before the step's kernel, exposed, and two
    sequential hops (dK, then dV) cost two synchronizations (a trace on four H200s). Over two
    devices the packet's copy and the kernels' operands cut from it hold one more K/V pair where
    the backward's float32 state peaks (+0.12 GiB per GPU at 128k tokens, 4 head groups: 0.59x
    -> 0.61x one GPU, measured), and each pass has a single hop to hide."""
    return config.axis_size > 2 and len({x.dtype for x in arrays}) == 1


def _block_forward(config, scale, q, k, v, is_causal, dropout=None):
    """One block pair's float32 output and its lse; ``dropout``: None, or the ``dropout``
    argument of ``_ffi.fwd_call`` (``_DeviceDropout.at``)."""
    out, lse = _ffi.fwd_call(q, k, v, scale, is_causal, dropout=dropout)
    return out.astype(jnp.float32), lse


def _block_backward(config, scale, q, k, v, out, lse, dout, is_causal, sums=None, dropout=None):
    """One block pair's float32 (dq, dk, dv) contributions, given the global out and lse; with
    ``sums`` (float32, shaped like q, k, v) the sums plus them, added by the kernels in place. A
    per-platform schedule choice runs the branch of the platform the computation lowers for.
    ``dropout`` as in ``_block_forward``."""
    schedule = _schedule_for(config, q, k, is_causal)
    arrays, dropout_static = _ffi._split_dropout(dropout)
    args = (q, k, v, out, lse, dout, scale) + (tuple(sums) if sums is not None else ()) + arrays
    if isinstance(schedule, str):
        return _block_backward_call(is_causal, schedule, dropout_static)(*args)
    branches = {platform: _block_backward_call(is_causal, name, dropout_static)
                for platform, name in schedule}
    return jax.lax.platform_dependent(*args, **branches)


@functools.lru_cache(maxsize=64)  # keyed by (is_causal, schedule name, dropout's static part)
def _block_backward_call(is_causal, schedule, dropout_static=None):
    """``_ffi.bwd_call`` of a block pair as a function of its operands (the sums, then the
    dropout arrays, last, if any); one function per key, so that ``platform_dependent`` sees the
    same branches every call."""
    def call(*args):
        args, dropout = _ffi._join_dropout(args, dropout_static)
        return _ffi.bwd_call(*args[:7], is_causal, schedule, f32_grads=True,
                             sums=args[7:] or None, dropout=dropout)

    return call


# ---- dropout: the global positions of a device's blocks ---------------------------------------

@dataclasses.dataclass(frozen=True)
class _DeviceDropout:
    """One device's view of the ring's dropout: the ``dropout`` argument of each block pair's
    kernel calls, whose offsets are the global coordinates of the pair's first query and key
    (the mask of ``jax_dash.attention`` on the global problem)."""
    config: RingConfig
    key_words: jax.Array  # uint32 [2]
    offsets: jax.Array    # int32 [4]: the ring's problem's origin, the head group's included
    device: jax.Array | int
    q_len: int            # this device's query block (tokens)
    kv_len: int

    def q_start(self, chunk=None):
        """The global position of this device's first query (``chunk``: of a zigzag chunk)."""
        return _global_start(self.config, self.device, self.q_len, chunk)

    def kv_start(self, source, chunk=None):
        """The same for the key block that started on device ``source``."""
        return _global_start(self.config, source, self.kv_len, chunk)

    def at(self, q_start, kv_start):
        shift = jnp.stack([jnp.int32(0), jnp.int32(0), jnp.asarray(q_start, jnp.int32),
                           jnp.asarray(kv_start, jnp.int32)])
        return (self.key_words, self.offsets + shift, *self.config.dropout)


def _global_start(config, owner, block_len, chunk):
    """The global position of the first token of device ``owner``'s block (contiguous), or of its
    zigzag chunk ``chunk`` (0: chunk ``owner``, 1: chunk ``2P-1-owner``, each half a block)."""
    if chunk is None:
        return owner * block_len
    half = block_len // 2
    return owner * half if chunk == 0 else (2 * config.axis_size - 1 - owner) * half


def _device_dropout(config, drop, head_start, q, k):
    """The ``_DeviceDropout`` of this device's (head group's) blocks, or None without dropout."""
    if not drop:
        return None
    key_words, offsets = drop
    device = jax.lax.axis_index(config.axis_name) if config.axis_size > 1 else 0
    offsets = offsets + jnp.stack([jnp.int32(0), jnp.asarray(head_start, jnp.int32),
                                   jnp.int32(0), jnp.int32(0)])
    return _DeviceDropout(config, key_words, offsets, device, q.shape[1], k.shape[1])


# Under zigzag with dropout a block pair is computed chunk pair by chunk pair: the kernels draw the
# mask at a call's global offsets, and a device's two chunks are not adjacent. (query chunk, key
# chunk, causal) of the pairs that exist, in the order they are computed and summed.
def _zigzag_pairs(is_causal, step, earlier=None):
    if not is_causal:
        return ((0, 0, False), (0, 1, False), (1, 0, False), (1, 1, False))
    if step == 0:  # the diagonal: our second chunk sees all of our first
        return ((0, 0, True), (1, 0, False), (1, 1, True))
    # An earlier device's first chunk is before both of ours, its second after both; a later
    # device's chunks are both after our first chunk and before our second.
    return ((0, 0, False), (1, 0, False)) if earlier else ((1, 0, False), (1, 1, False))


def _chunk(x, chunk, axis=1):
    """Zigzag chunk 0 or 1 (the first or second half) of x along the sequence axis."""
    half = x.shape[axis] // 2
    return jax.lax.slice_in_dim(x, chunk * half, (chunk + 1) * half, axis=axis)


def _zigzag_dropout_forward(config, scale, drop, step, q, kb, vb, state):
    """The forward state (float32 out, lse) after the zigzag block pair of ``step`` with dropout,
    merged chunk pair by chunk pair (``state`` None at step 0)."""
    source = (drop.device - step) % config.axis_size

    def visit(pairs, state):
        parts = [None, None] if state is None else [
            (_chunk(state[0], c), _chunk(state[1], c, axis=2)) for c in (0, 1)]
        for qc, kc, causal in pairs:
            block = _block_forward(config, scale, _chunk(q, qc), _chunk(kb, kc), _chunk(vb, kc),
                                   causal, drop.at(drop.q_start(qc), drop.kv_start(source, kc)))
            parts[qc] = block if parts[qc] is None else merge(*parts[qc], *block)
        return (jnp.concatenate([parts[0][0], parts[1][0]], axis=1),
                jnp.concatenate([parts[0][1], parts[1][1]], axis=2))

    if step == 0 or not config.is_causal:
        return visit(_zigzag_pairs(config.is_causal, step), state)
    return jax.lax.cond(source < drop.device,
                        lambda *s: visit(_zigzag_pairs(True, step, earlier=True), s),
                        lambda *s: visit(_zigzag_pairs(True, step, earlier=False), s), *state)


def _zigzag_dropout_sums(config, scale, drop, step, q, kb, vb, out, lse, dout, sums):
    """The float32 sums (dq, dk, dv) after the zigzag block pair of ``step`` with dropout is
    added to them, chunk pair by chunk pair, by the kernels in place (each chunk of a sum cut,
    added into and written back)."""
    source = (drop.device - step) % config.axis_size

    def visit(pairs, dq, dk, dv):
        for qc, kc, causal in pairs:
            dq_c, dk_c, dv_c = _block_backward(
                config, scale, _chunk(q, qc), _chunk(kb, kc), _chunk(vb, kc), _chunk(out, qc),
                _chunk(lse, qc, axis=2), _chunk(dout, qc), causal,
                (_chunk(dq, qc), _chunk(dk, kc), _chunk(dv, kc)),
                drop.at(drop.q_start(qc), drop.kv_start(source, kc)))
            dq = _set_seq(dq, dq_c, qc * (q.shape[1] // 2))
            dk = _set_seq(dk, dk_c, kc * (kb.shape[1] // 2))
            dv = _set_seq(dv, dv_c, kc * (kb.shape[1] // 2))
        return dq, dk, dv

    if step == 0 or not config.is_causal:
        return visit(_zigzag_pairs(config.is_causal, step), *sums)
    # As in _step_sums: each conditional updates the sums in place in its true branch only.
    is_earlier = source < drop.device
    sums = jax.lax.cond(is_earlier, lambda *s: visit(_zigzag_pairs(True, step, True), *s),
                        lambda *s: s, *sums)
    return jax.lax.cond(jnp.logical_not(is_earlier),
                        lambda *s: visit(_zigzag_pairs(True, step, False), *s),
                        lambda *s: s, *sums)


def merge(out_acc, lse_acc, out_block, lse_block):
    """The softmax-weighted combination of two partial attentions over disjoint key sets
    (float32 out [B, S, H, D], lse [B, H, S]); a side with lse = -inf contributes nothing.

    Written as ``out_acc + w * (out_block - out_acc)`` with ``w = exp(lse_block - lse_total)``:
    one product and one sum, so the only freedom XLA has (contracting them into an FMA or not)
    does not include choosing which of two products to contract."""
    lse_total = jnp.logaddexp(lse_acc, lse_block)
    weight = jnp.where(jnp.isneginf(lse_total), 0.0, jnp.exp(lse_block - lse_total))
    weight = jnp.swapaxes(weight, 1, 2)[..., None]  # [B, H, S] -> [B, S, H, 1]
    return out_acc + weight * (out_block - out_acc), lse_total


def _ring_loop(config, k, v, compute, combine=None, passengers=()):
    """Runs the P steps of the ring and returns the last state: at step s ``result =
    compute(s, k_block, v_block, state)`` (``state`` None at step 0), then ``state =
    combine(s, result, state)`` (default: the result). The transfer of the next step's block is
    issued before step s is computed, so XLA can run the two concurrently; and it is tied (an
    optimization barrier) to step s's ``result`` before it is sent on, so the transfer for step
    s + 2 cannot start before step s is computed and at most two blocks are alive. Without the tie
    nothing orders the chain of transfers (which depends on K/V alone) against the computation:
    XLA's CPU compiler issued every transfer up front (each device holding all P blocks, O(seq)
    memory instead of O(seq / P): at P = 8 the per-device temporaries were as large as at P = 2),
    and nothing forbids a GPU schedule from doing the same. (XLA's CPU pipeline removes the
    barrier before it schedules, so the CPU compile does not show the tie's effect; recent GPU
    pipelines remove it in their post-scheduling passes, after the schedule respected it.)

    K and V travel as one packet where ``_packs`` says so. ``passengers`` (with packets only: the
    previous head group's dK/dV on their hop home, in K's dtype) ride in step 0's packet and are
    tied to step 0's result the same way; then the loop returns ``(state, passengers after the
    hop)``."""
    blocks, state, arrived = (k, v), None, ()
    together = _packs(config, k, v, *passengers)
    if passengers and not together:
        raise ValueError("passengers ride in K/V packets only")
    packet = _pack(k, v) if together else None
    for step in range(config.axis_size):
        following = None
        if step + 1 < config.axis_size:
            if not together:
                following = _send(config, *blocks)
            elif step == 0 and passengers:
                sent = _send(config, _pack(k, v, *passengers))[0]
                following = (sent[:k.size + v.size],)  # the K/V packet sent on at step 1
                arrived = _unpack(sent[k.size + v.size:], *passengers)
            else:
                following = _send(config, packet)
        result = compute(step, *blocks, state)
        if following is not None:
            (following, arrived), result = jax.lax.optimization_barrier(
                ((following, arrived), result))
        state = combine(step, result, state) if combine else result
        if following is not None:
            packet = following[0] if together else None
            blocks = _unpack(packet, k, v) if together else following
    return (state, arrived) if passengers else state


def _pack(*arrays):
    """The arrays (one dtype) as one flat array, to travel in one transfer (``_packs``)."""
    return jnp.concatenate([x.reshape(-1) for x in arrays])


def _unpack(packet, *like):
    """The arrays shaped like ``like`` back from ``_pack``'s flat array (moves only)."""
    parts, offset = [], 0
    for x in like:
        parts.append(packet[offset:offset + x.size].reshape(x.shape))
        offset += x.size
    return tuple(parts)


def ring_forward(q, k, v, scale, config, drop=()):
    """This device's ``(out, lse)`` (out in q's dtype, lse float32 over the global keys);
    ``scale`` a number or a 0-d float32 array; ``drop`` the dropout arrays (``_ring``). The
    heads run in ``head_groups`` groups."""
    groups = _groups_for(config, q.shape, k.shape)
    if groups == 1:
        return _forward(q, k, v, scale, config, drop, 0)
    batch, seq, heads, _ = q.shape
    results = (jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32))

    def forward(group, q, k, v):
        return _forward(q, k, v, scale, config, drop, group * (heads // groups))

    return _in_head_groups(config, groups, forward, (q, k, v), ("q", "kv", "kv"), results,
                           ("q", "lse"))


def _forward(q, k, v, scale, config, drop, head_start):
    """``ring_forward`` of all heads of q, k, v at once (the first of them global head
    ``head_start`` of the ring's problem, for the dropout mask)."""
    n = config.axis_size
    causal = config.is_causal
    drop = _device_dropout(config, drop, head_start, q, k)
    device = jax.lax.axis_index(config.axis_name) if causal and n > 1 else None
    half = q.shape[1] // 2

    def at(step):  # the dropout of the contiguous block pair of step
        if drop is None:
            return None
        return drop.at(drop.q_start(), drop.kv_start((drop.device - step) % n))

    def body(step, kb, vb, state):
        if drop is not None and config.layout == "zigzag":
            return _zigzag_dropout_forward(config, scale, drop, step, q, kb, vb, state)
        out, lse = state or (None, None)
        if step == 0:  # the device's own (diagonal) block
            return _block_forward(config, scale, q, kb, vb, causal, at(step))
        if not causal:
            out, lse = merge(out, lse, *_block_forward(config, scale, q, kb, vb, False, at(step)))
        elif config.layout == "contiguous":
            def visible(out, lse, kb=kb, vb=vb, dropout=at(step)):
                return merge(out, lse, *_block_forward(config, scale, q, kb, vb, False, dropout))

            # The block came from device - step: visible iff that is not after this device.
            out, lse = jax.lax.cond(step <= device, visible, lambda o, s: (o, s), out, lse)
        else:
            def earlier(out, lse, kb=kb, vb=vb):
                # An earlier device's first chunk is before both of ours, its second after both.
                return merge(out, lse, *_block_forward(config, scale, q, kb[:, :half], vb[:, :half],
                                                       False))

            def later(out, lse, kb=kb, vb=vb):
                # A later device's chunks are both after our first chunk and before our second.
                upper, upper_lse = merge(out[:, half:], lse[..., half:],
                                         *_block_forward(config, scale, q[:, half:], kb, vb, False))
                return (jnp.concatenate([out[:, :half], upper], axis=1),
                        jnp.concatenate([lse[..., :half], upper_lse], axis=-1))

            source = (device - step) % n
            out, lse = jax.lax.cond(source < device, earlier, later, out, lse)
        return out, lse

    out, lse = _ring_loop(config, k, v, body)
    return out.astype(q.dtype), lse


def _step_contributions(config, scale, step, device, q, kb, vb, out, lse, dout):
    """float32 (dq, dk, dv) contributions of the block pair of ``step`` > 0 (zeros where the mask
    hides the block). They do not depend on the incoming dK/dV accumulators, so the accumulators'
    transfer can overlap with the kernel; the sums happen after."""
    n = config.axis_size
    if not config.is_causal:
        return _block_backward(config, scale, q, kb, vb, out, lse, dout, False)
    if config.layout == "contiguous":
        def visible():
            return _block_backward(config, scale, q, kb, vb, out, lse, dout, False)

        def hidden():
            zeros = (jnp.zeros(q.shape, jnp.float32), jnp.zeros(kb.shape, jnp.float32),
                     jnp.zeros(vb.shape, jnp.float32))
            return _ffi._unify_varying(q, *zeros)[1:]  # typed like the kernel's results

        return _cond(step <= device, visible, hidden)
    half = q.shape[1] // 2

    def earlier():
        # Both our chunks see the first chunk of an earlier device, neither sees its second.
        dq_b, dk_b, dv_b = _block_backward(config, scale, q, kb[:, :half], vb[:, :half], out, lse,
                                           dout, False)
        return dq_b, _pad_seq(dk_b, 0, half), _pad_seq(dv_b, 0, half)

    def later():
        # Only our second chunk sees a later device's chunks, and it sees both.
        dq_b, dk_b, dv_b = _block_backward(config, scale, q[:, half:], kb, vb, out[:, half:],
                                           lse[..., half:], dout[:, half:], False)
        return _pad_seq(dq_b, half, 0), dk_b, dv_b

    return _cond((device - step) % n < device, earlier, later)


def _step_sums(config, scale, step, device, q, kb, vb, out, lse, dout, sums, dropout=None):
    """The float32 sums (dq, dk, dv) after the block pair of ``step`` > 0 is added to them by the
    kernels in place (``sums`` unchanged where the mask hides the block): the bits of
    ``sums + _step_contributions(...)``. With zigzag the half that a block pair touches is cut
    from the sum, accumulated into and written back (``dynamic_update_slice``, in place).
    ``dropout``: the block pair's (contiguous layout; zigzag with dropout is
    ``_zigzag_dropout_sums``)."""
    n = config.axis_size
    if not config.is_causal:
        return _block_backward(config, scale, q, kb, vb, out, lse, dout, False, sums, dropout)
    if config.layout == "contiguous":
        def visible():
            return _block_backward(config, scale, q, kb, vb, out, lse, dout, False, sums,
                                   dropout)

        # (The in-place branch must be the true one: see the zigzag case below.)
        return _cond(step <= device, visible, lambda: tuple(sums))
    half = q.shape[1] // 2

    def earlier(dq, dk, dv):
        # Both our chunks see the first chunk of an earlier device, neither sees its second.
        dq, dk_h, dv_h = _block_backward(config, scale, q, kb[:, :half], vb[:, :half], out, lse,
                                         dout, False, (dq, dk[:, :half], dv[:, :half]))
        return dq, _set_seq(dk, dk_h, 0), _set_seq(dv, dv_h, 0)

    def later(dq, dk, dv):
        # Only our second chunk sees a later device's chunks, and it sees both.
        dq_h, dk, dv = _block_backward(config, scale, q[:, half:], kb, vb, out[:, half:],
                                       lse[..., half:], dout[:, half:], False,
                                       (dq[:, half:], dk, dv))
        return _set_seq(dq, dq_h, half), dk, dv

    # Two conditionals, each updating the sums in place in its true branch and passing them
    # through in its false branch. XLA (jaxlib 0.10.2's copy insertion) copies the sums where a
    # conditional's two branches both update them in place, and also where the in-place branch is
    # the false one (branch index 0); tests/test_ring.py checks the compiled program has no copy.
    is_earlier = (device - step) % n < device
    sums = jax.lax.cond(is_earlier, earlier, lambda *s: s, *sums)
    return jax.lax.cond(jnp.logical_not(is_earlier), later, lambda *s: s, *sums)


def _set_seq(x, part, start):
    """x with rows [start, start + len(part)) of the sequence axis (axis 1) replaced by part."""
    return jax.lax.dynamic_update_slice_in_dim(x, part, start, axis=1)


def _cond(predicate, if_true, if_false):
    return jax.lax.cond(predicate, lambda _: if_true(), lambda _: if_false(), None)


def _pad_seq(x, before, after):
    """x with zero rows before/after on the sequence axis (axis 1)."""
    return jnp.pad(x, ((0, 0), (before, after), (0, 0), (0, 0)))


def ring_backward(q, k, v, out, lse, dout, scale, config, drop=()):
    """This device's ``(dq, dk, dv)`` (dtypes of q and k), each summed in a fixed order: dq over
    the steps in order, a block's dk/dv over the devices from its home onwards. The heads run in
    ``head_groups`` groups (with K/V packets, each group's dK/dV hop home rides in the next
    group's first packet: ``_in_head_groups``); ``drop`` as in ``ring_forward``."""
    groups = _groups_for(config, q.shape, k.shape)
    homeward = groups > 1 and _packs(config, k, v)

    def backward(group, q, k, v, out, lse, dout, pending=()):
        head_start = group * q.shape[2]  # q: the group's heads
        (dq, dk, dv), arrived = _backward_before_home(q, k, v, out, lse, dout, scale, config,
                                                      drop, head_start, pending)
        # Cast before the hop home: a cast commutes with a move, and it halves bf16's bytes.
        dq, dk, dv = dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)
        if homeward:
            return dq, dk, dv, arrived
        if config.axis_size > 1:
            dk, dv = _send(config, dk, dv)  # the last hop home
        return dq, dk, dv

    if groups == 1:
        return backward(0, q, k, v, out, lse, dout)
    results = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
               jax.ShapeDtypeStruct(v.shape, v.dtype))
    return _in_head_groups(config, groups, backward, (q, k, v, out, lse, dout),
                           ("q", "kv", "kv", "q", "lse", "q"), results, ("q", "kv", "kv"),
                           homeward=2 if homeward else 0)


def _backward_before_home(q, k, v, out, lse, dout, scale, config, drop=(), head_start=0,
                          passengers=()):
    """``ring_backward``'s float32 sums of one group, before the cast to the inputs' dtypes, with
    dK/dV one hop before home (on the device before their block's; the first head of q global
    head ``head_start`` of the ring's problem, for the dropout mask), and ``passengers`` after
    their hop (``_ring_loop``)."""
    n = config.axis_size
    device = jax.lax.axis_index(config.axis_name) if config.is_causal and n > 1 else None
    drop = _device_dropout(config, drop, head_start, q, k)
    if drop is not None and not config.accumulate:
        raise ValueError("the ring applies dropout with the accumulating backward only")

    def at(step):  # the dropout of the contiguous block pair of step
        if drop is None:
            return None
        return drop.at(drop.q_start(), drop.kv_start((drop.device - step) % n))

    if drop is not None and config.layout == "zigzag":
        def accumulate(step, kb, vb, sums):
            if step == 0:  # chunk pair by chunk pair into zero sums
                zeros = tuple(jnp.zeros(x.shape, jnp.float32) for x in (q, kb, vb))
                sums = _ffi._unify_varying(q, *zeros)[1:]  # typed like the kernel's results
            else:
                dq, dk, dv = sums
                dk, dv = _send(config, dk, dv)  # dK/dV travel with their block (below)
                sums = (dq, dk, dv)
            return _zigzag_dropout_sums(config, scale, drop, step, q, kb, vb, out, lse, dout,
                                        sums)

        compute, combine = accumulate, None
    elif config.accumulate:
        def accumulate(step, kb, vb, sums):
            if step == 0:  # the device's own (diagonal) block starts the sums
                return _block_backward(config, scale, q, kb, vb, out, lse, dout,
                                       config.is_causal, dropout=at(step))
            dq, dk, dv = sums
            # dK/dV travel with their block: what arrives here belongs to the block now held, and
            # the kernels add this step's contributions to it (so they wait for its transfer).
            dk, dv = _send(config, dk, dv)
            return _step_sums(config, scale, step, device, q, kb, vb, out, lse, dout,
                              (dq, dk, dv), at(step))

        compute, combine = accumulate, None
    else:
        # The earlier formulation: the kernels return each step's contributions and XLA adds
        # them (the same float32 adds in the same order, so the same bits; three more float32
        # blocks alive at the backward's peak).
        def contributions(step, kb, vb, sums):
            if step == 0:  # the device's own (diagonal) block starts the sums
                return _block_backward(config, scale, q, kb, vb, out, lse, dout,
                                       config.is_causal)
            return _step_contributions(config, scale, step, device, q, kb, vb, out, lse, dout)

        def add(step, block, sums):
            if step == 0:
                return block
            dq, dk, dv = sums
            # dK/dV travel with their block: what arrives here belongs to the block now held.
            # The transfer does not wait for this step's kernel (the contributions do not depend
            # on it).
            dk, dv = _send(config, dk, dv)
            return dq + block[0], dk + block[1], dv + block[2]

        compute, combine = contributions, add
    if not passengers:
        return _ring_loop(config, k, v, compute, combine), ()
    return _ring_loop(config, k, v, compute, combine, passengers)


# ---- zigzag placement -------------------------------------------------------------------------

def _zigzag_order(axis_size):
    """Chunk order of the zigzag placement: device i holds chunks i and 2P-1-i."""
    return np.array([c for i in range(axis_size) for c in (i, 2 * axis_size - 1 - i)])


def _reorder_chunks(x, axis_size, seq_axis, order, name):
    if isinstance(axis_size, bool) or not isinstance(axis_size, (int, np.integer)) \
            or axis_size < 1:
        raise ValueError(f"axis_size must be a positive int (the ring's device count), got "
                         f"{axis_size!r}")
    x = jnp.asarray(x)
    if not isinstance(seq_axis, (int, np.integer)) or not -x.ndim <= seq_axis < x.ndim:
        raise ValueError(f"seq_axis={seq_axis!r} is not an axis of {name} with shape "
                         f"{tuple(x.shape)}")
    seq_axis = int(seq_axis) % x.ndim
    chunks = 2 * int(axis_size)
    seq = x.shape[seq_axis]
    if seq % chunks:
        raise ValueError(
            f"{name} has {seq} tokens on axis {seq_axis}, not a multiple of 2 * axis_size = "
            f"{chunks}: the zigzag placement cuts the sequence into 2 * axis_size equal chunks")
    split = x.reshape(x.shape[:seq_axis] + (chunks, seq // chunks) + x.shape[seq_axis + 1:])
    return jnp.take(split, order, axis=seq_axis).reshape(x.shape)


def zigzag(x, axis_size, seq_axis=1):
    """Reorders the tokens of ``x`` (a global array) into the zigzag placement: the sequence is cut
    into ``2 * axis_size`` chunks and laid out as chunks ``0, 2P-1, 1, 2P-2, ...``, so that
    sharding the result evenly over ``axis_size`` devices gives device ``i`` chunks ``i`` and
    ``2P-1-i``. Use with ``ring_attention(..., layout="zigzag")``; ``unzigzag`` undoes it."""
    return _reorder_chunks(x, axis_size, seq_axis, _zigzag_order(axis_size), "x")


def unzigzag(x, axis_size, seq_axis=1):
    """The inverse of ``zigzag``: tokens back in sequence order."""
    return _reorder_chunks(x, axis_size, seq_axis, np.argsort(_zigzag_order(axis_size)), "x")


def block_work(seq: int, axis_size: int, layout: str, is_causal: bool = True):
    """Per device, the (query, key) pairs its kernels compute over a whole ring pass (masked
    pairs inside computed tiles counted, as the kernels touch them at tile granularity: a causal
    diagonal block counts as half). The load-balance model of docs/ring.md."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    block = seq // axis_size
    if not is_causal:
        return [axis_size * block * block] * axis_size
    if layout == "contiguous":
        return [block * block / 2 + device * block * block for device in range(axis_size)]
    return [block * block / 2 + (axis_size - 1) * block * block / 2] * axis_size


# ---- the ring on one device -------------------------------------------------------------------

_SIMULATED_AXIS = "jax_dash_simulated_ring"


def simulate(query, key, value, ring_size, *, is_causal=False, scale=None, schedule="auto",
             layout="contiguous", head_groups="auto", dropout_rate=0.0, dropout_rng=None):
    """``ring_attention`` over ``ring_size`` simulated devices on the current device: the same
    code (block kernels, merges, transfers, summation order) under ``jax.vmap`` with a named axis
    in place of ``shard_map``, so it gives the ring's bits. Takes and returns global arrays
    ``[batch, seq, heads, head_dim]`` (already in the layout's token order, as ``shard_map`` would
    get them); differentiable; jitted (one compile per shapes and options, eager or not). For
    testing the ring's pieces on one GPU and for small CPU runs. ``head_groups``,
    ``dropout_rate`` and ``dropout_rng`` as in ``ring_attention`` (here the groups are unrolled,
    each after a barrier, not a loop)."""
    if isinstance(ring_size, bool) or not isinstance(ring_size, (int, np.integer)) \
            or ring_size < 1:
        raise ValueError(f"ring_size must be a positive int, got {ring_size!r}")
    ring_size = int(ring_size)
    for x, name in ((query, "query"), (key, "key"), (value, "value")):
        if jnp.ndim(x) != 4 or x.shape[1] % ring_size:
            raise ValueError(f"{name} must be [batch, seq, heads, head_dim] with seq a multiple of "
                             f"ring_size={ring_size}, got shape {tuple(jnp.shape(x))}")

    scale = _check_scale(scale, allowed=_SCALE_ALLOWED)
    _check_options(is_causal, schedule, layout)
    dropout.dropout_threshold(dropout_rate)  # checks the rate
    dropout_rate = float(dropout_rate)
    if dropout_rate > 0:
        dropout.dropout_key_words(dropout_rng)  # checks the key before it is traced
    else:
        dropout_rng = None
    # (_HEAD_GROUPS, read when "auto" is traced, keys the jit cache too)
    return _simulated(query, key, value, dropout_rng, ring_size, bool(is_causal), scale, schedule,
                      layout, _ACCUMULATE, head_groups, _HEAD_GROUPS, dropout_rate)


# Jitted with the static options as its key: eagerly, the ring's conditionals and the sequentially
# vmapped kernel calls would otherwise compile (and keep) new programs on every call.
@functools.partial(jax.jit, static_argnums=(4, 5, 6, 7, 8, 9, 10, 11, 12))
def _simulated(query, key, value, dropout_rng, ring_size, is_causal, scale, schedule, layout,
               accumulate, groups, auto_groups, dropout_rate):
    def split(x):  # [B, S, H, D] -> [P, B, S / P, H, D]: block i for device i
        batch, seq = x.shape[:2]
        blocks = x.reshape((batch, ring_size, seq // ring_size) + x.shape[2:])
        return jnp.moveaxis(blocks, 1, 0)

    def join(x):
        x = jnp.moveaxis(x, 0, 1)
        return x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])

    def device(q, k, v):
        return _ring_attention(q, k, v, _SIMULATED_AXIS, is_causal, scale, schedule, layout,
                               accumulate, groups, dropout_rate, dropout_rng)

    blocks = jax.vmap(device, axis_name=_SIMULATED_AXIS)(split(query), split(key), split(value))
    return join(blocks)
