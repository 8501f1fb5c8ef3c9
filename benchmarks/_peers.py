"""The implementations under test, as plain functions (q, k, v) -> out over [B, S, H, D] arrays.

`jax_dash` is our op (one variant per backward schedule); `cudnn`, `cudnn_det` and `xla` are
`jax.nn.dot_product_attention`. `cudnn_det` is the same call as `cudnn`: what makes it
deterministic is XLA_FLAGS=--xla_gpu_deterministic_ops=true, which only a separate process can set
(see DETERMINISTIC_XLA_FLAG and bench_attention.py's worker groups).

`fa3` is FlashAttention-3 through the `flash-attn3-jax` wheel (`flash_attn3_jax.flash_mha`;
bf16/fp16, head_dim 128 only in wheel 0.2.3, GQA supported). `fa3_det` is the same binding with
the backward kernel's `deterministic` attribute switched on. The wheel hard-codes that attribute:
`flash_attn3_jax/flash_hlo.py`, `_flash_mha_bwd_hlo_lowering`, lowers the backward with
`jax.ffi.ffi_call("flash_mha_bwd", ...)(dout, q, k, v, out, lse, ..., deterministic=False, ...)`,
looking `jax` up in flash_hlo's module globals at lowering time. `patch_fa3_deterministic()`
replaces that one global (`flash_attn3_jax.flash_hlo.jax`) by a thin proxy that forwards
everything to the real `jax`, except that a `jax.ffi.ffi_call` for the target "flash_mha_bwd"
returns a call whose `deterministic` attribute is forced to True (it fails loudly if the wheel
no longer passes `deterministic=False`, i.e. its binding changed). No code of the wheel is copied.
The switch is read when the backward is lowered (compiled), so it is per process: `fa3_det` runs
in worker processes started with FA3_DETERMINISTIC_ENV=1 (the patch is applied there on first
use) and `fa3` in processes without it, as `cudnn_det` / `cudnn` are split by XLA_FLAGS.

`tokamax` is `tokamax.dot_product_attention(..., implementation=TOKAMAX_IMPLEMENTATIONS)` (its
Pallas Mosaic-GPU kernel, else Triton; never its silent XLA fallback). tokamax imports `xprof`
only for its profiling helpers; where xprof is absent, `_import_tokamax` installs a stub module.

Peers in CHECKED_IMPLS are checked against jax_dash.reference before they are timed
(`check_against_reference`, the accuracy criterion of tests/helpers.py); one that fails raises
Wrong and is reported as wrong at that point, never as a speed.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

DETERMINISTIC_XLA_FLAG = "--xla_gpu_deterministic_ops=true"


FA3_DETERMINISTIC_ENV = "JAX_DASH_BENCH_FA3_DETERMINISTIC"
FA3_BWD_TARGET = "flash_mha_bwd"
FA3_HEAD_DIMS = (128,)  # flash-attn3-jax 0.2.3 ships kernels for head_dim 128 only
TOKAMAX_IMPLEMENTATIONS = ("mosaic", "triton")
# Peers whose forward and gradients are checked against the reference before being timed.
CHECKED_IMPLS = ("fa3", "fa3_det", "tokamax", "triton_tutorial")
# Peers that run in PyTorch, not JAX: timed by their own module (_triton_tutorial.py).
TORCH_IMPLS = ("triton_tutorial",)
# Accuracy criterion (tests/helpers.py): max|peer - ref| <= 2 * max|naive_lowp - ref| + atol.
CHECK_ATOL = 1e-3
CHECK_MAX_BATCH = 1  # the check runs on a slice: attention is independent per (batch, head)
CHECK_MAX_HEADS = 2


class Unavailable(Exception):
    """The implementation cannot run here (no GPU for cuDNN, jax_dash not built, ...)."""


class Wrong(Exception):
    """The implementation ran but its forward or gradients fail the reference check."""

    def __init__(self, message: str, check: dict):
        super().__init__(message)
        self.check = check


def xla_flags_with_determinism(env: dict) -> dict:
    env = dict(env)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + DETERMINISTIC_XLA_FLAG).strip()
    return env


def process_is_deterministic() -> bool:
    return DETERMINISTIC_XLA_FLAG in os.environ.get("XLA_FLAGS", "")


def env_with_fa3_deterministic(env: dict) -> dict:
    return dict(env, **{FA3_DETERMINISTIC_ENV: "1"})


def process_is_fa3_deterministic() -> bool:
    return os.environ.get(FA3_DETERMINISTIC_ENV, "") == "1"


def worker_group(impl: str) -> str:
    """Which worker process group runs `impl`: "default", "det" (XLA flag) or "fa3_det"."""
    return {"cudnn_det": "det", "fa3_det": "fa3_det"}.get(impl, "default")


def _backend() -> str:  # a function so the tests can pretend to be on a GPU
    import jax
    return jax.default_backend()


def _require_gpu(what: str):
    backend = _backend()
    if backend != "gpu":
        raise Unavailable(f"{what} needs a CUDA GPU; this process runs on {backend!r}")


# ----------------------------------------------------------------------------- FlashAttention-3

# Filled by patch_fa3_deterministic: how many "flash_mha_bwd" lowerings had the attribute forced.
FA3_PATCH = {"installed": False, "bwd_lowerings": 0}


class _FfiForcingDeterministicBwd:
    """`jax.ffi` as seen by flash_hlo: ffi_call("flash_mha_bwd") gets deterministic=True."""

    def __init__(self, ffi):
        self._ffi = ffi

    def __getattr__(self, name):
        return getattr(self._ffi, name)

    def ffi_call(self, target_name, *args, **kwargs):
        call = self._ffi.ffi_call(target_name, *args, **kwargs)
        if target_name != FA3_BWD_TARGET:
            return call

        def deterministic_call(*operands, **attrs):
            if attrs.get("deterministic") is not False:
                raise RuntimeError(
                    f"flash_attn3_jax lowered {FA3_BWD_TARGET!r} with deterministic="
                    f"{attrs.get('deterministic', '<absent>')!r}, not the False this patch "
                    f"expects: the wheel's binding changed, benchmarks/_peers.py needs updating")
            attrs["deterministic"] = True
            FA3_PATCH["bwd_lowerings"] += 1
            return call(*operands, **attrs)

        return deterministic_call


class _JaxForcingDeterministicBwd:
    """Stands in for the module `jax` inside flash_attn3_jax.flash_hlo only."""

    def __init__(self, jax_module):
        self._jax = jax_module
        self.ffi = _FfiForcingDeterministicBwd(jax_module.ffi)

    def __getattr__(self, name):
        return getattr(self._jax, name)


def patch_fa3_deterministic(flash_hlo=None):
    """Makes every later lowering of FA3's backward in this process deterministic (idempotent)."""
    if flash_hlo is None:
        flash_hlo = importlib.import_module("flash_attn3_jax.flash_hlo")
    current = getattr(flash_hlo, "jax", None)
    if isinstance(current, _JaxForcingDeterministicBwd):
        return
    if current is None or not hasattr(current, "ffi"):
        raise RuntimeError("flash_attn3_jax.flash_hlo has no global `jax` with `ffi`: the "
                           "deterministic patch in benchmarks/_peers.py does not apply")
    flash_hlo.jax = _JaxForcingDeterministicBwd(current)
    FA3_PATCH["installed"] = True


