"""Ring attention (context parallelism) on several GPUs: correctness against one GPU, run-to-run
bits, peak memory per GPU, throughput, contiguous against zigzag placement, and how much of the
communication the computation hides (issue 16).

    python benchmarks/bench_ring.py                      # every local GPU, seq 64k and 128k
    python benchmarks/bench_ring.py --ring-sizes 2,4 --seqs 131072,262144   # P = 2 and 4
    python benchmarks/bench_ring.py --dry-run            # CPU, 4 virtual devices, tiny sizes

Every part runs in a fresh worker process (so that each peak memory starts from zero):

1. correctness (``--check-seq`` tokens, causal and full, MHA and GQA): ``ring_attention`` in
   ``shard_map`` (contiguous and zigzag) and ``jax.jit(jax_dash.attention)`` on sequence-sharded
   inputs (the partitioning rule's ring), forward and gradients against the op on one device;
   every path ``--check-repeats`` times bitwise against its first run; the jit path's compiled program
   must hold ``collective-permute`` and no ``all-gather`` of the sequence, and give the bits of
   ``ring_attention`` (contiguous), as docs/determinism.md promises; and the zigzag ring run in
   two head groups (``jax_dash.ring._HEAD_GROUPS = 2``) must give the bits of the ring run in one;
2. one device, per sequence length: the op's forward + backward on device 0 alone, its time and
   peak memory (the baseline of the memory and speed columns);
3. the ring, per (sequence length, ring size, layout): inputs built already sharded (no device holds the
   whole sequence); jit(shard_map(forward + backward of ring_attention)) once, every device's
   peak memory; the median of ``--timed`` runs, TFLOP/s per GPU by the FlashAttention convention
   (forward 4*B*H*S^2*D, halved for causal; backward 2.5x the forward); ``--repeats`` runs bitwise
   against the first; the values against the op on device 0 (inputs gathered there). Then the
   same program with the transfers replaced by a local stand-in (an element-wise scaling, so the
   kernels run on the same shapes and no call is merged away) -- the compute alone -- and a
   program that makes the ring's transfers alone, in the ring's order; hidden communication =
   (compute + transfers - ring) / transfers, clipped to [0, 1].

``--head-groups N`` runs the ring's heads in N groups (``jax_dash.ring._HEAD_GROUPS``; default
``auto``, ``jax_dash.ring.head_groups``'s choice; 1: all heads in one ring, as before the groups):
the same bits, for comparing peak memory and time.

``--no-accumulate`` runs the ring's earlier backward (the kernels return each step's float32
contributions and XLA adds them; ``jax_dash.ring._ACCUMULATE = False``): the same bits, more
memory; for comparing peak memory and time with the default (the kernels add in place).

Results print as tables and go to --out (JSON: {"correctness": [...], "single": [...],
"ring": [...]}). A configuration that fails (out of memory, or a kernel feature missing on this
GPU) is reported with its error, not raised; the exit status is 1 if any check failed.
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
NAMES = ("out", "dq", "dk", "dv")


def _parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqs", default="65536,131072",
                        help="global sequence lengths, comma-separated (default 64k,128k; empty: "
                        "the correctness part only)")
    parser.add_argument("--ring-sizes", default=None,
                        help="ring sizes P, comma-separated (default: every local device); the "
                        "correctness part runs on the largest")
    parser.add_argument("--head-groups", default="auto",
                        help="head groups of the ring: auto (jax_dash.ring.head_groups) or N")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--mask", choices=("causal", "full"), default="causal")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--schedule", default="auto")
    parser.add_argument("--repeats", type=int, default=20,
                        help="runs of each timed ring compared bitwise")
    parser.add_argument("--check-repeats", type=int, default=20,
                        help="runs of each correctness path compared bitwise")
    parser.add_argument("--timed", type=int, default=10, help="timed runs (median)")
    parser.add_argument("--check-seq", type=int, default=8192,
                        help="global length of the correctness part (0: skip it)")
    parser.add_argument("--check-heads", type=int, default=8,
                        help="query heads of the correctness part (GQA: a quarter as many kv heads)")
    parser.add_argument("--no-accumulate", action="store_true",
                        help="the ring's earlier backward (XLA adds the float32 contributions)")
    parser.add_argument("--out", default=None, help="JSON results file")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU with 4 virtual devices and tiny sizes: checks the script runs")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dry_run:
        args.seqs, args.heads, args.head_dim = "256", 2, 32
        args.ring_sizes = args.ring_sizes or "2,4"
        args.check_seq, args.check_heads = min(args.check_seq, 256) or 0, 4
        args.repeats, args.timed = min(args.repeats, 3), min(args.timed, 2)
        args.check_repeats = min(args.check_repeats, 3)
    try:
        args.seq_list = [int(s) for s in args.seqs.split(",") if s]
    except ValueError:
        parser.error(f"--seqs={args.seqs!r} must be comma-separated integers")
    try:
        args.ring_size_list = [int(s) for s in (args.ring_sizes or "").split(",") if s] or [None]
    except ValueError:
        parser.error(f"--ring-sizes={args.ring_sizes!r} must be comma-separated integers")
    if any(p is not None and p < 1 for p in args.ring_size_list):
        parser.error(f"--ring-sizes={args.ring_sizes!r}: a ring has at least one device")
    if args.head_groups != "auto":
        try:
            args.head_groups = int(args.head_groups)
        except ValueError:
            parser.error(f"--head-groups={args.head_groups!r} must be auto or a positive integer")
        if args.head_groups < 1:
            parser.error(f"--head-groups={args.head_groups} must be auto or a positive integer")
    args.layout_list = [s for s in args.layouts.split(",") if s]
    for layout in args.layout_list:
        if layout not in LAYOUTS:
            parser.error(f"--layouts: {layout!r} is not one of {', '.join(LAYOUTS)}")
    if args.kv_heads is None:
        args.kv_heads = args.heads
    if args.check_heads < 4 or args.check_heads % 4:
        parser.error(f"--check-heads={args.check_heads} must be a positive multiple of 4 (the "
                     "GQA case has a quarter as many kv heads)")
    return args


def _flops(config):
    forward = 4 * config["batch"] * config["heads"] * config["seq"] ** 2 * config["head_dim"]
    if config["mask"] == "causal":
        forward /= 2
    return 3.5 * forward  # forward + backward (2.5x)


def _setup(config):
    """jax and a one-axis mesh over the ring's devices (the CPU's virtual devices in a dry run)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if config["dry_run"] and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=4").strip()
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from jax_dash import ring
    ring._ACCUMULATE = config.get("accumulate", True)  # --no-accumulate: the earlier backward
    groups = config.get("head_groups", "auto")
    ring._HEAD_GROUPS = None if groups == "auto" else int(groups)
    devices = jax.devices("cpu" if config["dry_run"] else None)
    size = config["ring_size"] or len(devices)
    if size > len(devices):
        raise ValueError(f"ring size {size} but only {len(devices)} devices are visible")
    return devices, Mesh(np.array(devices[:size]), ("seq",))


