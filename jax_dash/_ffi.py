"""Loads the native extension, registers its FFI targets, and wraps the raw ``ffi_call``\\ s.

Inputs here are always 4-D; folding vmap axes and the missing batch axis happens above
(``sharding.py``, ``attention.py``). A raw call that is vmapped anyway (``ring.simulate`` maps the
ring's devices) runs once per element (``vmap_method="sequential"``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

try:
    import _jax_dash as _ext
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError(
        "jax_dash's native extension is missing or failed to load; install the package with "
        "`pip install .` from a source checkout (it compiles the kernels)") from exc

SCHEDULE_IDS = {
    "ascending": 0,
    "descending": 1,
    "shift": 2,
    "symmetric_shift": 3,
    "atomic": 4,
    "mirror": 5,
}
_SCHEDULE_NAMES = {schedule_id: name for name, schedule_id in SCHEDULE_IDS.items()}

for _target, _platforms in _ext.registrations().items():
    for _platform, _capsule in _platforms.items():
        jax.ffi.register_ffi_target(_target, _capsule, platform=_platform)

built_with_cuda = _ext.built_with_cuda()
CPU_WAVE = _ext.CPU_WAVE
# Platforms (jax Device.platform) where the jit path runs sequence-sharded calls as a ring: those
# whose float32 block gradients (f32_grads) have been verified: the CPU kernels, and the Hopper
# kernels since tests/test_gpu_ring.py passed on an H100 (2026-11-23).
F32_GRADS_PLATFORMS = frozenset({"cpu", "gpu"})


def _result_type(shape, dtype, like):
    """A result type carrying ``like``'s varying manual axes, so that results inside
    ``shard_map`` have the type of the operands (the attribute is named by JAX version)."""
    aval = jax.typeof(like)
    mesh = getattr(getattr(aval, "sharding", None), "mesh", None)
    for name in ("manual_axis_type", "vma"):
        value = getattr(aval, name, None)
        if value is None or mesh is None or not getattr(value, "varying", value):
            continue  # not inside shard_map
        try:
            sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding, **{name: value})
        except TypeError:
            continue
    return jax.ShapeDtypeStruct(shape, dtype)


def tile_config(head_dim: int) -> tuple[int, int, int, int]:
    """(fwd_block_m, fwd_block_n, bwd_block_m, bwd_block_n) from ``cuda/tiles.h``."""
    return tuple(_ext.tile_config(int(head_dim)))


def schedule_summary(schedule: str, seq_q: int, seq_kv: int, block_m: int, block_n: int,
                     is_causal: bool, wave: int, window=None) -> tuple[str, int]:
    """(the schedule ``cuda/schedule.h`` runs for ``schedule`` after its fallbacks, work items per
    head) of one head, from its closed form: O(1), no tables built."""
    left, right = window if window is not None else (-1, -1)
    effective, items_per_head = _ext.schedule_summary(
        SCHEDULE_IDS[schedule], seq_q, seq_kv, block_m, block_n, bool(is_causal), wave, left, right)
    return _SCHEDULE_NAMES[effective], items_per_head


def _varying_axes(x):
    aval = jax.typeof(x)
    for name in ("manual_axis_type", "vma"):
        value = getattr(aval, name, None)
        if value is not None:
            return frozenset(getattr(value, "varying", value))
    return frozenset()


def _unify_varying(*arrays):
    """Inside ``shard_map``, makes every operand vary over the union of the operands' manual
    axes, so that the results (typed after the first operand) are varying wherever any input is."""
    axes = frozenset().union(*(_varying_axes(x) for x in arrays))
    if not axes or not hasattr(jax.lax, "pcast"):
        return arrays
    return tuple(x if _varying_axes(x) == axes
                 else jax.lax.pcast(x, tuple(sorted(axes - _varying_axes(x))), to="varying")
                 for x in arrays)


@dataclasses.dataclass(frozen=True)
class StaticMask:
    """The static part of the mask beyond ``is_causal`` (validated in ``attention.py``), and
    whether the call's length and segment-id operands mean anything. Hashable: it keys the cached
    ops of ``sharding.py``."""

    window: tuple[int, int] | None = None    # (left, right), both >= 0
    logits_soft_cap: float | None = None     # > 0
    has_seq_lengths: bool = False
    has_segment_ids: bool = False

    def attributes(self) -> dict:
        left, right = self.window if self.window is not None else (-1, -1)
        return dict(window_left=np.int64(left), window_right=np.int64(right),
                    logits_soft_cap=np.float32(self.logits_soft_cap or 0.0),
                    has_seq_lengths=bool(self.has_seq_lengths),
                    has_segment_ids=bool(self.has_segment_ids))


NO_MASK = StaticMask()


def default_mask_arrays(q, k):
    """The four mask operands of a call without lengths or segments: full lengths, segment 0.
    The FFI has no optional operands, so they are always passed (``has_seq_lengths`` /
    ``has_segment_ids`` say whether the kernel reads them)."""
    batch, seq_q, seq_kv = q.shape[0], q.shape[1], k.shape[1]
    return (jnp.full((batch,), seq_q, jnp.int32), jnp.full((batch,), seq_kv, jnp.int32),
            jnp.zeros((batch, seq_q), jnp.int32), jnp.zeros((batch, seq_kv), jnp.int32))


# ---- head dims the Hopper kernels do not have -------------------------------------------------
# The Hopper kernels are compiled for head_dim 64, 128 and 256. Another multiple of 8 runs them on
# operands zero-padded along head_dim (on "cuda" only, chosen at lowering by
# lax.platform_dependent; the CPU kernels take every multiple of 8 up to 256 as it is): the zero
# columns add exact zeros to every Q.K dot product and to dO.O, and produce zero output and gradient
# columns, which are sliced off. So the result is the attention of the unpadded operands, computed
# at the wider head_dim (a cost of up to 2x at head_dim 32, 1.33x at 96). The scale is the caller's
# (1 / sqrt of the unpadded head_dim by default), never the padded width's.
PAD_PLATFORMS = ("cuda",)


def hopper_head_dim(head_dim: int) -> int:
    """The head_dim the Hopper kernels run a call of ``head_dim`` at: 64, 128 or 256 (the next
    of them), or ``head_dim`` itself above 256 (refused before it gets here)."""
    for width in (64, 128, 256):
        if head_dim <= width:
            return width
    return head_dim


def _pad_head_dim(x, width):
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])


# Branch pairs are cached per static key: eagerly, platform_dependent runs a ``cond`` whose compiled
# form JAX caches by the identity of its branches, so new branch functions on every call would
# compile (and keep) a new ``cond`` on every call. Bounded: windows and caps are user numbers.
_BRANCH_CACHE_SIZE = 256


def _at_hopper_head_dim(call, static, operands, pad, crop):
    """``call(static, *operands)`` (a tuple of results); where the Hopper kernels lack the head_dim
    (that of ``operands[0]``), on PAD_PLATFORMS with the operands at indices ``pad`` zero-padded
    along head_dim to ``hopper_head_dim`` and the results at indices ``crop`` cut back to it.
    ``call`` is a module-level function and ``static`` a hashable tuple: they key the branches."""
    head_dim = operands[0].shape[-1]
    native, padded = _head_dim_branches(call, static, head_dim, frozenset(pad), frozenset(crop))
    if hopper_head_dim(head_dim) == head_dim:
        return native(*operands)
    return jax.lax.platform_dependent(*operands, default=native,
                                      **{platform: padded for platform in PAD_PLATFORMS})


@functools.lru_cache(maxsize=_BRANCH_CACHE_SIZE)
def _head_dim_branches(call, static, head_dim, pad, crop):
    """The (native, padded) branches of ``_at_hopper_head_dim`` for one static key."""
    width = hopper_head_dim(head_dim)

    def native(*ops):
        return tuple(call(static, *ops))

    def padded(*ops):
        results = call(static, *(_pad_head_dim(x, width) if i in pad else x
                                 for i, x in enumerate(ops)))
        return tuple(r[..., :head_dim] if i in crop else r for i, r in enumerate(results))

    return native, padded


def fwd_call(q, k, v, scale, is_causal: bool, *, mask: StaticMask = NO_MASK, mask_arrays=None,
             dropout=None):
    """Raw forward: returns ``(out [B, Sq, H, D], lse [B, H, Sq] float32)``. ``scale`` (a number
    or a 0-d array) is passed as a 0-d float32 operand, not an attribute, so a new scale reuses
    the compiled call. ``mask_arrays``: ``(q_seq_lengths [B], kv_seq_lengths [B],
    q_segment_ids [B, Sq], kv_segment_ids [B, Sk])`` int32, or None for none. ``dropout``: None,
    or ``(key_words, offsets, threshold, keep_scale)`` as in ``_fwd_call``. A head_dim the
    Hopper kernels lack runs them zero-padded on the GPU (``hopper_head_dim``)."""
    if mask_arrays is None:
        mask_arrays = default_mask_arrays(q, k)
    arrays, dropout_static = _split_dropout(dropout)
    return _at_hopper_head_dim(
        _fwd_branch, (bool(is_causal), mask, dropout_static),
        (q, k, v, jnp.asarray(scale, jnp.float32), *mask_arrays, *arrays), pad={0, 1, 2},
        crop={0})


def _fwd_branch(static, q, k, v, scale, *rest):
    """``_fwd_call`` with fwd_call's operand order: the mask arrays, then the dropout arrays."""
    is_causal, mask, dropout_static = static
    mask_arrays, dropout = _join_dropout(rest, dropout_static)
    return _fwd_call(q, k, v, scale, is_causal, mask, mask_arrays, dropout)