def _import_fa3():
    try:
        module = importlib.import_module("flash_attn3_jax")
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in ("flash_attn3_jax", "flash_attn3_jax_lib"):
            raise Unavailable(f"not installed ({e.name} is not importable; "
                              f"pip install flash-attn3-jax)")
        raise Unavailable(f"import flash_attn3_jax failed: {type(e).__name__}: {e}")
    except ImportError as e:  # e.g. its CUDA extension does not load
        raise Unavailable(f"import flash_attn3_jax failed: {type(e).__name__}: {e}")
    return module


def fa3_fn(impl: str, *, is_causal: bool, head_dim: int | None = None, window=None):
    module = _import_fa3()
    _require_gpu("FlashAttention-3")
    if head_dim is not None and head_dim not in FA3_HEAD_DIMS:
        raise Unavailable(f"flash_attn3_jax {getattr(module, '__version__', '?')} has kernels "
                          f"for head_dim {FA3_HEAD_DIMS} only, not {head_dim}")
    if (impl == "fa3_det") != process_is_fa3_deterministic():
        raise Unavailable(f"{impl} must run in a process with{'' if impl == 'fa3_det' else 'out'} "
                          f"{FA3_DETERMINISTIC_ENV}=1 (the switch is per process)")
    if impl == "fa3_det":
        patch_fa3_deterministic(importlib.import_module("flash_attn3_jax.flash_hlo"))
    flash_mha = module.flash_mha
    # GQA is detected from the head counts; without the patch its backward accumulates with atomics.
    # FA3's window_size is (left, right) keys around the query, -1 for no limit: jax.nn's
    # local_window_size.
    window_size = tuple(window) if window is not None else (-1, -1)
    return lambda q, k, v: flash_mha(q, k, v, is_causal=is_causal, window_size=window_size)


# ----------------------------------------------------------------------------- tokamax

