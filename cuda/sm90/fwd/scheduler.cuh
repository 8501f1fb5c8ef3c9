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

// Slots of one head in the grid order: its query tiles, or with pairs twice the pairs (an odd
// count of query tiles leaves one slot empty). The launch sizes the tile order's divisors with it.
__host__ __device__ __forceinline__ int fwd_slots_per_head(int num_m_blocks, bool pairs) {
  const int pair_slots = 2 * ((num_m_blocks + 1) / 2);
  return pairs ? pair_slots : num_m_blocks;
}

// Heaviest query tiles (causal: the last ones) first across each group of heads, so that the tail
// of each group, and of the grid, holds the short tiles. Group g holds heads [g * group_heads, ...)
// (the last group may hold fewer). pairs (persistent, causal, fwd_block_m a multiple of
// fwd_block_n): slots 2i and 2i + 1 of a group hold the heavy and the light tile of pair i, whose
// head is the group's (i % group_size)-th and whose rank k is i / group_size: query tiles
// num_m_blocks - 1 - k and k, whose KV lengths add up to the same total for every k.
template <class Params>
struct FwdTileOrder {
  const Params& p;
  int heads_total;
  bool pairs;
  int num_slots;  // tiles, or with pairs slots, of the whole grid (< 2^31: launch_fwd)

  __device__ FwdTileOrder(const Params& params, bool persistent) : p(params) {
    heads_total = p.num_heads * p.batch;
    pairs = persistent && p.pair_causal;
    num_slots = fwd_slots_per_head(p.num_m_blocks, pairs) * heads_total;
  }

  // Every division by a size of the call goes through the host's multiply-and-shift pairs
  // (Params): the 64-bit divisions they replace were a chain of ~90 instructions at the start of
  // every tile, ahead of the last warpgroup's opening turn (H100 ncu, hd128 causal 8 x 2k;
  // twenty-fifth session).
  __device__ __forceinline__ TileCoord at(int slot) const {
    TileCoord c;
    int group, in_group;
    p.group_tiles_div(group, in_group, slot);
    const int first_head = group * p.group_heads;
    // The last group may hold fewer heads than group_heads.
    const bool last_group = heads_total - first_head < p.group_heads;
    const cutlass::FastDivmod& group_size_div =
        last_group ? p.last_group_size_div : p.group_size_div;
    c.empty = false;
    int rank, head_in_group;
    if (pairs) {
      group_size_div(rank, head_in_group, in_group / 2);
      const int heavy = p.num_m_blocks - 1 - rank;
      c.m_block = in_group % 2 == 0 ? heavy : rank;
      c.empty = in_group % 2 == 1 && rank >= heavy;
      if (c.empty) c.m_block = p.num_m_blocks;  // past the last query row: nothing to write
    } else {
      group_size_div(rank, head_in_group, in_group);
      c.m_block = p.num_m_blocks - 1 - rank;
    }
    p.heads_div(c.batch, c.head, first_head + head_in_group);
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
    body(order.at(int(blockIdx.x)));
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
    const int64_t steps = ceil_div(int64_t(order.num_slots), per_round * G) * per_round;
    for (int64_t i = 0; i < steps; ++i) {
      const int64_t r = order.pairs ? i / 2 : i;
      const int64_t t = order.pairs ? r * 2 * G + 2 * int64_t(blockIdx.x) + (i & 1)
                                    : r * G + ((r & 1) ? G - 1 - blockIdx.x : blockIdx.x);
      if (t < order.num_slots) body(order.at(int(t)));
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
