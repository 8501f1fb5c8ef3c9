"""Load balance of the Hopper forward's persistent tile orders, in a simple cost model.

The persistent forward (cuda/sm90/fwd/scheduler.cuh, ``JAX_DASH_SM90_FWD=ws-persistent``) gives each of
its G CTAs a static list of query tiles. This module mirrors its two orders exactly (the same index
arithmetic as ``tile_at`` and ``for_each_tile``) and rates them in a model where a tile costs its
KV steps plus a fixed overhead:

- ``snake``: single tiles, heaviest first inside groups of about one wave of heads, handed out
  round by round, every other round in reverse;
- ``pairs`` (causal, ``fwd_block_m`` a multiple of ``fwd_block_n``): the k-th heaviest and the
  k-th lightest query tile of a head side by side, their KV lengths adding up to the same total,
  two slots a CTA a round;
- ``one_tile``: the one-tile grid, tiles in the same order as ``snake`` but each going to the
  first CTA slot that frees (the hardware's block scheduler), with a larger per-tile overhead.

    python scripts/fwd_tile_balance.py          # the paper grid's causal points, H100 (132 SMs)

The model has no memory system: it answers "which static order balances the CTAs", not "how fast".
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    batch: int
    heads: int
    seq: int
    block_m: int
    block_n: int
    causal: bool = True
    sms: int = 132

    @property
    def num_m_blocks(self) -> int:
        return math.ceil(self.seq / self.block_m)

    @property
    def num_kv_blocks(self) -> int:
        return math.ceil(self.seq / self.block_n)

    @property
    def heads_total(self) -> int:
        return self.batch * self.heads

    @property
    def group_heads(self) -> int:  # launch_fwd: about one wave of tiles per group of heads
        per_wave = math.ceil(self.sms / self.num_m_blocks)
        return min(self.heads_total, max(1, per_wave))

    def kv_steps(self, m_block: int) -> int:
        if not self.causal:
            return self.num_kv_blocks
        row_last = min((m_block + 1) * self.block_m, self.seq) - 1
        return min(self.num_kv_blocks, row_last // self.block_n + 1)


def pairs_apply(p: Problem) -> bool:
    """launch_fwd's rule for pairing causal tiles."""
    return p.causal and p.block_m % p.block_n == 0


def tile_at(p: Problem, slot: int, pairs: bool) -> tuple[int, int] | None:
    """(head, m_block) of a slot, or None for the empty slot of a pair (the kernel's tile_at)."""
    pair_slots = 2 * ((p.num_m_blocks + 1) // 2)
    per_head = pair_slots if pairs else p.num_m_blocks
    group_tiles = p.group_heads * per_head
    group, in_group = divmod(slot, group_tiles)
    first_head = group * p.group_heads
    group_size = min(p.group_heads, p.heads_total - first_head)
    if pairs:
        pair = in_group // 2
        k = pair // group_size
        heavy = p.num_m_blocks - 1 - k
        head = first_head + pair % group_size
        if in_group % 2 == 0:
            return head, heavy
        return (head, k) if k < heavy else None
    return first_head + in_group % group_size, p.num_m_blocks - 1 - in_group // group_size


def cta_slots(p: Problem, cta: int, grid: int, pairs: bool) -> list[int]:
    """The slots CTA `cta` of `grid` visits, in order (the kernel's for_each_tile)."""
    num_slots = (2 * ((p.num_m_blocks + 1) // 2) if pairs else p.num_m_blocks) * p.heads_total
    per_round = 2 if pairs else 1
    steps = math.ceil(num_slots / (per_round * grid)) * per_round
    out = []
    for i in range(steps):
        if pairs:
            r = i // 2
            t = r * 2 * grid + 2 * cta + (i & 1)
        else:
            r = i
            t = r * grid + ((grid - 1 - cta) if r & 1 else cta)
        if t < num_slots:
            out.append(t)
    return out


def persistent_grid(p: Problem, pairs: bool) -> int:
    units = math.ceil(p.num_m_blocks / 2) * p.heads_total if pairs else \
        p.num_m_blocks * p.heads_total
    return min(units, p.sms)


def persistent_makespan(p: Problem, pairs: bool, overhead: float = 0.5) -> float:
    grid = persistent_grid(p, pairs)
    worst = 0.0
    for cta in range(grid):
        cost = 0.0
        for slot in cta_slots(p, cta, grid, pairs):
            tile = tile_at(p, slot, pairs)
            if tile is not None:
                cost += overhead + p.kv_steps(tile[1])
        worst = max(worst, cost)
    return worst


def one_tile_makespan(p: Problem, overhead: float = 2.5) -> float:
    free = [(0.0, cta) for cta in range(p.sms)]
    for slot in range(p.num_m_blocks * p.heads_total):
        _, m = tile_at(p, slot, pairs=False)
        start, cta = heapq.heappop(free)
        heapq.heappush(free, (start + overhead + p.kv_steps(m), cta))
    return max(t for t, _ in free)


def ideal(p: Problem, overhead: float = 0.5) -> float:
    tiles = p.num_m_blocks * p.heads_total
    work = sum(p.kv_steps(m) for m in range(p.num_m_blocks)) * p.heads_total
    return (work + overhead * tiles) / p.sms


def main() -> None:
    # The paper grid: batch * seq = 16k tokens, heads * head_dim = 2048; the tile table's forward
    # tiles (192 x 128 at head_dim 64, 128 x 128 at 128).
    print("causal forward, makespan over the ideal (KV steps; overheads 0.5 persistent, 2.5 one-tile)")
    print(f"{'point':18s} {'snake':>8s} {'pairs':>8s} {'one-tile':>9s}")
    for hd, (bm, bn) in ((64, (192, 128)), (128, (128, 128))):
        for seq in (2048, 4096, 8192, 16384):
            p = Problem(16384 // seq, 2048 // hd, seq, bm, bn)
            base = ideal(p)
            snake = persistent_makespan(p, pairs=False) / base - 1
            pairs = persistent_makespan(p, pairs=True) / base - 1 if pairs_apply(p) else None
            one = one_tile_makespan(p) / base - 1
            pairs_text = f"{pairs:+8.1%}" if pairs is not None else f"{'-':>8s}"
            print(f"hd{hd} causal {seq:5d}  {snake:+8.1%} {pairs_text} {one:+9.1%}")


if __name__ == "__main__":
    main()
