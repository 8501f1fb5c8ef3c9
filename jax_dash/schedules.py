"""The backward schedules as a DAG, a simulator over it and a CLI; ``choose_schedule``, the rule
``schedule="auto"`` runs, comes from ``jax_dash._args`` (the run path never imports this module).

Every fact about a schedule (work items, Q-tile visit orders, dQ tickets, GQA dK/dV tickets,
fallbacks) comes from ``cuda/schedule.h`` through the extension; this module only turns those tables
into a DAG and runs it:

* nodes: the steps of each work item: one per contribution (m, n) (tile compute ``c``, then the
  ordered add ``r`` into dQ tile m), plus, with GQA, one per KV column for the ordered dK/dV add;
* edges: item order (a step follows the previous step of its item) and ticket order (a
  contribution's add waits for the add holding the previous ticket of the same tile);
* workers: in-order dynamic fetch, as on the GPU: ``P`` persistent workers (the wave width) start
  on items 0..P-1, and a worker that finishes an item takes the smallest item nobody has taken; a
  worker waiting for a ticket keeps its item;
* simulation: every node finishes at ``max(previous step + compute, ticket predecessor) + reduce``.

Masks: the tables come from the static band (causal and/or ``Problem.window``), so the DAG is the
band's; ``with_hidden_pairs`` marks the pairs that data (lengths, segment ids;
``hidden_pairs_from_data``) hides, which keep their tickets and edges and only cost a handoff.

The simulation is exact for this model, reports stalls per worker and the critical path, and
detects deadlock (steps that can never run). The costs are placeholders to be calibrated on a GPU.

CLI::

    python -m jax_dash.schedules --seq 8192 --head-dim 128 --heads 16 --batch 2 [--causal] \\
        [--sms N] [--plot gantt.png]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import math
import sys

import numpy as np

import _jax_dash as _ext
# The rule "auto" runs lives on the run path (jax_dash._args), which never imports this module.
from jax_dash._args import AUTO_CANDIDATES, MIRROR_MAX_KV_TILES, SCHEDULE_IDS, choose_schedule

SCHEDULE_NAMES = {v: k for k, v in SCHEDULE_IDS.items()}

_DQ, _DKV = 0, 1  # node kinds


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Costs of one step, in units of one tile's compute. Not yet calibrated on a GPU."""

    compute: float = 1.0     # c: the five GEMMs of one (m, n) tile
    reduce: float = 0.2      # r: one ordered fp32 add of a dQ tile into dq_accum
    dkv_reduce: float = 0.4  # ordered add of a dK_n/dV_n partial across a GQA group
    handoff: float = 0.02    # a pair the data hides: take the ticket, release it, add nothing

    def __post_init__(self):
        for name in ("compute", "reduce", "dkv_reduce", "handoff"):
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
    window: tuple[int, int] | None = None  # local_window_size (left, right); the band

    def __post_init__(self):
        if self.window is not None:
            window = self.window
            if (not isinstance(window, tuple) or len(window) != 2
                    or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0
                           for w in window)):
                raise ValueError(f"window={window!r} must be None or a (left, right) tuple of "
                                 "integers >= 0")
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
                 num_kv_heads=None, block_m=None, block_n=None, window=None) -> Problem:
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
                   is_causal=bool(is_causal), wave=wave,
                   window=None if window is None else tuple(window))


def _window_args(problem: Problem) -> tuple[int, int]:
    return problem.window if problem.window is not None else (-1, -1)


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
    ticket_count [Nq], first_kv_tile [Nq] (tile m sees KV tiles first_kv_tile[m] ..
    first_kv_tile[m] + ticket_count[m] - 1), first_q_tile / end_q_tile [Nkv] (the Q tiles that see
    KV tile n: a contiguous range, the band).
    """
    p = problem
    tables = dict(_ext.schedule_head_tables(
        _schedule_id(schedule), p.seq_q, p.seq_kv, p.block_m, p.block_n, p.is_causal,
        p.head_count, p.wave, int(head), *_window_args(p)))
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
                                    p.num_heads // p.num_kv_heads, *_window_args(p))
    out.flags.writeable = False
    return out


# ---- the DAG ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ScheduleDag:
    """Items in global order g; each item is a row of steps (padded to ``max_steps``).

    Node id = g * max_steps + step. ``pred`` is the node holding the previous ticket of the same
    counter (-1: first ticket, or atomic), which is the ticket edge; item-order edges are implicit
    (step s-1 -> s). Which worker runs an item, and after which item, is decided by ``simulate``
    (in-order dynamic fetch).
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
    # [items, max_steps] dQ steps whose pair the data (lengths, segment ids) hides: not computed,
    # the ticket only handed on (see with_hidden_pairs). None: nothing hidden.
    hidden: np.ndarray | None = None
    # [items, max_steps] hidden dQ steps that take no ticket turn at all (without_hidden_pairs):
    # their successors wait on the nearest visible predecessor instead. None: every step counts.
    skipped: np.ndarray | None = None

    @property
    def max_steps(self) -> int:
        return self.kind.shape[1]

    def ticket_edges(self) -> np.ndarray:
        """[E, 2] (from_node, to_node) ticket edges."""
        to = np.flatnonzero(self.pred.reshape(-1) >= 0)
        return np.stack([self.pred.reshape(-1)[to], to], axis=1)


