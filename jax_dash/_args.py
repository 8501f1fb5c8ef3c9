"""Argument checks, schedule names and the ``schedule="auto"`` rule, shared by every entry point.

The bottom of the package above ``_ffi``: ``ring``, ``sharding``, ``attention`` and the adapters
import from here, and this module imports nothing of jax_dash but ``_ffi`` (so ``schedules``, the
DAG model and its CLI, is never imported on the run path). Errors say what was passed, what is
allowed and how to fix it.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from jax_dash import _ffi

# The schedules the kernels know (ids mirroring cuda/schedule.h, kept beside the FFI call that
# passes them), and "auto" before them.
SCHEDULE_IDS = _ffi.SCHEDULE_IDS
SCHEDULES = ("auto",) + tuple(SCHEDULE_IDS)
# Schedules "auto" chooses from (see choose_schedule for the rule and why).
AUTO_CANDIDATES = ("symmetric_shift", "shift", "mirror", "descending")
_CPU_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))
MAX_HEAD_DIM = 256


# ---- the "auto" schedule ----------------------------------------------------------------------

# Causal heads with non-square tiles (head_dim 128's 64-row Q tiles) run mirror up to this many
# KV tiles (1,024 tokens at head_dim 128), symmetric_shift beyond: see choose_schedule.
MIRROR_MAX_KV_TILES = 8


@functools.lru_cache(maxsize=1024)
def choose_schedule(*, seq_q: int, seq_kv: int, head_dim: int, is_causal: bool,
                    wave: int, window: tuple[int, int] | None = None,
                    segment_ids: bool = False) -> str:
    """The schedule ``schedule="auto"`` runs: a function of ONE head's problem and the nominal
    wave width (the GPU model's resident backward CTAs), never of the batch size, the number of
    heads or how the call is sharded, so that auto's bits are as batch- and sharding-invariant as
    every schedule's (a sharded run sees fewer heads; a vmapped one a larger batch).

    ``segment_ids``: whether the call passes segment ids (packed rows). That they are given is a
    static property of the call, like the window; their values (the data) are never looked at.

    Rule: causal, where symmetric_shift would run as itself (seq_q == seq_kv, even Nkv, no
    window that cuts a tile pair) and no segment ids are given -> ``mirror`` with square tiles
    (head_dim 64's and 256's) or at most MIRROR_MAX_KV_TILES KV tiles, else ``symmetric_shift``
    where a head is one slice (Nkv / 2 <= wave); full mask -> ``shift`` where it runs as itself
    (no window that cuts a tile pair), a head is one slice (Nkv <= wave) and no segment ids are
    given; otherwise causal with segment ids, or a window that hides some pair and whose left
    side reaches further than its right (both clipped to the sequences; causal: right = 0) ->
    ``mirror``; otherwise ``descending``. Why:

    * causal: measured on an H100 (maintainers/results/2026-11-22-h100, bf16, seq 2k-8k, head_dim
      64/128) symmetric_shift's backward is 5-19% faster than descending's; the in-order-fetch
      simulator agrees in steady state (many heads). Where a head spans several slices (Nkv / 2 >
      wave) the simulator shows it losing (a slice waits for the previous slice's short columns
      on every tile), so auto keeps it to one slice per head, which also gives the same bits on
      every GPU with at least Nkv / 2 resident CTAs. mirror (below) against symmetric_shift on
      an H100 (paper grid, 16k tokens, 512 ... 16k; maintainers/perf-notes.md, twenty-eighth
      session call 4), backward: head_dim 64 -5.9, -4.3, -2.7, -0.9, -0.5, -1.6%; head_dim 256
      -4.4, -2.0, -2.7, -3.3, -5.8, -2.5%; head_dim 128 -7.8, -3.9, -0.2, +2.0, +5.5% and a tie
      at 16k. Its first items are the last KV tiles, whose bands are short: the short units go
      first and the long ones fill the tail. Its bits do not depend on the wave.
    * segment ids: the Hopper backward leaves the tile pairs no query can see out of its visit
      order, so on packed rows most of a KV tile's band is gone and symmetric_shift's pairing of
      a long and a short column no longer balances anything: measured on an H100 (16k tokens,
      documents of mean 2k, hd128, causal; maintainers/perf-notes.md, fifth session call
      2) descending ran the backward at 92 TFLOP/s of visible work, symmetric_shift at 62.
      Causal, each document is a causal triangle whose KV tiles under descending all start on
      its last Q tile and queue there; mirror starts each on its own diagonal (below): H100,
      16k tokens, backward of visible work, mirror / descending 147 / 125 (hd128, documents of
      mean 2k), 174 / 153 (mean 8k), 84 / 66 and 97 / 78 (hd64), atomic 150, 182, 87, 102
      (maintainers/perf-notes.md, twenty-seventh session call 2).
    * full mask: shift where it runs as itself and a head is one slice (Nkv <= wave), else
      descending. With descending every KV tile of a head starts on the same Q tile and the
      contributors of a tile queue on its ticket chain; shift starts each on another tile. The
      pipeline model (simulate_pipeline) puts descending's tax over atomic at +8..21% at 2k-4k and
      shift's at 0, as the H100 grid of 2026-11-23 measured for descending (+9..20%).
    * a sliding window: the band of KV tile n is cut by the sequence's end (its last KV tiles see
      fewer Q tiles) where the window's left side reaches, and by its start where the right side
      does. descending visits a band from its top: the last KV tiles all start on tile Nq - 1 and
      queue on its ticket chain; mirror (descending on the sequence read from its end) visits from
      the bottom, so only a cut at the start queues. The pipeline model puts descending's tax
      over atomic at +3.3% / +5.9% (hd128, causal window 4096, 1 x 16k / 2 x 8k) and +8.1% /
      +16.6% (hd64) against mirror's +0.5..1.0%, close to the H100's descending
      (maintainers/perf-notes.md, twenty-sixth session: +4..9% hd128, +7..15% hd64); with a wider
      right side the two swap. A window that hides nothing is no window.
    * a causal head longer than one symmetric_shift slice (Nkv / 2 > wave: > 33,792 tokens on a
      132-SM GPU): on an H100 at 1 x 64k (maintainers/perf-notes.md, twenty-seventh session
      call 9), backward / atomic's, head_dim 64 (128 x 128 tiles): descending 1.09, mirror 1.01,
      symmetric_shift over several slices 1.03; head_dim 128 (64-row Q tiles): 1.07, 1.09, 1.05;
      head_dim 256 (64 x 64 tiles, call 10) at 1 x 24k descending 1.24-1.27, mirror 1.09-1.12, at
      40k a tie (1.12-1.16 against 1.11-1.18, two noisy rounds). So mirror with square tiles at
      every length; head_dim 128 runs descending there (symmetric_shift's bits over several
      slices would depend on the GPU's resident CTAs).

    The choice is read from ``cuda/schedule.h``'s closed form (effective schedule and items per
    head, O(1)); it never builds a head's tables, which are quadratic in the sequence length.
    """
    _check_head_problem(seq_q, seq_kv, head_dim, wave, window)
    _, _, block_m, block_n = _ffi.tile_config(head_dim)

    if not segment_ids:
        # The rotating schedule of this mask: where it runs as itself (no fallback), it is
        # auto's with a head in one slice; a causal head over several slices runs mirror with
        # square tiles.
        rotating = "symmetric_shift" if is_causal else "shift"
        effective, items_per_head = _ffi.schedule_summary(rotating, seq_q, seq_kv, block_m,
                                                          block_n, is_causal, wave, window)
        if effective == rotating:
            if is_causal and (block_m == block_n
                              or -(-seq_kv // block_n) <= MIRROR_MAX_KV_TILES):
                return "mirror"
            if items_per_head <= wave:
                return rotating
    if is_causal and segment_ids:
        return "mirror"
    if window is not None:  # how far each side reaches, clipped to the sequences
        left, right = window
        hides_some_pair = left < seq_q - 1 or (not is_causal and right < seq_kv - 1)
        left, right = min(left, seq_q - 1), 0 if is_causal else min(right, seq_kv - 1)
        if hides_some_pair and left > right:
            return "mirror"
    return "descending"


def _check_head_problem(seq_q, seq_kv, head_dim, wave, window):
    """``choose_schedule``'s arguments (ValueError naming the one that is wrong)."""
    for name, value in (("seq_q", seq_q), ("seq_kv", seq_kv), ("head_dim", head_dim),
                        ("wave", wave)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    if window is not None and (
            not isinstance(window, tuple) or len(window) != 2
            or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0
                   for w in window)):
        raise ValueError(f"window={window!r} must be None or a (left, right) tuple of "
                         "integers >= 0")


