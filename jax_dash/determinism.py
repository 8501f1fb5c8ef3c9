"""``check_determinism``: which operations of a program can change its bits from run to run.

The check reads the StableHLO of ``fn`` lowered for a platform, so ``platform="gpu"`` works on a
machine without a GPU; on the current backend it also runs ``fn`` and compares the outputs bitwise.

What is reported (XLA's defaults; the check does not read ``XLA_FLAGS``):

=============================================  ==========================  =====================
operation                                      cuda (``platform="gpu"``)   cpu
=============================================  ==========================  =====================
float scatter-add/-mul whose indices may       reported: atomics add in    not reported: XLA's
repeat (``x.at[i].add``, ``table[ids]``'s      arrival order, and float    CPU scatter runs in
gradient, ``jax.ops.segment_sum``)             adds are not associative    order
overwrite scatter (``x.at[i].set``) whose      reported: the winner of a   not reported
indices may repeat                             repeat is unspecified
``select_and_scatter`` with overlapping        reported (atomics)          not reported
windows (max-pool gradient, stride < window)
cuDNN attention backward                       reported                    (GPU only)
(custom call ``__cudnn$fmha*Backward``)
``jax_dash_bwd`` with ``schedule="atomic"``    reported                    not reported: the CPU
                                                                           kernels add dQ in
                                                                           ticket order
=============================================  ==========================  =====================

Never reported, as the order cannot matter: scatters with ``unique_indices=True``; scatters with one
point per batch element (``jnp.take_along_axis``'s gradient in a cross-entropy: its batching dims
keep the rows apart); integer scatter-adds (exact); scatter-max/-min (order-free up to which of
+0.0/-0.0 wins a tie); non-overlapping max-pools; ``jax_dash_segment_sum``; ``jax_dash_bwd`` with
any other schedule. Not inspected: other custom calls (Pallas/Triton kernels), collectives, and
the cuDNN/cuBLAS algorithms XLA's autotuner may pick differently in another process.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
import sysconfig

import jax
import numpy as np
from jax.extend import backend as jax_backend
from jax.extend import core as jax_core

from jax_dash._ffi import SCHEDULE_IDS

# platform argument -> the lowering platform jax knows it by.
PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}
# Frames in these packages are not "the user's code": a finding points past them.
_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "equinox", "jax_dash")
# "path":line:col in a printed MLIR location (a NameLoc is "name"( instead).
_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):\d+')

# kind -> (op, why, fix) of a scatter whose repeated indices' updates can land in any order.
_SCATTER = {
    "add": ("scatter-add",
            "Its indices may repeat, and on the GPU the adds into a repeated index run as atomics "
            "in arrival order, so the float sum's bits can change from run to run.",
            "Use jax_dash.embed(table, ids) for embedding lookups, or jax_dash.segment_sum for "
            "segment sums; if the indices never repeat, pass unique_indices=True."),
    "mul": ("scatter-mul",
            "Its indices may repeat, and on the GPU the products into a repeated index run as "
            "atomics in arrival order, so the float result's bits can change from run to run.",
            "Make each index appear once (then pass unique_indices=True), or multiply the "
            "repeated updates together first in a fixed order."),
    "set": ("scatter (overwrite)",
            "Its indices may repeat, and which update wins at a repeated index is unspecified "
            "on the GPU (whichever write lands last).",
            "Make each index appear once (then pass unique_indices=True), or combine repeated "
            "updates with an order-free rule such as .at[idx].max(v)."),
    "other": ("scatter (custom combiner)",
              "Its indices may repeat, and on the GPU its combiner is applied to a repeated "
              "index's updates in arrival order.",
              "Make each index appear once, then pass unique_indices=True."),
}
_COMBINERS = {"stablehlo.add": "add", "stablehlo.multiply": "mul", "stablehlo.maximum": "max",
              "stablehlo.minimum": "min", "stablehlo.and": "and", "stablehlo.or": "or",
              "stablehlo.xor": "xor"}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One operation that is not run-to-run deterministic on the platform checked."""

    op: str      # what it is, e.g. "scatter-add"
    source: str  # "file.py:LINE" of the user's code that produced it
    why: str     # one sentence
    fix: str     # one sentence

    def __str__(self):
        return f"{self.source}: {self.op}: {self.why} Fix: {self.fix}"


