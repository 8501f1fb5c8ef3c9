"""Masked benchmark points (issue 13): a sliding window and packed sequences, in TFLOP/s of the
work the mask leaves visible.

    python benchmarks/bench_masks.py                 # both points at the GPU sizes (bf16)
    python benchmarks/bench_masks.py --impls jax_dash,cudnn,fa3,fa3_det,tokamax   # with peers
    python benchmarks/bench_masks.py --seq 1024 --window 256 --doc-mean 128 --iters 2   # small

Points (batch * seq = 16k tokens, hidden 2048 -> heads = 2048 / head_dim, causal):
  sliding  seq 16k, local_window_size (4095, 0): each query sees itself and the 4095 keys before it
  packed   one row of 16k tokens cut into documents of random length (mean 2k, fixed seed),
           segment ids: a query sees the keys of its own document up to itself
FLOPs of visible work: forward 4 * B * H * D * (visible (query, key) pairs), counted exactly from
the mask (closed form per row, no S^2 array); backward 2.5x forward, as in the main grid. Peers
(--impls, benchmarks/_peers.py): jax.nn's cuDNN attention (`cudnn`, and `cudnn_det` under
--xla_gpu_deterministic_ops), FlashAttention-3 (`fa3`, and `fa3_det` with its backward's
deterministic attribute on) and tokamax, at the causal and window points (none takes packed
segment ids); `cudnn_det` and `fa3_det` run in a child process each (their switch is per
process). Every implementation's forward and gradients are checked against jax_dash.reference at
each causal or window point before it is timed (a slice of batch and heads); one that fails is
reported wrong with its errors, never timed. The packed point is jax_dash only, unchecked here
(tests/test_masks.py and the GPU tests check segment ids).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _peers  # noqa: E402
import _timing  # noqa: E402

IMPLS = ("jax_dash", "cudnn", "cudnn_det", "fa3", "fa3_det", "tokamax")

PAPER_TOKENS, PAPER_HIDDEN = 16384, 2048


def band_visible_pairs(seq_q: int, seq_kv: int, *, is_causal: bool, window=None) -> int:
    """Exact number of (query, key) pairs a causal and/or windowed mask keeps (one head, one
    row): per query i the keys [max(0, i - left), min(seq_kv - 1, i + right)]."""
    i = np.arange(seq_q, dtype=np.int64)
    left, right = window if window is not None else (seq_kv, seq_kv)
    right = min(right, 0) if is_causal else right
    first = np.maximum(i - left, 0)
    last = np.minimum(i + right, seq_kv - 1)
    return int(np.maximum(last - first + 1, 0).sum())


def packed_visible_pairs(document_lengths, *, is_causal: bool) -> int:
    """Exact pairs of a row packed with these documents (segment ids, equal on both sides)."""
    lengths = np.asarray(document_lengths, np.int64)
    return int((lengths * (lengths + 1) // 2).sum() if is_causal else (lengths ** 2).sum())


def random_document_lengths(total: int, mean: int, seed: int = 0) -> np.ndarray:
    """Document lengths (>= 1) that fill `total` tokens, exponential with the given mean (the
    last one cut to fit)."""
    rng = np.random.default_rng(seed)
    lengths, used = [], 0
    while used < total:
        n = int(min(max(1, round(rng.exponential(mean))), total - used))
        lengths.append(n)
        used += n
    return np.asarray(lengths, np.int64)


def segment_ids(document_lengths) -> np.ndarray:
    return np.repeat(np.arange(len(document_lengths), dtype=np.int32), document_lengths)


def visible_flops(pairs_per_head_row: int, batch: int, heads: int, head_dim: int):
    forward = 4.0 * batch * heads * head_dim * pairs_per_head_row
    return forward, 2.5 * forward


def mask_points(seq: int, window: int, doc_mean: int, tokens: int, hidden: int, head_dim: int):
    """The two points (and the full causal point of the same shape) as dicts of jax_dash
    keyword arguments plus their exact visible pair counts per (batch row, head)."""
    batch, heads = max(1, tokens // seq), hidden // head_dim
    docs = random_document_lengths(seq, doc_mean)
    ids = segment_ids(docs)
    return [
        dict(name="causal", batch=batch, seq=seq, heads=heads, head_dim=head_dim,
             kwargs=dict(is_causal=True),
             pairs=band_visible_pairs(seq, seq, is_causal=True)),
        dict(name=f"sliding_window_{window}", batch=batch, seq=seq, heads=heads,
             head_dim=head_dim, kwargs=dict(is_causal=True, local_window_size=(window - 1, 0)),
             pairs=band_visible_pairs(seq, seq, is_causal=True, window=(window - 1, 0))),
        dict(name=f"packed_mean_{doc_mean}", batch=batch, seq=seq, heads=heads,
             head_dim=head_dim, documents=int(len(docs)),
             kwargs=dict(is_causal=True, query_segment_ids=np.tile(ids, (batch, 1)),
                         key_value_segment_ids=np.tile(ids, (batch, 1))),
             pairs=packed_visible_pairs(docs, is_causal=True)),
    ]


def _median_seconds(fn, args, iters: int) -> float:
    """Median seconds per call, timed as the main grid is (_timing.time_function: calls back to
    back, each sample >= 20 ms, so the host's dispatch latency is not counted in every call)."""
    return _timing.time_function(fn, [args], iters=iters)["median_s"]


def _attention_fn(point: dict, impl: str):
    """f(q, k, v) of `impl` at the point's mask (raises _peers.Unavailable with the reason)."""
    import jax.numpy as jnp
    kwargs = {name: (jnp.asarray(value) if isinstance(value, np.ndarray) else value)
              for name, value in point["kwargs"].items()}
    if impl == "jax_dash":
        try:
            import jax_dash
        except Exception as e:  # noqa: BLE001 - not built: recorded, the peers still run
            raise _peers.Unavailable(f"import jax_dash failed: {type(e).__name__}: {e}")
        return lambda q, k, v: jax_dash.attention(q, k, v, **kwargs)
    if "query_segment_ids" in kwargs:
        raise _peers.Unavailable(f"{impl} takes no segment ids (packed sequences)")
    return _peers.attention_fn(impl, is_causal=kwargs["is_causal"], head_dim=point["head_dim"],
                               window=kwargs.get("local_window_size"))


def run_point(point: dict, *, iters: int, dtype: str = "bfloat16", impl: str = "jax_dash",
              check: bool = True):
    """Checks (causal and window points) and times the forward and the backward of one point;
    returns TFLOP/s of visible work, or the reason it was not timed (status "unavailable" or
    "wrong")."""
    import jax
    import jax.numpy as jnp

    record = dict(name=point["name"], impl=impl, seq=point["seq"], batch=point["batch"],
                  heads=point["heads"], head_dim=point["head_dim"],
                  visible_pairs_per_row_head=point["pairs"],
                  visible_fraction=point["pairs"] / point["seq"] ** 2, status="ok")
    shape = (point["batch"], point["seq"], point["heads"], point["head_dim"])
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, dout = (jax.random.normal(key, shape, jnp.float32).astype(dtype) for key in keys)
    try:
        attention = _attention_fn(point, impl)
        if check and "query_segment_ids" not in point["kwargs"]:
            record["check"] = _peers.check_against_reference(
                attention, q, k, v, dout, is_causal=point["kwargs"]["is_causal"],
                window=point["kwargs"].get("local_window_size"))
    except _peers.Unavailable as e:
        return dict(record, status="unavailable", error=str(e))
    except _peers.Wrong as e:
        return dict(record, status="wrong", error=str(e), check=e.check)
    forward = jax.jit(attention)
    # The backward alone, as in a training step and in bench_attention.py: a jitted VJP applied
    # to residuals that a jitted forward computed once (not forward + backward minus forward).
    residuals, backward = _peers.jitted_backward(attention)
    vjp_fn = residuals(q, k, v)
    t_fwd = _median_seconds(forward, (q, k, v), iters)
    t_bwd = _median_seconds(backward, (vjp_fn, dout), iters)
    fwd_flops, bwd_flops = visible_flops(point["pairs"], point["batch"], point["heads"],
                                         point["head_dim"])
    return dict(record, fwd_ms=1e3 * t_fwd, bwd_ms=1e3 * t_bwd,
                fwd_tflops=fwd_flops / t_fwd / 1e12, bwd_tflops=bwd_flops / t_bwd / 1e12)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=16384)
    p.add_argument("--window", type=int, default=4096, help="keys each query sees (incl. itself)")
    p.add_argument("--doc-mean", type=int, default=2048, help="mean packed document length")
    p.add_argument("--tokens", type=int, default=PAPER_TOKENS)
    p.add_argument("--hidden", type=int, default=PAPER_HIDDEN)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--impls", default="jax_dash",
                   help=f"comma-separated, from {', '.join(IMPLS)} (peers where they take the "
                        "mask)")
    p.add_argument("--cudnn", action="store_true", help="the same as adding cudnn to --impls")
    p.add_argument("--no-check", action="store_true",
                   help="time without checking against the reference first")
    p.add_argument("--packed-schedules", default="",
                   help="comma-separated backward schedules to time the packed point with, beside "
                        "'auto' (e.g. descending,symmetric_shift)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p


def _in_child(argv, impls, group):
    """The same run for `impls` in a child process whose environment switches `group` on (the
    XLA determinism flag, or FA3's deterministic backward); its records, or one error record per
    impl."""
    env = (_peers.xla_flags_with_determinism(os.environ) if group == "det"
           else _peers.env_with_fa3_deterministic(os.environ))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        argv = [a for a in _without_options(argv, ("--impls", "--out", "--cudnn"))]
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--impls",
                               ",".join(impls), "--out", str(out)], env=env, capture_output=True,
                              text=True)
        if proc.returncode == 0 and out.exists():
            return json.loads(out.read_text())
        error = f"child process exited {proc.returncode}: {proc.stderr.strip()[-1500:]}"
        return [dict(impl=impl, status="unavailable", error=error) for impl in impls]


