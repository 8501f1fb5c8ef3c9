"""jax_dash attention benchmarks: speed, bitwise repeatability, memory and numerics vs XLA peers.

    python benchmarks/bench_attention.py                 # paper grid, all implementations
    python benchmarks/bench_attention.py --quick         # a subset (not timed as a whole)
    python benchmarks/bench_attention.py --memory --numerics --skip-timing

See benchmarks/README.md for what is measured and how. Results go to --out (default
benchmarks/results/<date>-<gpu>/): results.json, results.md and PNG plots. An existing
results.json there is merged into (same measurement: replaced), so a grid can be run in parts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Imports run one way: bench_attention (the CLI) -> _report, _worker -> _memory, _numerics,
# _triton_tutorial -> _grid, _peers, _timing. bench_memory.py and bench_numerics.py are entry
# points over this file.
import _grid  # noqa: E402
import _memory  # noqa: E402
import _numerics  # noqa: E402
import _peers  # noqa: E402
import _report  # noqa: E402
import _triton_tutorial  # noqa: E402
import _worker  # noqa: E402

SCRIPT = str(Path(__file__).resolve())
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCHEMA_VERSION = 1

QUICK_SEQS = (1024, 4096, 16384)
QUICK_SCHEDULES = ("auto", "atomic")
QUICK_ITERS = 10
DEFAULT_ITERS = 20
DEFAULT_XLA_MAX_SEQ = 4096  # XLA's attention materialises B*H*S^2 logits: slow, then OOM
TIME_BUDGET_S = 5.0  # per timed function; slow implementations get fewer samples
NUM_INPUT_SETS = 2
REPEATS = 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dims", default="64,128", help="comma list (default 64,128)")
    p.add_argument("--seqs", default=None, help="comma list, k suffix allowed (default 512..16k)")
    p.add_argument("--masks", default="full,causal", help="full,causal")
    p.add_argument("--impls", default=",".join(_grid.IMPLS), help=",".join(_grid.IMPLS))
    p.add_argument("--schedules", default=None, help="jax_dash schedules (default all six)")
    p.add_argument("--iters", type=int, default=None, help=f"timed samples (default {DEFAULT_ITERS})")
    p.add_argument("--tokens", type=int, default=_grid.PAPER_TOKENS, help="batch*seq (default 16384)")
    p.add_argument("--hidden", type=int, default=_grid.PAPER_HIDDEN, help="heads*head_dim (default 2048)")
    p.add_argument("--dtype", default=_grid.DEFAULT_DTYPE, choices=_grid.DTYPES,
                   help=f"of q, k, v and dout (default {_grid.DEFAULT_DTYPE}; the Triton tutorial "
                        f"needs float16)")
    p.add_argument("--triton-tutorial", metavar="PATH", default=None,
                   help="triton-lang/triton's python/tutorials/06-fused-attention.py, for the "
                        "triton_tutorial peer (not in this repository)")
    p.add_argument("--group", type=int, default=1,
                   help="query heads per KV head (GQA; default 1: multi-head attention)")
    p.add_argument("--xla-max-seq", type=int, default=DEFAULT_XLA_MAX_SEQ,
                   help=f"skip impl xla above this seq (default {DEFAULT_XLA_MAX_SEQ})")
    p.add_argument("--quick", action="store_true",
                   help=f"seqs {QUICK_SEQS}, schedules {QUICK_SCHEDULES}, {QUICK_ITERS} iters")
    p.add_argument("--skip-timing", action="store_true", help="only --memory / --numerics")
    p.add_argument("--memory", action="store_true", help="peak memory of fwd+bwd vs seq")
    p.add_argument("--memory-seqs", default=",".join(map(str, _memory.MEMORY_SEQS)))
    p.add_argument("--memory-head-dim", type=int, default=_memory.MEMORY_HEAD_DIM)
    p.add_argument("--memory-heads", type=int, default=_memory.MEMORY_HEADS)
    p.add_argument("--memory-mask", default=_memory.MEMORY_MASK, choices=_grid.MASKS)
    p.add_argument("--numerics", action="store_true", help="deviation from an fp64 reference")
    p.add_argument("--numerics-seqs", default=",".join(map(str, _numerics.NUMERICS_SEQS)))
    p.add_argument("--numerics-heads", type=int, default=_numerics.NUMERICS_HEADS)
    p.add_argument("--peak-size", type=int, default=8192, help="matmul size for the peak (default 8192)")
    p.add_argument("--item-timeout", type=float, default=90.0,
                   help="seconds one measurement may take before its worker is killed")
    p.add_argument("--out", default=None, help="output dir (default benchmarks/results/<date>-<gpu>)")
    p.add_argument("--fresh", action="store_true", help="do not merge into an existing results.json")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    return p


class Options:
    """Validated settings; every error names the option, the value and what is allowed."""

    def __init__(self, args):
        self.quick = args.quick
        self.head_dims = _grid.parse_int_list(args.head_dims, name="--head-dims")
        self.seqs = (_grid.parse_int_list(args.seqs, name="--seqs") if args.seqs
                     else QUICK_SEQS if args.quick else _grid.PAPER_SEQS)
        self.masks = _grid.parse_choice_list(args.masks, name="--masks", allowed=_grid.MASKS)
        self.impls = _grid.parse_choice_list(args.impls, name="--impls", allowed=_grid.IMPLS)
        self.schedules = (_grid.parse_choice_list(args.schedules, name="--schedules",
                                                  allowed=_grid.SCHEDULES) if args.schedules
                          else QUICK_SCHEDULES if args.quick else _grid.SCHEDULES)
        self.iters = args.iters if args.iters is not None else (QUICK_ITERS if args.quick else DEFAULT_ITERS)
        if self.iters < 1:
            raise ValueError(f"--iters={self.iters} must be >= 1")
        for name in ("tokens", "hidden", "group", "peak_size", "memory_head_dim", "memory_heads",
                     "numerics_heads"):
            if getattr(args, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be positive")
        if args.item_timeout <= 0:
            raise ValueError(f"--item-timeout={args.item_timeout} must be positive")
        self.timing = not args.skip_timing
        self.points = _grid.make_grid(self.head_dims, self.seqs, self.masks,
                                      tokens=args.tokens, hidden=args.hidden,
                                      group=args.group, dtype=args.dtype) if self.timing else []
        self.memory_points = _memory.memory_points(
            _grid.parse_int_list(args.memory_seqs, name="--memory-seqs"),
            head_dim=args.memory_head_dim, heads=args.memory_heads,
            mask=args.memory_mask) if args.memory else []
        self.numerics_points = _numerics.numerics_points(
            _grid.parse_int_list(args.numerics_seqs, name="--numerics-seqs"), self.head_dims,
            self.masks, heads=args.numerics_heads) if args.numerics else []
        if not (self.points or self.memory_points or self.numerics_points):
            raise ValueError("nothing to do: --skip-timing needs --memory and/or --numerics")
        self.triton_tutorial = args.triton_tutorial
        if self.triton_tutorial is not None:
            if not Path(self.triton_tutorial).is_file():
                raise ValueError(f"--triton-tutorial={self.triton_tutorial!r} is not a file")
            self.triton_tutorial = str(Path(self.triton_tutorial).resolve())
        self.xla_max_seq = args.xla_max_seq
        self.peak_size = args.peak_size
        self.item_timeout = args.item_timeout
        self.out = args.out
        self.fresh = args.fresh
        self.plots = not args.no_plots


def record_key(item: dict) -> str:
    kind = item["kind"]
    if kind == "env":
        return f"env|{item['group']}"
    if kind == "peak":
        return "peak"
    point = _grid.Point.from_json(item["point"]).key
    if kind == "numerics":
        return f"numerics|{point}"
    return f"{kind}|{item['impl']}|{item.get('schedule') or '-'}|{point}"


def timing_items(opts: Options, impls) -> list[dict]:
    items = []
    for point in opts.points:
        for impl in impls:
            for schedule in (opts.schedules if impl == "jax_dash" else (None,)):
                items.append({"kind": "time", "impl": impl, "schedule": schedule,
                              "point": point.to_json(), "iters": opts.iters,
                              "num_sets": NUM_INPUT_SETS, "repeats": REPEATS,
                              "time_budget_s": TIME_BUDGET_S})
    return items


class Collector:
    """Holds records, merges with an existing results.json, rewrites outputs as records arrive."""

    def __init__(self, opts: Options, command: str):
        self.opts = opts
        self.out_dir = Path(opts.out) if opts.out else None
        self.data = {"schema": SCHEMA_VERSION, "runs": [], "records": {}}
        self.run = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                    "command": command, "git_commit": _git_commit()}
        self.pending = []
        if self.out_dir:
            self._open()

    def _open(self):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        existing = self.out_dir / "results.json"
        if existing.exists() and not self.opts.fresh:
            with open(existing) as f:
                old = json.load(f)
            if old.get("schema") == SCHEMA_VERSION:
                print(f"note: merging into {existing} ({len(old['records'])} records; --fresh to "
                      f"start over)", file=sys.stderr)
                self.data = old
        self.data["runs"].append(self.run)
        for record in self.pending:
            self.add(record)
        self.pending = []

    def add(self, record: dict):
        item = record["item"]
        if self.out_dir is None:
            if item["kind"] == "env" and record.get("result"):
                self.out_dir = RESULTS_DIR / f"{datetime.date.today().isoformat()}-{_slug(record['result'])}"
                self.pending.append(record)
                self._open()
                return
            self.pending.append(record)
            return
        self.data["records"][record_key(item)] = record
        self.write()

    def write(self):
        tmp = self.out_dir / "results.json.tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.out_dir / "results.json")
        (self.out_dir / "results.md").write_text(_report.render_markdown(self.data))

    def platform(self):
        for record in list(self.data["records"].values()) + self.pending:
            if record["item"]["kind"] == "env" and record["item"]["group"] == "default" and record["result"]:
                return record["result"]["platform"]
        return None


def _gpu_memory_used_mib():
    """GPU 0's used memory per nvidia-smi (None where it cannot say); read while no worker runs."""
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                              "--id=0"], capture_output=True, text=True, timeout=30)
        return int(smi.stdout.strip().splitlines()[0])
    except Exception:
        return None


