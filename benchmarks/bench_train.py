"""Whole training steps of a Llama-style decoder on one GPU: speed and bitwise reproducibility.

    python benchmarks/bench_train.py                       # every recipe, seqs 4096 and 32768
    python benchmarks/bench_train.py --quick --configs cudnn_gather,dash_embed

The model (benchmarks/_train_model.py): d_model 2048, 8 layers under lax.scan, 16 query / 8 KV
heads of head_dim 128 (GQA), RoPE, SwiGLU hidden 5632, RMSNorm, untied embedding and LM head,
vocab 128256 (~0.9B parameters), float32 master parameters and bf16 compute, AdamW with global-norm
clipping, mean cross-entropy (float32 log_softmax + take_along_axis). Tokens per step `--tokens`,
batch = max(1, tokens // seq): 4 x 4096 and 1 x 32768 by default. Random tokens from `--seed`.

Each recipe (`--configs`) x seq runs in its own child process (XLA_FLAGS differ per recipe; peak
memory is per process). The child trains `--steps` steps twice from the same initial state; the
first run is timed (every step after the warm-up steps, each ended by block_until_ready), the
two final parameter sets are compared byte for byte (same_process). A second child trains once
more, and the parent compares the SHA-256 of its final parameters with the first (cross_process).
A child that fails or times out is a row with its error. Outputs in --out: results.json,
results.md, train.png. An existing results.json there is merged into (--fresh starts over).

Run time on an H100 (from 8-step runs): about 1 min a recipe at seq 4096 and 1.5 min at 32768
with the default 20 steps, ~15 min for everything. Inside a 10-minute limit run `--seqs 4096`
and `--seqs 32768` as two commands with the same --out (and --time-budget 540).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import hashlib
import importlib.util
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _grid  # noqa: E402
import _peers  # noqa: E402
import _train_model  # noqa: E402

SCRIPT = str(Path(__file__).resolve())
RESULTS_DIR = Path(__file__).resolve().parent / "results"
RECORD_PREFIX = "@@bench_train@@ "
SCHEMA_VERSION = 1
BASELINE = "cudnn_gather"
H100_BF16_DENSE_TFLOPS = 989.0  # datasheet peak, dense (no sparsity), SXM
DEFAULT_STEPS, QUICK_STEPS = 20, 10
DEFAULT_WARMUP, QUICK_WARMUP = 3, 2  # untimed first steps (the first is also after compile)
# LM head + loss in slices of at most this many tokens (--loss-chunks 0): at 32k tokens the whole
# at once ran out of memory on an 80 GB H100 (the memory note in _train_model.py); 4 slices cost 5% of
# the step at 16k tokens (175.6 vs 167.6 ms, cudnn_gather, 2026-11-26).
LOSS_CHUNK_TOKENS = 8192
STDERR_TAIL_LINES = 20

@dataclasses.dataclass(frozen=True)
class Recipe:
    attention: str        # "cudnn", "cudnn_det" (cuDNN under the deterministic flag), "jax_dash", "fa3"
    embedding: str        # "gather", "onehot", "dash_embed"
    deterministic_flag: bool  # run the child with XLA_FLAGS=--xla_gpu_deterministic_ops=true
    what: str


RECIPES = {
    "cudnn_gather": Recipe("cudnn", "gather", False, "cuDNN attention, table[ids]: the racing baseline"),
    "cudnn_detflag": Recipe("cudnn_det", "gather", True, "the same under XLA's deterministic flag"),
    "dash_detscatter": Recipe("jax_dash", "gather", True, "jax_dash, table[ids], deterministic flag"),
    "dash_onehot": Recipe("jax_dash", "onehot", False, "jax_dash, one_hot(ids) @ table"),
    "dash_embed": Recipe("jax_dash", "dash_embed", False, "jax_dash, jax_dash.embed: the recipe"),
    "fa3": Recipe("fa3", "gather", False, "FlashAttention-3 (flash_attn3_jax), table[ids]"),
    # Diagnostics, not run by default: each changes one part of the baseline or of the recipe, so
    # step-time differences split into attention and embedding.
    "cudnn_embed": Recipe("cudnn", "dash_embed", False, "cuDNN attention, jax_dash.embed (diagnostic)"),
    "dash_gather": Recipe("jax_dash", "gather", False, "jax_dash, table[ids], no flag (diagnostic)"),
}
DIAGNOSTIC_RECIPES = ("cudnn_embed", "dash_gather")


def loss_chunks_for(step_tokens: int, requested: int) -> int:
    """`requested`, or where 0 the fewest slices of <= LOSS_CHUNK_TOKENS that divide the step."""
    if requested:
        if step_tokens % requested:
            raise ValueError(f"--loss-chunks={requested} must divide the tokens of a step ({step_tokens})")
        return requested
    return next(c for c in range(1, step_tokens + 1)
                if step_tokens % c == 0 and step_tokens // c <= LOSS_CHUNK_TOKENS)


def batch_for(seq: int, tokens: int) -> int:
    """Tokens per step stay `tokens` where seq divides it; a longer seq runs one sequence."""
    return max(1, tokens // seq)


# ----------------------------------------------------------------------------- child process

def attention_for(name: str):
    import jax
    if name == "fa3":
        if jax.default_backend() != "gpu":
            raise _peers.Unavailable(f"FlashAttention-3 needs a GPU; this process runs on "
                                     f"{jax.default_backend()!r}")
        try:
            from flash_attn3_jax import flash_mha
        except ModuleNotFoundError as e:
            if e.name != "flash_attn3_jax":
                raise
            raise _peers.Unavailable("not installed (flash_attn3_jax is not importable)")
        # GQA is detected from the head counts; its backward accumulates dQ with atomics.
        return lambda q, k, v: flash_mha(q, k, v, is_causal=True)
    return _peers.attention_fn(name, is_causal=True)


def embedding_for(name: str):
    import jax
    if name == "gather":
        return lambda table, ids: table[ids]
    if name == "onehot":
        return lambda table, ids: jax.nn.one_hot(ids, table.shape[0], dtype=table.dtype) @ table
    import jax_dash
    if not hasattr(jax_dash, "embed"):
        raise _peers.Unavailable("jax_dash.embed does not exist in this jax_dash "
                                 f"({jax_dash.__file__})")
    return jax_dash.embed


def jitted_step(config: str, cfg, loss_chunks: int):
    """(the jitted training step of recipe `config`, its optimizer); the step donates the
    parameters and optimizer state. The recipe's XLA flag, where it has one, is the process's
    to set (child_env)."""
    import jax
    recipe = RECIPES[config]
    optimizer = _train_model.make_optimizer()
    step = _train_model.make_train_step(cfg, attention_for(recipe.attention),
                                        embedding_for(recipe.embedding), optimizer, loss_chunks)
    return jax.jit(step, donate_argnums=(0, 1)), optimizer


def params_digest(host_leaves) -> str:
    digest = hashlib.sha256()
    for leaf in host_leaves:
        digest.update(leaf.tobytes())
    return digest.hexdigest()


def train(spec: dict) -> dict:
    import jax
    import numpy as np

    import _worker
    cfg = _train_model.ModelConfig(**spec["model"])
    out = {"env": _worker.env_info()}
    step, optimizer = jitted_step(spec["config"], cfg, spec["loss_chunks"])
    init = jax.jit(lambda key: _train_model.init_params(cfg, key))
    batches = jax.device_put(_train_model.random_batches(
        spec["seed"], spec["steps"], spec["batch"], spec["seq"], cfg.vocab))

    def fresh_state():
        params = init(jax.random.key(spec["seed"]))
        return params, jax.jit(optimizer.init)(params)

    leaf_paths = [jax.tree_util.keystr(path) for path, _ in
                  jax.tree_util.tree_leaves_with_path(jax.eval_shape(fresh_state)[0])]

    start = time.perf_counter()
    compiled = step.lower(*jax.eval_shape(fresh_state), batches[0]).compile()
    out["compile_s"] = time.perf_counter() - start

    def run(label):
        params, opt_state = fresh_state()
        losses, times = [], []
        for i in range(spec["steps"]):
            start = time.perf_counter()
            params, opt_state, loss = jax.block_until_ready(compiled(params, opt_state, batches[i]))
            times.append(time.perf_counter() - start)
            losses.append(loss)
        print(f"  {spec['config']} seq {spec['seq']} {label}: {spec['steps']} steps, median "
              f"{statistics.median(times[spec['warmup']:]) * 1e3:.1f} ms", file=sys.stderr, flush=True)
        host = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(params)]
        return host, [float(x) for x in losses], times

    first, losses, times = run("timed run" if spec["mode"] == "full" else "second process")
    out.update(final_hash=params_digest(first), losses=losses, losses_finite=bool(np.all(np.isfinite(losses))))
    # Per parameter, so that a cross-process difference names the parameters it reached.
    out["leaf_hashes"] = {path: params_digest([leaf]) for path, leaf in zip(leaf_paths, first)}
    if spec.get("autotune_dump") and os.path.exists(spec["autotune_dump"]):
        with open(spec["autotune_dump"], "rb") as f:
            out["autotune_digest"] = hashlib.sha256(f.read()).hexdigest()
    if spec["mode"] == "hash":
        return out
    timed = times[spec["warmup"]:]
    out["step_times_s"] = timed
    out["step_time_s"] = statistics.median(timed)
    stats = jax.local_devices()[0].memory_stats() or {}
    out["peak_bytes"] = stats.get("peak_bytes_in_use")
    second, second_losses, _ = run("repeat")
    # Raw bytes: np.array_equal on floats would call NaN != NaN and -0 == +0.
    differing = [i for i, (a, b) in enumerate(zip(first, second)) if a.tobytes() != b.tobytes()]
    out["same_process"] = not differing
    out["differing_leaves"] = f"{len(differing)} of {len(first)}"
    out["first_differing_loss_step"] = next(
        (i for i, (a, b) in enumerate(zip(losses, second_losses)) if a != b), None)
    return out


def child_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    record = {"spec": spec}
    try:
        record["result"] = train(spec)
        record["status"] = "ok"
    except _peers.Unavailable as e:
        record["status"] = f"skipped: {e}"
    except Exception as e:  # a compile error (XLA's IndexError under the flag, OOM, ...) is a row
        lines = str(e).strip().splitlines()
        record["status"] = f"error: {type(e).__name__}: {lines[0] if lines else ''}"[:500]
    print(RECORD_PREFIX + json.dumps(record), flush=True)
    return 0


# ----------------------------------------------------------------------------- parent process

def run_child(spec: dict, env: dict, timeout_s: float) -> dict:
    """Runs one child; its stderr is echoed as progress and its last lines kept for errors."""
    tail = collections.deque(maxlen=STDERR_TAIL_LINES)
    with tempfile.TemporaryFile("w+") as stdout:
        proc = subprocess.Popen([sys.executable, SCRIPT, "--child", json.dumps(spec)], env=env,
                                stdout=stdout, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

        def echo():
            for line in proc.stderr:
                tail.append(line.rstrip())
                print("    " + line.rstrip(), file=sys.stderr, flush=True)

        reader = threading.Thread(target=echo, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group: it and its children
            proc.wait()
            return {"status": f"error: timed out after {timeout_s:.0f} s"}
        finally:
            reader.join(timeout=10)
        stdout.seek(0)
        for line in stdout:
            if line.startswith(RECORD_PREFIX):
                return json.loads(line[len(RECORD_PREFIX):])
    last = next((line for line in reversed(tail) if line.strip()), "")
    return {"status": f"error: child exited with code {proc.returncode}: {last}"[:500]}


def child_env(recipe: Recipe) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(_peers.DETERMINISTIC_XLA_FLAG, "").strip()
    if recipe.deterministic_flag:
        env = _peers.xla_flags_with_determinism(env)
    # Allocate on demand up to 95% of the card, so peak_bytes_in_use and an OOM are the step's
    # own (as bench_attention.py's memory items do).
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    return env


def measure_row(config: str, seq: int, opts, deadline: float) -> dict:
    recipe = RECIPES[config]
    batch = batch_for(seq, opts.tokens)
    row = {"config": config, "seq": seq, "batch": batch, "what": recipe.what,
           "loss_chunks": loss_chunks_for(batch * seq, opts.loss_chunks)}
    if recipe.attention == "fa3" and importlib.util.find_spec("flash_attn3_jax") is None:
        return dict(row, status="not installed")
    spec = {"config": config, "seq": seq, "batch": row["batch"], "steps": opts.steps,
            "warmup": opts.warmup, "seed": opts.seed,
            "loss_chunks": row["loss_chunks"],
            "model": dataclasses.asdict(opts.model)}
    # --compilation-cache: both processes share a fresh JAX persistent compilation cache, so the
    # second loads the first's executable (XLA's autotuning choices included) instead of compiling
    # and autotuning anew; no autotuning dump then (a flag that would change the cache key).
    cache_env = {}
    if opts.compilation_cache:
        cache_env = {"JAX_COMPILATION_CACHE_DIR": tempfile.mkdtemp(prefix="bench_train_cache_"),
                     "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                     "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
        row["compilation_cache"] = True
    for mode in ("full", "hash"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            note = f"skipped: --time-budget {opts.time_budget:.0f} s spent"
            return dict(row, status=note) if mode == "full" else dict(row, cross_process_note=note)
        print(f"{config} seq {seq} batch {row['batch']} ({mode}) ...", file=sys.stderr, flush=True)
        # XLA's autotuner times kernels in each process and may choose differently: each process
        # dumps its choices (a dump only; it changes nothing), compared below.
        dump = os.path.join(tempfile.gettempdir(), f"bench_train_autotune_{os.getpid()}_{config}_{seq}_{mode}.txt")
        if os.path.exists(dump):
            os.remove(dump)
        env = child_env(recipe)
        if cache_env:
            env.update(cache_env)
            dump = None
        else:
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_gpu_dump_autotune_results_to={dump}".strip()
        record = run_child(dict(spec, mode=mode, autotune_dump=dump), env, min(opts.child_timeout, remaining))
        if mode == "full":
            row.update(status=record["status"], **record.get("result", {}))
            if record["status"] != "ok":
                return row
        else:
            result = record.get("result", {})
            second = result.get("final_hash")
            row["cross_process"] = (second == row["final_hash"]) if second else None
            row["cross_process_note"] = None if second else record["status"]
            theirs = result.get("leaf_hashes", {})
            row["cross_process_differing"] = [path for path, digest in row.get("leaf_hashes", {}).items()
                                              if path in theirs and theirs[path] != digest]
            first_dump, second_dump = row.get("autotune_digest"), result.get("autotune_digest")
            row["autotune_identical"] = (first_dump == second_dump) if first_dump and second_dump else None
    return row


def derived(row: dict, opts) -> dict:
    """Throughput columns from the step time (MaxText's FLOP convention, see training_flops)."""
    if row.get("step_time_s") is None:
        return row
    flops = _train_model.training_flops(opts.model, row["batch"], row["seq"])
    tflops = flops["total"] / row["step_time_s"] / 1e12
    return dict(row, flops=flops, tokens_per_s=row["batch"] * row["seq"] / row["step_time_s"],
                tflops_per_s=tflops, mfu=tflops / opts.peak_tflops)


# ----------------------------------------------------------------------------- report

def _fmt(value, spec, missing="-"):
    return missing if value is None else format(value, spec)


def _yes_no(value):
    return {True: "yes", False: "**NO**", None: "-"}[value]


def table_lines(data: dict) -> list[str]:
    rows = sorted(data["records"].values(), key=lambda r: (r["seq"], list(RECIPES).index(r["config"])))
    base = {r["seq"]: r.get("step_time_s") for r in rows if r["config"] == BASELINE}
    lines = ["| config | seq | batch | step ms | / cudnn_gather | tokens/s | TFLOP/s | MFU % | "
             "peak GiB | same_process | cross_process | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r.get("step_time_s")
        ratio = t / base[r["seq"]] if t and base.get(r["seq"]) else None
        peak = r.get("peak_bytes")
        status = r["status"]
        if r.get("same_process") is False:
            step = r.get("first_differing_loss_step")
            status = "ok; the repeat's losses differ from step " + str(step) if step is not None \
                else "ok; the repeat's losses agree, its parameters differ"
        if r.get("cross_process_note"):
            status += f"; second process: {r['cross_process_note']}"
        if r.get("cross_process") is False and "cross_process_differing" in r:
            status += f"; across processes {len(r['cross_process_differing'])} parameters differ"
        if r.get("autotune_identical") is not None:
            status += ("; XLA autotuning " + ("same" if r["autotune_identical"] else "differed")
                       + " in the two processes")
        if r.get("compilation_cache"):
            status += "; the two processes shared a compilation cache"
        lines.append(
            f"| {r['config']} | {r['seq']} | {r['batch']} | {_fmt(t and t * 1e3, '.1f')} | "
            f"{_fmt(ratio, '.3f')} | {_fmt(r.get('tokens_per_s'), ',.0f')} | "
            f"{_fmt(r.get('tflops_per_s'), '.4g')} | {_fmt(r.get('mfu') and 100 * r['mfu'], '.3g')} | "
            f"{_fmt(peak and peak / 2**30, '.1f', 'n/a' if t else '-')} | "
            f"{_yes_no(r.get('same_process'))} | {_yes_no(r.get('cross_process'))} | "
            f"{status.replace('|', '/')} |")
    return lines


def render_markdown(data: dict) -> str:
    env, model = data.get("env") or {}, data["model"]
    cfg = _train_model.ModelConfig(**model)
    lines = [
        "# Training step: jax_dash vs the attention JAX users have today", "",
        f"- GPU: {env.get('gpu_name') or env.get('device_kind') or 'unknown'} "
        f"(platform {env.get('platform')}, driver {env.get('driver')}, cuDNN {env.get('cudnn')})",
        f"- jax {env.get('jax')}, jaxlib {env.get('jaxlib')}, Python {env.get('python')}",
        *[f"- {r['date']}, git commit {r['git_commit']}: `{r['command']}`" for r in data["runs"]],
        f"- model: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} query / {cfg.kv_heads} KV "
        f"heads x {cfg.head_dim}, SwiGLU {cfg.mlp_hidden}, vocab {cfg.vocab}: "
        f"{_train_model.param_count(cfg) / 1e6:,.1f}M parameters "
        f"({_train_model.matmul_params(cfg) / 1e6:,.1f}M in matmuls); float32 master, bf16 compute; AdamW",
        f"- {data['steps']} steps per run, the first {data['warmup']} untimed; step ms = median; "
        f"TFLOP/s = MaxText's count (6 x tokens x matmul params + 3 x causal attention); "
        f"MFU against {data['peak_tflops']:.0f} TFLOP/s; LM head + loss in slices of <= "
        f"{LOSS_CHUNK_TOKENS} tokens unless --loss-chunks (results.json: loss_chunks)",
        "- same_process: two runs in one process end with byte-identical parameters; "
        "cross_process: a second process ends with the same SHA-256", "",
    ]
    lines += table_lines(data)
    lines += ["", "| config | recipe |", "|---|---|"]
    lines += [f"| {name} | {r.what}{' (XLA_FLAGS=' + _peers.DETERMINISTIC_XLA_FLAG + ')' if r.deterministic_flag else ''} |"
              for name, r in RECIPES.items()]
    return "\n".join(lines) + "\n"


def write_plot(data: dict, out_dir: Path) -> bool:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in data["records"].values() if r.get("step_time_s")]
    if not rows:
        return False
    seqs = sorted({r["seq"] for r in rows})
    configs = [c for c in RECIPES if any(r["config"] == c for r in rows)]
    width = 0.8 / len(configs)
    fig, ax = plt.subplots(figsize=(3 + 1.5 * len(seqs) * max(1, len(configs) / 3), 4.5))
    labelled, ticks = set(), []
    for i, seq in enumerate(seqs):
        at_seq = {r["config"]: r for r in rows if r["seq"] == seq}
        # Relative to cudnn_gather; where it has no time, to the first timed row of that seq.
        base = at_seq.get(BASELINE) or at_seq[next(c for c in configs if c in at_seq)]
        ticks.append(f"seq {seq}" + ("" if base["config"] == BASELINE else f"\n(vs {base['config']})"))
        for j, config in enumerate(configs):
            if config not in at_seq:
                continue
            r, x = at_seq[config], i + (j - (len(configs) - 1) / 2) * width
            value = r["step_time_s"] / base["step_time_s"]
            racing = r.get("same_process") is False or r.get("cross_process") is False
            ax.bar(x, value, width, color=f"C{j}", hatch="//" if racing else None,
                   edgecolor="black", label=None if config in labelled else config)
            labelled.add(config)
            ax.text(x, value, f"{value:.2f}" + ("\nNR" if racing else ""), ha="center",
                    va="bottom", fontsize=7)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(range(len(seqs)), ticks)
    ax.set_ylabel(f"step time / {BASELINE}'s (lower: faster)")
    ax.set_title("Training step time (hatched, NR: not reproducible)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "train.png", dpi=120)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=",".join(c for c in RECIPES if c not in DIAGNOSTIC_RECIPES),
                   help=f"comma list of {', '.join(RECIPES)} (default: all but the diagnostics "
                        f"{', '.join(DIAGNOSTIC_RECIPES)})")
    p.add_argument("--seqs", default="4096,32768", help="comma list, k suffix allowed (default 4096,32768)")
    p.add_argument("--tokens", type=int, default=16384, help="tokens per step; batch = max(1, tokens // seq)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"steps per run (default {DEFAULT_STEPS}, --quick {QUICK_STEPS})")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed first steps (default {DEFAULT_WARMUP}, --quick {QUICK_WARMUP})")
    p.add_argument("--quick", action="store_true", help="fewer steps")
    p.add_argument("--seed", type=int, default=0, help="initial parameters and token data")
    p.add_argument("--loss-chunks", type=int, default=0,
                   help=f"LM head + loss in this many token slices; 0 (default): slices of <= "
                        f"{LOSS_CHUNK_TOKENS} tokens (1 x 32k runs out of memory on 80 GB)")
    defaults = _train_model.ModelConfig()
    for field in dataclasses.fields(defaults):
        p.add_argument("--" + field.name.replace("_", "-"), type=int, default=getattr(defaults, field.name),
                       help=f"model (default {getattr(defaults, field.name)})")
    p.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS,
                   help=f"MFU denominator (default {H100_BF16_DENSE_TFLOPS:.0f}, H100 SXM bf16 dense)")
    p.add_argument("--child-timeout", type=float, default=300.0, help="seconds per child process")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds for the whole command: rows not started by then are skipped")
    p.add_argument("--out", default=None, help="output dir (default benchmarks/results/<date>-train-<gpu>)")
    p.add_argument("--fresh", action="store_true", help="do not merge into an existing results.json")
    p.add_argument("--compilation-cache", action="store_true",
                   help="the two processes of a row share a JAX persistent compilation cache (the "
                        "second runs the first's executable, XLA's autotuning choices included)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)
    return p


class Options:
    """Validated settings; every error names the option, the value and what is allowed."""

    def __init__(self, args):
        self.configs = _grid.parse_choice_list(args.configs, name="--configs", allowed=RECIPES)
        self.seqs = _grid.parse_int_list(args.seqs, name="--seqs")
        self.steps = args.steps if args.steps is not None else QUICK_STEPS if args.quick else DEFAULT_STEPS
        self.warmup = args.warmup if args.warmup is not None else QUICK_WARMUP if args.quick else DEFAULT_WARMUP
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"--warmup={self.warmup} must be >= 0 and below --steps={self.steps}")
        for name in ("tokens", "peak_tflops", "child_timeout"):
            if getattr(args, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be positive")
        self.tokens, self.seed, self.peak_tflops = args.tokens, args.seed, args.peak_tflops
        self.loss_chunks = args.loss_chunks
        if self.loss_chunks < 0:
            raise ValueError(f"--loss-chunks={self.loss_chunks} must be >= 0 (0: automatic)")
        for seq in self.seqs:
            loss_chunks_for(batch_for(seq, self.tokens) * seq, self.loss_chunks)
        self.model = _train_model.ModelConfig(**{f.name: getattr(args, f.name)
                                                 for f in dataclasses.fields(_train_model.ModelConfig)})
        self.child_timeout = args.child_timeout
        self.time_budget = args.time_budget
        self.out, self.fresh, self.plots = args.out, args.fresh, not args.no_plots
        self.compilation_cache = args.compilation_cache


def _git_commit():
    """The checkout's commit; JAX_DASH_GIT_COMMIT names it where the tree has no .git (a copy)."""
    if os.environ.get("JAX_DASH_GIT_COMMIT"):
        return os.environ["JAX_DASH_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or None
    except Exception:
        return None


def _default_out_dir() -> Path:
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "--id=0"],
                             capture_output=True, text=True, timeout=30)
        name = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else "cpu"
    except Exception:
        name = "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return RESULTS_DIR / f"{datetime.date.today().isoformat()}-train-{slug}"