def _auto_schedule(query, key, is_causal, window=None, segment_ids=False):
    """The schedule for ``schedule="auto"``: ``choose_schedule`` of one head's problem (seq_q,
    seq_kv, head_dim, causal + window band, whether segment ids are given) and the nominal wave
    of the device the computation runs on. Batch size, head count and the data
    (lengths, the segment ids' values) are deliberately not passed: under vmap, sharding or a
    different batch the same sequence must get the same schedule, hence the same bits.

    The device: that of concrete (not traced) inputs; for traced inputs it is not known before
    lowering, so the choice is made per platform (CPU and, where JAX has one, the GPU) and
    ``lax.platform_dependent`` picks the one the computation lowers for. Returns a schedule name,
    or ``((platform, name), ...)`` where the platforms' choices differ."""
    def choose(wave):
        return choose_schedule(seq_q=query.shape[-3], seq_kv=key.shape[-3],
                               head_dim=query.shape[-1], is_causal=is_causal, wave=wave,
                               window=window, segment_ids=segment_ids)

    device = _device_of(query, key)
    if device is not None:
        return choose(_device_wave(device))
    choices = {"cpu": choose(_ffi.CPU_WAVE)}
    gpu_wave = _gpu_wave()
    if gpu_wave is not None:
        choices["cuda"] = choose(gpu_wave)
    if len(set(choices.values())) == 1:
        return choices["cpu"]
    return tuple(sorted(choices.items()))


