"""Turns results.json records into results.md tables and PNG plots."""

from __future__ import annotations

import collections
import re

import _grid
import _memory
import _numerics
import _peers

DASH_HEADLINE = "jax_dash:auto"
PEER_LABELS = {"cudnn": "cuDNN", "cudnn_det": "cuDNN det", "xla": "XLA", "fa3": "FA3",
               "fa3_det": "FA3 det", "tokamax": "tokamax", "triton_tutorial": "Triton tutorial"}
PEERS = ("cudnn", "cudnn_det", "fa3", "fa3_det", "tokamax", "triton_tutorial", "xla")
SHORT_SCHEDULE = {"auto": "auto", "ascending": "asc", "descending": "desc", "shift": "shift",
                  "symmetric_shift": "sym", "atomic": "atomic", "mirror": "mirror"}


def point_order(p):
    return (p.head_dim, _grid.MASKS.index(p.mask), p.seq)


def impl_label(item: dict) -> str:
    if item["impl"] == "jax_dash":
        return f"jax_dash:{item.get('schedule') or 'auto'}"
    return item["impl"]


def display_name(label: str) -> str:
    if label.startswith("jax_dash:"):
        return "dash " + SHORT_SCHEDULE.get(label.split(":", 1)[1], label.split(":", 1)[1])
    return PEER_LABELS.get(label, label)


def ordered_labels(labels) -> list[str]:
    order = list(PEERS) + [f"jax_dash:{s}" for s in _grid.SCHEDULES]
    return [x for x in order if x in labels] + sorted(set(labels) - set(order))


class Results:
    """Indexed view of the record dict stored in results.json."""

    def __init__(self, data: dict):
        self.data = data
        self.records = data.get("records", {})
        self.env = self._result("env|default") or {}
        self.env_det = self._result("env|det")
        peak = self._result("peak")
        self.peak_tflops = peak["tflops"] if peak else None
        self.timing = {}  # (point, label) -> result
        self.memory = {}  # (point, label) -> result
        self.numerics = {}  # point -> result
        self.problems = []  # (what, message) for skips and errors
        for record in self.records.values():
            item = record["item"]
            if record.get("skipped") or record.get("error") or record.get("wrong"):
                what = _describe(item)
                self.problems.append((what, record.get("skipped") and f"skipped: {record['skipped']}"
                                      or record.get("wrong") and f"WRONG (not timed): {record['wrong']}"
                                      or f"error: {record['error']}"))
                continue
            if "point" not in item:
                continue
            point = _grid.Point.from_json(item["point"])
            if item["kind"] == "time":
                self.timing[(point, impl_label(item))] = record["result"]
            elif item["kind"] == "memory":
                self.memory[(point, impl_label(item))] = record["result"]
            elif item["kind"] == "numerics":
                self.numerics[point] = record["result"]
        self.problems.sort()

    def _result(self, key):
        record = self.records.get(key)
        return record["result"] if record and record.get("result") else None

    def time_points(self):
        return sorted({p for p, _ in self.timing}, key=point_order)

    def tflops(self, point, label, phase):
        result = self.timing.get((point, label))
        return result["tflops"][phase] if result else None

    def bwd_seconds(self, point, label):
        result = self.timing.get((point, label))
        return result["bwd_s"] if result and result["bwd_s"] > 0 else None

    def dash_forward_label(self, point):
        """jax_dash's forward does not depend on the schedule: report the auto item's."""
        for schedule in _grid.SCHEDULES:
            if (point, f"jax_dash:{schedule}") in self.timing:
                return f"jax_dash:{schedule}"
        return None

    def ratio(self, point, label, peer):
        """Backward speed-up of `label` over `peer` (> 1 means `label` is faster)."""
        mine, theirs = self.bwd_seconds(point, label), self.bwd_seconds(point, peer)
        return theirs / mine if mine and theirs else None

    def tax(self, point, label):
        """Determinism tax: extra backward time of `label` over our own atomic schedule."""
        mine, atomic = self.bwd_seconds(point, label), self.bwd_seconds(point, "jax_dash:atomic")
        return mine / atomic - 1 if mine and atomic else None

    def best_deterministic(self, point):
        best = None
        for schedule in _grid.DETERMINISTIC_SCHEDULES:
            seconds = self.bwd_seconds(point, f"jax_dash:{schedule}")
            if seconds and (best is None or seconds < best[1]):
                best = (f"jax_dash:{schedule}", seconds)
        return best


