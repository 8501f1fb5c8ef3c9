"""The backward schedules as a DAG, a simulator over it, ``choose_schedule`` and a CLI.

Every fact about a schedule (work items, Q-tile visit orders, dQ tickets, GQA dK/dV tickets,
fallbacks) comes from ``cuda/schedule.h`` through the extension; this module only turns those tables
into a DAG and runs it:

* nodes: the steps of each work item: one per contribution (m, n) (tile compute ``c``, then the
  ordered add ``r`` into dQ tile m), plus, with GQA, one per KV column for the ordered dK/dV add;
* edges: item order (a step follows the previous step of its item; an item starts when the
  previous item of its worker ends: worker w runs items w, w+P, w+2P, ...) and ticket order
  (a contribution's add waits for the add holding the previous ticket of the same tile);
* simulation: every node finishes at ``max(previous step + compute, ticket predecessor) + reduce``.

The simulation is exact for this model, reports stalls per worker and the critical path, and
detects deadlock (steps that can never run). The costs are placeholders to be calibrated on a GPU.

CLI::

    python -m jax_dash.schedules --seq 8192 --head-dim 128 --heads 16 --batch 2 [--causal] \\
        [--sms 132] [--plot gantt.png]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys

import numpy as np

from jax_dash import _jax_dash as _ext
from jax_dash._ffi import SCHEDULE_IDS

SCHEDULE_NAMES = {v: k for k, v in SCHEDULE_IDS.items()}
# Schedules "auto" chooses from, in tie-break order. Only the batch-invariant ones: shift and
# symmetric_shift take their tickets from the global wave a head's items fall in, so a sequence's
# dQ bits can change with the batch around it (docs/determinism.md). They stay available by name.
AUTO_CANDIDATES = ("descending", "ascending")

_DQ, _DKV = 0, 1  # node kinds


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Costs of one step, in units of one tile's compute. Not yet calibrated on a GPU."""

    compute: float = 1.0     # c: the five GEMMs of one (m, n) tile
    reduce: float = 0.2      # r: one ordered fp32 add of a dQ tile into dq_accum
    dkv_reduce: float = 0.4  # ordered add of a dK_n/dV_n partial across a GQA group

    def __post_init__(self):
        for name in ("compute", "reduce", "dkv_reduce"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"CostModel.{name}={value!r} must be a finite number >= 0")


