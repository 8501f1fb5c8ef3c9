"""The cost of attention dropout (issue 33): jax_dash's forward and backward with
``dropout_rate`` against its own without dropout, and cuDNN's attention with dropout (XLA's fused
attention, ``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention(..., dropout_rate=)``)
timed in the same process.

    python benchmarks/bench_dropout.py --out DIR [--rate 0.1] [--head-dims 64,128]
        [--seqs 2k,4k,8k,16k] [--masks full,causal]

Each point has batch x seq = --tokens and heads x head_dim = --hidden (the attention grid's
shapes, benchmarks/README.md), bfloat16. cuDNN runs in a child process (with jaxlib 0.11.2 its
dropout aborted the process on an H100: "cuda_dnn.cc:6951 Check failed:
local_device_ordinal.has_value()"), which reports the abort as every cuDNN point's error. The forward is timed alone; the backward alone, from
the forward's residuals (``_peers.jitted_backward``). Writes DIR/dropout.json and DIR/dropout.md
(milliseconds and jax_dash's dropout / no-dropout throughput ratio, the issue's line being 0.85).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peers  # noqa: E402
import _timing  # noqa: E402


def _seq(text: str) -> int:
    return int(text[:-1]) * 1024 if text.lower().endswith("k") else int(text)


def _impls(rate: float, is_causal: bool, which: str):
    """(name, attention function of (q, k, v)) of one mask: jax_dash without and with dropout
    (``which="jax_dash"``), or cuDNN with dropout (``which="cudnn"``)."""
    import jax
    import jax_dash

    if which == "jax_dash":
        rng = jax.random.key(0)
        return [
            ("jax_dash", lambda q, k, v: jax_dash.attention(q, k, v, is_causal=is_causal)),
            ("jax_dash_dropout", lambda q, k, v: jax_dash.attention(
                q, k, v, is_causal=is_causal, dropout_rate=rate, dropout_rng=rng)),
        ]
    from jax._src.cudnn import fused_attention_stablehlo as cudnn
    mask_type = cudnn.MaskType.CAUSAL if is_causal else cudnn.MaskType.NO_MASK

    def cudnn_dropout(q, k, v):
        return cudnn.dot_product_attention(q, k, v, scale=1 / math.sqrt(q.shape[-1]),
                                           mask_type=mask_type, dropout_rate=rate, seed=0)

    return [("cudnn_dropout", cudnn_dropout)]


def _cudnn_in_child(args) -> list[dict]:
    """The cuDNN points, timed by a child process of this script (``--which cudnn``); a child
    that dies (an abort in XLA's cuDNN runtime) gives every point not yet reported its error."""
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), "--which", "cudnn", "--print-only",
           "--out", args.out, "--rate", str(args.rate), "--head-dims", args.head_dims,
           "--seqs", args.seqs, "--masks", args.masks, "--tokens", str(args.tokens),
           "--hidden", str(args.hidden), "--iters", str(args.iters), "--budget", str(args.budget)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if line.strip()
                and not line.lstrip().startswith("@")][-3:]
        done = {(r["head_dim"], r["seq"], r["mask"]) for r in records}
        error = f"the cuDNN process ended with {proc.returncode}: " + " | ".join(tail)[-400:]
        for head_dim in (int(x) for x in args.head_dims.split(",")):
            for seq in (_seq(x) for x in args.seqs.split(",")):
                for mask in args.masks.split(","):
                    if (head_dim, seq, mask) not in done:
                        records.append(dict(impl="cudnn_dropout", head_dim=head_dim, seq=seq,
                                            mask=mask, rate=args.rate, error=error))
    return records


def run(args) -> list[dict]:
    import jax
    import jax.numpy as jnp

    records = []
    for head_dim in (int(x) for x in args.head_dims.split(",")):
        heads = args.hidden // head_dim
        for seq in (_seq(x) for x in args.seqs.split(",")):
            batch = max(1, args.tokens // seq)
            keys = jax.random.split(jax.random.key(1), 4)
            q, k, v, dout = (jax.random.normal(key, (batch, seq, heads, head_dim), jnp.bfloat16)
                             for key in keys)
            for mask in args.masks.split(","):
                is_causal = mask == "causal"
                for name, fn in _impls(args.rate, is_causal, args.which):
                    record = dict(impl=name, head_dim=head_dim, seq=seq, batch=batch,
                                  heads=heads, mask=mask, rate=0.0 if name == "jax_dash"
                                  else args.rate)
                    try:
                        fwd = jax.jit(fn)
                        record["fwd_ms"] = 1e3 * _timing.time_function(
                            fwd, [(q, k, v)], iters=args.iters,
                            time_budget_s=args.budget)["median_s"]
                        residuals, backward = _peers.jitted_backward(fn)
                        vjp = residuals(q, k, v)
                        record["bwd_ms"] = 1e3 * _timing.time_function(
                            backward, [(vjp, dout)], iters=args.iters,
                            time_budget_s=args.budget)["median_s"]
                        del vjp
                    except Exception as exc:  # a peer that does not run here: said, not hidden
                        record["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    print(json.dumps(record), flush=True)
                    records.append(record)
    return records


def table(records: list[dict]) -> str:
    """Markdown: per point, ms of each impl and jax_dash's dropout / no-dropout throughput."""
    rows = ["| head_dim | seq | mask | fwd ms (none / dropout / cuDNN dropout) | fwd ratio "
            "| bwd ms (none / dropout / cuDNN dropout) | bwd ratio |",
            "|---|---|---|---|---|---|---|"]
    points = sorted({(r["head_dim"], r["seq"], r["mask"]) for r in records})
    for point in points:
        by = {r["impl"]: r for r in records if (r["head_dim"], r["seq"], r["mask"]) == point}

        def ms(impl, key):
            r = by.get(impl, {})
            return f"{r[key]:.3f}" if key in r else ("err" if "error" in r else "-")

        def ratio(key):
            a, b = by.get("jax_dash", {}).get(key), by.get("jax_dash_dropout", {}).get(key)
            return f"{a / b:.3f}" if a and b else "-"

        cells = [str(point[0]), str(point[1]), point[2]]
        for key in ("fwd_ms", "bwd_ms"):
            cells.append(" / ".join(ms(i, key) for i in ("jax_dash", "jax_dash_dropout",
                                                          "cudnn_dropout")))
            cells.append(ratio(key))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--rate", type=float, default=0.1)
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--seqs", default="2k,4k,8k,16k")
    p.add_argument("--masks", default="full,causal")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--budget", type=float, default=2.0, help="seconds of samples per timing")
    p.add_argument("--no-cudnn", action="store_true", help="time jax_dash only")
    p.add_argument("--which", default="jax_dash", choices=("jax_dash", "cudnn"),
                   help=argparse.SUPPRESS)
    p.add_argument("--print-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 0.0 < args.rate < 1.0:
        p.error(f"--rate must be in (0, 1), got {args.rate}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = run(args)
    if args.print_only:  # a child: the records went to stdout
        return 0
    if not args.no_cudnn:
        records += _cudnn_in_child(args)
    (out / "dropout.json").write_text(json.dumps(records, indent=1) + "\n")
    (out / "dropout.md").write_text(table(records))
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