def _describe(item):
    text = item["kind"]
    if "point" in item:
        text += " " + _grid.Point.from_json(item["point"]).label()
    if item.get("impl"):
        text += " " + impl_label(item)
    return text


def _tf(value, peak=None):
    if value is None:
        return "-"
    # GPU numbers are hundreds; tiny CPU smoke runs still need visible digits.
    text = f"{value:.0f}" if value >= 10 else f"{value:.2g}"
    return f"{text} ({100 * value / peak:.0f}%)" if peak else text


def _x(value):
    return "-" if value is None else f"{value:.2f}x"


def _pct(value):
    return "-" if value is None else f"{100 * value:+.1f}%"


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def headline_table(res: Results) -> list[str]:
    """Rows per (head_dim, mask): peers and jax_dash auto backward TFLOP/s, then the ratios."""
    points = res.time_points()
    seqs = sorted({p.seq for p in points})
    groups = collections.OrderedDict()
    for p in points:
        groups.setdefault((p.head_dim, p.mask), {})[p.seq] = p
    rows = []
    for (head_dim, mask), by_seq in groups.items():
        def row(name, fn):
            rows.append([head_dim, mask, name] + [fn(by_seq[s]) if s in by_seq else "-" for s in seqs])
        row("cuDNN bwd", lambda p: _tf(res.tflops(p, "cudnn", "bwd")))
        row("cuDNN det bwd", lambda p: _tf(res.tflops(p, "cudnn_det", "bwd")))
        row("jax_dash auto bwd", lambda p: _tf(res.tflops(p, DASH_HEADLINE, "bwd")))
        row("auto / cuDNN", lambda p: _x(res.ratio(p, DASH_HEADLINE, "cudnn")))
        row("auto / cuDNN det", lambda p: _x(res.ratio(p, DASH_HEADLINE, "cudnn_det")))
        row("tax vs atomic", lambda p: _pct(res.tax(p, DASH_HEADLINE)))
    return _table(["head_dim", "mask", "backward TFLOP/s"] + [_seq_name(s) for s in seqs], rows)


def _seq_name(seq):
    return f"{seq // 1024}k" if seq >= 1024 and seq % 1024 == 0 else str(seq)


def backward_table(res: Results) -> list[str]:
    points = res.time_points()
    labels = ordered_labels({label for _, label in res.timing})
    header = ["hd", "mask", "seq", "B x H"] + [display_name(x) for x in labels] + [
        "auto/cuDNN", "auto/cuDNN det", "best det", "best/cuDNN det", "auto/best", "tax auto",
        "not repeatable"]
    rows = []
    for p in points:
        best = res.best_deterministic(p)
        not_repeatable = [display_name(x) for x in labels
                          if (p, x) in res.timing and not res.timing[(p, x)]["repeat"]["repeatable"]]
        rows.append([p.head_dim, p.mask, p.seq, f"{p.batch}x{p.heads}" + (f"/{p.kv_heads}kv" if p.kv_heads else "")]
                    + [_tf(res.tflops(p, x, "bwd"), res.peak_tflops) for x in labels]
                    + [_x(res.ratio(p, DASH_HEADLINE, "cudnn")), _x(res.ratio(p, DASH_HEADLINE, "cudnn_det")),
                       display_name(best[0]) if best else "-",
                       _x(res.ratio(p, best[0], "cudnn_det")) if best else "-",
                       _x(res.ratio(p, DASH_HEADLINE, best[0])) if best else "-",
                       _pct(res.tax(p, DASH_HEADLINE)), ", ".join(not_repeatable) or "none"])
    return _table(header, rows)


def forward_table(res: Results) -> list[str]:
    points = res.time_points()
    peers = [x for x in PEERS
             if any((p, x) in res.timing for p in points)]
    header = ["hd", "mask", "seq", "jax_dash"] + [display_name(x) for x in peers] + ["jax_dash/cuDNN"]
    rows = []
    for p in points:
        dash = res.dash_forward_label(p)
        dash_tf = res.tflops(p, dash, "fwd") if dash else None
        cudnn_tf = res.tflops(p, "cudnn", "fwd")
        rows.append([p.head_dim, p.mask, p.seq, _tf(dash_tf, res.peak_tflops)]
                    + [_tf(res.tflops(p, x, "fwd"), res.peak_tflops) for x in peers]
                    + [_x(dash_tf / cudnn_tf) if dash_tf and cudnn_tf else "-"])
    return _table(header, rows)