@dataclasses.dataclass(frozen=True)
class Problem:
    """One backward call as the schedules see it."""

    batch: int
    num_heads: int
    num_kv_heads: int
    seq_q: int
    seq_kv: int
    block_m: int
    block_n: int
    is_causal: bool
    wave: int

    def __post_init__(self):
        for name in ("batch", "num_heads", "num_kv_heads", "seq_q", "seq_kv", "block_m",
                     "block_n", "wave"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")

    @property
    def num_q_tiles(self) -> int:
        return -(-self.seq_q // self.block_m)

    @property
    def num_kv_tiles(self) -> int:
        return -(-self.seq_kv // self.block_n)

    @property
    def head_count(self) -> int:
        """Heads of work (batch * num_heads); head_linear = b * num_heads + h."""
        return self.batch * self.num_heads


def make_problem(*, batch, num_heads, seq_q, seq_kv, is_causal, wave, head_dim=None,
                 num_kv_heads=None, block_m=None, block_n=None) -> Problem:
    """A Problem with the backward tiles of ``cuda/tiles.h`` for ``head_dim`` (or given blocks)."""
    if block_m is None or block_n is None:
        if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) \
                or head_dim < 1:
            raise ValueError(f"head_dim={head_dim!r} must be an integer >= 1 (or pass block_m "
                             "and block_n)")
        _, _, tile_m, tile_n = _ext.tile_config(int(head_dim))
        block_m = tile_m if block_m is None else block_m
        block_n = tile_n if block_n is None else block_n
    return Problem(batch=batch, num_heads=num_heads,
                   num_kv_heads=num_heads if num_kv_heads is None else num_kv_heads,
                   seq_q=seq_q, seq_kv=seq_kv, block_m=block_m, block_n=block_n,
                   is_causal=bool(is_causal), wave=wave)


def _schedule_id(schedule: str) -> int:
    if schedule not in SCHEDULE_IDS:
        raise ValueError(f"schedule={schedule!r} is not one of {', '.join(SCHEDULE_IDS)}")
    return SCHEDULE_IDS[schedule]


@functools.lru_cache(maxsize=256)
def head_tables(schedule: str, problem: Problem, head: int) -> dict:
    """``cuda/schedule.h`` for one head (head_linear), as read-only numpy arrays.

    Keys: effective_schedule (name), num_q_tiles, num_kv_tiles, items_per_head,
    item_kv_tiles [items, 2] (-1 = none), wave_first / wave_end [items],
    visit [Nkv, Nq] (-1 past visit_count), visit_count [Nkv], ticket [Nq, Nkv] (-1 = masked),
    ticket_count [Nq].
    """
    p = problem
    tables = dict(_ext.schedule_head_tables(
        _schedule_id(schedule), p.seq_q, p.seq_kv, p.block_m, p.block_n, p.is_causal,
        p.head_count, p.wave, int(head)))
    tables["effective_schedule"] = SCHEDULE_NAMES[tables["effective_schedule"]]
    for value in tables.values():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return tables


def effective_schedule(schedule: str, problem: Problem) -> str:
    """The schedule schedule.h actually runs for this problem (after its fallbacks)."""
    return head_tables(schedule, problem, 0)["effective_schedule"]


@functools.lru_cache(maxsize=64)
def dkv_tickets(schedule: str, problem: Problem) -> np.ndarray:
    """``dkv_ticket(head_in_group, n)`` as a [group_size, Nkv] array."""
    p = problem
    out = _ext.schedule_dkv_tickets(_schedule_id(schedule), p.seq_q, p.seq_kv, p.block_m,
                                    p.block_n, p.is_causal, p.head_count, p.wave,
                                    p.num_heads // p.num_kv_heads)
    out.flags.writeable = False
    return out


# ---- the DAG ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ScheduleDag:
    """Items in global order g; each item is a row of steps (padded to ``max_steps``).

    Node id = g * max_steps + step. ``pred`` is the node holding the previous ticket of the same
    counter (-1: first ticket, or atomic), which is the ticket edge; item-order edges are implicit
    (step s-1 -> s, and the worker's previous item -> step 0).
    """

    schedule: str
    effective_schedule: str
    problem: Problem
    num_items: int
    items_per_head: int
    length: np.ndarray   # [items] real steps per item
    kind: np.ndarray     # [items, max_steps] _DQ or _DKV (padding: _DQ with zero cost)
    q_tile: np.ndarray   # [items, max_steps] m of a dQ step, -1 otherwise
    kv_tile: np.ndarray  # [items, max_steps] n of the step, -1 for padding
    ticket: np.ndarray   # [items, max_steps] ticket of the step, -1 for padding
    pred: np.ndarray     # [items, max_steps] ticket predecessor node, -1 if none

    @property
    def max_steps(self) -> int:
        return self.kind.shape[1]

    def ticket_edges(self) -> np.ndarray:
        """[E, 2] (from_node, to_node) ticket edges."""
        to = np.flatnonzero(self.pred.reshape(-1) >= 0)
        return np.stack([self.pred.reshape(-1)[to], to], axis=1)


def build_dag(schedule: str, problem: Problem, *, num_items: int | None = None) -> ScheduleDag:
    """The DAG of ``schedule`` for ``problem``; ``num_items`` keeps only the first items (which
    must not wait on the dropped ones: true for whole waves)."""
    p = problem
    first = head_tables(schedule, p, 0)
    per_head = int(first["items_per_head"])
    total = p.head_count * per_head
    num_items = total if num_items is None else max(0, min(int(num_items), total))
    heads_used = -(-num_items // per_head) if per_head else 0
    gqa = p.num_heads != p.num_kv_heads
    group = p.num_heads // p.num_kv_heads
    nq, nkv = int(first["num_q_tiles"]), int(first["num_kv_tiles"])
    tables = [head_tables(schedule, p, h) for h in range(heads_used)]

    # Steps of an item: column 0's visits (+ its dK/dV add under GQA), then column 1's.
    item_kv = first["item_kv_tiles"]                                   # [items, 2]
    has_col = item_kv >= 0
    col = np.where(has_col, item_kv, 0)
    col_steps = np.where(has_col, first["visit_count"][col] + int(gqa), 0)  # [items, 2]
    max_steps = max(int(col_steps.sum(axis=1).max(initial=0)), 1)
    step = np.arange(max_steps)[None, :]
    in_second = step >= col_steps[:, :1]
    local = np.where(in_second, step - col_steps[:, :1], step)         # [items, steps]
    column = np.where(in_second, col[:, 1:2], col[:, :1])
    real_step = local < np.where(in_second, col_steps[:, 1:2], col_steps[:, :1])
    count = first["visit_count"][column]
    is_dkv = real_step & (local == count)                              # only under GQA
    is_dq = real_step & ~is_dkv
    kv_one = np.where(real_step, column, -1).astype(np.int32)

    shape = (num_items, max_steps)
    heads = np.repeat(np.arange(heads_used, dtype=np.int64), per_head)[:num_items]
    local_items = np.tile(np.arange(per_head), heads_used)[:num_items]
    kv_tile = kv_one[local_items]
    kind = np.where(is_dkv, _DKV, _DQ).astype(np.int8)[local_items]
    dq = is_dq[local_items]
    q_tile = np.full(shape, -1, np.int32)
    ticket = np.full(shape, -1, np.int32)
    safe_local = np.minimum(local, nq - 1 if nq else 0)
    for h, t in enumerate(tables):
        rows = slice(h * per_head, min((h + 1) * per_head, num_items))
        count_rows = rows.stop - rows.start
        m = np.where(is_dq, t["visit"][column, safe_local], -1)[:count_rows]
        q_tile[rows] = m
        ticket[rows] = np.where(dq[rows], t["ticket"][np.maximum(m, 0), column[:count_rows]], -1)
    if gqa:
        dkv = dkv_tickets(schedule, p)
        in_group = ((heads % p.num_heads) % group)[:, None]
        ticket = np.where(kind == _DKV, dkv[in_group, np.maximum(kv_tile, 0)], ticket)
    length = (kv_tile >= 0).sum(axis=1).astype(np.int32)

    # Ticket edges: the node holding (counter, ticket - 1). Counters: per head and Q tile (dQ),
    # per (batch, kv head, KV tile) (dK/dV).
    node = np.arange(num_items * max_steps, dtype=np.int64).reshape(shape)
    pred = np.full(shape, -1, np.int64)
    eff = first["effective_schedule"]
    if eff != "atomic" and dq.any():
        counter = heads[:, None] * nq + q_tile
        _link_tickets(pred, node, dq, counter, ticket, heads_used * nq, max(nkv, 1))
    dkv_mask = kind == _DKV
    if dkv_mask.any():
        kv_head = (heads // p.num_heads) * p.num_kv_heads + (heads % p.num_heads) // group
        counter = kv_head[:, None] * nkv + kv_tile
        _link_tickets(pred, node, dkv_mask, counter, ticket, p.batch * p.num_kv_heads * nkv,
                      group)
    return ScheduleDag(schedule=schedule, effective_schedule=eff, problem=p,
                       num_items=num_items, items_per_head=per_head, length=length, kind=kind,
                       q_tile=q_tile, kv_tile=kv_tile, ticket=ticket, pred=pred)


def _link_tickets(pred, node, mask, counter, ticket, num_counters, tickets_per_counter):
    """pred[x] = the node with the same counter and ticket[x] - 1 (among ``mask``)."""
    key = counter[mask].astype(np.int64) * tickets_per_counter + ticket[mask]
    owner = np.full(num_counters * tickets_per_counter, -1, np.int64)
    owner[key] = node[mask]
    pred[mask] = np.where(ticket[mask] > 0, owner[np.maximum(key - 1, 0)], -1)


# ---- simulation ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SimResult:
    schedule: str
    effective_schedule: str
    workers: int
    makespan: float             # inf if deadlocked
    deadlocked: bool
    blocked_items: np.ndarray   # items that never finish (deadlock)
    finish: np.ndarray          # [items, max_steps] finish time of every node (nan: never)
    start: np.ndarray           # [items] start time of each item
    busy: np.ndarray            # [workers] time spent computing and reducing
    stall: np.ndarray           # [workers] time spent waiting on tickets (between start and end)
    tail: np.ndarray            # [workers] idle time after the worker's last item
    work_bound: float           # total work / workers
    critical_path: list         # [(item, first_step, last_step)] from the end back to time 0

    @property
    def idle_fraction(self) -> float:
        """(stalls + tails) / (workers * makespan)."""
        if not math.isfinite(self.makespan) or self.makespan <= 0:
            return float("nan") if self.deadlocked else 0.0
        return float((self.stall.sum() + self.tail.sum()) / (self.workers * self.makespan))


def simulate(dag: ScheduleDag, *, workers: int | None = None,
             cost: CostModel = CostModel()) -> SimResult:
    """Runs the DAG with ``workers`` persistent workers (default: the problem's wave width).

    Each node finishes at max(previous step's finish + compute, ticket predecessor's finish)
    + reduce, which is a max-plus prefix scan per item. Items are evaluated wave by wave (ticket
    and worker edges never point to a later wave), sweeping forward and backward inside a wave
    until nothing changes; steps still unknown then can never run: a deadlock.
    """
    p = dag.problem
    workers = p.wave if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    num_items, max_steps = dag.kind.shape
    real = dag.kv_tile >= 0
    compute = np.where(real & (dag.kind == _DQ), cost.compute, 0.0)
    reduce = np.where(real, np.where(dag.kind == _DQ, cost.reduce, cost.dkv_reduce), 0.0)
    total = np.cumsum(compute + reduce, axis=1)  # S[s]: work up to and including step s
    has_pred = dag.pred >= 0
    offset = reduce - total  # pred + reduce - S[s]
    # Node finish times, plus one trailing -inf that "no ticket predecessor" points at.
    flat = np.full(num_items * max_steps + 1, np.nan)
    flat[-1] = -np.inf
    finish = flat[:-1].reshape(num_items, max_steps)
    pred_index = np.where(has_pred, dag.pred, len(flat) - 1)
    start = np.full(num_items, np.nan)

    def evaluate(g):
        begin = finish[g - workers, -1] if g >= workers else 0.0
        if math.isnan(begin):
            return
        row = np.maximum.accumulate(flat[pred_index[g]] + offset[g])
        np.maximum(row, begin, out=row)
        row += total[g]
        finish[g] = row
        start[g] = begin

    block = max(p.wave, 1)
    deadlocked = False
    for lo in range(0, num_items, block):
        pending = list(range(lo, min(lo + block, num_items)))
        forward = True
        known = 0
        while pending:
            for g in (pending if forward else reversed(pending)):
                evaluate(g)
            pending = [g for g in pending if math.isnan(finish[g, -1])]
            now_known = int(np.count_nonzero(~np.isnan(finish[lo:lo + block])))
            if pending and now_known == known:
                deadlocked = True
                break
            known = now_known
            forward = not forward
        if deadlocked:
            break

    done = ~np.isnan(finish[:, -1])
    blocked = np.flatnonzero(~done)
    work = total[:, -1]
    worker_of = np.arange(num_items) % workers
    busy = np.bincount(worker_of, weights=work, minlength=workers)
    if deadlocked:
        makespan = math.inf
        stall = np.full(workers, np.nan)
        tail = np.full(workers, np.nan)
        path = []
    else:
        makespan = float(finish[:, -1].max()) if num_items else 0.0
        end = np.zeros(workers)
        np.maximum.at(end, worker_of, finish[:, -1])
        stall = end - busy
        tail = makespan - end
        path = _critical_path(dag, finish, start, total, offset, has_pred, workers)
    return SimResult(schedule=dag.schedule, effective_schedule=dag.effective_schedule,
                     workers=workers, makespan=makespan, deadlocked=deadlocked,
                     blocked_items=blocked, finish=finish, start=start, busy=busy, stall=stall,
                     tail=tail, work_bound=float(work.sum() / workers), critical_path=path)


def _critical_path(dag, finish, start, total, offset, has_pred, workers):
    """Walks back from the last node: which term of the max fixed each finish time."""
    if dag.num_items == 0:
        return []
    flat = finish.reshape(-1)
    g = int(np.argmax(finish[:, -1]))
    s = int(dag.length[g]) - 1
    path = []
    while g >= 0 and s >= 0:
        waits = np.where(has_pred[g, :s + 1], flat[np.where(has_pred[g, :s + 1],
                                                            dag.pred[g, :s + 1], 0)], -np.inf)
        waits = waits + offset[g, :s + 1]
        best = int(np.argmax(waits[::-1]))  # latest step whose wait sets the time
        j = s - best
        if waits[j] > start[g] + 1e-12 * max(1.0, abs(start[g])):
            path.append((g, j, s))
            g, s = divmod(int(dag.pred[g, j]), dag.max_steps)
        else:
            path.append((g, 0, s))
            if g < workers or start[g] == 0:
                break
            g -= workers
            s = int(dag.length[g]) - 1
    return path


# ---- choosing a schedule ------------------------------------------------------------------------

@functools.lru_cache(maxsize=1024)
def choose_schedule(*, batch: int, num_heads: int, seq_q: int, seq_kv: int, head_dim: int,
                    is_causal: bool, wave: int) -> str:
    """The deterministic schedule with the smallest simulated makespan for this call's shape.

    Simulates the same first heads (about one wave of work items; the steady state repeats it)
    for each candidate whose effective schedule is itself (a fallback is represented by its
    target). Ties go to the
    earlier of ``AUTO_CANDIDATES`` (the batch-invariant schedules).
    """
    problem = make_problem(batch=batch, num_heads=num_heads, seq_q=seq_q, seq_kv=seq_kv,
                           head_dim=head_dim, is_causal=is_causal, wave=wave)
    names = [n for n in AUTO_CANDIDATES if effective_schedule(n, problem) == n]
    # The same whole heads for every candidate, enough for one full wave of the one with the
    # fewest items per head.
    fewest = min(head_tables(n, problem, 0)["items_per_head"] for n in names)
    heads = min(problem.head_count, -(-problem.wave // max(fewest, 1)))
    best, best_time = None, math.inf
    for name in names:
        dag = build_dag(name, problem, num_items=heads * head_tables(name, problem, 0)["items_per_head"])
        makespan = simulate(dag, cost=CostModel()).makespan
        if makespan < best_time * (1 - 1e-9):
            best, best_time = name, makespan
    return best if best is not None else "descending"


# ---- report and pictures ------------------------------------------------------------------------

def compare(problem: Problem, *, schedules=tuple(SCHEDULE_IDS), workers=None,
            cost: CostModel = CostModel()) -> list[SimResult]:
    return [simulate(build_dag(name, problem), workers=workers, cost=cost) for name in schedules]


def format_table(results: list[SimResult]) -> str:
    base = next((r.makespan for r in results if r.schedule == "ascending"), None)
    header = (f"{'schedule':<16} {'runs as':<16} {'makespan':>10} {'idle %':>7} "
              f"{'vs ascending':>12} {'work bound':>10}  deterministic")
    lines = [header, "-" * len(header)]
    for r in results:
        speedup = base / r.makespan if base and math.isfinite(r.makespan) else float("nan")
        state = "DEADLOCK" if r.deadlocked else ("no" if r.effective_schedule == "atomic"
                                                  else "yes")
        lines.append(f"{r.schedule:<16} {r.effective_schedule:<16} {r.makespan:>10.2f} "
                     f"{100 * r.idle_fraction:>6.1f}% {speedup:>11.3f}x {r.work_bound:>10.2f}  "
                     f"{state}")
    return "\n".join(lines)


def plot_gantt(results: list[SimResult], dags: list[ScheduleDag], path: str, *,
               cost: CostModel = CostModel(), max_workers: int = 64) -> None:
    """One Gantt panel per schedule: a bar per item on its worker's row, ticket stalls in red."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit("--plot needs matplotlib: pip install 'jax_dash[plot]' "
                         "(or pip install matplotlib)") from exc
    fig, axes = plt.subplots(len(results), 1, figsize=(14, 2.2 + 0.09 * max_workers *
                                                       len(results)), squeeze=False)
    # Head colours from tab20 without its two reds, which would read as ticket stalls.
    palette = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (6, 7)]
    for ax, r, dag in zip(axes[:, 0], results, dags):
        shown = min(r.workers, max_workers)
        per_head = max(dag.items_per_head, 1)
        for g in range(dag.num_items):
            w = g % r.workers
            if w >= shown or math.isnan(r.start[g]):
                continue
            end = np.nanmax(r.finish[g]) if np.isfinite(r.finish[g]).any() else r.start[g]
            ax.broken_barh([(r.start[g], end - r.start[g])], (w - 0.4, 0.8),
                           facecolors=palette[(g // per_head) % len(palette)], edgecolor="none")
            steps = int(dag.length[g])
            done = r.finish[g, :steps]
            prev = np.concatenate([[r.start[g]], done[:-1]])
            gaps = done - prev - _step_costs(dag, g, cost)[:steps]  # waiting for a ticket
            waits = [(t0, gap) for t0, gap in zip(prev, gaps) if gap > 1e-9]
            if waits:
                ax.broken_barh(waits, (w - 0.4, 0.8), facecolors="red", edgecolor="none")
        title = f"{r.schedule}" + (f" (runs as {r.effective_schedule})"
                                   if r.effective_schedule != r.schedule else "")
        ax.set_title(f"{title}: makespan {r.makespan:.1f}, idle {100 * r.idle_fraction:.1f}% "
                     "(red: waiting for a ticket; colour: head)", fontsize=9)
        ax.set_ylabel("worker")
        ax.set_ylim(shown - 0.5, -0.5)
    axes[-1, 0].set_xlabel("time (units of one tile's compute)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _step_costs(dag, g, cost):
    real = dag.kv_tile[g] >= 0
    c = np.where(real & (dag.kind[g] == _DQ), cost.compute, 0.0)
    r = np.where(real, np.where(dag.kind[g] == _DQ, cost.reduce, cost.dkv_reduce), 0.0)
    return c + r


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jax_dash.schedules",
        description="Simulate the deterministic backward schedules (DAG model of cuda/schedule.h).")
    parser.add_argument("--seq", type=int, required=True, help="query length (and key length)")
    parser.add_argument("--seq-kv", type=int, default=None, help="key length (default: --seq)")
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, default=None, help="GQA kv heads (default: heads)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--sms", type=int, default=132,
                        help="resident backward CTAs = the wave width (default 132: H100/H200 SXM)")
    parser.add_argument("--compute", type=float, default=CostModel.compute, help="c per tile")
    parser.add_argument("--reduce", type=float, default=CostModel.reduce, help="r per dQ add")
    parser.add_argument("--plot", default=None, help="write a Gantt chart (PNG) here")
    args = parser.parse_args(argv)
    try:
        problem = make_problem(batch=args.batch, num_heads=args.heads, num_kv_heads=args.kv_heads,
                               seq_q=args.seq, seq_kv=args.seq_kv or args.seq,
                               head_dim=args.head_dim, is_causal=args.causal, wave=args.sms)
        cost = CostModel(compute=args.compute, reduce=args.reduce)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"batch {problem.batch}, heads {problem.num_heads} (kv {problem.num_kv_heads}), "
          f"seq {problem.seq_q}x{problem.seq_kv}, tiles {problem.block_m}x{problem.block_n} "
          f"-> Nq {problem.num_q_tiles}, Nkv {problem.num_kv_tiles}, "
          f"{'causal' if problem.is_causal else 'full'}, wave {problem.wave}, "
          f"c {cost.compute}, r {cost.reduce}")
    dags = [build_dag(name, problem) for name in SCHEDULE_IDS]
    results = [simulate(dag, cost=cost) for dag in dags]
    print(format_table(results))
    auto = choose_schedule(batch=problem.batch, num_heads=problem.num_heads, seq_q=problem.seq_q,
                           seq_kv=problem.seq_kv, head_dim=args.head_dim,
                           is_causal=problem.is_causal, wave=problem.wave)
    print(f'schedule="auto" picks: {auto} (it chooses among the batch-invariant schedules: '
          f'{", ".join(AUTO_CANDIDATES)})')
    if args.plot:
        plot_gantt(results, dags, args.plot, cost=cost)
        print(f"Gantt chart written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