def open_results(opts: Options, out_dir: Path, command: str) -> dict:
    settings = {"model": dataclasses.asdict(opts.model), "steps": opts.steps, "warmup": opts.warmup,
                "tokens": opts.tokens, "seed": opts.seed, "peak_tflops": opts.peak_tflops,
                "loss_chunks": opts.loss_chunks}
    data = {"schema": SCHEMA_VERSION, "runs": [], "env": None, "records": {}, **settings}
    existing = out_dir / "results.json"
    if existing.exists() and not opts.fresh:
        old = json.loads(existing.read_text())
        if old.get("schema") != SCHEMA_VERSION or any(old.get(k) != v for k, v in settings.items()):
            raise ValueError(f"{existing} holds runs of other settings (model, steps, tokens, seed "
                             f"or peak); pass --fresh to replace it or choose another --out")
        print(f"note: merging into {existing} ({len(old['records'])} rows; --fresh to start over)",
              file=sys.stderr)
        data = old
    data["runs"].append({"date": datetime.datetime.now().isoformat(timespec="seconds"),
                         "command": command, "git_commit": _git_commit()})
    return data


def write_results(data: dict, out_dir: Path):
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "results.json.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, out_dir / "results.json")
    (out_dir / "results.md").write_text(render_markdown(data))


