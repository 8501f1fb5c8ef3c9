"""The embedding gradient alone: ``jax_dash.segment_sum`` against XLA's scatter-add, racing and
deterministic (``--xla_gpu_deterministic_ops=true``, in a child process), on the same input.

    python benchmarks/bench_segment_sum.py [--tokens 32768] [--vocab 128256] [--features 4096]

Reports milliseconds, the bandwidth over the bytes the op must move (read every token's row once,
write the whole table gradient once: ``tokens * features + vocab * features`` elements), as a
fraction of the GPU's measured copy bandwidth, and whether 20 repeats gave one result. Token ids:
uniform over the vocabulary, and Zipf-distributed (frequent tokens, long same-id chains).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import _timing  # benchmarks/ (this script's folder)

SAMPLES = 15
REPEATS = 10


def _median_seconds(fn, *args):
    return _timing.time_function(fn, [args], iters=SAMPLES)["median_s"]


def _copy_bandwidth():
    """Bytes per second of a 2 GiB device copy (read + write), the achievable peak."""
    x = jnp.ones((2**29,), jnp.float32)
    seconds = _median_seconds(jax.jit(lambda x: x * 1.0001), x)
    return 2 * x.nbytes / seconds


def _problem(tokens, vocab, features, dtype, ids_kind, seed=0):
    rng = np.random.default_rng(seed)
    if ids_kind == "uniform":
        ids = rng.integers(0, vocab, tokens)
    else:
        ids = (rng.zipf(1.1, tokens) - 1) % vocab
    data = jax.random.normal(jax.random.key(seed), (tokens, features), jnp.float32).astype(dtype)
    return data, jnp.asarray(ids, jnp.int32)


def _bits(x):
    return jax.lax.bitcast_convert_type(x, jnp.uint16 if x.dtype.itemsize == 2 else jnp.uint32)


def _xla_scatter(vocab):
    return jax.jit(lambda d, i: jnp.zeros((vocab,) + d.shape[1:], d.dtype).at[i].add(d))


def _parts(args):
    """Where jax_dash's time goes: XLA's stable sort of (id, row) alone, the kernels alone (ids
    already sorted, so no sort and no row order), and a write of the output's zeros (a floor)."""
    import jax_dash
    data, ids = _problem(args.tokens, args.vocab, args.features, jnp.dtype(args.dtype),
                         args.ids)
    positions = jnp.arange(ids.shape[0], dtype=jnp.int32)
    sort = jax.jit(lambda i, p: jax.lax.sort((i, p), num_keys=1, is_stable=True))
    sorted_ids, order = sort(ids, positions)
    sorted_data = data[order]
    kernels = jax.jit(lambda d, i: jax_dash.segment_sum(d, i, args.vocab, indices_are_sorted=True))
    zeros = jax.jit(lambda d: jnp.zeros((args.vocab,) + d.shape[1:], d.dtype) + d[0, 0] * 0)
    return {"sort_s": _median_seconds(sort, ids, positions),
            "kernels_sorted_s": _median_seconds(kernels, sorted_data, sorted_ids),
            "zero_fill_s": _median_seconds(zeros, data)}


def _time_impl(impl, args):
    data, ids = _problem(args.tokens, args.vocab, args.features, jnp.dtype(args.dtype),
                         args.ids)
    if impl == "jax_dash":
        import jax_dash
        fn = jax.jit(lambda d, i: jax_dash.segment_sum(d, i, args.vocab))
    else:
        fn = _xla_scatter(args.vocab)
    seconds = _median_seconds(fn, data, ids)
    # Compared on the device, bit for bit (a table gradient is GBs: no copies to the host).
    same_bits = jax.jit(lambda a, b: jnp.array_equal(_bits(a), _bits(b)))
    first = fn(data, ids)
    differing = sum(not bool(same_bits(first, fn(data, ids))) for _ in range(REPEATS - 1))
    return {"seconds": seconds, "repeats": REPEATS, "repeats_differing_from_first": differing}


def _child(impl, args, xla_flags):
    env = dict(os.environ, XLA_FLAGS=xla_flags)
    cmd = [sys.executable, __file__, "--child", impl, "--tokens", str(args.tokens), "--vocab",
           str(args.vocab), "--features", str(args.features), "--dtype", args.dtype, "--ids",
           args.ids]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    parser.add_argument("--ids", default="uniform", help=argparse.SUPPRESS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ours-only", action="store_true",
                        help="time jax_dash and its parts only (no XLA scatter)")
    parser.add_argument("--out", default=None, help="write results.json here")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_time_impl(args.child, args)))
        return

    bandwidth = _copy_bandwidth()
    rows = []
    print(f"device: {jax.devices()[0].device_kind}; copy bandwidth {bandwidth / 1e12:.2f} TB/s",
          flush=True)
    for dtype in args.dtypes.split(","):
        for ids in ("uniform", "zipf"):
            args.dtype, args.ids = dtype, ids
            moved = (args.tokens + args.vocab) * args.features * jnp.dtype(dtype).itemsize
            ours = _time_impl("jax_dash", args)
            parts = _parts(args)
            print(f"{dtype:9s} {ids:8s} jax_dash parts: sort {parts['sort_s'] * 1e3:.3f} ms, "
                  f"kernels on sorted ids {parts['kernels_sorted_s'] * 1e3:.3f} ms "
                  f"({moved / parts['kernels_sorted_s'] / bandwidth:.0%} of copy bw), zero fill "
                  f"of the output {parts['zero_fill_s'] * 1e3:.3f} ms", flush=True)
            row = dict(dtype=dtype, ids=ids, bytes_moved=moved, jax_dash=ours, jax_dash_parts=parts,
                       jax_dash_bandwidth_fraction=moved / ours["seconds"] / bandwidth)
            rows.append(row)
            if args.ours_only:
                print(f"{dtype:9s} {ids:8s} jax_dash {ours['seconds'] * 1e3:7.3f} ms "
                      f"({row['jax_dash_bandwidth_fraction']:.0%} of copy bw; "
                      f"{ours['repeats_differing_from_first']}/{REPEATS - 1} repeats differ)",
                      flush=True)
                continue
            racing = _time_impl("xla_scatter", args)
            deterministic = _child("xla_scatter", args, "--xla_gpu_deterministic_ops=true")
            row.update(xla_racing=racing, xla_deterministic=deterministic)
            det = deterministic.get("seconds")
            print(f"{dtype:9s} {ids:8s} jax_dash {ours['seconds'] * 1e3:7.3f} ms "
                  f"({row['jax_dash_bandwidth_fraction']:.0%} of copy bw; "
                  f"{ours['repeats_differing_from_first']}/{REPEATS - 1} repeats differ) | XLA racing "
                  f"{racing['seconds'] * 1e3:7.3f} ms ({racing['repeats_differing_from_first']}/"
                  f"{REPEATS - 1} differ) | "
                  + (f"XLA deterministic {det * 1e3:8.3f} ms = {det / ours['seconds']:.1f}x ours"
                     if det else f"XLA deterministic: {deterministic.get('error')}"), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "segment_sum.json"), "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, copy_bandwidth=bandwidth,
                           tokens=args.tokens, vocab=args.vocab, features=args.features,
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