def _device_of(*arrays):
    """The device a concrete array lives on (the lowest id where it is sharded), else None."""
    for x in arrays:
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            try:
                return min(x.devices(), key=lambda d: d.id)
            except Exception:  # noqa: BLE001 - a deleted or otherwise unusable array
                return None
    return None


def _device_wave(device):
    """Resident backward CTAs of a device's model (its SM count on GPU; the CPU kernels'
    CPU_WAVE otherwise): a property of the GPU model, never of the call, so auto's choice does
    not change with the batch or the sharding."""
    cores = getattr(device, "core_count", None)
    if device.platform == "gpu" and isinstance(cores, int) and cores > 0:
        return cores
    return _ffi.CPU_WAVE


@functools.lru_cache(maxsize=1)  # a process's backends do not change
def _gpu_wave():
    """The wave of this process's (first) CUDA GPU, or None where JAX has no CUDA backend."""
    try:
        gpus = jax.devices("cuda")
    except RuntimeError:
        return None
    return _device_wave(gpus[0]) if gpus else None


# ---- validation ---------------------------------------------------------------------------------

# Keywords Flax passes to an attention_fn, which jax_dash.attention (jax.nn's signature) lacks.
_FLAX_KEYWORDS = ("dropout_rng", "dropout_rate", "broadcast_dropout", "deterministic", "dtype",
                  "precision", "module", "promote_dtype", "force_fp32_for_softmax",
                  "einsum_dot_general", "qk_attn_weights_einsum", "attn_weights_value_einsum")