def _slug(env: dict) -> str:
    name = env.get("device_kind") or env.get("platform") or "unknown"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _git_commit():
    """The checkout's commit; JAX_DASH_GIT_COMMIT names it where the tree has no .git (a copy)."""
    if os.environ.get("JAX_DASH_GIT_COMMIT"):
        return os.environ["JAX_DASH_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or None
    except Exception:
        return None


def _skip(collector, items, reason):
    for item in items:
        print(f"note: {_worker.describe(item)} skipped: {reason}", file=sys.stderr)
        collector.add({"item": item, "skipped": reason, "error": None, "result": None, "elapsed_s": 0})


def run(opts: Options, command: str) -> Path:
    collector = Collector(opts, command)
    base_env = dict(os.environ)
    if opts.triton_tutorial:
        base_env[_triton_tutorial.TUTORIAL_ENV] = opts.triton_tutorial
    det_env = _peers.xla_flags_with_determinism(base_env)
    # Worker processes must not inherit a forced determinism flag for the default group.
    base_env["XLA_FLAGS"] = base_env.get("XLA_FLAGS", "").replace(_peers.DETERMINISTIC_XLA_FLAG, "").strip()
    run_kwargs = dict(script=SCRIPT, item_timeout_s=opts.item_timeout, on_record=collector.add)

    fa3_det_env = _peers.env_with_fa3_deterministic(base_env)
    base_env.pop(_peers.FA3_DETERMINISTIC_ENV, None)
    group_envs = {"default": base_env, "det": det_env, "fa3_det": fa3_det_env}
    default_impls = [x for x in opts.impls if _peers.worker_group(x) == "default"]
    items = [{"kind": "env", "group": "default"}]
    skipped_xla = []
    if opts.points:
        items.append({"kind": "peak", "size": opts.peak_size})
        for item in timing_items(opts, default_impls):
            too_long = item["impl"] == "xla" and item["point"]["seq"] > opts.xla_max_seq
            (skipped_xla if too_long else items).append(item)
    items += [{"kind": "numerics", "point": p.to_json(), "schedule": "auto",
               "impls": [x for x in _numerics.NUMERICS_IMPLS if x in opts.impls]}
              for p in opts.numerics_points]
    _worker.run_items(items, env=base_env, progress_tag="", **run_kwargs)
    _skip(collector, skipped_xla, f"seq > --xla-max-seq={opts.xla_max_seq} "
                                  f"(XLA materialises the S^2 logits: slow or out of memory)")

    on_gpu = collector.platform() == "gpu"
    det_items = timing_items(opts, ["cudnn_det"]) if "cudnn_det" in opts.impls else []
    if det_items and not on_gpu:
        _skip(collector, det_items, f"cuDNN needs a CUDA GPU (platform {collector.platform()})")
    elif det_items:
        print(f"note: cudnn_det runs in a worker with XLA_FLAGS={det_env['XLA_FLAGS']!r}", file=sys.stderr)
        _worker.run_items([{"kind": "env", "group": "det"}] + det_items, env=det_env,
                          progress_tag="det ", **run_kwargs)
    fa3_det_items = timing_items(opts, ["fa3_det"]) if "fa3_det" in opts.impls else []
    if fa3_det_items and not on_gpu:
        _skip(collector, fa3_det_items, f"FlashAttention-3 needs a CUDA GPU "
                                        f"(platform {collector.platform()})")
    elif fa3_det_items:
        print(f"note: fa3_det runs in a worker with {_peers.FA3_DETERMINISTIC_ENV}=1 (FA3's "
              f"backward lowered with deterministic=True, see _peers.py)", file=sys.stderr)
        _worker.run_items([{"kind": "env", "group": "fa3_det"}] + fa3_det_items, env=fa3_det_env,
                          progress_tag="fa3det ", **run_kwargs)

    memory_items = [{"kind": "memory", "impl": impl, "schedule": "auto" if impl == "jax_dash" else None,
                     "point": p.to_json()}
                    for p in opts.memory_points for impl in opts.impls
                    if impl != "xla" and impl not in _peers.TORCH_IMPLS]
    if memory_items and not on_gpu:
        _skip(collector, memory_items, "peak device memory is only measured on GPU")
    for item in memory_items if on_gpu else []:
        env = group_envs[_peers.worker_group(item["impl"])]
        # A fresh process per point resets peak_bytes_in_use. Allocating on demand (no 75% pool)
        # up to 95% of the card means an OOM is the workload's, not a failed pool reservation.
        env = dict(env, XLA_PYTHON_CLIENT_PREALLOCATE="false",
                   XLA_PYTHON_CLIENT_MEM_FRACTION=env.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95"))
        # Memory held by other processes (a test run still exiting, say) makes OOMs meaningless.
        item = dict(item, gpu_memory_used_before_mib=_gpu_memory_used_mib())
        held_mib = item["gpu_memory_used_before_mib"]
        if held_mib and held_mib > _memory.OTHERS_MEMORY_WARN_MIB:
            print(f"WARNING: {held_mib} MiB of GPU memory are held by other "
                  f"processes before {_worker.describe(item)}", file=sys.stderr)
        _worker.run_items([item], env=env, progress_tag="mem ", **run_kwargs)

    if collector.out_dir is None:  # the env item itself failed: keep what came back
        collector.out_dir = RESULTS_DIR / f"{datetime.date.today().isoformat()}-unknown"
        collector._open()
    collector.write()
    if opts.plots:
        try:
            written = _report.write_plots(collector.data, collector.out_dir)
            print(f"plots: {', '.join(written) or 'none (no data)'}", file=sys.stderr)
        except ImportError as e:
            print(f"note: plots skipped, matplotlib is not importable ({e}); "
                  f"pip install matplotlib", file=sys.stderr)
    print(f"results: {collector.out_dir / 'results.json'}, {collector.out_dir / 'results.md'}",
          file=sys.stderr)
    return collector.out_dir


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.worker:
        return _worker.worker_main(args.worker)
    try:
        opts = Options(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = "python benchmarks/bench_attention.py " + " ".join(shlex.quote(a) for a in argv)
    run(opts, command.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
