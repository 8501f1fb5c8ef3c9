"""One attention forward + backward, a few times, for a profiler (ncu, nsys) to catch kernels of
one implementation at one shape, in a process of its own:

    ncu -k regex:'Bwd|bwd_main' --launch-skip 2 -c 3 ... python maintainers/scripts/attn_once.py \
        --impl fa3 --batch 2 --seq 8192 --heads 16 --head-dim 128 --causal

--impl: any of benchmarks/_peers.py's implementations (jax_dash, cudnn, fa3, fa3_det, tokamax);
fa3_det needs the environment that benchmarks/_peers.py names (it says so when missing).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import jax  # noqa: E402

import _grid  # noqa: E402
import _peers  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", required=True)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--dropout-rate", type=float, default=0.0,
                   help="jax_dash only: attention dropout at this rate (key 0)")
    args = p.parse_args()
    point = _grid.Point(head_dim=args.head_dim, seq=args.seq, mask="causal" if args.causal else "full",
                        batch=args.batch, heads=args.heads, kv_heads=args.kv_heads)
    if args.dropout_rate > 0:
        if args.impl != "jax_dash":
            p.error("--dropout-rate is for --impl jax_dash")
        import jax_dash
        rng = jax.random.key(0)

        def fn(q, k, v):
            return jax_dash.attention(q, k, v, is_causal=point.is_causal,
                                      dropout_rate=args.dropout_rate, dropout_rng=rng)
    else:
        fn = _peers.attention_fn(args.impl, is_causal=point.is_causal, schedule=None,
                                 head_dim=point.head_dim)
    _, fwd_bwd = _peers.jitted_pair(fn)
    inputs = _peers.random_inputs(point, num_sets=1)[0]
    for _ in range(args.calls):
        jax.block_until_ready(fwd_bwd(*inputs))
    print(f"{args.impl} {point.label()}: {args.calls} forward+backward calls done")


if __name__ == "__main__":
    main()
