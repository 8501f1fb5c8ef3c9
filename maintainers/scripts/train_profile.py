"""Where a training step's GPU time goes: per-kernel totals of bench_train's step, one recipe.

    python maintainers/scripts/train_profile.py --config dash_embed --seq 32768 [--steps 3]

Builds benchmarks/bench_train.py's model and step for the recipe (its XLA flag too, where the
recipe has one: run each recipe in its own process), runs warm-up steps, traces `--steps` steps
with jax.profiler and reads the trace back with jax.profiler.ProfileData: the kernels on the GPU
plane, summed by name, per step. Prints the total and the top kernels with a coarse class
(attention, matmul, embedding/scatter, other fusions) and writes the table as JSON with --out.
"""
import argparse
import collections
import glob
import json
import os
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_train  # noqa: E402


def kernel_class(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("jax_dash", "bwd_main", "fwd_kernel", "flash", "cudnn", "fmha",
                            "sdpa", "attn", "dq_post", "preprocess", "postprocess", "generated_")):
        return "attention"
    if any(s in n for s in ("gemm", "matmul", "cutlass", "nvjet", "sm90_xmma", "cublas", "triton_")):
        return "matmul"
    if any(s in n for s in ("scatter", "segment", "sort", "radix", "gather")):
        return "embedding"
    return "other"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, choices=list(bench_train.RECIPES))
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    recipe = bench_train.RECIPES[args.config]
    if recipe.deterministic_flag and "--xla_gpu_deterministic_ops=true" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
    import jax
    import _train_model

    cfg = _train_model.ModelConfig()
    batch = bench_train.batch_for(args.seq, args.tokens)
    step, optimizer = bench_train.jitted_step(args.config, cfg,
                                              bench_train.loss_chunks_for(batch * args.seq, 0))
    params = jax.jit(lambda key: _train_model.init_params(cfg, key))(jax.random.key(0))
    opt_state = jax.jit(optimizer.init)(params)
    batches = jax.device_put(_train_model.random_batches(0, 3 + args.steps, batch, args.seq, cfg.vocab))
    for i in range(3):
        params, opt_state, loss = jax.block_until_ready(step(params, opt_state, batches[i]))
    trace_dir = tempfile.mkdtemp(prefix="train_profile_")
    with jax.profiler.trace(trace_dir):
        for i in range(args.steps):
            params, opt_state, loss = jax.block_until_ready(step(params, opt_state, batches[3 + i]))
    path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    data = jax.profiler.ProfileData.from_file(path)
    totals = collections.Counter()
    counts = collections.Counter()
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            # The stream lines hold the kernels; skip XLA's op/module summary lines.
            if "stream" not in line.name.lower():
                continue
            for event in line.events:
                totals[event.name] += event.duration_ns
                counts[event.name] += 1
    if not totals:  # another profiler's naming: show what the GPU planes hold
        for plane in data.planes:
            print(plane.name, [(line.name, sum(1 for _ in line.events)) for line in plane.lines])
        raise SystemExit("no kernel events on a GPU plane's stream lines")
    per_step = {name: ns / 1e6 / args.steps for name, ns in totals.items()}
    total = sum(per_step.values())
    by_class = collections.Counter()
    for name, ms in per_step.items():
        by_class[kernel_class(name)] += ms
    print(f"{args.config} seq {args.seq} batch {batch}: GPU kernel time {total:.1f} ms a step "
          f"(sum over streams, {args.steps} traced steps)")
    for cls, ms in by_class.most_common():
        print(f"  {cls:10s} {ms:8.2f} ms")
    for name, ms in sorted(per_step.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {ms:8.3f} ms  x{counts[name] // args.steps:<4d} [{kernel_class(name)}] {name[:110]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(config=args.config, seq=args.seq, batch=batch, steps=args.steps,
                           total_ms=total, by_class=dict(by_class),
                           kernels={n: dict(ms=per_step[n], calls=counts[n] // args.steps)
                                    for n in per_step}), f, indent=1)


if __name__ == "__main__":
    main()
