"""Digests of jax_dash's GPU outputs and gradients over a fixed set of cases, for showing that a
kernel change kept the bits: run it with the old and the new extension on the same GPU model and
compare the two JSON files (`--compare A.json B.json`).

    python maintainers/scripts/bits_digest.py --out new.json
    python maintainers/scripts/bits_digest.py --compare old.json new.json

Each case: fixed random inputs (seeded), jitted forward and VJP against a fixed cotangent; the
SHA-256 of out, dq, dk, dv's bytes. Cases: head_dim 64/128/256, full/causal, MHA and GQA,
bfloat16 and float16, the deterministic schedules, and the masked kernels (window, lengths,
segment ids, soft cap) at a length that is not a multiple of the tiles. `--dropout` adds attention
dropout cases (rate 0.1, every head dim, offsets on and off the 16-element Philox blocks, a
windowed and a segment-id case).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys


def cases():
    for hd in (64, 128, 256):
        for causal in (False, True):
            for sched in ("descending", "shift", "symmetric_shift"):
                yield dict(hd=hd, causal=causal, schedule=sched, dtype="bfloat16", h=4, hkv=4, s=1024)
            yield dict(hd=hd, causal=causal, schedule="auto", dtype="float16", h=4, hkv=2, s=1024)
    for hd in (64, 128):
        yield dict(hd=hd, causal=True, schedule="auto", dtype="bfloat16", h=4, hkv=2, s=1000,
                   window=(256, 0))
        yield dict(hd=hd, causal=False, schedule="auto", dtype="bfloat16", h=4, hkv=2, s=1000,
                   lengths=True)
        yield dict(hd=hd, causal=True, schedule="auto", dtype="bfloat16", h=4, hkv=2, s=1000,
                   segments=True)
        yield dict(hd=hd, causal=True, schedule="auto", dtype="bfloat16", h=4, hkv=2, s=1000,
                   soft_cap=30.0)


def dropout_cases():
    for hd in (64, 128, 256):
        for causal in (False, True):
            yield dict(hd=hd, causal=causal, schedule="auto", dtype="bfloat16", h=4, hkv=2, s=1000,
                       dropout=0.1)
    yield dict(hd=128, causal=True, schedule="descending", dtype="float16", h=4, hkv=4, s=1024,
               dropout=0.2, offsets=(1, 2, 7, 5))
    yield dict(hd=64, causal=True, schedule="shift", dtype="bfloat16", h=4, hkv=4, s=1024,
               dropout=0.1, offsets=(0, 4, 32, 48))
    yield dict(hd=128, causal=True, schedule="auto", dtype="bfloat16", h=4, hkv=2, s=1000,
               window=(256, 0), dropout=0.1)
    yield dict(hd=64, causal=True, schedule="auto", dtype="bfloat16", h=4, hkv=2, s=1000,
               segments=True, dropout=0.1)


def digest(case):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import jax_dash

    dtype = jnp.dtype(case["dtype"])
    b, s, h, hkv, hd = 2, case["s"], case["h"], case["hkv"], case["hd"]
    keys = jax.random.split(jax.random.key(7), 4)
    q = jax.random.normal(keys[0], (b, s, h, hd), jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (b, s, hkv, hd), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (b, s, hkv, hd), jnp.float32).astype(dtype)
    g = jax.random.normal(keys[3], (b, s, h, hd), jnp.float32).astype(dtype)
    kw = dict(is_causal=case["causal"], schedule=case["schedule"])
    if "window" in case:
        kw["local_window_size"] = case["window"]
    if case.get("lengths"):
        kw["query_seq_lengths"] = jnp.array([s, s - 77], jnp.int32)
        kw["key_value_seq_lengths"] = jnp.array([s - 5, s - 300], jnp.int32)
    if case.get("segments"):
        seg = jnp.asarray(np.repeat(np.arange(4), -(-s // 4))[:s][None].repeat(b, 0), jnp.int32)
        kw["query_segment_ids"] = seg
        kw["key_value_segment_ids"] = seg
    if "soft_cap" in case:
        kw["logits_soft_cap"] = case["soft_cap"]
    if "dropout" in case:
        kw["dropout_rate"] = case["dropout"]
        kw["dropout_rng"] = jax.random.key(3)
        kw["dropout_offsets"] = case.get("offsets")

    @jax.jit
    def run(q, k, v, g):
        out, vjp = jax.vjp(lambda q, k, v: jax_dash.attention(q, k, v, **kw), q, k, v)
        return (out, *vjp(g))

    outs = jax.block_until_ready(run(q, k, v, g))
    return {name: hashlib.sha256(np.asarray(x).tobytes()).hexdigest()[:16]
            for name, x in zip(("out", "dq", "dk", "dv"), outs)}


def label(case):
    return ",".join(f"{k}={v}" for k, v in case.items())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    p.add_argument("--dropout", action="store_true", help="add the dropout cases")
    a = p.parse_args()
    if a.compare:
        x, y = (json.load(open(f)) for f in a.compare)
        same = [c for c in x["cases"] if y["cases"].get(c) == x["cases"][c]]
        diff = [c for c in x["cases"] if c in y["cases"] and y["cases"][c] != x["cases"][c]]
        missing = [c for c in x["cases"] if c not in y["cases"]]
        print(f"identical {len(same)}, different {len(diff)}, missing {len(missing)}")
        for c in diff:
            print("  DIFFERENT", c, x["cases"][c], y["cases"][c])
        for c in missing:
            print("  MISSING", c)
        sys.exit(0 if not diff and not missing else 1)
    import jax
    import jax_dash
    result = {"device": str(jax.devices()[0].device_kind), "jax_dash": jax_dash.__version__,
              "cases": {}}
    for case in list(cases()) + (list(dropout_cases()) if a.dropout else []):
        result["cases"][label(case)] = digest(case)
        print(label(case), result["cases"][label(case)], flush=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