def run(opts: Options, command: str) -> Path:
    out_dir = Path(opts.out) if opts.out else _default_out_dir()
    data = open_results(opts, out_dir, command)
    budget = opts.time_budget if opts.time_budget is not None else float("inf")
    deadline = time.monotonic() + budget
    for seq in opts.seqs:  # every recipe at the short seq first: a budget cut loses the long ones
        for config in opts.configs:
            row = derived(measure_row(config, seq, opts, deadline), opts)
            env = row.pop("env", None) or {}
            row["xla_flags"] = env.get("xla_flags")
            first_gpu = env.get("platform") == "gpu" and (data["env"] or {}).get("platform") != "gpu"
            if env and (data["env"] is None or first_gpu):
                data["env"] = env
            data["records"][f"{config}|{seq}"] = row
            write_results(data, out_dir)
    if opts.plots:
        try:
            if not write_plot(data, out_dir):
                print("note: no timed rows, no plot", file=sys.stderr)
        except ImportError as e:
            print(f"note: plot skipped, matplotlib is not importable ({e}); pip install matplotlib",
                  file=sys.stderr)
    print(f"results: {out_dir / 'results.json'}, {out_dir / 'results.md'}", file=sys.stderr)
    print("\n".join(table_lines(data)))
    return out_dir


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.child:
        return child_main(args.child)
    try:
        opts = Options(args)
        command = "python benchmarks/bench_train.py " + " ".join(shlex.quote(a) for a in argv)
        run(opts, command.strip())
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
