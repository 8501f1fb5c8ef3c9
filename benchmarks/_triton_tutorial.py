"""`triton_tutorial`: Triton's fused-attention tutorial as a peer, timed in PyTorch.

The DASH paper's second baseline (arXiv 2601.21824) is the fused attention of Triton's tutorial
`python/tutorials/06-fused-attention.py` (triton-lang/triton). Its backward is deterministic by
construction: each program computes one KV tile's dK/dV over the Q tiles and then one Q tile's dQ
over the KV tiles, without atomics. Its kernels take float16 (P and dS are cast to float16) in
[B, H, S, D] layout, S a multiple of 128, no GQA.

The tutorial is not part of this repository and none of its code is copied here: the benchmark
loads the file, as published for the installed Triton, from the path given by
`bench_attention.py --triton-tutorial PATH` (exported to the workers as TUTORIAL_ENV), and
calls its `attention(q, k, v, causal, sm_scale, warp_specialize)` autograd function as its own
benchmark does (`_warp_specialize`; the forward autotunes, the backward has fixed tiles).
Inputs are the same random tensors as every other impl's (`_peers.random_inputs`), copied to
PyTorch and transposed to [B, H, S, D] outside the timing. Its forward and gradients are checked
against jax_dash.reference before it is timed (`_peers.check_outputs`), as for the other peers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from pathlib import Path

import _grid
import _peers
import _timing

TUTORIAL_ENV = "JAX_DASH_BENCH_TRITON_TUTORIAL"
SEQ_MULTIPLE = 128  # the tutorial's backward asserts N_CTX % 128 == 0
BWD_METHOD = ("torch.autograd.grad(out, (q, k, v), dout) on a forward run outside the timing "
              "(the tutorial's backward: K prescaled, dO.O preprocess, dK/dV + dQ kernel)")

_loaded = {}  # path -> module: one import per worker process


def tutorial_path() -> Path:
    text = os.environ.get(TUTORIAL_ENV, "")
    if not text:
        raise _peers.Unavailable(
            f"no tutorial file: pass bench_attention.py --triton-tutorial PATH (or set "
            f"{TUTORIAL_ENV}), PATH being python/tutorials/06-fused-attention.py of "
            f"triton-lang/triton for the installed Triton")
    path = Path(text)
    if not path.is_file():
        raise _peers.Unavailable(f"{TUTORIAL_ENV}={text!r} is not a file")
    return path


def load_tutorial():
    """The tutorial's module (imported once per process), or Unavailable with the reason."""
    path = tutorial_path()
    key = str(path.resolve())
    if key in _loaded:
        return _loaded[key]
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        raise _peers.Unavailable(f"the Triton tutorial needs PyTorch and Triton: {e}")
    if not torch.cuda.is_available():
        raise _peers.Unavailable("the Triton tutorial needs a CUDA GPU; torch sees none")
    spec = importlib.util.spec_from_file_location("_jax_dash_bench_triton_tutorial", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # e.g. a tutorial written for another Triton's API
        raise _peers.Unavailable(f"importing {path} failed: {type(e).__name__}: {e}")
    if not callable(getattr(module, "attention", None)):
        raise _peers.Unavailable(f"{path} defines no attention(q, k, v, causal, sm_scale)")
    _loaded[key] = module
    return module


def _unsupported(point) -> str | None:
    if point.dtype != "float16":
        return (f"the Triton tutorial's kernels are float16 only (P and dS are cast to float16); "
                f"this point is {point.dtype}: run bench_attention.py with --dtype float16")
    if point.num_kv_heads != point.heads:
        return "the Triton tutorial has no GQA (kv_heads must equal heads)"
    if point.seq % SEQ_MULTIPLE:
        return f"the Triton tutorial's backward needs seq % {SEQ_MULTIPLE} == 0, not {point.seq}"
    return None


def _warp_specialize(module, causal: bool) -> bool:
    """The tutorial's `warp_specialize` argument (its forward only), chosen as its own benchmark
    chooses it: on Blackwell always, on Hopper only without the causal mask (Triton 3.6 fails to
    compile its causal warp-specialized forward on an H100: "PassManager::run failed")."""
    if callable(getattr(module, "is_blackwell", None)) and module.is_blackwell():
        return True
    return not causal


def _file_info(path: Path) -> dict:
    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def run_time(item: dict) -> dict:
    """bench_attention's time item for the tutorial: the same result keys as _worker.run_time."""
    point = _grid.Point.from_json(item["point"])
    reason = _unsupported(point)
    if reason:
        raise _peers.Unavailable(reason)
    module = load_tutorial()
    import jax
    import numpy as np
    import torch
    import triton

    causal, scale = point.is_causal, 1.0 / math.sqrt(point.head_dim)
    ws = _warp_specialize(module, causal)
    jax_sets = _peers.random_inputs(point, num_sets=item["num_sets"])
    jax.block_until_ready(jax_sets)

    def to_torch(x):  # [B, S, H, D] JAX array -> contiguous [B, H, S, D] CUDA tensor
        return torch.from_numpy(np.array(x)).cuda().permute(0, 2, 1, 3).contiguous()

    # q, k, v are leaves that require grad; autograd.grad returns the gradients without
    # accumulating them in .grad, so every call does the same work.
    sets = [tuple(to_torch(x).requires_grad_(i < 3) for i, x in enumerate(s)) for s in jax_sets]
    torch.cuda.synchronize()

    def fwd(q, k, v):
        with torch.no_grad():
            return module.attention(q, k, v, causal, scale, ws)

    def forward_graph(q, k, v):
        return (module.attention(q, k, v, causal, scale, ws), q, k, v)

    def bwd(graph, dout):
        out, q, k, v = graph
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    def fwd_bwd(q, k, v, dout):
        out = module.attention(q, k, v, causal, scale, ws)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    def block(_result):
        torch.cuda.synchronize()

    def to_numpy(t):  # torch [B, H, S, D] -> numpy [B, S, H, D], exact (float16 -> float32)
        return t.detach().permute(0, 2, 1, 3).float().cpu().numpy()

    out = {"tutorial": _file_info(tutorial_path()), "torch": torch.__version__,
           "triton": triton.__version__}
    # The gate, as for every checked peer: forward and gradients against the reference first.
    got = [to_numpy(t) for t in fwd_bwd(*sets[0])]
    out["check"] = _peers.check_outputs(got, *(np.asarray(x) for x in jax_sets[0]),
                                        is_causal=causal)
    budget = dict(iters=item["iters"], time_budget_s=item["time_budget_s"], block=block)
    out["fwd"] = _timing.time_function(fwd, [s[:3] for s in sets], **budget)
    graphs = [(forward_graph(*s[:3]), s[3]) for s in sets]
    out["bwd"] = _timing.time_function(bwd, graphs, **budget)
    out["bwd"]["input_sets"] = len(graphs)
    del graphs
    out["fwd_bwd"] = _timing.time_function(fwd_bwd, sets, **budget)
    out["bwd_s"] = out["bwd"]["median_s"]
    out["bwd_method"] = BWD_METHOD
    out["tflops"] = _grid.tflops(point, out)
    # float16 -> float32 is exact and one-to-one, so the host copies compare the outputs' bits.
    out["repeat"] = _timing.bitwise_repeatable(lambda *a: [to_numpy(t) for t in fwd_bwd(*a)],
                                               sets[0], repeats=item["repeats"])
    return out