def build_dag(schedule: str, problem: Problem, *, num_items: int | None = None) -> ScheduleDag:
    """The DAG of ``schedule`` for ``problem``; ``num_items`` keeps only the first items (which
    must not wait on the dropped ones: true for whole heads)."""
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


def with_hidden_pairs(dag: ScheduleDag, hidden: np.ndarray) -> ScheduleDag:
    """``dag`` with the tile pairs the data hides marked: ``hidden`` is a boolean [head_count,
    Nq, Nkv] (head_linear = b * num_heads + h) of the (m, n) pairs that lengths or segment ids make
    invisible in that head. Items, visit orders, tickets and edges stay the band's (tickets come
    from the static band only); a hidden step just costs ``CostModel.handoff`` instead of compute
    + reduce, as a kernel that skips the tile but still takes and releases its ticket. So the
    deadlock argument of the band holds as it is, and the simulation shows what skipping saves."""
    p = dag.problem
    hidden = np.asarray(hidden, bool)
    if hidden.shape != (p.head_count, p.num_q_tiles, p.num_kv_tiles):
        raise ValueError(f"hidden has shape {hidden.shape}, expected [head_count, Nq, Nkv] = "
                         f"{(p.head_count, p.num_q_tiles, p.num_kv_tiles)}")
    heads = (np.arange(dag.num_items) // max(dag.items_per_head, 1))[:, None]
    is_dq = (dag.kind == _DQ) & (dag.q_tile >= 0)
    marked = is_dq & hidden[heads, np.maximum(dag.q_tile, 0), np.maximum(dag.kv_tile, 0)]
    return dataclasses.replace(dag, hidden=marked)


def without_hidden_pairs(dag: ScheduleDag, hidden: np.ndarray) -> ScheduleDag:
    """``dag`` with the hidden pairs (as in ``with_hidden_pairs``) dropped from the ticket order
    instead of handed over: a hidden dQ step takes no ticket turn and costs nothing, and a visible
    step waits for the nearest visible step before it in its counter's order (in a kernel: ticket
    = its rank among the tile's visible contributors, computable from the same tile-range test).
    Every wait of the result is one the band's DAG already implied (its chain ran through the
    dropped steps), so no new cycle can form; the simulators check the in-order fetch. The
    hand-over of ``with_hidden_pairs`` keeps each hidden step on the chain (a release and a poll
    per step), which bounds what skipping saves on packed rows; this is the alternative."""
    marked = with_hidden_pairs(dag, hidden).hidden
    flat_pred = dag.pred.reshape(-1)
    skip = marked.reshape(-1)
    target = flat_pred.copy()
    while True:  # the nearest ancestor along the chain that is not dropped
        through = (target >= 0) & skip[np.maximum(target, 0)]
        if not through.any():
            break
        target[through] = flat_pred[target[through]]
    pred = np.where(skip, -1, target).reshape(dag.pred.shape)
    return dataclasses.replace(dag, pred=pred, hidden=None, skipped=marked)


def hidden_pairs_from_data(problem: Problem, *, q_lengths=None, kv_lengths=None,
                           q_segment_ids=None, kv_segment_ids=None) -> np.ndarray:
    """[head_count, Nq, Nkv] pairs that lengths ([batch]) or segment ids ([batch, seq]) hide, by
    the tile test of cuda/mask.h (a tile past a length, or tiles whose id ranges do not meet)."""
    p = problem
    nq, nkv = p.num_q_tiles, p.num_kv_tiles
    hidden = np.zeros((p.batch, nq, nkv), bool)
    m0 = np.arange(nq) * p.block_m
    n0 = np.arange(nkv) * p.block_n
    for b in range(p.batch):
        if q_lengths is not None:
            hidden[b] |= (m0 >= int(q_lengths[b]))[:, None]
        if kv_lengths is not None:
            hidden[b] |= (n0 >= int(kv_lengths[b]))[None, :]
        if q_segment_ids is not None:
            def ranges(ids, block, count, seq):
                ids = np.asarray(ids[b])
                spans = [ids[t * block:min((t + 1) * block, seq)] for t in range(count)]
                return (np.array([x.min() for x in spans]), np.array([x.max() for x in spans]))
            q_lo, q_hi = ranges(q_segment_ids, p.block_m, nq, p.seq_q)
            kv_lo, kv_hi = ranges(kv_segment_ids, p.block_n, nkv, p.seq_kv)
            hidden[b] |= (q_hi[:, None] < kv_lo[None, :]) | (kv_hi[None, :] < q_lo[:, None])
    return np.repeat(hidden, p.num_heads, axis=0)


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
    blocked_items: np.ndarray   # items that never finish (deadlock), started or not
    finish: np.ndarray          # [items, max_steps] finish time of every node (nan: never)
    start: np.ndarray           # [items] start time of each item (nan: never started)
    busy: np.ndarray            # [workers] time spent computing and reducing
    stall: np.ndarray           # [workers] time spent waiting on tickets (between start and end)
    tail: np.ndarray            # [workers] idle time after the worker's last item
    work_bound: float           # total work / workers
    critical_path: list         # [(item, first_step, last_step)] from the end back to time 0
    worker: np.ndarray = None   # [items] the worker that ran each item (-1: never started)
    previous: np.ndarray = None  # [items] the item the worker ran just before (-1: none)

    @property
    def idle_fraction(self) -> float:
        """(stalls + tails) / (workers * makespan)."""
        if not math.isfinite(self.makespan) or self.makespan <= 0:
            return float("nan") if self.deadlocked else 0.0
        return float((self.stall.sum() + self.tail.sum()) / (self.workers * self.makespan))


def simulate(dag: ScheduleDag, *, workers: int | None = None,
             cost: CostModel = CostModel()) -> SimResult:
    """Runs the DAG on ``workers`` persistent workers (default: the problem's wave width) that
    fetch items in order, as the GPU's CTAs do from their atomic counter.

    Worker model (in-order dynamic fetch): items 0..workers-1 start at time 0 on workers
    0..workers-1; whenever a worker finishes an item it takes the smallest item nobody has taken,
    so item g starts at the (g - workers + 1)-th item completion (ties: the smaller finished item
    hands over first). A worker that waits for a ticket keeps its item.

    Node times: every node finishes at max(previous step's finish + compute, ticket predecessor's
    finish) + reduce, a max-plus prefix scan along an item's row, evaluated as far as the ticket
    predecessors are known. Items are handed out by a heap of lower bounds of the started items'
    completions (exact once an item is done): the smallest entry is resolved (its row and,
    depth first, the rows it waits on are evaluated) until the smallest entry is an exact
    completion, which starts the next item. A started item that cannot move because it waits,
    through a chain of rows, on an item that has not started finishes after the next start, so it
    is set aside until then. Nothing left to hand over while items remain unfinished is a
    deadlock (every worker holds an item that waits on an item no worker can take, or rows wait
    on each other in a cycle); ``blocked_items`` says which items never finish. Exact for
    positive step costs.
    """
    p = dag.problem
    workers = _worker_count(p, workers)
    num_items, max_steps = dag.kind.shape
    compute, reduce = _cost_arrays(dag, cost)
    total = np.cumsum(compute + reduce, axis=1)  # S[s]: work up to and including step s
    work = total[:, -1]
    has_pred = dag.pred >= 0
    offset = reduce - total  # pred + reduce - S[s]
    # Node finish times, plus one trailing -inf that "no ticket predecessor" points at.
    flat = np.full(num_items * max_steps + 1, np.nan)
    flat[-1] = -np.inf
    finish = flat[:-1].reshape(num_items, max_steps)
    pred_index = np.where(has_pred, dag.pred, len(flat) - 1)
    pred_list = dag.pred.tolist()
    start = np.full(num_items, np.nan)
    worker = np.full(num_items, -1, np.int64)
    previous = np.full(num_items, -1, np.int64)
    known = [0] * num_items      # finish[g, :known[g]] are final
    started = [False] * num_items

    def evaluate(g):
        """Extends item g's known prefix as far as its ticket predecessors allow."""
        k = known[g]
        if k == max_steps:
            return k
        # F[s] = S[s] + max(start, max_{j <= s} (pred F[j] + offset[j])); resume at s = k.
        base = start[g] if k == 0 else finish[g, k - 1] - total[g, k - 1]
        row = np.maximum.accumulate(flat[pred_index[g, k:]] + offset[g, k:])
        np.maximum(row, base, out=row)  # nan (unknown predecessor) stays nan from there on
        row += total[g, k:]
        unknown = np.isnan(row)
        new = k + (int(unknown.argmax()) if unknown.any() else len(row))
        finish[g, k:new] = row[:new - k]
        known[g] = new
        return new

    def blocker(g):
        """(item, step) holding the ticket predecessor that stops row g."""
        return divmod(pred_list[g][known[g]], max_steps)

    def lower_bound(g):
        """A lower bound of item g's completion, lowered by a rounding margin so that an exact
        completion computed along the row never sorts below it."""
        k = known[g]
        bound = start[g] + work[g] if k == 0 else finish[g, k - 1] + work[g] - total[g, k - 1]
        return float(bound - 1e-9 * (1.0 + abs(bound)))

    def resolve(root):
        """Depth first: evaluates root and the rows it waits on; True if any row moved."""
        moved = False
        stack, visited = [root], {root}
        while stack:
            g = stack[-1]
            before = known[g]
            moved |= evaluate(g) > before
            if known[g] == max_steps:
                stack.pop()
                continue
            z, _ = blocker(g)
            if not started[z] or z in visited:
                stack.pop()
                continue
            visited.add(z)
            stack.append(z)
        return moved

    def waits_on_unstarted_or_cycle(g):
        """Follows the chain of stopped rows from g: True if it ends at an item that has not
        started (or closes a cycle: a deadlock); False if some row of it can move."""
        seen = set()
        while g not in seen:
            seen.add(g)
            z, step = blocker(g)
            if not started[z]:
                return True
            if known[z] > step:
                return False
            if known[z] == max_steps:
                return False
            g = z
        return True

    heap = []       # (completion or a lower bound of it, item)
    set_aside = []  # items that finish after the next start
    next_item = min(workers, num_items)
    for g in range(next_item):
        start[g], worker[g], started[g] = 0.0, g, True
        heap.append((lower_bound(g), g))
    heapq.heapify(heap)
    while heap:
        bound, g = heapq.heappop(heap)
        if known[g] < max_steps:
            while resolve(g) and known[g] < max_steps:
                pass
            if known[g] < max_steps:
                if waits_on_unstarted_or_cycle(g):
                    set_aside.append(g)
                else:
                    heapq.heappush(heap, (lower_bound(g), g))
                continue
        if finish[g, -1] > bound:  # the key was a lower bound (possibly set before g finished)
            heapq.heappush(heap, (float(finish[g, -1]), g))
            continue
        # g is done and nothing left can finish earlier: its worker takes the next item.
        if next_item < num_items:
            time, h = float(finish[g, -1]), next_item
            start[h], worker[h], previous[h], started[h] = time, worker[g], g, True
            next_item += 1
            heapq.heappush(heap, (lower_bound(h), h))
            for s in set_aside:  # they wait on an item that starts at >= time
                heapq.heappush(heap, (max(lower_bound(s), time), s))
            set_aside = []

    done = np.array(known) == max_steps if num_items else np.zeros(0, bool)
    deadlocked = not bool(done.all())
    blocked = np.flatnonzero(~done)
    ran = worker >= 0
    busy = np.bincount(worker[ran], weights=work[ran], minlength=workers)
    if deadlocked:
        makespan = math.inf
        stall = np.full(workers, np.nan)
        tail = np.full(workers, np.nan)
        path = []
    else:
        makespan = float(finish[:, -1].max()) if num_items else 0.0
        end = np.zeros(workers)
        np.maximum.at(end, worker, finish[:, -1])
        stall = end - busy  # a worker takes its next item the moment it is free
        tail = makespan - end
        path = _critical_path(dag, finish, start, total, offset, has_pred, previous)
    return SimResult(schedule=dag.schedule, effective_schedule=dag.effective_schedule,
                     workers=workers, makespan=makespan, deadlocked=deadlocked,
                     blocked_items=blocked, finish=finish, start=start, busy=busy, stall=stall,
                     tail=tail, work_bound=float(work.sum() / workers), critical_path=path,
                     worker=worker, previous=previous)


EARLY_FETCH_MODES = ("never", "safe", "always")


@dataclasses.dataclass(frozen=True)
class FetchResult:
    early: str
    workers: int
    deadlocked: bool
    makespan: float      # inf if deadlocked
    start: np.ndarray    # [items] start of each item's first step (nan: never started)
    finish: np.ndarray   # [items, max_steps] node finish times (nan: never)
    taken: np.ndarray    # [items] when the item was fetched (nan: never)
    fetched_early: int   # items fetched while their worker still held another one


def simulate_fetch(dag: ScheduleDag, *, workers: int | None = None,
                   cost: CostModel = CostModel(), early: str = "never",
                   setup: float = 0.0, release: float = 0.0) -> FetchResult:
    """The in-order fetch of ``simulate``, node by node, with an optional **early fetch** (stage S4
    of the kernel plan): a worker takes its next item as soon as the compute of its current item's
    last step is done (the rest of that item is the dQ writer's tail: the last ticket wait and
    add), and starts it when the current item completes. A worker then holds two items.

    early="never": fetch at completion (``simulate``'s model; the tests check they agree).
    early="always": every worker fetches early.
    early="safe": the early-fetch rule of the kernel plan (section 4.4; not in this repository): ascending, descending and atomic
    always fetch early; shift and symmetric_shift only when the next untaken item lies in a later
    slice of the same head or in another head (else at completion).

    ``setup``: a fixed cost per item between its fetch and its first step (the kernel's unit
    start: the fetch itself, the visit tables, the K/V load), which early fetch overlaps with the
    previous item's tail: an item's first step begins at max(its start, fetch + setup).
    Nodes finish at max(previous node + compute, ticket predecessor) + reduce, as in
    ``simulate``; runnable nodes commit in time order (ties: smaller item first, then a fetch
    before a node of the same item). Nothing runnable while items remain: a deadlock.

    ``release``: an **asynchronous ticket release** (a releaser warp beside the dQ writer). A node's
    add completes at max(previous node's completion + compute, ticket predecessor's release) +
    reduce; its ticket is released ``release`` later by a serial releaser (after the previous
    node's release), and the writer goes on to the next node's ticket from the completion, not the
    release. ``finish`` holds the releases (what successors wait on); an item is done, and its
    worker fetches, at its last release. 0 (the default) is the synchronous writer.
    A simple event simulation for deadlock sweeps on small problems (``simulate`` is the fast one).
    """
    if early not in EARLY_FETCH_MODES:
        raise ValueError(f"early={early!r} must be one of {EARLY_FETCH_MODES}")
    if not (math.isfinite(setup) and setup >= 0):
        raise ValueError(f"setup={setup!r} must be a finite number >= 0")
    if not (math.isfinite(release) and release >= 0):
        raise ValueError(f"release={release!r} must be a finite number >= 0")
    p = dag.problem
    workers = _worker_count(p, workers)
    num_items, max_steps = dag.kind.shape
    compute, reduce = _cost_arrays(dag, cost)
    per_head = max(dag.items_per_head, 1)
    tables = head_tables(dag.schedule, p, 0)
    wave_first = np.asarray(tables["wave_first"])
    sliced = dag.effective_schedule in ("shift", "symmetric_shift")

    def may_fetch_early(g, candidate):
        if early == "never" or candidate >= num_items:
            return False
        if early == "always" or not sliced:
            return True
        same_head = candidate // per_head == g // per_head
        return not (same_head and wave_first[candidate % per_head] == wave_first[g % per_head])

    finish = np.full((num_items, max_steps), np.nan)
    complete = np.full((num_items, max_steps), np.nan)  # the adds (== finish when release == 0)
    start = np.full(num_items, np.nan)
    taken_at = np.full(num_items, np.nan)
    nxt = [0] * num_items
    waiting = {}       # node -> items whose next node waits on it
    held = {}          # item -> the item its worker fetched early (not started yet)
    heap = []          # (time, item, kind, payload): kind 0 = fetch, 1 = node
    last_real = np.maximum(dag.length - 1, 0)
    state = {"taken": 0, "early": 0}

    def offer(g):
        s = nxt[g]
        before = max(start[g], taken_at[g] + setup) if s == 0 else complete[g, s - 1]
        if early != "never" and s == last_real[g]:
            heapq.heappush(heap, (before + compute[g, s], g, 0, 0))  # its math is done then
        pred = int(dag.pred[g, s])
        if pred >= 0 and np.isnan(finish.flat[pred]):
            waiting.setdefault(pred, []).append(g)
            return
        wait = finish.flat[pred] if pred >= 0 else -np.inf
        heapq.heappush(heap, (max(before + compute[g, s], wait) + reduce[g, s], g, 1, 0))

    def take(time):
        h = state["taken"]
        state["taken"] += 1
        taken_at[h] = time
        return h

    for g in range(min(workers, num_items)):
        take(0.0)
        start[g] = 0.0
        offer(g)
    while heap:
        time, g, kind, _ = heapq.heappop(heap)
        if kind == 0:  # g's last step has left the math warps: fetch early if allowed
            if g not in held and may_fetch_early(g, state["taken"]):
                held[g] = take(time)
                state["early"] += 1
            continue
        if kind == 1:
            s = nxt[g]
            complete[g, s] = time
            # (the padding past an item's length releases nothing)
            lag = release if s < dag.length[g] else 0.0
            finish[g, s] = time if release == 0 else \
                max(time, finish[g, s - 1] if s > 0 else -np.inf) + lag
            nxt[g] += 1
            for h in waiting.pop(g * max_steps + s, []):
                offer(h)
            if nxt[g] < max_steps:
                offer(g)
                continue
            if release > 0:  # done at its last release
                heapq.heappush(heap, (finish[g, s], g, 2, 0))
                continue
        # g is complete: its worker starts the item it fetched early, or fetches now.
        h = held.pop(g, None)
        if h is None and state["taken"] < num_items:
            h = take(time)
        if h is not None:
            start[h] = time
            offer(h)
    done = ~np.isnan(finish).any(axis=1) if num_items else np.zeros(0, bool)
    deadlocked = not bool(done.all())
    makespan = math.inf if deadlocked else (float(np.nanmax(finish)) if num_items else 0.0)
    return FetchResult(early=early, workers=workers, deadlocked=deadlocked, makespan=makespan,
                       start=start, finish=finish, taken=taken_at,
                       fetched_early=state["early"])


def _critical_path(dag, finish, start, total, offset, has_pred, previous):
    """Walks back from the last node: which term of the max fixed each finish time (a ticket
    predecessor, or the item's start, i.e. the end of the worker's previous item)."""
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
            if previous[g] < 0 or start[g] == 0:
                break
            g = int(previous[g])
            s = int(dag.length[g]) - 1
    return path


# ---- the warp-specialized pipeline (timing model) ------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PipelineCost:
    """Per-step costs of the warp-specialized backward (cuda/sm90/bwd/), in SM cycles.
    The defaults are the per-role trace of ws-rs at head_dim 128, seq 8k, full mask, descending,
    on an H100 (maintainers/perf-notes.md, fourth session call 1): the math warpgroups' step
    without its waits, the dQ writer's bulk reduction until its shared-memory read is done (the
    dQ buffer is free again) and until the adds are complete, the fence + release of the ticket,
    and the unit's start and epilogue. ``visible`` (a release until the next writer's poll sees
    it) is not traced: a free parameter of the model."""

    math: float = 4240.0
    store: float = 300.0         # the end of the math step that needs a free dQ buffer
    read: float = 1700.0
    complete: float = 10.0
    release: float = 1150.0
    visible: float = 600.0
    unit_start: float = 9300.0
    epilogue: float = 22000.0
    buffers: int = 1             # dQ buffers between the math and the writer
    async_release: bool = False  # a releaser warp fences and releases (the deleted ws-rs-async)

    def __post_init__(self):
        for name in ("math", "store", "read", "complete", "release", "visible", "unit_start",
                     "epilogue"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value < 0:
                raise ValueError(f"PipelineCost.{name}={value!r} must be a finite number >= 0")
        if isinstance(self.buffers, bool) or not isinstance(self.buffers, int) or self.buffers < 1:
            raise ValueError(f"PipelineCost.buffers={self.buffers!r} must be an int >= 1")
        if self.store > self.math:
            raise ValueError(f"PipelineCost.store={self.store!r} is part of the math step "
                             f"(math={self.math!r}): it cannot be longer")


@dataclasses.dataclass
class PipelineResult:
    workers: int
    makespan: float           # inf if deadlocked
    deadlocked: bool
    steps: int                # dQ steps run
    math_per_step: float      # the math role's cycles a step: waits, unit start, epilogue in
    buffer_wait: float        # per step: the math waiting for a free dQ buffer
    ticket_wait: float        # per step: the writer waiting for its ticket after its previous step


def simulate_pipeline(dag: ScheduleDag, *, workers: int | None = None,
                      cost: PipelineCost = PipelineCost()) -> PipelineResult:
    """A timing model of the warp-specialized backward: per worker (CTA) the math role and the dQ
    writer run concurrently, coupled by ``cost.buffers`` dQ buffers; each step's reduction waits
    for the ticket of the step before it in the counter's order (``dag.pred``) to become visible.
    Items are fetched in order as in ``simulate``; a worker starts its next item once the math has
    stored the item's dK/dV (``epilogue``) and the writer has released its last ticket. Where
    ``simulate`` charges each step compute + reduce in series, here the math of step s + 1 runs
    while the writer reduces step s, so the model can say which role or which hand-over sets the
    pace (the question the fourth session's ws-rs-async run raised). MHA and the dQ steps only
    (no GQA dK/dV reduction steps); pairs the data hides cost the math nothing and the writer its
    ticket hand-over (``with_hidden_pairs``), or nothing at all (``without_hidden_pairs``).
    """
    p = dag.problem
    if (dag.kind == _DKV).any():
        raise ValueError("simulate_pipeline models MHA only (no dK/dV reduction steps): "
                         f"num_heads={p.num_heads}, num_kv_heads={p.num_kv_heads}")
    workers = _worker_count(p, workers)
    num_items, max_steps = dag.kind.shape
    length = dag.length.astype(np.int64)
    hidden = dag.hidden if dag.hidden is not None else np.zeros(dag.kind.shape, bool)
    skipped = dag.skipped if dag.skipped is not None else np.zeros(dag.kind.shape, bool)
    hidden = hidden | skipped
    nodes = num_items * max_steps
    math_done = np.full(nodes, np.nan)
    read_done = np.full(nodes, np.nan)
    visible = np.full(nodes, np.nan)
    pred = dag.pred.reshape(-1)
    m_next = np.zeros(num_items, np.int64)
    w_next = np.zeros(num_items, np.int64)
    m_busy = np.zeros(num_items, bool)
    w_busy = np.zeros(num_items, bool)
    released_until = np.full(num_items, -np.inf)  # the releaser's last release (async)
    math_end = np.full(num_items, np.nan)
    writer_end = np.full(num_items, np.nan)
    item_start = np.full(num_items, np.nan)
    writer_free = np.zeros(num_items)  # when the writer finished its previous step
    waiting = {}
    heap = []
    order = [0]
    totals = {"buffer": 0.0, "ticket": 0.0}
    state = {"taken": 0, "end": 0.0}
    finished = np.zeros(num_items, bool)
    store_waits = {}  # item -> (step, time its math body ended) waiting for a dQ buffer
    MATH, READ, WEND, VIS, EPI, BODY = range(6)

    def push(time, kind, g, s):
        order[0] += 1
        heapq.heappush(heap, (time, order[0], kind, g, s))

    def start_item(g, time):
        item_start[g] = time
        writer_free[g] = time
        if length[g] == 0:
            math_end[g] = writer_end[g] = time
            push(time, EPI, g, -1)
            return
        try_math(g, time + cost.unit_start)

    def try_math(g, time):
        s = int(m_next[g])
        if m_busy[g] or (s == length[g] and not np.isnan(math_end[g])):
            return
        if s == length[g]:  # every step's dQ is handed over: the dK/dV epilogue
            math_end[g] = time + cost.epilogue
            push(math_end[g], EPI, g, -1)
            return
        m_busy[g] = True
        m_next[g] += 1
        push(time + (0.0 if hidden[g, s] else cost.math - cost.store), BODY, g, s)

    def store_dq(g, s, time):
        """Step s's math body is done at ``time``: its dQ store needs a free buffer."""
        if s >= cost.buffers:
            freed = read_done[g * max_steps + s - cost.buffers]
            if np.isnan(freed):
                store_waits[g] = (s, time)  # READ of that step resumes it
                return
        push(time + (0.0 if hidden[g, s] else cost.store), MATH, g, s)

    def try_writer(g, time):
        s = int(w_next[g])
        if w_busy[g] or s >= length[g]:
            return
        node = g * max_steps + s
        if np.isnan(math_done[node]):
            return
        q = int(pred[node])
        if q >= 0 and np.isnan(visible[q]):
            waiting.setdefault(q, []).append(g)
            return
        if q >= 0:  # as the trace counts it: from the writer's previous step to the ticket
            totals["ticket"] += max(0.0, visible[q] - writer_free[g])
        w_busy[g] = True
        w_next[g] += 1
        push(time + (0.0 if hidden[g, s] else cost.read), READ, g, s)

    def finish_item(g, time):
        finished[g] = True
        state["end"] = max(state["end"], time)
        if state["taken"] < num_items:
            h = state["taken"]
            state["taken"] += 1
            start_item(h, time)

    for g in range(min(workers, num_items)):
        state["taken"] += 1
        start_item(g, 0.0)
    while heap:
        time, _, kind, g, s = heapq.heappop(heap)
        node = g * max_steps + s
        if kind == MATH:
            math_done[node] = time
            m_busy[g] = False
            try_math(g, time)
            try_writer(g, time)
        elif kind == BODY:
            store_dq(g, s, time)
        elif kind == READ:
            read_done[node] = time
            waiting_store = store_waits.get(g)
            if waiting_store is not None and waiting_store[0] - cost.buffers == s:
                del store_waits[g]
                totals["buffer"] += time - waiting_store[1]
                store_dq(g, waiting_store[0], time)
            adds = time + (0.0 if hidden[g, s] else cost.complete)
            turn = 0.0 if skipped[g, s] else cost.release  # a dropped step releases nothing
            if cost.async_release:
                release = max(adds, released_until[g]) + turn
                released_until[g] = release
                push(adds, WEND, g, s)
            else:
                release = adds + turn
                push(release, WEND, g, s)
            push(release + (0.0 if skipped[g, s] else cost.visible), VIS, g, s)
            if s == length[g] - 1:
                writer_end[g] = release
                push(release, EPI, g, -1)
        elif kind == WEND:
            w_busy[g] = False
            writer_free[g] = time
            try_writer(g, time)
        elif kind == VIS:
            visible[node] = time
            for h in waiting.pop(node, []):
                try_writer(h, time)
        elif kind == EPI:
            if not finished[g] and not np.isnan(math_end[g]) and \
                    not np.isnan(writer_end[g]) and time >= max(math_end[g], writer_end[g]):
                finish_item(g, time)
    steps = int(length.sum())
    done = bool(finished.all())
    makespan = state["end"] if done else math.inf
    spans = math_end - item_start  # as the trace counts: unit start and epilogue included
    math_per_step = float(np.nansum(spans) / steps) if steps else 0.0
    return PipelineResult(workers=workers, makespan=makespan, deadlocked=not done, steps=steps,
                          math_per_step=math_per_step,
                          buffer_wait=totals["buffer"] / steps if steps else 0.0,
                          ticket_wait=totals["ticket"] / steps if steps else 0.0)


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
        raise SystemExit("--plot needs matplotlib: python -m pip install matplotlib "
                         "(or, in a jax_dash checkout, python -m pip install \".[plot]\")") from exc
    fig, axes = plt.subplots(len(results), 1, figsize=(14, 2.2 + 0.09 * max_workers *
                                                       len(results)), squeeze=False)
    # Head colours from tab20 without its two reds, which would read as ticket stalls.
    palette = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (6, 7)]
    for ax, r, dag in zip(axes[:, 0], results, dags):
        shown = min(r.workers, max_workers)
        per_head = max(dag.items_per_head, 1)
        for g in range(dag.num_items):
            w = int(r.worker[g])
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


def _worker_count(problem, workers):
    """The simulators' worker count: the problem's wave, or ``workers`` (>= 1)."""
    workers = problem.wave if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    return workers


def _cost_arrays(dag, cost):
    """[items, max_steps] compute and reduce cost of every node (hidden pairs: a handoff)."""
    real = dag.kv_tile >= 0
    compute = np.where(real & (dag.kind == _DQ), cost.compute, 0.0)
    reduce = np.where(real, np.where(dag.kind == _DQ, cost.reduce, cost.dkv_reduce), 0.0)
    if dag.hidden is not None:
        compute = np.where(dag.hidden, 0.0, compute)
        reduce = np.where(dag.hidden, cost.handoff, reduce)
    if dag.skipped is not None:
        compute = np.where(dag.skipped, 0.0, compute)
        reduce = np.where(dag.skipped, 0.0, reduce)
    return compute, reduce


def _step_costs(dag, g, cost):
    compute, reduce = _cost_arrays(dag, cost)
    return compute[g] + reduce[g]


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
    parser.add_argument("--window", type=int, nargs=2, default=None, metavar=("LEFT", "RIGHT"),
                        help="local_window_size (left, right): the band")
    parser.add_argument("--sms", type=int, default=int(_ext.CPU_WAVE),
                        help="resident backward CTAs = the wave width (default: the CPU kernels' "
                        f"wave, {int(_ext.CPU_WAVE)}, that of an H100/H200 SXM)")
    parser.add_argument("--compute", type=float, default=CostModel.compute, help="c per tile")
    parser.add_argument("--reduce", type=float, default=CostModel.reduce, help="r per dQ add")
    parser.add_argument("--plot", default=None, help="write a Gantt chart (PNG) here")
    args = parser.parse_args(argv)
    try:
        problem = make_problem(batch=args.batch, num_heads=args.heads, num_kv_heads=args.kv_heads,
                               seq_q=args.seq, seq_kv=args.seq_kv or args.seq,
                               head_dim=args.head_dim, is_causal=args.causal, wave=args.sms,
                               window=None if args.window is None else tuple(args.window))
        cost = CostModel(compute=args.compute, reduce=args.reduce)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"batch {problem.batch}, heads {problem.num_heads} (kv {problem.num_kv_heads}), "
          f"seq {problem.seq_q}x{problem.seq_kv}, tiles {problem.block_m}x{problem.block_n} "
          f"-> Nq {problem.num_q_tiles}, Nkv {problem.num_kv_tiles}, "
          f"{'causal' if problem.is_causal else 'full'}"
          f"{'' if problem.window is None else f', window {problem.window}'}, wave {problem.wave}, "
          f"c {cost.compute}, r {cost.reduce}")
    dags = [build_dag(name, problem) for name in SCHEDULE_IDS]
    results = [simulate(dag, cost=cost) for dag in dags]
    print(format_table(results))
    auto = choose_schedule(seq_q=problem.seq_q, seq_kv=problem.seq_kv, head_dim=args.head_dim,
                           is_causal=problem.is_causal, wave=problem.wave, window=problem.window)
    print(f'schedule="auto" picks: {auto} (per-head rule over {", ".join(AUTO_CANDIDATES)}; '
          'see choose_schedule)')
    if args.plot:
        plot_gantt(results, dags, args.plot, cost=cost)
        print(f"Gantt chart written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