def _check_unexpected_keywords(keywords, function="attention"):
    """Keywords ``function`` does not take: Python's TypeError, which for Flax's attention_fn
    keywords points to the Flax adapter."""
    if not keywords:
        return
    flax = [name for name in keywords if name in _FLAX_KEYWORDS]
    if flax:
        raise TypeError(
            f"jax_dash.{function} got Flax's attention_fn keyword(s) {', '.join(flax)}: it has "
            "the signature of jax.nn.dot_product_attention, not of a Flax attention_fn. Give "
            "Flax the adapter instead: attention_fn=jax_dash.flax.make_attention_fn(...) (e.g. "
            "make_attention_fn(is_causal=True)), or jax_dash.flax.attention_fn")
    raise TypeError(f"{function}() got an unexpected keyword argument {next(iter(keywords))!r}")


def _check_dense(bias, mask):
    """``bias`` and ``mask`` must be None: the kernels take structured masks only."""
    for dense, name, plural in ((bias, "bias", "biases"), (mask, "mask", "masks")):
        if dense is not None:
            raise ValueError(
                f"{name} is not supported by jax_dash.attention (got {_describe(dense)}): dense "
                f"{plural} are not implemented; express the mask with is_causal, "
                "local_window_size, query_seq_lengths/key_value_seq_lengths or "
                "query_segment_ids/key_value_segment_ids, or use jax.nn.dot_product_attention")


def _check_implementation(implementation):
    """jax.nn's ``implementation`` picks a backend; jax_dash is one: only None is accepted."""
    if implementation is not None:
        raise ValueError(
            "jax_dash.attention is its own implementation (Hopper kernels on GPU, C++ kernels on "
            f"CPU); implementation must be None, got {implementation!r} (for jax.nn's 'xla' or "
            "'cudnn', call jax.nn.dot_product_attention)")


def _as_array(x, name):
    """JAX arrays (and tracers) as they are; anything else through ``jnp.asarray`` as jax.nn does
    (NumPy float64 becomes float32 unless x64 is on, as under jit)."""
    if isinstance(x, jax.Array):
        return x
    if isinstance(x, jax.ShapeDtypeStruct):
        raise TypeError(f"{name} is a jax.ShapeDtypeStruct {x.shape} {x.dtype}, which describes an "
                        "array but holds no values; pass an array (for shapes only, call "
                        "jax.eval_shape(jax_dash.attention, query, key, value))")
    if x is None:
        raise TypeError(f"{name} must be an array, got None")
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array, got {type(x).__name__} that jnp.asarray "
                        f"cannot convert: {exc}") from exc


def _check_shapes(query, key, value):
    for x, name in ((query, "query"), (key, "key"), (value, "value")):
        if x.ndim not in (3, 4):
            raise ValueError(
                f"{name} must be 4-D [batch, seq, heads, head_dim] or 3-D [seq, heads, head_dim], "
                f"got shape {tuple(x.shape)}")
    if not query.ndim == key.ndim == value.ndim:
        raise ValueError(
            "query, key and value must all be 4-D or all be 3-D, got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if tuple(key.shape) != tuple(value.shape):
        raise ValueError(f"key and value must have the same shape, got key {tuple(key.shape)} "
                         f"and value {tuple(value.shape)}")
    batch_axis = query.ndim == 4
    if batch_axis and query.shape[0] != key.shape[0]:
        raise ValueError(f"query and key must have the same batch size, got query "
                         f"{tuple(query.shape)} and key {tuple(key.shape)}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same head_dim, got query "
                         f"{tuple(query.shape)} and key {tuple(key.shape)}")
    seq_q, num_heads, head_dim = query.shape[-3:]
    seq_kv, num_kv_heads = key.shape[-3], key.shape[-2]
    if seq_q == 0 or seq_kv == 0:
        raise ValueError(f"sequence lengths must be at least 1, got seq_q={seq_q} and "
                         f"seq_kv={seq_kv} (query {tuple(query.shape)}, key {tuple(key.shape)})")
    if num_heads == 0 or num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads "
                         f"({num_kv_heads}) (query {tuple(query.shape)}, key {tuple(key.shape)})")
    if head_dim == 0 or head_dim % 8 or head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} is not supported: it must be a multiple of 8 up to "
                         f"{MAX_HEAD_DIM}")
    if batch_axis and query.shape[0] == 0:
        raise ValueError(f"batch must be at least 1, got query {tuple(query.shape)}")