@dataclasses.dataclass(frozen=True)
class DeterminismReport:
    """``findings``: the non-deterministic operations in the program lowered for ``platform``.
    ``identical``: whether ``runs`` runs on the current backend gave the same bits; None when
    they were not made, and ``reason`` says why. ``ok`` needs both: no finding and identical
    runs, so a report for another platform than the current backend (or ``runs=0``) is never
    ``ok``: its findings alone cannot show that the program is deterministic there."""

    platform: str
    findings: list[Finding]
    identical: bool | None
    runs: int
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return not self.findings and self.identical is True

    def __str__(self):
        count = len(self.findings)
        lines = [f"check_determinism on {self.platform}: "
                 + (f"{count} non-deterministic operation{'s' * (count != 1)}" if count
                    else "no non-deterministic operation")]
        lines += [f"  {finding}" for finding in self.findings]
        if self.identical is None:
            lines.append(f"  runs not compared: {self.reason}")
        else:
            lines.append(f"  {self.runs} runs: " + ("identical bits" if self.identical
                                                    else "the bits differ between runs"))
        lines.append("  ok" if self.ok else "  not ok")
        return "\n".join(lines)


def check_determinism(fn, *args, platform=None, runs=2, **kwargs) -> DeterminismReport:
    """Lists the operations of ``fn(*args, **kwargs)`` that are not run-to-run deterministic on
    ``platform`` (None: the default device's; ``"gpu"``/``"cuda"`` or ``"cpu"``), from its
    lowering under ``jax.jit``, so no device of that platform is needed. When ``platform`` is
    the current backend, also runs the jitted ``fn`` ``runs`` times (0: never; else at least 2)
    and compares every output leaf bitwise. ``fn`` may already be jitted (its static arguments
    are then kept); it must not donate its arguments when it is run."""
    if not callable(fn):
        raise TypeError(f"fn must be callable (the function to check), got {fn!r} "
                        f"(type {type(fn).__name__})")
    if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs == 1 or runs < 0:
        raise ValueError(f"runs must be 0 (do not run) or an int >= 2 (runs to compare), "
                         f"got {runs!r}")
    current = _current_platform()
    target = _lowering_platform(platform, current)
    jitted = fn if hasattr(fn, "trace") and hasattr(fn, "lower") else jax.jit(fn)
    traced = jitted.trace(*args, **kwargs)
    findings = _scan(traced, target)

    if target != current:
        return DeterminismReport(target, findings, None, 0,
                                 f"platform {target!r} is not the current backend {current!r}; "
                                 "the findings come from the lowered program alone")
    if runs == 0:
        return DeterminismReport(target, findings, None, 0, "runs=0")
    first, *others = (_output_bits(jitted(*args, **kwargs)) for _ in range(int(runs)))
    return DeterminismReport(target, findings, all(bits == first for bits in others), int(runs))


def _current_platform() -> str:
    """The platform of the device ``jax.jit`` runs on (``jax.default_device`` included)."""
    device = jax_backend.get_default_device()
    if device.platform == "gpu":  # CUDA and ROCm are both "gpu" to jax
        version = jax_backend.get_backend("gpu").platform_version.lower()
        return "rocm" if "rocm" in version else "cuda"
    return device.platform


def _lowering_platform(platform, current: str) -> str:
    allowed = "None (the current backend), 'cpu', 'gpu' or 'cuda'"
    if platform is None:
        if current not in PLATFORMS.values():
            raise ValueError(f"platform=None means the current backend {current!r}, whose "
                             f"non-deterministic operations check_determinism does not know; "
                             f"pass platform= one of {allowed}")
        return current
    if not isinstance(platform, str) or platform.lower() not in PLATFORMS:
        raise ValueError(f"platform={platform!r} is not supported; allowed: {allowed} (ROCm and "
                         "TPU are not covered)")
    return PLATFORMS[platform.lower()]


def _output_bits(outputs):
    """(dtype, shape, raw bytes) per output leaf: NaN-safe, and -0.0 differs from 0.0."""
    bits = []
    for leaf in jax.tree.leaves(outputs):
        if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        array = np.asarray(jax.device_get(leaf))
        bits.append((array.dtype.str, array.shape, array.tobytes()))
    return bits


# ---- the scan ------------------------------------------------------------------------------------

