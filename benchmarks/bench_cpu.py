"""What the CPU kernels cost: jitted forward+backward of jax_dash.attention against XLA's attention
(jax.nn.dot_product_attention(implementation="xla")) on the CPU, and the CPU time of the demo.

    python benchmarks/bench_cpu.py                          # the default shapes, both masks
    python benchmarks/bench_cpu.py --demo                   # also time `python -m jax_dash.demo`
    python benchmarks/bench_cpu.py --out benchmarks/results/<date>-cpu   # bench_cpu.md / .json

A shape is BxSxHxD ([batch, seq, heads, head_dim], self-attention, float32 by default). Each
point jits grad of sum(out * dout) with respect to q, k and v (one forward and one backward, as in
a training step), compiles and warms it up, then reports the median of --iters timed calls (each
ended by block_until_ready; the two implementations' calls alternate, so that load from other
processes falls on both alike). The ratio is jax_dash's time over XLA's (> 1: jax_dash slower). Both
use every CPU the process may use (XLA's thread pool; jax_dash's JAX_DASH_CPU_THREADS default).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

DEFAULT_SHAPES = "8x128x4x32,4x256x8x64,1x1024x8x64,1x1024x8x128"
IMPLS = ("xla", "jax_dash")


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"shape {text!r} must be BxSxHxD, e.g. 1x512x8x64")
    return tuple(int(p) for p in parts)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def make_step(impl: str, *, is_causal: bool):
    import jax
    import jax.numpy as jnp

    import jax_dash

    if impl == "jax_dash":
        attn = lambda q, k, v: jax_dash.attention(q, k, v, is_causal=is_causal)
    else:
        attn = lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=is_causal, implementation="xla")

    def loss(q, k, v, dout):
        return jnp.sum(attn(q, k, v).astype(jnp.float32) * dout)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def time_pair(shape, *, is_causal: bool, dtype: str, iters: int) -> dict:
    """Both implementations on the same inputs; their timed calls alternate (XLA, jax_dash, XLA,
    ...) so that load from other processes falls on both alike."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v, dout = (jax.random.normal(kk, shape, jnp.dtype(dtype)) for kk in keys)
    dout = dout.astype(jnp.float32)
    steps, result = {}, {}
    for impl in IMPLS:
        steps[impl] = make_step(impl, is_causal=is_causal)
        start = time.perf_counter()
        jax.block_until_ready(steps[impl](q, k, v, dout))  # compile
        result[impl] = {"compile_s": time.perf_counter() - start, "samples_s": []}
        jax.block_until_ready(steps[impl](q, k, v, dout))  # warm-up
    for _ in range(iters):
        for impl in IMPLS:
            start = time.perf_counter()
            jax.block_until_ready(steps[impl](q, k, v, dout))
            result[impl]["samples_s"].append(time.perf_counter() - start)
    for r in result.values():
        r["median_s"] = statistics.median(r["samples_s"])
        r["min_s"] = min(r["samples_s"])
    return result


def time_demo(args: list[str]) -> dict:
    """CPU (user + system) and wall time of `python -m jax_dash.demo ARGS`, imports and
    compilation included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "jax_dash.demo", *args],
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"command": " ".join(["python -m jax_dash.demo", *args]).strip(),
            "returncode": proc.returncode,
            "user_s": after.ru_utime - before.ru_utime,
            "system_s": after.ru_stime - before.ru_stime,
            "wall_s": wall,
            "last_line": (proc.stdout.strip().splitlines() or [""])[-1]}


def markdown(report: dict) -> str:
    env = report["env"]
    lines = [
        "# jax_dash on the CPU: forward+backward against XLA's attention",
        "",
        f"- CPU: {env['cpu']} ({env['machine']}, {env['usable_cpus']} usable CPUs), {env['system']}",
        f"- jax {env['jax']}, jaxlib {env['jaxlib']}, python {env['python']}, "
        f"JAX_DASH_CPU_THREADS={env['jax_dash_cpu_threads'] or '(unset)'}",
        f"- date {report['date']}; command: `{report['command']}`",
        "",
        "Jitted grad of sum(out * dout) with respect to q, k, v (one forward, one backward); "
        "median of the timed calls after compile and one warm-up call. ratio = jax_dash / XLA "
        "(> 1: jax_dash slower).",
        "",
        "| shape BxSxHxD | dtype | mask | XLA ms | jax_dash ms | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for p in report["points"]:
        lines.append(f"| {p['shape']} | {p['dtype']} | {p['mask']} | {p['xla']['median_s'] * 1e3:.2f} "
                     f"| {p['jax_dash']['median_s'] * 1e3:.2f} | {p['ratio']:.2f}x |")
    if report["points"]:
        ratios = [p["ratio"] for p in report["points"]]
        lines += ["", f"jax_dash / XLA: {min(ratios):.2f}x to {max(ratios):.2f}x."]
    if report.get("demo"):
        d = report["demo"]
        lines += ["", "## The demo", "",
                  f"`{d['command']}`: {d['user_s']:.1f} s user + {d['system_s']:.1f} s system CPU "
                  f"time, {d['wall_s']:.1f} s wall (imports and compilation included; return code "
                  f"{d['returncode']}). Last line: {d['last_line']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help=f"comma-separated BxSxHxD (default {DEFAULT_SHAPES})")
    p.add_argument("--masks", default="full,causal", help="comma-separated: full, causal")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--iters", type=int, default=10, help="timed calls per point (default 10)")
    p.add_argument("--demo", action="store_true", help="also time python -m jax_dash.demo")
    p.add_argument("--demo-args", default="", help="extra arguments for the demo, e.g. '--steps 20'")
    p.add_argument("--out", default=None, help="folder for bench_cpu.md and bench_cpu.json")
    args = p.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s]
    masks = [m for m in args.masks.split(",") if m]
    for m in masks:
        if m not in ("full", "causal"):
            p.error(f"--masks: {m!r} is not full or causal")

    import jax
    import jaxlib

    report = {
        "date": time.strftime("%Y-%m-%d"),
        "command": "python benchmarks/bench_cpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "env": {"cpu": cpu_name(), "machine": platform.machine(), "system": platform.system(),
                "usable_cpus": usable_cpus(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
                "python": platform.python_version(),
                "jax_dash_cpu_threads": os.environ.get("JAX_DASH_CPU_THREADS", ""),
                "backend": jax.default_backend()},
        "points": [],
    }
    if jax.default_backend() != "cpu":
        print(f"note: JAX's default backend is {jax.default_backend()!r}; this script measures the "
              "CPU (set JAX_PLATFORMS=cpu)", file=sys.stderr)
    for shape in shapes:
        for mask in masks:
            point = {"shape": "x".join(map(str, shape)), "dtype": args.dtype, "mask": mask}
            point.update(time_pair(shape, is_causal=mask == "causal", dtype=args.dtype,
                                   iters=args.iters))
            point["ratio"] = point["jax_dash"]["median_s"] / point["xla"]["median_s"]
            print(f"{point['shape']} {mask}: XLA {point['xla']['median_s'] * 1e3:.2f} ms, jax_dash "
                  f"{point['jax_dash']['median_s'] * 1e3:.2f} ms ({point['ratio']:.2f}x)",
                  file=sys.stderr)
            report["points"].append(point)
    if args.demo:
        report["demo"] = time_demo(args.demo_args.split())
        d = report["demo"]
        print(f"demo: {d['user_s']:.1f} s user, {d['system_s']:.1f} s system, {d['wall_s']:.1f} s wall",
              file=sys.stderr)
    text = markdown(report)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_cpu.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "bench_cpu.json"), "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
