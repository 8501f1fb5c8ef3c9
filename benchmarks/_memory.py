"""Peak device memory of forward + backward against sequence length: the grid and the
measurement of one point (run in a worker, see _worker.py).

Each (implementation, seq) runs in a fresh worker process, so `peak_bytes_in_use` starts from
zero. The command line is `python benchmarks/bench_attention.py --memory --skip-timing` (or
`bench_memory.py`, which runs exactly that).
"""

from __future__ import annotations

import _grid
import _peers

MEMORY_SEQS = (16384, 32768, 65536, 131072)
# The project's targets (not in this repository), goal 5: batch 1, 16 heads, head_dim 128, causal.
MEMORY_HEADS = 16
MEMORY_HEAD_DIM = 128
MEMORY_MASK = "causal"
# GPU memory in use before a point beyond a bare CUDA context's worth: another process holds it.
OTHERS_MEMORY_WARN_MIB = 1024
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory", "Out of memory", "OOM")


def memory_points(seqs, *, head_dim=MEMORY_HEAD_DIM, heads=MEMORY_HEADS, mask=MEMORY_MASK):
    return [_grid.Point(head_dim=head_dim, seq=s, mask=mask, batch=1, heads=heads) for s in seqs]


def run_memory_item(item: dict) -> dict:
    """Peak bytes of one jit(forward + backward) call, inputs and outputs included."""
    import jax
    point = _grid.Point.from_json(item["point"])
    device = jax.devices()[0]
    if device.memory_stats() is None:
        raise _peers.Unavailable(f"device {device.device_kind!r} reports no memory_stats()")
    fn = _peers.attention_fn(item["impl"], is_causal=point.is_causal, schedule=item.get("schedule"))
    _, fwd_bwd = _peers.jitted_pair(fn)
    (args,) = _peers.random_inputs(point, num_sets=1)
    jax.block_until_ready(args)
    stats = device.memory_stats()
    result = {"inputs_bytes": stats["bytes_in_use"], "bytes_limit": stats.get("bytes_limit"),
              "oom": False, "peak_bytes": None, "temp_bytes": None, "error": None,
              "gpu_memory_used_before_mib": item.get("gpu_memory_used_before_mib")}
    try:
        compiled = fwd_bwd.lower(*args).compile()
        analysis = compiled.memory_analysis()
        if analysis is not None:
            # What XLA plans to allocate besides arguments and outputs (workspaces included).
            result["temp_bytes"] = int(analysis.temp_size_in_bytes)
        jax.block_until_ready(compiled(*args))
        result["peak_bytes"] = int(device.memory_stats()["peak_bytes_in_use"])
    except Exception as e:
        message = f"{type(e).__name__}: {e}"
        result["error"] = message[:2000]
        result["oom"] = any(marker in message for marker in OOM_MARKERS)
        if not result["oom"]:
            raise
    return result
