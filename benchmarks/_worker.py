"""Worker processes: every measurement runs in a child process.

Why children: `cudnn_det` needs XLA_FLAGS (and `fa3_det` its patch, see _peers.py) set before JAX starts; memory peaks must start from a
fresh allocator; and a crashed or hung kernel must cost one item, not the whole run. The parent
(`run_items`) sends a list of items as a JSON file, the worker (`worker_main`) answers one
`RECORD_PREFIX`-tagged JSON line per item on stdout, and prints progress on stderr.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import _grid
import _memory
import _numerics
import _peers
import _timing
import _triton_tutorial

RECORD_PREFIX = "@@jax_dash_bench@@ "
# Sent by a worker that quits on purpose (its device is unusable) after answering an item.
RESTART_LINE = "@@jax_dash_bench_restart@@\n"
MAX_ERROR_CHARS = 2000
CPU_PEAK_MATMUL_SIZE = 512  # an 8192^3 bf16 matmul takes minutes on a CPU


def _fmt_tflops(x):
    return "-" if x is None else f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " ..."


# ----------------------------------------------------------------------------- items (worker side)

def env_info() -> dict:
    import platform as py_platform

    import jax
    import jaxlib
    import numpy as np
    devices = jax.devices()
    info = {
        "platform": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        "python": py_platform.python_version(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        # Which Hopper forward kernel jax_dash ran (cuda/sm90/launch.h; the backward has one).
        "jax_dash_kernels": {var: os.environ.get(var, "") for var in ("JAX_DASH_SM90_FWD",)},
        "worker_pid": os.getpid(),
        "cudnn": None,
        "driver": None,
        "jax_dash": None,
    }
    try:
        import jax_dash
        info["jax_dash"] = getattr(jax_dash, "__version__", "importable")
    except Exception as e:
        info["jax_dash"] = f"unavailable: {_short_error(e)}"
    if info["platform"] == "gpu":
        info["cudnn"] = _cudnn_version()
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30)
            first = smi.stdout.strip().splitlines()[0].split(",")
            info["gpu_name"], info["driver"], info["gpu_memory"] = (s.strip() for s in first[:3])
        except Exception as e:
            info["driver"] = f"nvidia-smi failed: {_short_error(e)}"
    return info


def _cudnn_version():
    """cuDNN as loaded by the JAX CUDA plugin; the plugin's version module, else the library."""
    import importlib
    for module in ("jax_cuda13_plugin._versions", "jax_cuda12_plugin._versions",
                   "jaxlib.cuda._versions"):
        try:
            version = importlib.import_module(module).cudnn_get_version()
            return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
        except Exception:
            continue
    try:
        import ctypes
        for name in ("libcudnn.so.9", "libcudnn.so"):
            try:
                lib = ctypes.CDLL(name)
                version = lib.cudnnGetVersion()
                return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
            except OSError:
                continue
    except Exception:
        pass
    return None


def run_peak(item: dict) -> dict:
    import jax
    size = item["size"]
    note = None
    if jax.default_backend() == "cpu" and size > CPU_PEAK_MATMUL_SIZE:
        note = f"size reduced from {size} to {CPU_PEAK_MATMUL_SIZE} on CPU"
        size = CPU_PEAK_MATMUL_SIZE
    result = _timing.matmul_peak_tflops(size, iters=item.get("iters", 20),
                                        warmup_s=1.0 if jax.default_backend() == "gpu" else 0.1)
    result["note"] = note
    return result


BWD_METHOD = "jit(vjp_fn)(dout) on residuals precomputed by a jitted forward"
RESIDUALS_BUDGET_BYTES = 8 * 2**30


