"""How much of a timed call is host dispatch: one call per sample against many back to back.

    python benchmarks/probe_dispatch.py [--impls jax_dash,cudnn] [--calls 16] [--samples 15]

For each point (bf16, 16k tokens, hidden 2048) and implementation it times the jitted forward and
the jitted backward (VJP on precomputed residuals, as bench_attention.py does) three ways:
  single   one call per sample, blocked on (what bench_attention.py did for any call of >= 2 ms
           until 2026-11-24, when its minimum sample was 2 ms; it is 20 ms since);
  steady   `--calls` calls back to back per sample, blocked on the last (dispatch overlaps the
           device's work, as in a training step);
  enqueue  host seconds per call to dispatch `--calls` calls without blocking (then blocked on,
           outside the measurement).
A `single` time far above `steady` means the sample includes host latency the device waited on.
"""

from __future__ import annotations

import argparse
import statistics
import time

import _grid
import _peers

POINTS = (  # (head_dim, seq, causal)
    (128, 2048, False), (128, 8192, False), (64, 2048, True), (64, 8192, False))


def _median(fn, args_list, calls, samples):
    import jax
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        r = None
        for i in range(calls):
            r = fn(*args_list[i % len(args_list)])
        jax.block_until_ready(r)
        out.append((time.perf_counter() - start) / calls)
        del r
    return statistics.median(out)


def _enqueue(fn, args_list, calls):
    import jax
    jax.block_until_ready(fn(*args_list[0]))
    start = time.perf_counter()
    rs = [fn(*args_list[i % len(args_list)]) for i in range(calls)]
    host = (time.perf_counter() - start) / calls
    jax.block_until_ready(rs)
    return host


def main():
    import jax
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impls", default="jax_dash,cudnn")
    p.add_argument("--calls", type=int, default=16)
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--tokens", type=int, default=16384, help="batch * seq (default 16384)")
    args = p.parse_args()
    print(f"{'impl':9} {'point':22} {'phase':4} {'single ms':>10} {'steady ms':>10} "
          f"{'enqueue ms':>10}")
    for hd, seq, causal in POINTS:
        seq = min(seq, args.tokens)
        point = _grid.Point(head_dim=hd, seq=seq, batch=args.tokens // seq, heads=2048 // hd,
                            mask="causal" if causal else "full")
        sets = _peers.random_inputs(point, num_sets=2)
        for impl in args.impls.split(","):
            try:
                fn = _peers.attention_fn(impl, is_causal=causal)
            except _peers.Unavailable as e:
                print(f"{impl}: unavailable ({e})")
                continue
            fwd, _ = _peers.jitted_pair(fn)
            residuals, bwd = _peers.jitted_backward(fn)
            fwd_args = [s[:3] for s in sets]
            bwd_args = [(jax.block_until_ready(residuals(*s[:3])), s[3]) for s in sets]
            for phase, f, a in (("fwd", fwd, fwd_args), ("bwd", bwd, bwd_args)):
                for x in a:
                    jax.block_until_ready(f(*x))
                single = _median(f, a, 1, args.samples)
                steady = _median(f, a, args.calls, args.samples)
                enq = _enqueue(f, a, args.calls)
                name = f"hd{hd} {point.mask} {seq}"
                print(f"{impl:9} {name:22} {phase:4} {single * 1e3:10.3f} {steady * 1e3:10.3f} "
                      f"{enq * 1e3:10.3f}", flush=True)
            del bwd_args


if __name__ == "__main__":
    main()