def _check_dtypes(query, key, value):
    dtypes = [jnp.dtype(x.dtype) for x in (query, key, value)]
    for dtype, name in zip(dtypes, ("query", "key", "value")):
        if dtype not in _CPU_DTYPES:
            raise TypeError(f"{name} has dtype {dtype}; allowed: bfloat16, float16 (GPU and CPU) "
                            "and float32 (CPU only)")
    if len(set(dtypes)) != 1:
        raise TypeError("query, key and value must have the same dtype, got "
                        f"{dtypes[0]}, {dtypes[1]}, {dtypes[2]}")


def _describe(x):
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is not None:
        return f"an array of shape {tuple(shape)} and dtype {dtype}"
    return f"{x!r}"


def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _check_window(window):
    """``local_window_size`` as ``(left, right)`` Python ints, or None."""
    if window is None:
        return None
    allowed = "None, an int >= 0, or a (left, right) tuple of ints >= 0"
    if _is_int(window):
        window = (window, window)
    elif isinstance(window, (tuple, list)) and len(window) == 2 and all(map(_is_int, window)):
        window = tuple(window)
    else:
        raise TypeError(f"local_window_size must be {allowed} (a Python value, compiled into the "
                        f"kernel), got {window!r} of type {type(window).__name__}")
    if window[0] < 0 or window[1] < 0:
        raise ValueError(f"local_window_size={window!r} must not be negative; allowed: {allowed}")
    if max(window) >= 2 ** 40:
        raise ValueError(f"local_window_size={window!r} is too large: each side must be below "
                         "2**40 (use None for no window)")
    return int(window[0]), int(window[1])


def _check_soft_cap(cap):
    """``logits_soft_cap`` as a float > 0 that is finite in float32, or None."""
    if cap is None:
        return None
    if isinstance(cap, (bool, np.bool_)) or not isinstance(cap, numbers.Real):
        raise TypeError(f"logits_soft_cap must be None or a Python number > 0 (compiled into the "
                        f"kernel), got {cap!r} of type {type(cap).__name__}")
    try:
        as_float = float(cap)
    except OverflowError:
        as_float = math.inf
    with np.errstate(over="ignore"):
        finite = bool(np.isfinite(np.float32(as_float)))
    if not (finite and np.float32(as_float) > 0):
        raise ValueError(f"logits_soft_cap={cap!r} must be a finite number > 0 (in float32), or "
                         "None for no cap")
    return as_float


def _check_int_array(x, name):
    x = _as_array(x, name)
    dtype = jnp.dtype(x.dtype)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype (int32 recommended), got {dtype}")
    return x


def _check_lengths(lengths, name, batch, unbatched, seq):
    """``[batch]`` int lengths as int32, clipped to [0, seq] (which keeps their meaning: position
    i is kept iff i < length), or None."""
    if lengths is None:
        return None
    lengths = _check_int_array(lengths, name)
    allowed = "[] or [1] (no batch axis)" if unbatched else f"[batch] = [{batch}]"
    if unbatched and lengths.shape in ((), (1,)):
        lengths = lengths.reshape((1,))
    elif tuple(lengths.shape) != (batch,):
        raise ValueError(f"{name} has shape {tuple(lengths.shape)}; expected {allowed}")
    return jnp.clip(lengths, 0, seq).astype(jnp.int32)


