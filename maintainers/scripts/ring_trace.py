"""Where does the ring's time go on each GPU? Traces one forward + backward of the ring (bench_ring's
program) with the JAX profiler and reads the per-GPU kernel timeline from its trace: compute busy,
collective (NCCL) busy, both at once, neither (idle: waiting on a peer or the host), the longest
kernels, and the backward's per-kernel times per device (issue 35: 4 head groups at P = 4 cost
~40 ms more than one).

    python maintainers/scripts/ring_trace.py --seq 262144 --ring-size 4 --groups 1,4 --out DIR
    python maintainers/scripts/ring_trace.py --dry-run --out DIR   (CPU, 4 virtual devices)

For each group count it traces the ring and the compute-only program (transfers replaced by a
local scaling, as in bench_ring.py). Writes DIR/summary.txt (and prints it) and
DIR/timeline_<name>.txt (every GPU event of >= 50 us, with start offsets per device).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))


def _intervals_union(intervals):
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def _length(union):
    return sum(end - start for start, end in union)


def _intersection(a, b):
    """Total length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _short(name, width=70):
    name = name.replace("void ", "")
    for cut in ("<", "("):
        if cut in name and name.index(cut) > 8:
            head = name[:name.index(cut)]
            if "jax_dash" in name or "Kernel" in name:
                # keep the template's first words (which kernel of ours)
                head = name[:width]
            name = head
    return name[:width]


def _is_comm(name):
    low = name.lower()
    return "nccl" in low or "sendrecv" in low or "collective" in low


def read_trace(log_dir):
    """{device name: [(start_us, end_us, name, thread name)]} of the GPU kernel lines."""
    folders = sorted((pathlib.Path(log_dir) / "plugins" / "profile").iterdir(),
                     key=os.path.getmtime)
    path = next(folders[-1].glob("*.trace.json.gz"))
    with gzip.open(path, "rb") as handle:
        trace = json.load(handle)
    processes, threads = {}, {}
    for event in trace["traceEvents"]:
        if event.get("ph") == "M" and event.get("name") == "process_name":
            processes[event["pid"]] = event["args"]["name"]
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            threads[(event["pid"], event["tid"])] = event["args"]["name"]
    devices = {}
    thread_names = {}
    for event in trace["traceEvents"]:
        if event.get("ph") != "X":
            continue
        pname = processes.get(event["pid"], "")
        if "GPU" not in pname.upper() or "host" in pname.lower():
            continue
        tname = threads.get((event["pid"], event["tid"]), str(event["tid"]))
        thread_names.setdefault(pname, {}).setdefault(tname, 0)
        thread_names[pname][tname] += 1
        start = float(event["ts"])
        devices.setdefault(pname, []).append(
            (start, start + float(event.get("dur", 0.0)), event["name"], tname))
    derived = ("xla ops", "xla modules", "steps", "framework", "source", "launch stats")
    for pname, events in devices.items():
        # The stream lines hold the kernels; the XLA Ops / Modules / Steps lines repeat them.
        streams = [e for e in events if e[3].lower().startswith("stream")]
        devices[pname] = streams or [e for e in events
                                     if not any(d in e[3].lower() for d in derived)]
    return devices, thread_names, path.stat().st_size