def _fwd_call(q, k, v, scale, is_causal, mask, mask_arrays, dropout=None):
    """The forward FFI call; ``dropout``: None, or ``(key_words, offsets, threshold,
    keep_scale)`` (a uint32 [2] key; int32 [4] global coordinates (batch, head, q, kv) of the
    call's first element; the 16-bit threshold; 1 / (1 - rate); cuda/dropout.h), which runs the
    dropout target."""
    extra = () if dropout is None else tuple(dropout[:2])
    q, k, v, scale, *rest = _unify_varying(q, k, v, jnp.asarray(scale, jnp.float32),
                                           *mask_arrays, *extra)
    mask_arrays, extra = rest[:len(mask_arrays)], rest[len(mask_arrays):]
    batch, seq_q, num_heads, _ = q.shape
    result_types = (
        _result_type(q.shape, q.dtype, q),
        _result_type((batch, num_heads, seq_q), jnp.float32, q),
    )
    if dropout is None:  # one int32 of workspace: the Hopper persistent kernel's tile counter
        result_types += (_result_type((1,), jnp.int32, q),)
    target = "jax_dash_fwd" if dropout is None else "jax_dash_fwd_dropout"
    results = jax.ffi.ffi_call(target, result_types, vmap_method="sequential")(
        q, k, v, *mask_arrays, scale, *extra, is_causal=bool(is_causal), **mask.attributes(),
        **_dropout_attributes(dropout))
    return tuple(results[:2])