def memory_table(res: Results) -> list[str]:
    points = sorted({p for p, _ in res.memory} | {p for p, _ in _memory_problem_points(res)},
                    key=lambda p: p.seq)
    labels = ordered_labels({x for _, x in res.memory})
    rows = []
    for p in points:
        cells = []
        for label in labels:
            r = res.memory.get((p, label))
            if r is None:
                cells.append("-")
            elif r["oom"]:
                asked = f", plans {r['temp_bytes'] / 1e9:.1f} GB temp" if r.get("temp_bytes") else ""
                held = r.get("gpu_memory_used_before_mib") or 0
                suspect = (f" (SUSPECT: other processes held {held / 1024:.1f} GiB at start)"
                           if held > _memory.OTHERS_MEMORY_WARN_MIB else "")
                cells.append(f"OOM{asked}{suspect}")
            else:
                cells.append(f"{r['peak_bytes'] / 1e9:.2f}")
        base = res.memory.get((p, "cudnn"))
        dash = res.memory.get((p, DASH_HEADLINE))
        ratio = (dash["peak_bytes"] / base["peak_bytes"]
                 if base and dash and base.get("peak_bytes") and dash.get("peak_bytes") else None)
        rows.append([p.seq, f"{p.batch}x{p.heads}x{p.head_dim}" + (f"/{p.kv_heads}kv" if p.kv_heads else "") + f" {p.mask}"] + cells + [_x(ratio)])
    return _table(["seq", "B x H x D mask"] + [display_name(x) + " peak GB" for x in labels]
                  + ["jax_dash/cuDNN"], rows)


def _memory_problem_points(res):
    out = []
    for record in res.records.values():
        item = record["item"]
        if item["kind"] == "memory" and "point" in item and (record.get("error") or record.get("skipped")):
            out.append((_grid.Point.from_json(item["point"]), impl_label(item)))
    return out


def numerics_table(res: Results) -> list[str]:
    TENSORS = _numerics.TENSORS
    rows = []
    for p in sorted(res.numerics, key=point_order):
        for impl, per_tensor in res.numerics[p]["impls"].items():
            if "skipped" in per_tensor or "error" in per_tensor:
                rows.append([p.head_dim, p.mask, p.seq, impl]
                            + [per_tensor.get("skipped") and "skipped" or "error"] * len(TENSORS))
                continue
            rows.append([p.head_dim, p.mask, p.seq, impl] + [
                f"{per_tensor[t]['max_abs']:.2e} / {per_tensor[t]['rel_rms']:.2e}"
                + ("" if per_tensor[t]["finite"] else " NONFINITE") for t in TENSORS])
    return _table(["hd", "mask", "seq", "impl"] + [f"{t} max abs / rel RMS" for t in TENSORS], rows)


GOAL_MIN_SEQ = 2048  # the project's targets (not in this repository): goals 1 and 3 apply from 2k tokens on