def _forward_backward(fn, q, k, v, dout):
    import jax
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(dout))


def _op_program(is_causal, schedule, **jit_kwargs):
    """jit(forward + backward of jax_dash.attention): on one device, or (with shardings) the
    partitioning rule's ring."""
    import functools

    import jax

    import jax_dash
    return jax.jit(functools.partial(_forward_backward, functools.partial(
        jax_dash.attention, is_causal=is_causal, schedule=schedule)), **jit_kwargs)


def _ring_program(mesh, spec, is_causal, schedule, layout):
    """jit(shard_map(forward + backward of ring_attention)) over the mesh's "seq" axis. Traced
    anew on each call (the compute-only variant patches ring._send before calling it)."""
    import functools

    import jax

    import jax_dash

    def device_fn(q, k, v, dout):  # one device's block of the ring
        return _forward_backward(functools.partial(
            jax_dash.ring_attention, axis_name="seq", is_causal=is_causal, schedule=schedule,
            layout=layout), q, k, v, dout)

    return jax.jit(jax.shard_map(device_fn, mesh=mesh, in_specs=(spec,) * 4,
                                 out_specs=(spec,) * 4))


def _inputs(shapes, dtype, key, sharding=None):
    import jax
    import jax.numpy as jnp

    def make(key):
        keys = jax.random.split(key, len(shapes))
        return tuple(jax.random.normal(k, s, jnp.float32).astype(dtype)
                     for k, s in zip(keys, shapes))

    shardings = {} if sharding is None else {"out_shardings": (sharding,) * len(shapes)}
    return jax.jit(make, **shardings)(key)