def bwd_call(q, k, v, out, lse, dout, scale, is_causal: bool, schedule: str,
             f32_grads: bool = False, *, mask: StaticMask = NO_MASK, mask_arrays=None,
             sums=None, dropout=None):
    """Raw backward: returns ``(dq, dk, dv)``; the workspace results are dropped. ``scale`` and
    ``mask_arrays`` as in ``fwd_call``.

    ``f32_grads`` returns them in float32, unrounded (the ring's carried accumulators). A head_dim
    the Hopper kernels lack runs them zero-padded on the GPU, as in ``fwd_call``.

    ``sums``: ``(dq_sum, dk_sum, dv_sum)`` float32 arrays shaped like q, k, v (needs
    ``f32_grads``), or None. Given, the call returns ``(dq_sum + dq, dk_sum + dk, dv_sum + dv)``
    with the bits of that float32 add of this call's float32 gradients, computed by the kernels in
    place: each sum is an operand aliased to its gradient (``input_output_aliases``), so no buffer
    of the gradients alone is allocated (where the sum is not used afterwards, XLA donates its
    buffer; otherwise it copies it first).

    ``dropout``: None, or ``(key_words, offsets, threshold, keep_scale)`` as in ``_fwd_call``."""
    if mask_arrays is None:
        mask_arrays = default_mask_arrays(q, k)
    if sums is not None:
        sums = _check_sums(sums, q, k, v, f32_grads)
    accumulate = sums is not None
    if not accumulate:  # the FFI has no optional operands: empty ones, ignored
        sums = (jnp.zeros((0,), jnp.float32),) * 3
    operands = (q, k, v, out, lse, dout, jnp.asarray(scale, jnp.float32), *mask_arrays, *sums)
    first_sum = len(operands) - 3
    arrays, dropout_static = _split_dropout(dropout)
    return _at_hopper_head_dim(
        _bwd_branch, (bool(is_causal), schedule, bool(f32_grads), mask, accumulate,
                      dropout_static), operands + arrays,
        pad={0, 1, 2, 3, 5} | ({first_sum, first_sum + 1, first_sum + 2} if accumulate else set()),
        crop={0, 1, 2})


def _bwd_branch(static, q, k, v, out, lse, dout, scale, *rest):
    """``_bwd_call`` with bwd_call's operand order: the mask arrays, the three sums, then the
    dropout arrays."""
    is_causal, schedule, f32_grads, mask, accumulate, dropout_static = static
    rest, dropout = _join_dropout(rest, dropout_static)
    return _bwd_call(q, k, v, out, lse, dout, scale, is_causal, schedule, f32_grads, mask,
                     rest[:-3], rest[-3:], accumulate, dropout=dropout)


