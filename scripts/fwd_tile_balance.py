"""Load balance of the Hopper forward's tile order, in a simple cost model.

Both forward kernels take query tiles in one grid order (cuda/sm90/fwd/scheduler.cuh,
``FwdTileOrder``): groups of about one wave of heads, heaviest tile first inside each, and the last
``TAIL_GROUPS`` groups taken together as one block. Both hand the tiles out greedily: the one-tile
kernel's CTAs through the hardware's block scheduler (a CTA starts as an SM frees), the persistent
kernel's through an atomic tile counter (each CTA takes the next slot when its producer is done
with the current tile). This module mirrors the order exactly (the same index arithmetic as
``tile_at``) and rates it in a model where a tile costs its KV steps plus a fixed overhead, against
the static orders the persistent kernel had before (``snake``: single tiles round by round, every
other round reversed; ``pairs``: each head's k-th heaviest and k-th lightest causal tile side by side,
round robin) and against the order without the merged tail.

    python scripts/fwd_tile_balance.py          # the paper grid's causal points, H100 (132 SMs)

The model has no memory system: it answers "which order balances the CTAs", not "how fast".
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

TAIL_GROUPS = 3  # cuda/sm90/fwd/scheduler.cuh kTailGroups
PERSISTENT_OVERHEAD = 0.5  # KV steps a tile, the persistent kernel (its prologue and epilogue hidden)
ONE_TILE_OVERHEAD = 2.5    # the one-tile kernel


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
    def num_tiles(self) -> int:
        return self.num_m_blocks * self.heads_total

    @property
    def group_heads(self) -> int:  # launch_fwd: about one wave of tiles per group of heads
        per_wave = math.ceil(self.sms / self.num_m_blocks)
        return min(self.heads_total, max(1, per_wave))

    def tail_first_head(self, tail_groups: int = TAIL_GROUPS) -> int:  # launch_fwd
        groups = math.ceil(self.heads_total / self.group_heads)
        return max(0, groups - tail_groups) * self.group_heads

    def kv_steps(self, m_block: int) -> int:
        if not self.causal:
            return self.num_kv_blocks
        row_last = min((m_block + 1) * self.block_m, self.seq) - 1
        return min(self.num_kv_blocks, row_last // self.block_n + 1)


def tile_at(p: Problem, slot: int, tail_groups: int = TAIL_GROUPS) -> tuple[int, int]:
    """(head, m_block) of a slot of the grid order (the kernel's FwdTileOrder::at)."""
    tail_head = p.tail_first_head(tail_groups)
    tail_slot = tail_head * p.num_m_blocks
    if slot < tail_slot:
        group, in_group = divmod(slot, p.group_heads * p.num_m_blocks)
        rank, head_in_group = divmod(in_group, p.group_heads)
        head = group * p.group_heads + head_in_group
    else:
        rank, head_in_tail = divmod(slot - tail_slot, p.heads_total - tail_head)
        head = tail_head + head_in_tail
    return head, p.num_m_blocks - 1 - rank


def greedy_makespan(p: Problem, overhead: float, tail_groups: int = TAIL_GROUPS) -> float:
    """The grid order handed out greedily: each slot to the CTA that frees first (the persistent
    kernel's tile counter, or the one-tile kernel's block scheduler)."""
    free = [(0.0, cta) for cta in range(min(p.sms, p.num_tiles))]
    for slot in range(p.num_tiles):
        _, m = tile_at(p, slot, tail_groups)
        start, cta = heapq.heappop(free)
        heapq.heappush(free, (start + overhead + p.kv_steps(m), cta))
    return max(t for t, _ in free)


def static_makespan(p: Problem, pairs: bool, overhead: float = PERSISTENT_OVERHEAD) -> float:
    """The persistent kernel's static orders before the tile counter (for comparison): pairs (each
    head's k-th heaviest and k-th lightest causal tile, a CTA taking pairs round robin) or snake
    (single tiles, heaviest first in groups, round by round, every other round reversed)."""
    loads: list[float] = []
    if pairs:
        units = []
        for group_first in range(0, p.heads_total, p.group_heads):
            size = min(p.group_heads, p.heads_total - group_first)
            for k in range((p.num_m_blocks + 1) // 2):
                for _ in range(size):
                    heavy = p.num_m_blocks - 1 - k
                    cost = overhead + p.kv_steps(heavy)
                    if k < heavy:
                        cost += overhead + p.kv_steps(k)
                    units.append(cost)
        grid = min(len(units), p.sms)
        loads = [0.0] * grid
        for i, cost in enumerate(units):
            loads[i % grid] += cost
    else:
        grid = min(p.num_tiles, p.sms)
        loads = [0.0] * grid
        for slot in range(p.num_tiles):
            _, m = tile_at(p, slot, tail_groups=1)
            r, b = divmod(slot, grid)
            loads[grid - 1 - b if r % 2 else b] += overhead + p.kv_steps(m)
    return max(loads)


def ideal(p: Problem, overhead: float = PERSISTENT_OVERHEAD) -> float:
    work = sum(p.kv_steps(m) for m in range(p.num_m_blocks)) * p.heads_total
    return (work + overhead * p.num_tiles) / p.sms


def main() -> None:
    # The paper grid: batch * seq = 16k tokens, heads * head_dim = 2048; the tile table's forward
    # tiles (192 x 128 at head_dim 64, 128 x 128 at 128; 128-row tiles at head_dim 64 up to 1k
    # causal).
    print("causal forward, makespan over the ideal (KV steps; overheads "
          f"{PERSISTENT_OVERHEAD} persistent, {ONE_TILE_OVERHEAD} one-tile)")
    print(f"{'point':24s} {'greedy':>8s} {'no tail':>8s} {'pairs':>8s} {'snake':>8s} {'one-tile':>9s}")
    for hd, (bm, bn) in ((64, (128, 128)), (64, (192, 128)), (128, (128, 128))):
        for seq in (512, 1024, 2048, 4096, 8192, 16384):
            p = Problem(16384 // seq, 2048 // hd, seq, bm, bn)
            base = ideal(p)
            cells = [greedy_makespan(p, PERSISTENT_OVERHEAD) / base - 1,
                     greedy_makespan(p, PERSISTENT_OVERHEAD, tail_groups=1) / base - 1]
            pairs = static_makespan(p, True) / base - 1 if bm % bn == 0 else None
            snake = static_makespan(p, False) / base - 1
            one = greedy_makespan(p, ONE_TILE_OVERHEAD) / ideal(p, ONE_TILE_OVERHEAD) - 1
            text = " ".join(f"{c:+8.1%}" for c in cells)
            pairs_text = f"{pairs:+8.1%}" if pairs is not None else f"{'-':>8s}"
            print(f"hd{hd} {bm}-row causal {seq:5d}  {text} {pairs_text} {snake:+8.1%} {one:+9.1%}")


if __name__ == "__main__":
    main()
