"""The forward's tile order (cuda/sm90/fwd/scheduler.cuh: FwdTileOrder), through its mirror in
scripts/fwd_tile_balance.py: the order visits every (head, query tile) exactly once whatever the
head count, group size, tail and tile count; each block of heads goes heaviest tile first; and in
the model the greedy hand-out of the order (the persistent kernel's tile counter) balances the
causal points that the static orders before it left uneven. The mirror is written by hand from the
kernel; the GPU tests (test_gpu.py: the persistent kernel's bits and accuracy at every length)
check the kernel itself."""

import importlib.util
import itertools
import pathlib
import sys

import pytest

_PATH = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "fwd_tile_balance.py"


@pytest.fixture(scope="module")
def tb():
    spec = importlib.util.spec_from_file_location("fwd_tile_balance", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _problems(tb):
    for batch, heads, seq, (bm, bn), sms in itertools.product(
            (1, 3), (1, 2, 5, 16), (100, 128, 384, 640, 1000, 2048), ((128, 128), (192, 128),
                                                                     (128, 64)),
            (1, 4, 7, 132)):
        yield tb.Problem(batch, heads, seq, bm, bn, causal=True, sms=sms)


def test_every_tile_is_visited_once(tb):
    checked = tails = 0
    for p in _problems(tb):
        expected = sorted((h, m) for h in range(p.heads_total) for m in range(p.num_m_blocks))
        for tail_groups in (1, tb.TAIL_GROUPS):
            seen = sorted(tb.tile_at(p, slot, tail_groups) for slot in range(p.num_tiles))
            assert seen == expected, (p, tail_groups)
            checked += 1
        tails += 0 < p.tail_first_head() < p.heads_total
    assert checked > 100 and tails > 10


def test_each_block_of_heads_goes_heaviest_first(tb):
    """Within a group of heads, and within the merged tail, a slot's query tile is never heavier
    than an earlier slot's of the same block."""
    for p in _problems(tb):
        tail_head = p.tail_first_head()
        previous_block, previous_steps = None, None
        for slot in range(p.num_tiles):
            head, m = tb.tile_at(p, slot)
            block = "tail" if head >= tail_head else head // p.group_heads
            steps = p.kv_steps(m)
            if block == previous_block:
                assert steps <= previous_steps, (p, slot)
            previous_block, previous_steps = block, steps


@pytest.mark.parametrize("seq", [2048, 4096, 8192, 16384])
def test_the_greedy_order_balances_the_hd128_causal_points(tb, seq):
    p = tb.Problem(16384 // seq, 16, seq, 128, 128)
    greedy = tb.greedy_makespan(p, tb.PERSISTENT_OVERHEAD)
    assert greedy <= 1.02 * tb.ideal(p)
    # the static pairs it replaced: every CTA a whole number of pairs (1,024 on 132 SMs at 2k-8k)
    assert greedy <= tb.static_makespan(p, pairs=True)
    # and the merged tail is what gets it there at 2k-8k
    if seq <= 8192:
        assert greedy < tb.greedy_makespan(p, tb.PERSISTENT_OVERHEAD, tail_groups=1)