def goals_section(res: Results) -> list[str]:
    """The project's target goals (not in this repository), each judged on the points of this run that measured it (worst case)."""
    points = res.time_points()
    long_points = [p for p in points if p.seq >= GOAL_MIN_SEQ]

    def judge(name, values, threshold, higher_is_better, fmt):
        values = [(v, p) for v, p in values if v is not None]
        if not values:
            return f"| {name} | not measured | - | - |"
        worst, where = (min if higher_is_better else max)(values, key=lambda vp: vp[0])
        met = sum(1 for v, _ in values if (v >= threshold if higher_is_better else v <= threshold))
        verdict = "met" if met == len(values) else "NOT met"
        return (f"| {name} | {verdict} ({met}/{len(values)} points) | {fmt(worst)} at "
                f"{where.label()} | {fmt(threshold)} |")

    rows = [
        judge("1. auto bwd >= 1.0x cuDNN (seq >= 2k)",
              [(res.ratio(p, DASH_HEADLINE, "cudnn"), p) for p in long_points], 1.0, True, _x),
        judge("2. auto bwd >= 1.3x cuDNN det (hd 128)",
              [(res.ratio(p, DASH_HEADLINE, "cudnn_det"), p) for p in points if p.head_dim == 128],
              1.3, True, _x),
        judge("2. auto bwd >= 1.8x cuDNN det (hd 64)",
              [(res.ratio(p, DASH_HEADLINE, "cudnn_det"), p) for p in points if p.head_dim == 64],
              1.8, True, _x),
        judge("3. tax vs atomic <= 5% (seq >= 2k)",
              [(res.tax(p, DASH_HEADLINE), p) for p in long_points], 0.05, False, _pct),
        judge("4. forward >= 0.95x cuDNN",
              [(_fwd_ratio(res, p), p) for p in points], 0.95, True, _x),
    ]
    memory_points = [p for p, x in res.memory if x == DASH_HEADLINE]
    memory_ratios = []
    for p in memory_points:
        dash, base = res.memory[(p, DASH_HEADLINE)], res.memory.get((p, "cudnn"))
        if dash.get("peak_bytes") and base and base.get("peak_bytes"):
            memory_ratios.append((dash["peak_bytes"] / base["peak_bytes"], p))
        elif dash["oom"]:
            memory_ratios.append((float("inf"), p))
    rows.append(judge("5. fwd+bwd peak memory <= 2x cuDNN", memory_ratios, 2.0, False, _x))
    auto_vs_best = [(res.ratio(p, DASH_HEADLINE, res.best_deterministic(p)[0])
                     if res.best_deterministic(p) else None, p) for p in points]
    rows.append(judge("6. auto within 3% of the best schedule", auto_vs_best, 0.97, True, _x))
    return (["| goal (project targets) | verdict | worst value | threshold |", "|---|---|---|---|"] + rows
            + ["", "Goal 2 is judged on every measured sequence length; the targets state it for the "
               "whole grid."])


def _fwd_ratio(res, p):
    dash = res.dash_forward_label(p)
    mine, theirs = res.timing.get((p, dash)) if dash else None, res.timing.get((p, "cudnn"))
    return theirs["fwd"]["median_s"] / mine["fwd"]["median_s"] if mine and theirs else None


def _min_sample_ms(res) -> str:
    """The minimum sample length of this file's timings (records before 2026-11-24 hold none:
    they were taken at 2 ms)."""
    lengths = {result.get("fwd", {}).get("min_sample_s", 2e-3)
               for result in res.timing.values() if isinstance(result, dict)}
    return "/".join(f"{x * 1e3:g}" for x in sorted(lengths)) or "20"


def _backward_method(res) -> str:
    """How this file's backward times were taken: older runs subtracted the forward."""
    methods = {result.get("bwd_method") for (_, label), result in res.timing.items()
               if label not in _peers.TORCH_IMPLS}
    torch_methods = {result.get("bwd_method") for (_, label), result in res.timing.items()
                     if label in _peers.TORCH_IMPLS}
    torch_text = (" The Triton tutorial runs in PyTorch: " + "; ".join(sorted(torch_methods)) + "."
                  if torch_methods else "")
    if methods == {None} or not methods:
        return ("**Backward time = time(jit(forward + VJP)) - time(jit(forward))**, the same "
                "definition for every implementation." + torch_text)
    text = ("**Backward time = time of a jitted VJP applied to residuals precomputed by a jitted "
            "forward** (the backward alone, as in a training step), the same for every "
            "implementation.")
    if None in methods:
        text += " Records from older runs in this file subtracted the forward instead."
    return text + torch_text