def run_time(item: dict) -> dict:
    import jax
    if item["impl"] in _peers.TORCH_IMPLS:
        return _triton_tutorial.run_time(item)
    point = _grid.Point.from_json(item["point"])
    fn = _peers.attention_fn(item["impl"], is_causal=point.is_causal, schedule=item.get("schedule"),
                             head_dim=point.head_dim)
    input_sets = _peers.random_inputs(point, num_sets=item["num_sets"])
    out = {}
    if item["impl"] in _peers.CHECKED_IMPLS:
        # The gate: forward and gradients against the reference before any timing; a peer that
        # fails raises _peers.Wrong (reported as wrong at this point, never as a speed).
        out["check"] = _peers.check_against_reference(fn, *input_sets[0], is_causal=point.is_causal)
        if item["impl"] == "fa3_det":
            if not _peers.FA3_PATCH["bwd_lowerings"]:
                raise RuntimeError("fa3_det: the deterministic patch never saw FA3's backward "
                                   "lowering; its timing would be of the non-deterministic kernel")
            out["fa3_deterministic_patch"] = dict(_peers.FA3_PATCH)
    fwd, fwd_bwd = _peers.jitted_pair(fn)
    residuals, bwd = _peers.jitted_backward(fn)
    budget = dict(iters=item["iters"], time_budget_s=item["time_budget_s"])
    out["fwd"] = _timing.time_function(fwd, [s[:3] for s in input_sets], **budget)
    # The backward alone: each input set's residuals are computed once, outside the timing.
    # XLA's residuals are S^2 probabilities (several GB per set at seq 4k): past
    # RESIDUALS_BUDGET_BYTES the backward rotates over fewer sets rather than run out of memory.
    bwd_sets = []
    for s in input_sets:
        bwd_sets.append((jax.block_until_ready(residuals(*s[:3])), s[3]))
        set_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(bwd_sets[0][0]))
        if set_bytes * (len(bwd_sets) + 1) > RESIDUALS_BUDGET_BYTES:
            break
    out["bwd"] = _timing.time_function(bwd, bwd_sets, **budget)
    out["bwd"]["input_sets"] = len(bwd_sets)
    del bwd_sets  # XLA's residuals are S^2 probabilities: free them before the next timing
    out["fwd_bwd"] = _timing.time_function(fwd_bwd, input_sets, **budget)
    out["bwd_s"] = out["bwd"]["median_s"]
    out["bwd_method"] = BWD_METHOD
    out["tflops"] = _grid.tflops(point, out)
    out["repeat"] = _timing.bitwise_repeatable(fwd_bwd, input_sets[0], repeats=item["repeats"])
    return out


def run_item(item: dict) -> dict:
    kind = item["kind"]
    if kind == "env":
        return env_info()
    if kind == "peak":
        return run_peak(item)
    if kind == "time":
        return run_time(item)
    if kind == "memory":
        return _memory.run_memory_item(item)
    if kind == "numerics":
        return _numerics.run_numerics_item(item)
    if kind == "selftest_exit":  # lets the tests check that a dying worker costs one item only
        os._exit(item.get("code", 3))
    if kind == "selftest_fault":  # lets the tests check the restart after a device fault
        global _simulated_device_fault
        _simulated_device_fault = True
        raise RuntimeError("simulated device fault")
    raise ValueError(f"item kind={kind!r} is not one of env, peak, time, memory, numerics, "
                     f"selftest_exit, selftest_fault")


def describe(item: dict) -> str:
    parts = [item["kind"]]
    if "point" in item:
        parts.append(_grid.Point.from_json(item["point"]).label())
    if item.get("impl"):
        parts.append(item["impl"] + (f":{item['schedule']}" if item.get("schedule") else ""))
    return " ".join(parts)


def progress_line(item: dict, record: dict) -> str:
    head = f"{describe(item)}: "
    if record.get("skipped"):
        return head + f"skipped ({record['skipped']})"
    if record.get("wrong"):
        return head + "WRONG (not timed) " + record["wrong"][:300]
    if record.get("error"):
        return head + "ERROR " + record["error"].splitlines()[0][:200]
    result = record["result"]
    if item["kind"] == "time":
        rep = "yes" if result["repeat"]["repeatable"] else "NO"
        return (head + f"fwd {_fmt_tflops(result['tflops']['fwd'])} TFLOP/s, "
                f"bwd {_fmt_tflops(result['tflops']['bwd'])} TFLOP/s, bitwise repeatable: {rep}")
    if item["kind"] == "peak":
        return head + f"{result['tflops']:.1f} TFLOP/s ({result['size']}^3 {result['dtype']})"
    if item["kind"] == "memory" and result.get("peak_bytes") is not None:
        return head + f"peak {result['peak_bytes'] / 1e9:.2f} GB"
    if item["kind"] == "env":
        return head + f"{result['platform']} {result['device_kind']}, jax {result['jax']}"
    return head + "done"


