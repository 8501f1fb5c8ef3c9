"""Which part of a training step changes bits between processes (and why)?

    python benchmarks/probe_cross_process.py [--config dash_embed] [--seq 4096] [--processes 2]

Runs bench_train.py's model in several fresh processes, each with the same parameters and batch,
and prints, per process, a SHA-256 of every gradient leaf of step 1 and of every parameter after
`--steps` steps, first with XLA's default flags and then with `--xla_gpu_autotune_level=0` (no
autotuning: XLA's default kernel for every GEMM fusion). Each default-flags process also dumps
XLA's autotuning results, which are compared. A leaf whose hash differs between processes
is named; so is whether the autotuner chose differently.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def child(args) -> None:
    import jax

    import numpy as np

    import _train_model
    import bench_train

    def digest(x):
        return bench_train.params_digest([np.asarray(x)])[:16]
    recipe = bench_train.RECIPES[args.config]
    cfg = _train_model.ModelConfig(**json.loads(args.model))
    batch = bench_train.batch_for(args.seq, args.tokens)
    chunks = bench_train.loss_chunks_for(batch * args.seq, 0)
    attention = bench_train.attention_for(recipe.attention)
    embed = bench_train.embedding_for(recipe.embedding)
    optimizer = _train_model.make_optimizer()
    loss = lambda p, t: _train_model.loss_fn(p, t, cfg=cfg, attention=attention, embed=embed,
                                             loss_chunks=chunks)
    step = jax.jit(_train_model.make_train_step(cfg, attention, embed, optimizer, chunks))
    params = jax.jit(lambda key: _train_model.init_params(cfg, key))(jax.random.key(0))
    batches = jax.device_put(_train_model.random_batches(0, args.steps, batch, args.seq,
                                                         cfg.vocab))
    grads = jax.jit(jax.grad(loss))(params, batches[0])
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(grads)]
    grad_hashes = dict(zip(paths, map(digest, jax.tree_util.tree_leaves(grads))))
    state = optimizer.init(params)
    for i in range(args.steps):
        params, state, _ = step(params, state, batches[i])
    param_hashes = dict(zip(paths, map(digest, jax.tree_util.tree_leaves(params))))
    print(json.dumps({"grads": grad_hashes, "params": param_hashes}))


def run_children(args, flags: str, dump_dir: str | None) -> list[dict]:
    results = []
    for i in range(args.processes):
        env_flags = flags
        if dump_dir is not None:
            env_flags += f" --xla_gpu_dump_autotune_results_to={dump_dir}/autotune_{i}.textproto"
        env = dict(os.environ, XLA_FLAGS=env_flags.strip())
        proc = subprocess.run([sys.executable, __file__, "--child", "--config", args.config,
                               "--seq", str(args.seq), "--tokens", str(args.tokens), "--steps",
                               str(args.steps), "--model", args.model], env=env, capture_output=True, text=True,
                              timeout=args.child_timeout)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"child {i} ({flags or 'default flags'}) failed")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


def report(label: str, results: list[dict]) -> None:
    for part in ("grads", "params"):
        differing = [k for k in results[0][part]
                     if len({r[part][k] for r in results}) > 1]
        print(f"{label}: {part}: {len(differing)} of {len(results[0][part])} leaves differ "
              f"between {len(results)} processes" + (f": {differing}" if differing else ""),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="dash_embed")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--child-timeout", type=float, default=240)
    parser.add_argument("--model", default="{}", help="ModelConfig fields as JSON (default: "
                        "bench_train's model)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as dump_dir:
        report("default flags", run_children(args, "", dump_dir))
        dumps = [open(os.path.join(dump_dir, name)).read()
                 for name in sorted(os.listdir(dump_dir))]
        if dumps:
            print(f"autotuning results identical across processes: {len(set(dumps)) == 1} "
                  f"({len(dumps)} dumps, {[len(d) for d in dumps]} bytes)", flush=True)
        else:
            print("no autotuning results were dumped (no GPU?)", flush=True)
        if len(set(dumps)) > 1:
            import difflib
            diff = difflib.unified_diff(dumps[0].splitlines(), dumps[1].splitlines(), lineterm="",
                                        n=2)
            print("\n".join(list(diff)[:60]))
    report("--xla_gpu_autotune_level=0", run_children(args, "--xla_gpu_autotune_level=0", None))


if __name__ == "__main__":
    main()