def _check_segment_ids(q_ids, kv_ids, batch, unbatched, seq_q, seq_kv):
    if q_ids is None and kv_ids is None:
        return None, None
    if q_ids is None or kv_ids is None:
        given, missing = (("query_segment_ids", "key_value_segment_ids") if kv_ids is None
                          else ("key_value_segment_ids", "query_segment_ids"))
        raise ValueError(f"{given} was given without {missing}: pass both or neither")
    out = []
    for ids, name, seq in ((q_ids, "query_segment_ids", seq_q),
                           (kv_ids, "key_value_segment_ids", seq_kv)):
        ids = _check_int_array(ids, name)
        expected = (seq,) if unbatched else (batch, seq)
        if unbatched and tuple(ids.shape) == (1, seq):
            ids = ids.reshape((seq,))
        if tuple(ids.shape) != expected:
            what = "[seq] or [1, seq]" if unbatched else "[batch, seq]"
            raise ValueError(f"{name} has shape {tuple(ids.shape)}; expected {what} = "
                             f"{list(expected)}")
        out.append(ids.reshape((batch, seq)).astype(jnp.int32))
    return tuple(out)


def _check_scale(scale, head_dim=None, allowed="a real number"):
    """The softmax scale as a float: ``1 / sqrt(head_dim)`` for None, else a real number that is
    finite in float32, the precision the kernels take it in (1e39 would become inf there).
    Python (and NumPy scalar) numbers only; ``_scale_operand`` also takes arrays."""
    if scale is None:
        return None if head_dim is None else 1.0 / math.sqrt(head_dim)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be {allowed}, got {scale!r} of type {type(scale).__name__}")
    try:
        as_float = float(scale)
    except OverflowError:  # a Python int beyond float64
        as_float = math.inf
    with np.errstate(over="ignore"):
        finite = bool(np.isfinite(np.float32(as_float)))
    if not finite:
        raise ValueError(f"scale must be finite, got {scale!r}: the kernels take it as float32, "
                         f"whose finite values are at most {float(np.finfo(np.float32).max):.8g} "
                         "in magnitude")
    return as_float


_SCALE_ALLOWED = "a real number or a 0-d array of a real dtype"


def validate_scale(scale):
    """Raises what ``attention`` raises for a bad ``scale`` (None is fine): for adapters that
    take the scale before they see a head_dim (the Flax factory)."""
    if scale is not None:
        _scale_operand(scale, None)


def _scale_operand(scale, head_dim):
    """(0-d float32 array for the kernels, whether it is traced: a gradient may reach it).

    Numbers keep ``_check_scale``'s checks. Arrays (``jax.Array``, tracers, NumPy 0-d arrays) must
    be 0-d with a real (integer or floating) dtype; their value is not checked, which would need it
    on the host: a non-finite scale gives NaN or inf as in jax.nn."""
    if scale is None or isinstance(scale, numbers.Real):
        return jnp.asarray(_check_scale(scale, head_dim, _SCALE_ALLOWED), jnp.float32), False
    if not isinstance(scale, (jax.Array, np.ndarray)):
        _check_scale(scale, allowed=_SCALE_ALLOWED)  # raises the TypeError for other objects
    dtype = np.dtype(scale.dtype)
    if dtype == np.bool_ or not (jnp.issubdtype(dtype, jnp.floating)
                                 or jnp.issubdtype(dtype, jnp.integer)):
        raise TypeError(f"scale must be {_SCALE_ALLOWED}, got an array of dtype {dtype}")
    if np.shape(scale) != ():
        raise ValueError(f"scale must be 0-d (a single number), got an array of shape "
                         f"{tuple(np.shape(scale))}")
    if isinstance(scale, np.ndarray):  # a host value: checked like a number; no gradient
        return jnp.asarray(_check_scale(scale.item()), jnp.float32), False
    return jnp.asarray(scale).astype(jnp.float32), isinstance(scale, jax.core.Tracer)
