// Tile schedulers of the sm90 forward: which query tiles a CTA computes, in which order. Both
// take the tiles in one grid order (FwdTileOrder); the launch picks the scheduler by type, and
// each gives the grid size it was written for (grid_size).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/sm90/async_ops.cuh"
#include "cuda/tiles.h"

namespace jax_dash::sm90::fwd {

// A query tile's place: its query block and (batch, head). empty: the light slot of a causal pair
// whose two tiles coincide (an odd count of query tiles); it computes and writes nothing.
struct TileCoord {
  int m_block, head, batch;
  bool empty;
};

// Heaviest query tiles (causal: the last ones) first across each group of heads, so that the tail
// of each group, and of the grid, holds the short tiles. Group g holds heads [g * group_heads, ...)
// (the last group may hold fewer). pairs (persistent, causal, fwd_block_m a multiple of
// fwd_block_n): slots 2i and 2i + 1 of a group hold the heavy and the light tile of pair i, whose
// head is the group's (i % group_size)-th and whose rank k is i / group_size: query tiles
// num_m_blocks - 1 - k and k, whose KV lengths add up to the same total for every k.
template <class Params>
struct FwdTileOrder {
  const Params& p;
  int64_t heads_total;
  bool pairs;
  int pair_slots;     // pairs: slots per head (an odd count of query tiles leaves one empty)
  int64_t num_slots;  // tiles, or with pairs slots, of the whole grid

  __device__ FwdTileOrder(const Params& params, bool persistent) : p(params) {
    heads_total = int64_t(p.num_heads) * p.batch;
    const int64_t num_tiles = int64_t(p.num_m_blocks) * heads_total;
    pairs = persistent && p.pair_causal;
    pair_slots = 2 * ((p.num_m_blocks + 1) / 2);
    num_slots = pairs ? int64_t(pair_slots) * heads_total : num_tiles;
  }

  __device__ __forceinline__ TileCoord at(int64_t slot) const {
    TileCoord c;
    const int per_head = pairs ? pair_slots : p.num_m_blocks;
    const int64_t group_tiles = int64_t(p.group_heads) * per_head;
    const int64_t group = slot / group_tiles;
    const int64_t in_group = slot - group * group_tiles;
    const int64_t first_head = group * p.group_heads;
    const int64_t group_size = min(int64_t(p.group_heads), heads_total - first_head);
    c.empty = false;
    int64_t bh;
    if (pairs) {
      const int64_t pair = in_group / 2;
      const int k = int(pair / group_size);
      const int heavy = p.num_m_blocks - 1 - k;
      bh = first_head + pair % group_size;
      c.m_block = in_group % 2 == 0 ? heavy : k;
      c.empty = in_group % 2 == 1 && k >= heavy;
      if (c.empty) c.m_block = p.num_m_blocks;  // past the last query row: nothing to write
    } else {
      c.m_block = p.num_m_blocks - 1 - int(in_group / group_size);
      bh = first_head + in_group % group_size;
    }
    c.head = int(bh % p.num_heads);
    c.batch = int(bh / p.num_heads);
    return c;
  }
};

// One query tile per CTA, tile blockIdx.x of the grid order.
template <class Params>
struct FwdOneTileScheduler {
  static constexpr bool kPersistent = false;
  FwdTileOrder<Params> order;

  __device__ explicit FwdOneTileScheduler(const Params& p) : order(p, false) {}

  template <class Body>
  __device__ __forceinline__ void for_each_tile(Body&& body) const {
    body(order.at(int64_t(blockIdx.x)));
  }

  static int64_t grid_size(int64_t num_tiles, int64_t num_pairs, bool pairs, int sms) {
    return num_tiles;
  }
};

// One CTA per SM (the math warps' 240 or 160 registers allow no second), each looping over its
// tiles. Round r gives CTA b tile r * G + b on even rounds and r * G + (G - 1 - b) on odd ones
// (G = gridDim.x), a bijection on every round, the last partial one included. With the heaviest
// tiles first in each group of about one wave, a plain grid stride gave CTA 0 the heaviest causal
// tile of every group (2026-11-24, call 6: causal 2k +65% against ws). pairs: round r gives CTA b
// slots r * 2G + 2b and + 1 (pairs of equal work: plain round robin).
template <class Params>
struct FwdPersistentTileScheduler {
  static constexpr bool kPersistent = true;
  FwdTileOrder<Params> order;

  __device__ explicit FwdPersistentTileScheduler(const Params& p) : order(p, true) {}

  // One loop and one call of body: a second copy of the tile body made ptxas spill.
  template <class Body>
  __device__ __forceinline__ void for_each_tile(Body&& body) const {
    const int64_t G = gridDim.x;
    const int per_round = order.pairs ? 2 : 1;
    const int64_t steps = ceil_div(order.num_slots, per_round * G) * per_round;
    for (int64_t i = 0; i < steps; ++i) {
      const int64_t r = order.pairs ? i / 2 : i;
      const int64_t t = order.pairs ? r * 2 * G + 2 * int64_t(blockIdx.x) + (i & 1)
                                    : r * G + ((r & 1) ? G - 1 - blockIdx.x : blockIdx.x);
      if (t < order.num_slots) body(order.at(t));
    }
  }

  // One CTA per pair at most with pairs.
  static int64_t grid_size(int64_t num_tiles, int64_t num_pairs, bool pairs, int sms) {
    return std::min<int64_t>(pairs ? num_pairs : num_tiles, sms);
  }
};

// The persistent kernel's scheduler, or the one-tile kernel's.
template <bool kPersistent, class Params>
using FwdScheduler = std::conditional_t<kPersistent, FwdPersistentTileScheduler<Params>,
                                        FwdOneTileScheduler<Params>>;

}  // namespace jax_dash::sm90::fwd