def _check_sums(sums, q, k, v, f32_grads):
    """The accumulate operands of ``bwd_call``: a ValueError naming the one that is wrong."""
    if not f32_grads:
        raise ValueError("bwd_call(sums=...) needs f32_grads=True: the kernels add float32 "
                         "gradients to float32 sums")
    if not isinstance(sums, (tuple, list)) or len(sums) != 3:
        got = (f"a {type(sums).__name__} of {len(sums)}" if isinstance(sums, (tuple, list))
               else f"a {type(sums).__name__}")
        raise ValueError(f"sums must be (dq_sum, dk_sum, dv_sum), got {got}")
    for name, x, like, owner in (("dq_sum", sums[0], q, "query"), ("dk_sum", sums[1], k, "key"),
                                 ("dv_sum", sums[2], v, "value")):
        shape, dtype = tuple(jnp.shape(x)), jnp.result_type(x)
        if shape != tuple(like.shape) or dtype != jnp.float32:
            raise ValueError(f"{name} must be float32 with the {owner}'s shape "
                             f"{tuple(like.shape)}, got {jnp.dtype(dtype).name} {shape}")
    return tuple(sums)


def _bwd_call(q, k, v, out, lse, dout, scale, is_causal, schedule, f32_grads, mask,
              mask_arrays, sums, accumulate, alias_sums=True, dropout=None):
    """The FFI call of ``bwd_call`` at a head_dim the kernels have. ``alias_sums=False`` (tests
    only) passes the accumulate sums without aliasing them to the gradients, so that the handler
    copies them into the outputs first. ``dropout`` as in ``_fwd_call`` (the forward's)."""
    extra = () if dropout is None else tuple(dropout[:2])
    q, k, v, out, lse, dout, scale, *rest = _unify_varying(
        q, k, v, out, lse, dout, jnp.asarray(scale, jnp.float32), *mask_arrays, *sums, *extra)
    n = len(mask_arrays)
    mask_arrays, sums, extra = rest[:n], rest[n:n + 3], rest[n + 3:]
    batch, seq_q, num_heads, head_dim = q.shape
    seq_kv, num_kv_heads = k.shape[1], k.shape[2]
    f32_size, i32_size = _ext.bwd_workspace_size(
        batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim)
    grad_dtype = jnp.float32 if f32_grads else q.dtype
    result_types = (
        _result_type(q.shape, grad_dtype, q),
        _result_type(k.shape, grad_dtype, q),
        _result_type(v.shape, grad_dtype, q),
        _result_type((f32_size,), jnp.float32, q),
        _result_type((i32_size,), jnp.int32, q),
    )
    first_sum = 7 + len(mask_arrays)  # operand index of dq_sum
    aliases = {first_sum + i: i for i in range(3)} if accumulate and alias_sums else {}
    target = "jax_dash_bwd" if dropout is None else "jax_dash_bwd_dropout"
    dq, dk, dv, _, _ = jax.ffi.ffi_call(target, result_types, vmap_method="sequential",
                                        input_output_aliases=aliases)(
        q, k, v, out, lse, dout, *mask_arrays, scale, *sums, *extra, is_causal=bool(is_causal),
        schedule=np.int32(SCHEDULE_IDS[schedule]), f32_grads=bool(f32_grads),
        accumulate=bool(accumulate), **mask.attributes(), **_dropout_attributes(dropout))
    return dq, dk, dv



# ---- dropout ------------------------------------------------------------------------------------

def _dropout_attributes(dropout):
    """The attributes of the *_dropout targets (none without dropout)."""
    if dropout is None:
        return {}
    _, _, threshold, keep_scale = dropout
    return dict(dropout_threshold=np.int64(threshold), dropout_scale=np.float32(keep_scale))


def _split_dropout(dropout):
    """``(arrays, static)`` of a ``dropout`` argument: the operands ``(key_words, offsets)`` and
    the hashable ``(threshold, keep_scale)``; ``((), None)`` without dropout."""
    if dropout is None:
        return (), None
    key_words, offsets, threshold, keep_scale = dropout
    return (key_words, offsets), (int(threshold), float(keep_scale))


def _join_dropout(operands, dropout_static):
    """The inverse of ``_split_dropout`` on a branch's trailing operands: ``(the operands
    before them, dropout)``."""
    if dropout_static is None:
        return operands, None
    return operands[:-2], (*operands[-2:], *dropout_static)