def analyse(devices, label):
    lines = [f"== {label}"]
    table = []
    for device in sorted(devices):
        events = sorted(devices[device])
        begin = min(e[0] for e in events)
        end = max(e[1] for e in events)
        comm = _intervals_union([(s, e) for s, e, n, _ in events if _is_comm(n)])
        compute = _intervals_union([(s, e) for s, e, n, _ in events if not _is_comm(n)])
        both = _intersection(comm, compute)
        busy = _length(_intervals_union([(s, e) for s, e, _, _ in events]))
        span = end - begin
        table.append((device, span, _length(compute), _length(comm), both, span - busy,
                      _length(comm) - both))
        kernels = {}
        for s, e, n, _ in events:
            key = _short(n)
            total, count = kernels.get(key, (0.0, 0))
            kernels[key] = (total + e - s, count + 1)
        lines.append(f"{device}: {len(events)} events, streams "
                     f"{sorted({t for *_, t in events})}")
        for key, (total, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:12]:
            lines.append(f"   {total / 1e3:9.2f} ms {count:6d} x  {key}")
    lines.append("device | span ms | compute busy | comm busy | comm under compute | idle "
                 "(neither) | comm alone")
    for device, span, compute, comm, both, idle, alone in table:
        lines.append(f"{device} | {span / 1e3:.2f} | {compute / 1e3:.2f} | {comm / 1e3:.2f} | "
                     f"{both / 1e3:.2f} | {idle / 1e3:.2f} | {alone / 1e3:.2f}")
    return "\n".join(lines)


def timeline(devices, min_us=50.0):
    begin = min(e[0] for events in devices.values() for e in events)
    rows = []
    for device in sorted(devices):
        for s, e, n, t in sorted(devices[device]):
            if e - s >= min_us or _is_comm(n):
                rows.append(f"{device[-6:]:>6} {t[:22]:22} {(s - begin) / 1e3:10.3f} "
                            f"{(e - s) / 1e3:8.3f}  {_short(n, 110)}")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=262144)
    parser.add_argument("--ring-size", type=int, default=4)
    parser.add_argument("--groups", default="1,4")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--layout", default="zigzag")
    parser.add_argument("--no-accumulate", action="store_true")
    parser.add_argument("--out", required=True, help="summary and timelines")
    parser.add_argument("--trace-dir", default="/tmp/ring_trace", help="the profiler's files")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.seq, args.heads, args.head_dim = 256, 4, 32
    import bench_ring

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = []
    for groups in [int(g) for g in args.groups.split(",")]:
        config = {"dry_run": args.dry_run, "ring_size": args.ring_size, "head_groups": groups,
                  "accumulate": not args.no_accumulate}
        devices, mesh = bench_ring._setup(config)
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P

        from jax_dash import ring
        spec = P(None, "seq")
        kv = args.kv_heads or args.heads
        q_shape = (1, args.seq, args.heads, args.head_dim)
        kv_shape = (1, args.seq, kv, args.head_dim)
        dtype = jnp.float32 if args.dry_run else jnp.bfloat16
        inputs = bench_ring._inputs((q_shape, kv_shape, kv_shape, q_shape), dtype,
                                    jax.random.PRNGKey(0), NamedSharding(mesh, spec))
        programs = {"ring": bench_ring._ring_program(mesh, spec, True, "auto", args.layout)}
        send = ring._send
        ring._send = lambda cfg, *xs: tuple(x * jnp.asarray(1.015625, x.dtype) for x in xs)
        try:
            programs["compute_only"] = bench_ring._ring_program(
                mesh, spec, True, "auto", args.layout).lower(*inputs).compile()
        finally:
            ring._send = send
        for name, fn in programs.items():
            label = f"{name}_groups{groups}" + ("_noacc" if args.no_accumulate else "")
            for _ in range(2):
                jax.block_until_ready(fn(*inputs))
            start = time.perf_counter()
            jax.block_until_ready(fn(*inputs))
            wall = time.perf_counter() - start
            log_dir = pathlib.Path(args.trace_dir) / label
            with jax.profiler.trace(str(log_dir)):
                jax.block_until_ready(fn(*inputs))
            traced, thread_names, size = read_trace(log_dir)
            summary.append(f"{label}: wall {wall * 1e3:.1f} ms untraced; trace {size} B; "
                           f"threads {json.dumps(thread_names)[:600]}")
            if traced:
                summary.append(analyse(traced, label))
                (out / f"timeline_{label}.txt").write_text(timeline(traced) + "\n")
            else:
                summary.append(f"{label}: no GPU stream events in the trace")
        del inputs, programs
    text = "\n".join(summary)
    with open(out / "summary.txt", "a") as handle:
        handle.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
