"""The persistent forward's tile orders (cuda/sm90/fwd/scheduler.cuh: FwdTileOrder, for_each_tile), through
their mirror in scripts/fwd_tile_balance.py: every CTA grid visits every (head, query tile) exactly
once, in both orders, whatever the head count, group size and parity of the tile count; a pair is
one head's k-th heaviest and k-th lightest tile; and in the model pairing balances the causal
points that the snake order leaves uneven. The mirror is written by hand from the kernel; the GPU
tests (test_gpu.py: the persistent kernel's bits and accuracy) check the kernel itself."""

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
            (1, 3), (1, 2, 5), (100, 128, 384, 640, 1000), ((128, 128), (192, 128), (128, 64)),
            (1, 4, 7, 132)):
        yield tb.Problem(batch, heads, seq, bm, bn, causal=True, sms=sms)


def test_every_tile_is_visited_once(tb):
    checked = 0
    for p in _problems(tb):
        expected = sorted((h, m) for h in range(p.heads_total) for m in range(p.num_m_blocks))
        for pairs in (False, True):
            if pairs and not tb.pairs_apply(p):
                continue
            grid = tb.persistent_grid(p, pairs)
            seen = []
            for cta in range(grid):
                for slot in tb.cta_slots(p, cta, grid, pairs):
                    tile = tb.tile_at(p, slot, pairs)
                    if tile is not None:
                        seen.append(tile)
            assert sorted(seen) == expected, (p, pairs)
            checked += 1
    assert checked > 100


def test_a_pair_is_one_heads_heavy_and_light_tile(tb):
    for p in _problems(tb):
        if not tb.pairs_apply(p):
            continue
        num_slots = 2 * ((p.num_m_blocks + 1) // 2) * p.heads_total
        empty = 0
        for slot in range(0, num_slots, 2):
            head, heavy = tb.tile_at(p, slot, True)
            light = tb.tile_at(p, slot + 1, True)
            if light is None:  # an odd tile count: the middle tile alone
                empty += 1
                assert heavy == (p.num_m_blocks - 1) // 2
                continue
            assert light[0] == head and light[1] + heavy == p.num_m_blocks - 1, (p, slot)
            if p.seq % p.block_m == 0:  # whole tiles: every pair has the same KV steps
                assert p.kv_steps(heavy) + p.kv_steps(light[1]) == p.num_kv_blocks + \
                    p.block_m // p.block_n, (p, slot)
        assert empty == (p.heads_total if p.num_m_blocks % 2 else 0)


@pytest.mark.parametrize("seq", [2048, 4096, 8192, 16384])
def test_pairs_balance_the_hd128_causal_points(tb, seq):
    p = tb.Problem(16384 // seq, 16, seq, 128, 128)
    ideal = tb.ideal(p)
    pairs = tb.persistent_makespan(p, pairs=True)
    assert pairs <= 1.05 * ideal
    assert pairs <= tb.persistent_makespan(p, pairs=False) * 1.01