def _scan(traced, platform: str) -> list[Finding]:
    """The findings of the program ``traced`` lowered for ``platform``, once per (op, source)."""
    if platform != "cuda":
        return []  # XLA:CPU and the jax_dash CPU kernels are deterministic (module docstring)
    module = traced.lower(lowering_platforms=(platform,)).compiler_ir("stablehlo")
    findings = _scan_module(module)
    if any(op.name == "stablehlo.custom_call" and
           _symbol(op.attributes["call_target_name"]) == "CustomSPMDPartitioning"
           for op in _walk(module.operation)):
        # Lowered for several devices, a custom_partitioning op (jax_dash's attention under a
        # sharding) is a call whose body only the partitioner sees: lower each body alone.
        for body in _partitioned_bodies(traced.jaxpr.jaxpr):
            avals = [jax.ShapeDtypeStruct(aval.shape, aval.dtype) for aval in body.in_avals]
            alone = jax.jit(jax_core.jaxpr_as_fun(body)).trace(*avals)
            findings += _scan_module(alone.lower(lowering_platforms=(platform,))
                                     .compiler_ir("stablehlo"))
    return list({(f.op, f.source): f for f in findings}.values())


def _partitioned_bodies(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "custom_partitioning":
            yield eqn.params["call"]
        for inner in jax_core.jaxprs_in_params(eqn.params):
            yield from _partitioned_bodies(inner)


def _scan_module(module) -> list[Finding]:
    """The findings of every function of ``module``, in program order."""
    functions = {_symbol(op.attributes["sym_name"]): op.operation
                 for op in module.body.operations if op.operation.name == "func.func"}
    callers = {}  # function name -> [(location of a call, the calling function)]
    for name, function in functions.items():
        for op in _walk(function):
            for callee in _callees(op):
                callers.setdefault(callee, []).append((str(op.location), name))
    return [Finding(found[0], _source(str(op.location), name, callers), *found[1:])
            for name, function in functions.items() for op in _walk(function)
            if (found := _classify(op)) is not None]


def _classify(op):
    """(op, why, fix) when ``op`` is not deterministic on the GPU, else None."""
    if op.name == "stablehlo.scatter":
        kind = _scatter_kind(op)
        return None if kind is None else _SCATTER[kind]
    if op.name == "stablehlo.select_and_scatter":
        windows = _int_list(op.attributes["window_dimensions"])
        strides = (_int_list(op.attributes["window_strides"])
                   if "window_strides" in op.attributes else [1] * len(windows))
        if all(stride >= window for window, stride in zip(windows, strides)):
            return None  # every input position is in at most one window: one add each
        return ("select_and_scatter",
                "The gradient of an overlapping max-pool (stride < window) adds into input "
                "positions shared by several windows with GPU atomics, in arrival order.",
                "Compute the pool as a max over its strided shifted slices "
                "(jnp.max(jnp.stack([x[:, i::s, j::s] ...]), 0)), whose gradient adds in a "
                "fixed order, or use non-overlapping windows (stride = window).")
    if op.name == "stablehlo.custom_call":
        target = _symbol(op.attributes["call_target_name"])
        if "cudnn$fmha" in target and "Backward" in target:
            return ("cudnn attention backward",
                    "cuDNN's fused attention backward accumulates dQ with atomics in arrival "
                    "order, so its gradients' bits can change from run to run.",
                    "Use jax_dash.attention, a drop-in for jax.nn.dot_product_attention with a "
                    "bitwise-reproducible backward.")
        config = str(op.attributes["mhlo.backend_config"]) if (
            "mhlo.backend_config" in op.attributes) else ""
        atomic = re.search(rf"\bschedule = {SCHEDULE_IDS['atomic']}\b", config)
        if target == "jax_dash_bwd" and atomic:
            return ("jax_dash attention schedule='atomic'",
                    "schedule='atomic' adds dQ partials with fp32 atomics in arrival order (it "
                    "exists to measure what determinism costs).",
                    "Use schedule='auto' (or any other schedule).")
    return None


def _scatter_kind(op):
    """"add", "mul", "set" or "other" for a scatter that can order repeated indices' updates
    differently from run to run on the GPU; None when that cannot happen or cannot matter."""
    if str(op.attributes["unique_indices"]) == "true":
        return None
    inputs = (len(op.operands) - 1) // 2  # operands: inputs..., indices, updates...
    _, element = _tensor(op.operands[0].type)
    indices_shape, _ = _tensor(op.operands[inputs].type)
    updates_shape, _ = _tensor(op.operands[inputs + 1].type)
    if 0 in updates_shape:
        return None
    numbers = str(op.attributes["scatter_dimension_numbers"])
    # The printer leaves out index_vector_dim when it is 0.
    found = re.search(r"index_vector_dim = (\d+)", numbers)
    vector_dim = int(found.group(1)) if found else 0
    batching = _field(numbers, "scatter_indices_batching_dims")
    # Points of one batch element (one point's window never overlaps itself; batching dims keep
    # batch elements apart). One point per batch element cannot collide: take_along_axis's grad.
    points = np.prod([size if size >= 0 else 2 for dim, size in enumerate(indices_shape)
                      if dim != vector_dim and dim not in batching], dtype=np.int64)
    if points <= 1:
        return None
    combiner = _combiner(op, inputs)
    if combiner in ("keep", "max", "min", "and", "or", "xor"):
        return None  # order-free (max/min: up to which of +0.0/-0.0 wins a tie)
    if combiner in ("add", "mul") and re.fullmatch(r"u?i\d+", element):
        return None  # integer arithmetic is exact, so order-free
    return combiner


def _combiner(op, inputs: int) -> str:
    """What the scatter's update computation returns: an op of _COMBINERS, "set" (the update),
    "keep" (the operand) or "other"."""
    block = op.regions[0].blocks[0]
    result = list(block.operations)[-1].operands[0]
    if hasattr(result, "arg_number"):  # a block argument: operands first, then updates
        return "set" if result.arg_number >= inputs else "keep"
    return _COMBINERS.get(getattr(result.owner, "operation", result.owner).name, "other")


# ---- where an op comes from ----------------------------------------------------------------------

def _source(location: str, function: str, callers: dict) -> str:
    """The innermost frame of the user's code in ``location``, then in the locations of the
    calls of its function (an op inside a nested jit carries only the frames below the call)."""
    own, frames, seen = location, [], set()
    while function not in seen:
        seen.add(function)
        frames += _FILE_LOC.findall(location)
        if any(not _is_library(path) for path, _ in frames) or function not in callers:
            break
        location, function = callers[function][0]
    user = [frame for frame in frames if not _is_library(frame[0])]
    if not (user or frames):  # no line at all: jax's name of the op is the best there is
        name = re.match(r'loc\("([^"]*)"', own)
        return f"{name.group(1)} (no source line)" if name else "unknown location"
    path, line = (user or frames)[0]
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    return f"{path if relative.startswith('..') else relative}:{line}"


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    dirs = []
    for name in _LIBRARIES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # ValueError: imported without a spec
            continue
        dirs += list(spec.submodule_search_locations or ()) if spec else []
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


@functools.cache
def _is_library(path: str) -> bool:
    real = os.path.realpath(path)
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
    if real.startswith(stdlib) and "-packages" not in real:
        return True  # contextlib, functools: never where the user wrote the op
    return real.startswith(_library_dirs())


# ---- reading MLIR through its printed attributes (no jaxlib import) ---------------------------

def _walk(op):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _walk(inner.operation)


def _callees(op):
    for name in ("callee", "decomposition", "called_computations"):
        if name in op.attributes:
            yield from re.findall(r"@([\w$.-]+)", str(op.attributes[name]))


def _symbol(attribute) -> str:
    return str(attribute).strip('"@')


def _int_list(attribute) -> list[int]:
    """The ints of ``array<i64: 1, 2>`` or ``dense<[1, 2]> : tensor<2xi64>``."""
    values = re.sub(r"\b[iu]\d+:", "", str(attribute).split(" : ")[0])
    return [int(x) for x in re.findall(r"-?\d+", values)]


def _field(numbers: str, name: str) -> list[int]:
    match = re.search(rf"\b{name} = \[([\d, ]*)\]", numbers)
    return [int(x) for x in match.group(1).split(",") if x.strip()] if match else []


def _tensor(type_) -> tuple[list[int], str]:
    """([dims], element type) of a printed ranked tensor type; -1 for a dynamic dim."""
    text = str(type_)
    body = text[text.index("<") + 1:text.rindex(">")].split(",")[0]
    *dims, element = body.split("x")
    return [-1 if d == "?" else int(d) for d in dims], element