def _without_options(argv, names):
    """argv without the options in `names` (with their values)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = arg != "--cudnn"
            continue
        if any(arg.startswith(n + "=") for n in names):
            continue
        kept.append(arg)
    return kept


def _print(record):
    if record.get("status", "ok") != "ok":
        print(f"{record.get('name', '-'):>22} {record['impl']:>8}: {record['status']}: "
              f"{record.get('error', '')[:300]}", file=sys.stderr)
        return
    print(f"{record['name']:>22} {record['impl']:>8}: visible {record['visible_fraction']:.3f} "
          f"of S^2, fwd {record['fwd_tflops']:.2f} TFLOP/s, bwd {record['bwd_tflops']:.2f} TFLOP/s "
          "(visible work)", file=sys.stderr)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    for name in ("seq", "window", "doc_mean", "tokens", "hidden", "head_dim", "iters"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    from jax_dash.attention import SCHEDULES
    packed_schedules = [name for name in args.packed_schedules.split(",") if name]
    for name in packed_schedules:
        if name not in SCHEDULES:
            raise SystemExit(f"--packed-schedules: {name!r} is not a schedule; choose from "
                             f"{', '.join(SCHEDULES)}")
    impls = [name for name in args.impls.split(",") if name] + (["cudnn"] if args.cudnn else [])
    impls = list(dict.fromkeys(impls))
    for name in impls:
        if name not in IMPLS:
            raise SystemExit(f"--impls: {name!r} is not one of {', '.join(IMPLS)}")
    here = [i for i in impls if _peers.worker_group(i) == "default"]
    # A process runs the impls of its own group: the child of a "det" or "fa3_det" group gets
    # only those, and its environment has the switch on.
    if _peers.process_is_deterministic() or _peers.process_is_fa3_deterministic():
        here = impls
    results = []
    for point in mask_points(args.seq, args.window, args.doc_mean, args.tokens, args.hidden,
                             args.head_dim):
        packed = "query_segment_ids" in point["kwargs"]
        variants = [point]
        if packed:  # the same point under other backward schedules, one row each
            variants += [dict(point, name=f"{point['name']}_{schedule}",
                              kwargs=dict(point["kwargs"], schedule=schedule))
                         for schedule in packed_schedules]
        for impl in here:
            if packed and impl != "jax_dash":
                continue  # no peer takes segment ids
            for variant in variants if impl == "jax_dash" else [point]:
                record = run_point(variant, iters=args.iters, dtype=args.dtype, impl=impl,
                                   check=not args.no_check)
                results.append(record)
                _print(record)
    if not (_peers.process_is_deterministic() or _peers.process_is_fa3_deterministic()):
        for group in ("det", "fa3_det"):
            members = [i for i in impls if _peers.worker_group(i) == group]
            if members:
                for record in _in_child(argv, members, group):
                    results.append(record)
                    _print(record)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
