"""Ring attention (context parallelism) on several GPUs: correctness against one GPU, run-to-run
bits, peak memory per GPU and throughput, contiguous against zigzag placement.

    python benchmarks/bench_ring.py                      # every local GPU, seq 64k and 128k
    python benchmarks/bench_ring.py --dry-run            # CPU, 4 virtual devices, tiny sizes

For each (sequence length, layout) a fresh worker process (so that peak memory starts from zero):

1. builds the inputs already sharded over the ring (no device ever holds the whole sequence),
   runs jit(shard_map(forward + backward of jax_dash.ring_attention)) once and records every
   device's peak memory;
2. times it (median of --timed runs after a warm-up): TFLOP/s per GPU by the FlashAttention
   convention (forward 4*B*H*S^2*D, halved for causal; backward 2.5x the forward);
3. repeats it --repeats times and checks every output bitwise against the first run;
4. gathers the inputs on device 0, runs jax_dash.attention there (one GPU) and reports the ring's
   max and relative RMS difference from it, and the one-GPU time for the speed-up.

Results print as a table and go to --out (JSON). A configuration that fails (out of memory, or a
kernel feature missing on this GPU) is reported with its error, not raised.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

LAYOUTS = ("contiguous", "zigzag")
# What the run is judged by: the ring and one GPU both round to bf16; their difference should be
# of the order of the kernels' own deviation from an fp64 reference (relative RMS 2e-3 to 2.6e-3
# on an H100, README), so more than this much is flagged.
MAX_RELATIVE_RMS = 1e-2


def _parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", default="65536,131072",
                        help="global sequence lengths, comma-separated (default 64k,128k)")
    parser.add_argument("--devices", type=int, default=None,
                        help="ring size (default: every local device)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--mask", choices=("causal", "full"), default="causal")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--schedule", default="auto")
    parser.add_argument("--repeats", type=int, default=20, help="runs compared bitwise")
    parser.add_argument("--timed", type=int, default=10, help="timed runs (median)")
    parser.add_argument("--out", default=None, help="JSON results file")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU with 4 virtual devices and tiny sizes: checks the script runs")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dry_run:
        args.seqs, args.devices, args.heads, args.head_dim = "256", 4, 2, 32
        args.repeats, args.timed = min(args.repeats, 3), min(args.timed, 2)
    try:
        args.seq_list = [int(s) for s in args.seqs.split(",") if s]
    except ValueError:
        parser.error(f"--seqs={args.seqs!r} must be comma-separated integers")
    args.layout_list = [s for s in args.layouts.split(",") if s]
    for layout in args.layout_list:
        if layout not in LAYOUTS:
            parser.error(f"--layouts: {layout!r} is not one of {', '.join(LAYOUTS)}")
    if args.kv_heads is None:
        args.kv_heads = args.heads
    return args


def _flops(config):
    forward = 4 * config["batch"] * config["heads"] * config["seq"] ** 2 * config["head_dim"]
    if config["mask"] == "causal":
        forward /= 2
    return 3.5 * forward  # forward + backward (2.5x)


def run_worker(config: dict) -> dict:
    """One (seq, layout): everything in the module docstring's steps 1-4."""
    flags = os.environ.get("XLA_FLAGS", "")
    if config["dry_run"] and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=4").strip()
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jax_dash
    from jax_dash import ring

    devices = jax.devices("cpu" if config["dry_run"] else None)
    size = config["devices"] or len(devices)
    if size > len(devices):
        raise ValueError(f"--devices={size} but only {len(devices)} devices are visible")
    mesh = Mesh(np.array(devices[:size]), ("seq",))
    spec = P(None, "seq")
    sharding = NamedSharding(mesh, spec)
    is_causal = config["mask"] == "causal"
    layout, seq = config["layout"], config["seq"]
    dtype = jnp.bfloat16
    q_shape = (config["batch"], seq, config["heads"], config["head_dim"])
    kv_shape = (config["batch"], seq, config["kv_heads"], config["head_dim"])
    result = {**config, "ring_size": size, "device_kind": devices[0].device_kind,
              "jax_version": jax.__version__, "error": None}

    @functools.partial(jax.jit, out_shardings=(sharding,) * 4)
    def make_inputs(key):  # random tokens, already in the layout's order and sharded
        keys = jax.random.split(key, 4)
        shapes = (q_shape, kv_shape, kv_shape, q_shape)
        return tuple(jax.random.normal(k, s, jnp.float32).astype(dtype)
                     for k, s in zip(keys, shapes))

    def forward_backward(fn, q, k, v, dout):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(dout))

    def device_fn(q, k, v, dout):  # one device's block of the ring
        return forward_backward(functools.partial(
            jax_dash.ring_attention, axis_name="seq", is_causal=is_causal,
            schedule=config["schedule"], layout=layout), q, k, v, dout)

    def single_device_fn(q, k, v, dout):  # the whole sequence on one device
        return forward_backward(functools.partial(
            jax_dash.attention, is_causal=is_causal, schedule=config["schedule"]), q, k, v, dout)

    try:
        ring_fn = jax.jit(jax.shard_map(device_fn, mesh=mesh, in_specs=(spec,) * 4,
                                        out_specs=(spec,) * 4))
        args = make_inputs(jax.random.PRNGKey(0))
        first = jax.block_until_ready(ring_fn(*args))
        stats = [d.memory_stats() for d in mesh.devices.flat]
        result["peak_bytes_per_device"] = [s and s.get("peak_bytes_in_use") for s in stats]

        times = []
        for _ in range(config["timed"]):
            start = time.perf_counter()
            jax.block_until_ready(ring_fn(*args))
            times.append(time.perf_counter() - start)
        result["ring_seconds"] = float(np.median(times))
        result["ring_tflops_per_device"] = _flops(config) / size / result["ring_seconds"] / 1e12

        def bits(x):
            return jax.lax.bitcast_convert_type(x, {2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize])

        same = jax.jit(lambda a, b: jnp.all(jnp.stack(
            [jnp.array_equal(bits(x), bits(y)) for x, y in zip(a, b)])))
        mismatches = sum(not bool(same(ring_fn(*args), first)) for _ in range(config["repeats"]))
        result["repeats"], result["repeats_not_bitwise"] = config["repeats"], mismatches

        # One device: the whole sequence on device 0, in natural token order.
        one = devices[0]
        natural = [jax.device_put(ring.unzigzag(x, size) if layout == "zigzag" else x, one)
                   for x in (*args, *first)]
        del args
        single_fn = jax.jit(single_device_fn)
        single = jax.block_until_ready(single_fn(*natural[:4]))
        start = time.perf_counter()
        for _ in range(max(1, config["timed"] // 2)):
            jax.block_until_ready(single_fn(*natural[:4]))
        result["single_seconds"] = (time.perf_counter() - start) / max(1, config["timed"] // 2)
        result["speedup_over_one_device"] = result["single_seconds"] / result["ring_seconds"]
        result["max_abs_diff"], result["relative_rms_diff"] = {}, {}
        for name, ours, theirs in zip(("out", "dq", "dk", "dv"), natural[4:], single):
            ours, theirs = ours.astype(jnp.float32), theirs.astype(jnp.float32)
            result["max_abs_diff"][name] = float(jnp.max(jnp.abs(ours - theirs)))
            result["relative_rms_diff"][name] = float(
                jnp.sqrt(jnp.mean((ours - theirs) ** 2) / jnp.mean(theirs ** 2)))
        result["matches_one_device"] = all(
            r <= MAX_RELATIVE_RMS for r in result["relative_rms_diff"].values())
    except Exception as exc:  # reported per configuration (OOM, missing kernel feature)
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    return result


def _report(results):
    header = (f"{'seq':>8} {'layout':>10} {'P':>2} {'ms':>9} {'TFLOP/s/dev':>11} "
              f"{'x one dev':>9} {'bitwise':>9} {'rel RMS (out dq dk dv)':>30} "
              f"{'peak GiB/dev (max)':>18}")
    print(header)
    for r in results:
        if r.get("error"):
            print(f"{r['seq']:>8} {r['layout']:>10}  error: {r['error'][:200]}")
            continue
        peaks = [p for p in r["peak_bytes_per_device"] if p is not None]
        peak = f"{max(peaks) / 2**30:.2f}" if peaks else "n/a"
        rms = " ".join(f"{r['relative_rms_diff'][n]:.1e}" for n in ("out", "dq", "dk", "dv"))
        bitwise = f"{r['repeats'] - r['repeats_not_bitwise']}/{r['repeats']}"
        print(f"{r['seq']:>8} {r['layout']:>10} {r['ring_size']:>2} {r['ring_seconds'] * 1e3:9.2f} "
              f"{r['ring_tflops_per_device']:11.2f} {r['speedup_over_one_device']:9.2f} "
              f"{bitwise:>9} {rms:>30} {peak:>18}")
    by_seq = {}
    for r in results:
        if not r.get("error"):
            by_seq.setdefault(r["seq"], {})[r["layout"]] = r["ring_seconds"]
    for seq, times in by_seq.items():
        if len(times) == 2:
            print(f"seq {seq}: zigzag is {times['contiguous'] / times['zigzag']:.2f}x the speed "
                  "of contiguous")


def main(argv=None) -> int:
    args = _parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return 0
    results = []
    for seq in args.seq_list:
        for layout in args.layout_list:
            config = {"seq": seq, "layout": layout, "devices": args.devices,
                      "batch": args.batch, "heads": args.heads, "kv_heads": args.kv_heads,
                      "head_dim": args.head_dim, "mask": args.mask, "schedule": args.schedule,
                      "repeats": args.repeats, "timed": args.timed, "dry_run": args.dry_run}
            env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                                   json.dumps(config)], capture_output=True, text=True, env=env)
            lines = proc.stdout.strip().splitlines()
            try:
                results.append(json.loads(lines[-1]))
            except (IndexError, json.JSONDecodeError):
                results.append({**config, "error": f"worker exited {proc.returncode}: "
                                f"{proc.stderr.strip()[-1500:]}"})
    _report(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    failed = [r for r in results if r.get("error") or r.get("repeats_not_bitwise")
              or not r.get("matches_one_device")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