def _install_xprof_stub():
    """tokamax/_src/benchmarking.py does `from xprof.cli.tools import get_kernel_stats_tool`,
    used only by its own profiling helpers. Where xprof is absent, a stub stands in."""
    if "xprof" in sys.modules or importlib.util.find_spec("xprof") is not None:
        return False

    def get_kernel_stats_tool(*args, **kwargs):
        raise RuntimeError("xprof is a stub installed by benchmarks/_peers.py")

    names = ("xprof", "xprof.cli", "xprof.cli.tools")
    modules = [types.ModuleType(n) for n in names]
    modules[2].get_kernel_stats_tool = get_kernel_stats_tool
    modules[0].cli, modules[1].tools = modules[1], modules[2]
    for n, m in zip(names, modules):
        m.__jax_dash_bench_stub__ = True
        sys.modules[n] = m
    return True


def tokamax_fn(*, is_causal: bool, window=None):
    _install_xprof_stub()
    try:
        tokamax = importlib.import_module("tokamax")
    except ImportError as e:
        raise Unavailable(f"import tokamax failed ({type(e).__name__}: {e}); pip install tokamax")
    _require_gpu("tokamax's Pallas attention")
    return lambda q, k, v: tokamax.dot_product_attention(
        q, k, v, is_causal=is_causal, local_window_size=window,
        implementation=TOKAMAX_IMPLEMENTATIONS)


# ----------------------------------------------------------------------------- all peers

def attention_fn(impl: str, *, is_causal: bool, schedule: str | None = None,
                 head_dim: int | None = None, window=None):
    """Returns f(q, k, v) -> out for `impl`, or raises Unavailable with the reason.
    `head_dim` (where known) lets a peer that lacks kernels for it say so; `window` is jax.nn's
    `local_window_size` as (left, right), None for no window."""
    import jax
    window = tuple(window) if window is not None else None
    if impl in ("fa3", "fa3_det"):
        return fa3_fn(impl, is_causal=is_causal, head_dim=head_dim, window=window)
    if impl == "tokamax":
        return tokamax_fn(is_causal=is_causal, window=window)
    if impl in TORCH_IMPLS:
        raise Unavailable(f"{impl} runs in PyTorch, not as a JAX function: only its timing "
                          f"(bench_attention.py's time items) is implemented")
    if impl == "jax_dash":
        try:
            import jax_dash
        except Exception as e:  # not built / import error: recorded, the peers still run
            raise Unavailable(f"import jax_dash failed: {type(e).__name__}: {e}")
        sched = schedule or "auto"
        return lambda q, k, v: jax_dash.attention(q, k, v, is_causal=is_causal, schedule=sched,
                                                  local_window_size=window)
    if impl in ("cudnn", "cudnn_det"):
        if jax.default_backend() != "gpu":
            raise Unavailable(f"cuDNN attention needs a CUDA GPU; this process runs on "
                              f"{jax.default_backend()!r}")
        if (impl == "cudnn_det") != process_is_deterministic():
            raise Unavailable(f"{impl} must run in a process with XLA_FLAGS "
                              f"{'containing' if impl == 'cudnn_det' else 'without'} "
                              f"{DETERMINISTIC_XLA_FLAG}")
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=is_causal, local_window_size=window, implementation="cudnn")
    if impl == "xla":
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=is_causal, local_window_size=window, implementation="xla")
    raise ValueError(f"impl={impl!r} is not one of jax_dash, cudnn, cudnn_det, xla, fa3, "
                     f"fa3_det, tokamax, triton_tutorial")


def _reference_module():
    try:
        from jax_dash import reference
        return reference
    except Exception:  # jax_dash not built: its reference is pure JAX, load the file alone
        path = Path(__file__).resolve().parents[1] / "jax_dash" / "reference.py"
        spec = importlib.util.spec_from_file_location("_jax_dash_reference", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


TENSORS = ("out", "dq", "dk", "dv")


def check_against_reference(fn, q, k, v, dout, *, is_causal: bool, atol: float = CHECK_ATOL,
                            window=None):
    """Checks fn's forward and gradients against jax_dash.reference on one input set: runs fn
    and its VJP on the full inputs, then `check_outputs`. Raises Wrong as that does."""
    import jax

    def fwd_bwd(q, k, v, dout):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(dout))

    got = jax.jit(fwd_bwd)(q, k, v, dout)
    return check_outputs(got, q, k, v, dout, is_causal=is_causal, atol=atol, window=window)