def worker_main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    items = spec["items"]
    for index, item in enumerate(items):
        start = time.perf_counter()
        record = {"item": item, "skipped": None, "error": None, "result": None}
        try:
            record["result"] = run_item(item)
        except _peers.Unavailable as e:
            record["skipped"] = str(e)
        except _peers.Wrong as e:  # ran, but failed the reference check: reported, not timed
            record["wrong"] = str(e)
            record["check"] = e.check
        except Exception as e:
            record["error"] = _short_error(e)
            record["traceback"] = traceback.format_exc()[-MAX_ERROR_CHARS:]
        record["elapsed_s"] = time.perf_counter() - start
        tag = spec.get("progress_tag", "")
        print(f"[{tag}{spec.get('first_index', 0) + index + 1}/{spec.get('total', len(items))}] "
              f"{progress_line(item, record)} ({record['elapsed_s']:.1f} s)",
              file=sys.stderr, flush=True)
        sys.stdout.write(RECORD_PREFIX + json.dumps(record) + "\n")
        sys.stdout.flush()
        if record["error"] and index + 1 < len(items) and not _device_still_works():
            # A kernel fault poisons the CUDA context: every later item here would fail too.
            print("note: the device stopped working after this error; restarting the worker",
                  file=sys.stderr, flush=True)
            sys.stdout.write(RESTART_LINE)
            sys.stdout.flush()
            return 0
    return 0


_simulated_device_fault = False


def _device_still_works() -> bool:
    if _simulated_device_fault:
        return False
    try:
        import jax
        import jax.numpy as jnp
        return float(jax.block_until_ready(jnp.arange(8.0).sum())) == 28.0
    except Exception:
        return False


# ----------------------------------------------------------------------------- parent side

def run_items(items, *, script: str, env: dict, item_timeout_s: float, on_record,
              progress_tag: str = "", startup_allowance_s: float = 60.0):
    """Runs `items` in worker processes of `script`, calling on_record(record) for each.

    A worker that crashes or exceeds `item_timeout_s` on an item is killed; that item gets an
    error record and a new worker continues with the next item.
    """
    remaining = list(items)
    done = 0
    total = len(items)
    while remaining:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"items": remaining, "first_index": done, "total": total,
                       "progress_tag": progress_tag}, f)
            spec_path = f.name
        proc = subprocess.Popen([sys.executable, script, "--worker", spec_path],
                                stdout=subprocess.PIPE, stderr=None, env=env, text=True)
        lines = queue.Queue()

        def pump(stream=proc.stdout, sink=lines):
            for line in stream:
                sink.put(line)
            sink.put(None)

        threading.Thread(target=pump, daemon=True).start()
        answered = 0
        failure = None
        timeout = item_timeout_s + startup_allowance_s
        while answered < len(remaining):
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                proc.kill()
                failure = f"timed out after {timeout:.0f} s (worker killed)"
                break
            if line is None:
                code = proc.wait()
                failure = f"worker exited with code {code} before answering"
                break
            if line == RESTART_LINE:
                break
            if line.startswith(RECORD_PREFIX):
                on_record(json.loads(line[len(RECORD_PREFIX):]))
                answered += 1
                timeout = item_timeout_s
            else:  # a library printing to stdout: show it, it is not a record
                sys.stderr.write(line)
        proc.wait()
        os.unlink(spec_path)
        done += answered
        remaining = remaining[answered:]
        if failure is not None and remaining:
            item = remaining.pop(0)
            done += 1
            print(f"[{progress_tag}{done}/{total}] {describe(item)}: ERROR {failure}",
                  file=sys.stderr, flush=True)
            on_record({"item": item, "skipped": None, "error": failure, "result": None,
                       "elapsed_s": None})
