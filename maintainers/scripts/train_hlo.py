"""Which custom calls a compiled training step holds, and where: bench_train's step for one
recipe, compiled (not run), its optimized HLO searched for a custom-call target.

    python maintainers/scripts/train_hlo.py --config dash_embed --seq 4096 [--target jax_dash_fwd]

Prints each call site: the instruction's name (an XLA pass that clones one names the copy, e.g.
`.remat`, `.clone`), the computation holding it, and how many; with --dump also writes the HLO.
"""
import argparse
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_train  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, choices=list(bench_train.RECIPES))
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--target", default="jax_dash_fwd")
    p.add_argument("--dump", default=None)
    args = p.parse_args()
    import jax
    import _train_model
    cfg = _train_model.ModelConfig()
    batch = bench_train.batch_for(args.seq, args.tokens)
    step, optimizer = bench_train.jitted_step(args.config, cfg,
                                              bench_train.loss_chunks_for(batch * args.seq, 0))
    params = jax.eval_shape(lambda k: _train_model.init_params(cfg, k), jax.random.key(0))
    opt_state = jax.eval_shape(optimizer.init, params)
    tokens = jax.ShapeDtypeStruct((batch, args.seq + 1), "int32")
    lowered = step.lower(params, opt_state, tokens)
    pre = lowered.as_text()
    print(f"StableHLO: {pre.count('@' + args.target)} call(s) of {args.target}")
    hlo = lowered.compile().as_text()
    if args.dump:
        with open(args.dump, "w") as f:
            f.write(hlo)
    computation = None
    sites = []
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if m and not line.startswith(" "):
            computation = m.group(1)
        if f'custom_call_target="{args.target}"' in line:
            name = line.strip().split(" = ")[0]
            sites.append((name, computation))
    print(f"optimized HLO: {len(sites)} call site(s) of {args.target}")
    for name, comp in sites:
        print(f"  {name}  in  {comp}")
    for what in ("while(", "custom_call_target=\"jax_dash_bwd", "custom_call_target=\"__cudnn"):
        print(f"  {what}: {hlo.count(what)}")


if __name__ == "__main__":
    main()