def check_outputs(got, q, k, v, dout, *, is_causal: bool, atol: float = CHECK_ATOL, window=None):
    """Checks a peer's (out, dq, dk, dv) for inputs (q, k, v, dout), all [B, S, H, D], against
    jax_dash.reference.

    Criterion (tests/helpers.py): for out, dq, dk, dv, max|peer - ref_fp32| <=
    2 * max|naive_lowp - ref_fp32| + atol, naive_lowp being the reference computed in the input
    dtype. The comparison uses the first CHECK_MAX_BATCH sequences and CHECK_MAX_HEADS query
    heads (with their KV heads), since attention is independent per (batch, head) and the
    reference materialises S^2 scores. Returns the check (per tensor: error, budget, ok); raises
    Wrong if any tensor fails or is not finite.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    ref_mod = _reference_module()
    heads, kv_heads = q.shape[2], k.shape[2]
    group = heads // kv_heads
    kv_keep = max(1, min(kv_heads, -(-CHECK_MAX_HEADS // group)))
    q_keep = kv_keep * group  # whole GQA groups, so the slice's dk/dv are complete
    nb = min(CHECK_MAX_BATCH, q.shape[0])
    sq = lambda x: x[:nb, :, :q_keep]
    skv = lambda x: x[:nb, :, :kv_keep]
    qs, ks, vs, ds = sq(q), skv(k), skv(v), sq(dout)
    got = [sq(got[0]), sq(got[1]), skv(got[2]), skv(got[3])]

    masks = {} if window is None else {"local_window_size": tuple(window)}

    def run_ref(qs, ks, vs, ds, *, compute_dtype):
        out, lse = ref_mod.reference_forward(qs, ks, vs, is_causal=is_causal,
                                             compute_dtype=compute_dtype, **masks)
        grads = ref_mod.reference_backward(qs, ks, vs, out, lse, ds, is_causal=is_causal,
                                           compute_dtype=compute_dtype, **masks)
        return (out, *grads)

    # The inputs are arguments, not closed-over constants: XLA would constant-fold the reference's
    # S^2 matmuls at compile time (20-80 s a point on an H100 in the seventeenth session's call 1).
    ref = jax.jit(functools.partial(run_ref, compute_dtype=jnp.float32))(qs, ks, vs, ds)
    naive = jax.jit(functools.partial(run_ref, compute_dtype=q.dtype))(qs, ks, vs, ds)
    check = {"criterion": "max|peer - ref_fp32| <= 2 * max|naive_lowp - ref_fp32| + atol",
             "atol": atol, "slice": {"batch": nb, "heads": q_keep, "kv_heads": kv_keep},
             "tensors": {}}
    failures = []
    for name, g, r, n in zip(TENSORS, got, ref, naive):
        g, r, n = (np.asarray(x, dtype=np.float64) for x in (g, r, n))
        finite = bool(np.all(np.isfinite(g)))
        error = float(np.max(np.abs(g - r))) if finite else float("inf")
        budget = 2 * float(np.max(np.abs(n - r))) + atol
        ok = finite and error <= budget
        check["tensors"][name] = {"max_error": error, "budget": budget, "finite": finite, "ok": ok}
        if not ok:
            failures.append(f"{name}: max|peer - ref| = {error:.3e} > budget {budget:.3e}"
                            if finite else f"{name}: not finite")
    check["ok"] = not failures
    if failures:
        raise Wrong("wrong against the reference: " + "; ".join(failures), check)
    return check


def jitted_pair(fn):
    """(forward, forward+backward) jitted. The backward is the VJP with a given cotangent `dout`
    (equivalent to grad of sum(out * dout)); fwd+bwd returns only (dq, dk, dv)."""
    import jax

    def fwd_bwd(q, k, v, dout):
        _, vjp = jax.vjp(fn, q, k, v)
        return vjp(dout)

    return jax.jit(fn), jax.jit(fwd_bwd)


def jitted_backward(fn):
    """(residuals, backward), both jitted, to time the backward alone.

    `residuals(q, k, v)` runs the forward and returns its VJP function: a pytree that holds what
    the backward needs (for jax_dash q, k, v, out and the log-sum-exp; for XLA's attention the
    S^2 probabilities), exactly what a training step keeps from its forward. `backward(vjp_fn,
    dout)` runs the backward only and returns (dq, dk, dv).
    """
    import jax

    def residuals(q, k, v):
        return jax.vjp(fn, q, k, v)[1]

    def backward(vjp_fn, dout):
        return vjp_fn(dout)

    return jax.jit(residuals), jax.jit(backward)


def random_inputs(point, *, num_sets: int, dtype_name: str | None = None, seed: int = 0):
    """`num_sets` independent (q, k, v, dout) tuples of standard normals (never zeros), in
    `dtype_name` (default: `point.dtype`)."""
    import jax
    import jax.numpy as jnp
    dtype = jnp.dtype(dtype_name or point.dtype)
    shape = (point.batch, point.seq, point.heads, point.head_dim)
    kv_shape = (point.batch, point.seq, point.num_kv_heads, point.head_dim)
    sets = []
    for i in range(num_sets):
        keys = jax.random.split(jax.random.key(seed * 1000 + i), 4)
        sets.append(tuple(jax.random.normal(kk, s, dtype)
                          for kk, s in zip(keys, (shape, kv_shape, kv_shape, shape))))
    return sets