def _bitwise_equal_fn():
    import jax
    import jax.numpy as jnp

    def bits(x):
        return jax.lax.bitcast_convert_type(x, {2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize])

    return jax.jit(lambda a, b: jnp.all(jnp.stack(
        [jnp.array_equal(bits(x), bits(y)) for x, y in zip(a, b)])))


def _differences(ours, theirs):
    """Max abs and relative RMS difference per result (out, dq, dk, dv)."""
    import jax.numpy as jnp
    max_abs, rel_rms = {}, {}
    for name, a, b in zip(NAMES, ours, theirs):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        max_abs[name] = float(jnp.max(jnp.abs(a - b)))
        rel_rms[name] = float(jnp.sqrt(jnp.mean((a - b) ** 2) / jnp.mean(b ** 2)))
    return max_abs, rel_rms


def _timed(fn, args, runs):
    import jax
    import numpy as np
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def run_correctness(config: dict) -> list[dict]:
    """Part 1 (see the module docstring): every path at the check length, each a result row."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jax_dash import ring

    devices, mesh = _setup(config)
    size = mesh.devices.size
    spec = P(None, "seq")
    sharding = NamedSharding(mesh, spec)
    same = _bitwise_equal_fn()
    seq, heads, head_dim = config["check_seq"], config["check_heads"], config["head_dim"]
    rows = []
    for mask in ("causal", "full"):
        for kv_heads in (heads, heads // 4):
            is_causal = mask == "causal"
            base = {"seq": seq, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                    "mask": mask, "ring_size": size, "device_kind": devices[0].device_kind}
            q_shape = (1, seq, heads, head_dim)
            kv_shape = (1, seq, kv_heads, head_dim)
            args = _inputs((q_shape, kv_shape, kv_shape, q_shape), jnp.bfloat16,
                           jax.random.PRNGKey(seq + kv_heads + is_causal), None)
            args = [jax.device_put(x, devices[0]) for x in args]
            single = jax.block_until_ready(
                _op_program(is_causal, config["schedule"])(*args))
            jit_path = _op_program(is_causal, config["schedule"], in_shardings=(sharding,) * 4,
                                   out_shardings=(sharding,) * 4)
            results = {}
            paths = ("ring contiguous", "ring zigzag") + (
                ("ring zigzag, 2 head groups",) if kv_heads % 2 == 0 else ()) + (
                "jit (partitioning rule)",)
            for path in paths:
                row = {**base, "path": path, "error": None}
                rows.append(row)
                try:
                    zig = path.startswith("ring zigzag")
                    grouped = path.endswith("head groups")
                    placed = [jax.device_put(ring.zigzag(x, size) if zig else x, sharding)
                              for x in args]
                    if grouped:  # traced below with two groups, then back to the default
                        ring._HEAD_GROUPS, default_groups = 2, ring._HEAD_GROUPS
                    try:
                        fn = jit_path if path.startswith("jit") else _ring_program(
                            mesh, spec, is_causal, config["schedule"], path.split()[1].rstrip(","))
                        fn = fn.lower(*placed).compile()
                    finally:
                        if grouped:
                            ring._HEAD_GROUPS = default_groups
                    if path.startswith("jit"):
                        hlo = fn.as_text()
                        row["collective_permutes"] = hlo.count("collective-permute-start") or \
                            hlo.count("collective-permute(")
                        row["all_gathers"] = hlo.count("all-gather-start") + hlo.count("all-gather(")
                    first = jax.block_until_ready(fn(*placed))
                    row["repeats"] = config["check_repeats"]
                    row["repeats_not_bitwise"] = sum(
                        not bool(same(fn(*placed), first)) for _ in range(config["check_repeats"]))
                    natural = [jax.device_put(ring.unzigzag(x, size) if zig else x, devices[0])
                               for x in first]
                    results[path] = natural
                    row["max_abs_diff"], row["relative_rms_diff"] = _differences(natural, single)
                    checks = [row["repeats_not_bitwise"] == 0,
                              all(r <= MAX_RELATIVE_RMS for r in row["relative_rms_diff"].values())]
                    if grouped:
                        one_group = results.get("ring zigzag")
                        row["bits_of_one_group"] = one_group is not None and bool(
                            same(natural, one_group))
                        checks.append(row["bits_of_one_group"])
                    if path.startswith("jit"):
                        contiguous = results.get("ring contiguous")
                        row["bits_of_ring_attention"] = contiguous is not None and bool(
                            same(natural, contiguous))
                        checks += [row["collective_permutes"] > 0, row["all_gathers"] == 0,
                                   row["bits_of_ring_attention"]]
                    row["passed"] = all(checks)
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                    row["passed"] = False
    return rows


def run_single(config: dict) -> dict:
    """Part 2: the op on device 0 alone at the full length; time and peak memory."""
    import jax
    import jax.numpy as jnp

    devices, _ = _setup(config)
    seq, is_causal = config["seq"], config["mask"] == "causal"
    q_shape = (config["batch"], seq, config["heads"], config["head_dim"])
    kv_shape = (config["batch"], seq, config["kv_heads"], config["head_dim"])
    result = {**config, "device_kind": devices[0].device_kind, "error": None}
    try:
        with jax.default_device(devices[0]):
            args = _inputs((q_shape, kv_shape, kv_shape, q_shape), jnp.bfloat16,
                           jax.random.PRNGKey(0))
            fn = _op_program(is_causal, config["schedule"])
            jax.block_until_ready(fn(*args))
            stats = devices[0].memory_stats()
            result["peak_bytes"] = stats and stats.get("peak_bytes_in_use")
            result["seconds"] = _timed(fn, args, max(1, config["timed"] // 2))
            result["tflops"] = _flops(config) / result["seconds"] / 1e12
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    return result


def run_worker(config: dict) -> dict:
    """Part 3: one (seq, layout) of the ring."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jax_dash import ring

    devices, mesh = _setup(config)
    size = mesh.devices.size
    spec = P(None, "seq")
    sharding = NamedSharding(mesh, spec)
    is_causal = config["mask"] == "causal"
    layout, seq = config["layout"], config["seq"]
    q_shape = (config["batch"], seq, config["heads"], config["head_dim"])
    kv_shape = (config["batch"], seq, config["kv_heads"], config["head_dim"])
    block = (config["batch"], seq // size, config["heads"], config["head_dim"])
    groups = ring._HEAD_GROUPS or ring.head_groups(block, block[:2] + (config["kv_heads"],))
    result = {**config, "ring_size": size, "device_kind": devices[0].device_kind,
              "jax_version": jax.__version__, "head_groups": groups, "error": None}

    def compile_ring():
        return _ring_program(mesh, spec, is_causal, config["schedule"], layout)

    def transfers_only(k, v):  # the ring's transfers in its order, nothing computed
        ring_config = ring.RingConfig("seq", size, is_causal, config["schedule"], layout)

        def send(*xs):  # the ring's own sends (packets where it packs)
            return ring._send(ring_config, *xs)

        def one_group(k, v):
            kf = k, v
            for _ in range(size - 1):  # forward: K/V around the ring
                kf = send(*kf)
            kb = k, v
            dk, dv = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
            for _ in range(size - 1):  # backward: K/V again, the float32 dK/dV with them
                kb = send(*kb)
                dk, dv = send(dk + 1, dv + 1)
            dk, dv = send(dk.astype(k.dtype), dv.astype(v.dtype))  # the last hop home
            return (*kf, *kb, dk, dv)

        # One group's transfers after another, as the ring's head groups make them.
        parts = [one_group(*(jnp.split(x, groups, axis=2)[g] for x in (k, v)))
                 for g in range(groups)]
        return tuple(jnp.concatenate(xs, axis=2) for xs in zip(*parts))

    try:
        ring_fn = compile_ring()
        args = _inputs((q_shape, kv_shape, kv_shape, q_shape), jnp.bfloat16,
                       jax.random.PRNGKey(0), sharding)
        first = jax.block_until_ready(ring_fn(*args))
        stats = [d.memory_stats() for d in mesh.devices.flat]
        result["peak_bytes_per_device"] = [s and s.get("peak_bytes_in_use") for s in stats]

        result["ring_seconds"] = _timed(ring_fn, args, config["timed"])
        result["ring_tflops_per_device"] = _flops(config) / size / result["ring_seconds"] / 1e12

        same = _bitwise_equal_fn()
        mismatches = sum(not bool(same(ring_fn(*args), first)) for _ in range(config["repeats"]))
        result["repeats"], result["repeats_not_bitwise"] = config["repeats"], mismatches

        # The compute alone: the same program with every transfer a local element-wise scaling.
        send = ring._send
        ring._send = lambda cfg, *xs: tuple(x * jnp.asarray(1.015625, x.dtype) for x in xs)
        try:
            lowered = compile_ring().lower(*args)
            if "collective_permute" in lowered.as_text():
                raise RuntimeError("the compute-only program still transfers (ring._send was not "
                                   "replaced)")
            local_fn = lowered.compile()
            jax.block_until_ready(local_fn(*args))
            result["compute_only_seconds"] = _timed(local_fn, args, max(1, config["timed"] // 2))
        finally:
            ring._send = send
        comm_fn = jax.jit(jax.shard_map(transfers_only, mesh=mesh, in_specs=(spec,) * 2,
                                        out_specs=(spec,) * 6))
        jax.block_until_ready(comm_fn(*args[1:3]))
        result["transfers_only_seconds"] = _timed(comm_fn, args[1:3], max(1, config["timed"] // 2))
        exposed = result["ring_seconds"] - result["compute_only_seconds"]
        result["hidden_fraction"] = min(1.0, max(0.0, 1 - exposed / result[
            "transfers_only_seconds"]))

        # One device: the whole sequence on device 0, in natural token order.
        one = devices[0]
        natural = [jax.device_put(ring.unzigzag(x, size) if layout == "zigzag" else x, one)
                   for x in (*args, *first)]
        del args, first
        single = jax.block_until_ready(_op_program(is_causal, config["schedule"])(*natural[:4]))
        result["max_abs_diff"], result["relative_rms_diff"] = _differences(natural[4:], single)
        result["matches_one_device"] = all(
            r <= MAX_RELATIVE_RMS for r in result["relative_rms_diff"].values())
    except Exception as exc:  # reported per configuration (OOM, missing kernel feature)
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    return result


def _gib(n):
    return f"{n / 2**30:.2f}" if n else "n/a"


def _report(correctness, singles, results):
    if correctness:
        print(f"correctness ({correctness[0]['seq']} tokens, {correctness[0]['ring_size']} "
              f"devices, {correctness[0]['device_kind']}):")
        print(f"{'mask':>6} {'heads':>6} {'path':>24} {'bitwise':>8} "
              f"{'rel RMS vs one device (out dq dk dv)':>36} {'ok':>4}")
        for r in correctness:
            heads = f"{r['heads']}/{r['kv_heads']}"
            if r.get("error"):
                print(f"{r['mask']:>6} {heads:>6} {r['path']:>24}  error: {r['error'][:300]}")
                continue
            rms = " ".join(f"{r['relative_rms_diff'][n]:.1e}" for n in NAMES)
            extra = ""
            if "bits_of_ring_attention" in r:
                extra = (f"  permutes={r['collective_permutes']} all-gathers={r['all_gathers']}"
                         f" bits of ring_attention: {r['bits_of_ring_attention']}")
            bitwise = f"{r['repeats'] - r['repeats_not_bitwise']}/{r['repeats']}"
            print(f"{r['mask']:>6} {heads:>6} {r['path']:>24} {bitwise:>8} {rms:>36} "
                  f"{'yes' if r['passed'] else 'NO':>4}{extra}")
    single = {r["seq"]: r for r in singles}
    for r in singles:
        if r.get("error"):
            print(f"one device, seq {r['seq']}: error: {r['error'][:300]}")
    if not results:
        return
    print(f"{'seq':>8} {'heads':>6} {'layout':>10} {'P':>2} {'groups':>6} {'ms':>9} "
          f"{'TFLOP/s/dev':>11} {'x one dev':>9} {'bitwise':>8} {'rel RMS (out dq dk dv)':>30} "
          f"{'GiB/dev':>8} {'GiB one':>8} {'mem x one':>9} {'compute ms':>10} {'comm ms':>8} "
          f"{'hidden':>6}")
    for r in results:
        heads = f"{r['heads']}/{r['kv_heads']}"
        if r.get("error"):
            print(f"{r['seq']:>8} {heads:>6} {r['layout']:>10} {r.get('ring_size')!s:>2}  "
                  f"error: {r['error'][:300]}")
            continue
        one = single.get(r["seq"], {})
        peaks = [p for p in r["peak_bytes_per_device"] if p is not None]
        speedup = (f"{one['seconds'] / r['ring_seconds']:.2f}" if one.get("seconds")
                   else "n/a")
        rms = " ".join(f"{r['relative_rms_diff'][n]:.1e}" for n in NAMES)
        bitwise = f"{r['repeats'] - r['repeats_not_bitwise']}/{r['repeats']}"
        memory = (f"{max(peaks) / one['peak_bytes']:.2f}" if peaks and one.get("peak_bytes")
                  else "n/a")
        print(f"{r['seq']:>8} {heads:>6} {r['layout']:>10} {r['ring_size']:>2} "
              f"{r['head_groups']:>6} {r['ring_seconds'] * 1e3:9.2f} "
              f"{r['ring_tflops_per_device']:11.2f} {speedup:>9} {bitwise:>8} {rms:>30} "
              f"{_gib(max(peaks) if peaks else None):>8} {_gib(one.get('peak_bytes')):>8} "
              f"{memory:>9} {r['compute_only_seconds'] * 1e3:10.2f} {r['transfers_only_seconds'] * 1e3:8.2f} "
              f"{r['hidden_fraction']:6.0%}")
    for seq in sorted(single):
        one = single[seq]
        if one.get("seconds"):
            print(f"one device, seq {seq}: {one['seconds'] * 1e3:.2f} ms, "
                  f"{one['tflops']:.1f} TFLOP/s, peak {_gib(one.get('peak_bytes'))} GiB")
    by_ring = {}
    for r in results:
        if not r.get("error"):
            by_ring.setdefault((r["seq"], r["ring_size"]), {})[r["layout"]] = r["ring_seconds"]
    for (seq, size), times in by_ring.items():
        if len(times) == 2:
            print(f"seq {seq}, P = {size}: zigzag is {times['contiguous'] / times['zigzag']:.2f}x "
                  "the speed of contiguous")


def _in_worker(mode, config):
    """Runs one part in a fresh process (peak memory from zero); its JSON result, or an error."""
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                           json.dumps({**config, "mode": mode})], capture_output=True, text=True,
                          env=env)
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        error = f"worker exited {proc.returncode}: {proc.stderr.strip()[-1500:]}"
        return [{**config, "error": error, "passed": False}] if mode == "correctness" else \
            {**config, "error": error}


def _progress(result):
    """One line per finished part, as it finishes (a run cut short keeps what it measured)."""
    keys = ("seq", "ring_size", "layout", "head_groups", "seconds", "ring_seconds", "peak_bytes",
            "peak_bytes_per_device", "repeats_not_bitwise", "relative_rms_diff", "error")
    print("part: " + json.dumps({k: result[k] for k in keys if k in result}), flush=True)


def main(argv=None) -> int:
    args = _parse_args(argv)
    if args.worker:
        config = json.loads(args.worker)
        run = {"correctness": run_correctness, "single": run_single, "ring": run_worker}
        print(json.dumps(run[config["mode"]](config)))
        return 0
    common = {"batch": args.batch, "heads": args.heads, "head_groups": args.head_groups,
              "kv_heads": args.kv_heads, "head_dim": args.head_dim, "mask": args.mask,
              "schedule": args.schedule, "repeats": args.repeats, "timed": args.timed,
              "dry_run": args.dry_run, "accumulate": not args.no_accumulate}
    correctness = []
    sizes = args.ring_size_list
    largest = None if None in sizes else max(sizes)
    if args.check_seq:
        correctness = _in_worker("correctness", {**common, "ring_size": largest,
                                                 "check_seq": args.check_seq,
                                                 "check_repeats": args.check_repeats,
                                                 "check_heads": args.check_heads})
    singles, results = [], []
    for seq in args.seq_list:
        singles.append(_in_worker("single", {**common, "ring_size": 1, "seq": seq}))
        _progress(singles[-1])
        for size in sizes:
            for layout in args.layout_list:
                results.append(_in_worker("ring", {**common, "ring_size": size, "seq": seq,
                                                   "layout": layout}))
                _progress(results[-1])
    _report(correctness, singles, results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"correctness": correctness, "single": singles, "ring": results}, f,
                      indent=1)
    failed = ([r for r in correctness if not r.get("passed")]
              + [r for r in singles if r.get("error")]
              + [r for r in results if r.get("error") or r.get("repeats_not_bitwise")
                 or not r.get("matches_one_device")])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