def render_markdown(data: dict) -> str:
    res = Results(data)
    env = res.env
    lines = ["# jax_dash attention benchmarks", ""]
    lines.append(f"- GPU: {env.get('gpu_name') or env.get('device_kind', '?')} "
                 f"(platform {env.get('platform', '?')}, driver {env.get('driver') or '-'}, "
                 f"memory {env.get('gpu_memory') or '-'})")
    lines.append(f"- jax {env.get('jax', '?')}, jaxlib {env.get('jaxlib', '?')}, "
                 f"cuDNN {env.get('cudnn') or '-'}, jax_dash {env.get('jax_dash') or '-'}, "
                 f"python {env.get('python', '?')}")
    kernels = {var: value for var, value in (env.get("jax_dash_kernels") or {}).items() if value}
    lines.append("- jax_dash Hopper kernels: " + (
        ", ".join(f"{var}={value}" for var, value in sorted(kernels.items())) if kernels
        else "the defaults (no JAX_DASH_SM90_FWD)"))
    if res.peak_tflops:
        peak = data["records"]["peak"]["result"]
        lines.append(f"- measured {peak['dtype']} matmul peak ({peak['size']}^3, random data): "
                     f"{res.peak_tflops:.0f} TFLOP/s; the % columns are of this number")
    for run in data.get("runs", []):
        lines.append(f"- run {run.get('date', '?')} (git {run.get('git_commit') or '?'}): "
                     f"`{run.get('command', '?')}`")
    dtypes = sorted({p.dtype for p in res.time_points()}) or [_grid.DEFAULT_DTYPE]
    lines += ["", f"Method: {', '.join(dtypes)}, tensors [batch, seq, heads, head_dim], "
              "self-attention. FLOPs: forward "
              "4·B·H·S²·D (half for causal), backward 2.5x forward. Each time is the median over "
              f"samples of back-to-back calls (>= {_min_sample_ms(res)} ms per sample) after warm-up, "
              "rotating between 2 "
              "random-normal input sets. " + _backward_method(res) + " `cuDNN` is "
              "`jax.nn.dot_product_attention(implementation='cudnn')`, `cuDNN det` the same in a "
              "process with `XLA_FLAGS=--xla_gpu_deterministic_ops=true`, `XLA` is "
              "`implementation='xla'`; `dash <schedule>` is jax_dash's backward schedule. Ratios are "
              "backward speed-ups (>1: jax_dash faster); tax = backward time over jax_dash's own "
              "`atomic` schedule, minus 1. Bitwise repeatability: 3 runs of forward+backward on the "
              "same inputs, dq/dk/dv compared with np.array_equal on their bits.", ""]
    if res.timing or res.memory:
        lines += ["## Goals", ""] + goals_section(res) + [""]
    if res.timing:
        lines += ["## Headline: backward TFLOP/s and ratios", ""] + headline_table(res) + [""]
        lines += ["## Backward TFLOP/s (% of measured matmul peak)", ""] + backward_table(res) + [""]
        lines += ["## Forward TFLOP/s (% of measured matmul peak)", ""] + forward_table(res) + [""]
    if res.memory:
        lines += ["## Peak device memory of forward + backward (GB, inputs and outputs included)",
                  ""] + memory_table(res) + [""]
    if res.numerics:
        lines += ["## Numerical deviation from an fp64 reference (bf16 inputs)", "",
                  "Max absolute error / relative RMS error (‖x - ref‖₂ / ‖ref‖₂) against a float64 "
                  "computation on the same bf16-rounded inputs (after Golden et al., "
                  "\"Is Flash Attention Stable?\").", ""] + numerics_table(res) + [""]
    if res.problems:
        lines += ["## Skipped and failed measurements", ""]
        lines += [f"- {what}: {msg.splitlines()[0][:300]}" for what, msg in res.problems] + [""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plots

def write_plots(data: dict, out_dir) -> list[str]:
    """PNG plots; returns the written file names. Raises ImportError without matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    res = Results(data)
    written = []
    points = res.time_points()
    if points:
        for phase in ("bwd", "fwd"):
            written.append(_plot_throughput(plt, res, points, phase, out_dir))
    if res.memory:
        written.append(_plot_memory(plt, res, out_dir))
    if res.numerics:
        written.append(_plot_numerics(plt, res, out_dir))
    return written


def _seq_axis(ax, seqs):
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs)
    ax.set_xticklabels([_seq_name(s) for s in seqs])
    ax.minorticks_off()
    ax.set_xlabel("sequence length")
    ax.grid(True, alpha=0.3)


def _plot_throughput(plt, res, points, phase, out_dir):
    head_dims = sorted({p.head_dim for p in points})
    masks = [m for m in _grid.MASKS if any(p.mask == m for p in points)]
    fig, axes = plt.subplots(len(head_dims), len(masks), figsize=(6 * len(masks), 4 * len(head_dims)),
                             squeeze=False)
    labels = ordered_labels({x for _, x in res.timing})
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}  # same colour in every panel
    for row, head_dim in zip(axes, head_dims):
        for ax, mask in zip(row, masks):
            panel_points = [p for p in points if (p.head_dim, p.mask) == (head_dim, mask)]
            if not panel_points:  # runs merged into one results.json need not fill the grid
                ax.axis("off")
                continue
            for label in labels:
                if phase == "fwd" and label.startswith("jax_dash:") and label != res.dash_forward_label(
                        panel_points[0]):
                    continue  # one forward kernel for every schedule
                xs, ys = [], []
                for p in panel_points:
                    value = res.tflops(p, label, phase)
                    if value is not None:
                        xs.append(p.seq)
                        ys.append(value)
                if xs:
                    name = ("jax_dash" if phase == "fwd" and label.startswith("jax_dash:")
                            else display_name(label))
                    ax.plot(xs, ys, "-o" if label.startswith("jax_dash") else "--s", label=name,
                            color=colors[label])
            _seq_axis(ax, sorted({p.seq for p in panel_points}))
            ax.set_ylim(bottom=0)
            ax.set_title(f"head_dim {head_dim}, {mask} mask, bf16")
            ax.set_ylabel(f"{'backward' if phase == 'bwd' else 'forward'} TFLOP/s")
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    name = f"{phase}_tflops.png"
    fig.savefig(f"{out_dir}/{name}", dpi=100)
    plt.close(fig)
    return name


def _plot_memory(plt, res, out_dir):
    fig, ax = plt.subplots(figsize=(6, 4))
    for label in ordered_labels({x for _, x in res.memory}):
        pts = sorted((p.seq, r["peak_bytes"] / 1e9) for (p, x), r in res.memory.items()
                     if x == label and r.get("peak_bytes"))
        color = None
        if pts:
            (line,) = ax.plot([s for s, _ in pts], [g for _, g in pts], "-o", label=display_name(label))
            color = line.get_color()
        # An OOM is drawn where XLA planned to go (inputs + temp), when it said how much.
        ooms = sorted((p.seq, (r["inputs_bytes"] + (r.get("temp_bytes") or 0)) / 1e9)
                      for (p, x), r in res.memory.items() if x == label and r["oom"])
        if ooms:
            ax.plot([s for s, _ in ooms], [g for _, g in ooms], "x", markersize=10, color=color,
                    label=f"{display_name(label)}: out of memory (planned)")
    capacity = re.match(r"\s*(\d+)\s*MiB", res.env.get("gpu_memory") or "")
    if capacity:
        ax.axhline(int(capacity.group(1)) * 2**20 / 1e9, color="gray", linestyle=":",
                   label=f"GPU memory ({res.env.get('gpu_name', 'GPU')})")
    _seq_axis(ax, sorted({p.seq for p, _ in res.memory}))
    ax.set_yscale("log")
    ax.set_ylabel("peak GB (fwd + bwd)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/memory.png", dpi=110)
    plt.close(fig)
    return "memory.png"


def _plot_numerics(plt, res, out_dir):
    ROUNDING_FLOOR, TENSORS = _numerics.ROUNDING_FLOOR, _numerics.TENSORS
    panels = sorted({(p.head_dim, p.mask) for p in res.numerics},
                    key=lambda x: (x[0], _grid.MASKS.index(x[1])))
    fig, axes = plt.subplots(len(panels), len(TENSORS), figsize=(4 * len(TENSORS), 3 * len(panels)),
                             squeeze=False)
    for row, (head_dim, mask) in zip(axes, panels):
        pts = sorted((p for p in res.numerics if (p.head_dim, p.mask) == (head_dim, mask)),
                     key=lambda p: p.seq)
        impls = sorted({i for p in pts for i in res.numerics[p]["impls"]}, key=lambda i: (i != ROUNDING_FLOOR, i))
        for ax, tensor in zip(row, TENSORS):
            for impl in impls:
                xs, ys = [], []
                for p in pts:
                    entry = res.numerics[p]["impls"].get(impl, {})
                    if tensor in entry and entry[tensor]["rel_rms"]:
                        xs.append(p.seq)
                        ys.append(entry[tensor]["rel_rms"])
                if xs:
                    ax.plot(xs, ys, ":" if impl == ROUNDING_FLOOR else "-o", label=impl)
            _seq_axis(ax, sorted({p.seq for p in pts}))
            ax.set_yscale("log")
            ax.set_title(f"{tensor}: hd {head_dim}, {mask}", fontsize=9)
            ax.set_ylabel("rel. RMS error vs fp64")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/numerics.png", dpi=100)
    plt.close(fig)
    return "numerics.png"
