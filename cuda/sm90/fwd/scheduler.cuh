// Tile schedulers of the sm90 forward: which query tiles a CTA computes, in which order. Both
// take the tiles in one grid order (FwdTileOrder); the launch picks the scheduler by type, and
// each gives the grid size it was written for (grid_size). Each role walks the CTA's tiles through
// the scheduler: the producer with producer_tiles, the math warpgroups with math_tiles.
#pragma once

#include <cuda_runtime.h>

#include <cutlass/arch/barrier.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/fwd/traits.cuh"  // kTileSlots
#include "cuda/tiles.h"

namespace jax_dash::sm90::fwd {

// A query tile's place: its query block and (batch, head).
struct TileCoord {
  int m_block, head, batch;
};

// The heads of the grid order's last block (launch_fwd): the last kTailGroups groups of heads,
// the last one perhaps partial, taken together heaviest tile first.
constexpr int kTailGroups = 3;

// Heaviest query tiles (causal: the last ones) first across each block of heads, so that the CTAs
// that run together share their heads' K and V in L2. The blocks are groups of group_heads heads
// (about one wave of tiles each), except the last one, which holds the last kTailGroups groups:
// taken apart, the last group's heaviest tiles started when the other CTAs were running out of
// work, and the grid's tail waited on them (scripts/fwd_tile_balance.py: hd128 causal 2k, the
// dynamic scheduler below +8.9% over the ideal with plain groups, +1.0% with the merged tail).
// Slot s of a group is the group's (s % group_heads)-th head at rank s / group_heads; the tail's
// slots likewise over its heads. Query tile rank r is num_m_blocks - 1 - r.
template <class Params>
struct FwdTileOrder {
  const Params& p;
  int num_slots;  // tiles of the whole grid (< 2^31: launch_fwd)

  __device__ explicit FwdTileOrder(const Params& params) : p(params) {
    num_slots = p.num_m_blocks * p.num_heads * p.batch;
  }

  // Every division by a size of the call goes through the host's multiply-and-shift pairs
  // (Params): the 64-bit divisions they replace were a chain of ~90 instructions at the start of
  // every tile, ahead of the last warpgroup's opening turn (H100 ncu, hd128 causal 8 x 2k;
  // twenty-fifth session).
  __device__ __forceinline__ TileCoord at(int slot) const {
    int rank, head_index;
    if (slot < p.tail_first_slot) {
      int group, in_group, head_in_group;
      p.group_tiles_div(group, in_group, slot);
      p.group_size_div(rank, head_in_group, in_group);
      head_index = group * p.group_heads + head_in_group;
    } else {
      int head_in_tail;
      p.tail_size_div(rank, head_in_tail, slot - p.tail_first_slot);
      head_index = p.tail_first_head + head_in_tail;
    }
    TileCoord c;
    c.m_block = p.num_m_blocks - 1 - rank;
    p.heads_div(c.batch, c.head, head_index);
    return c;
  }
};

// One query tile per CTA, tile blockIdx.x of the grid order (the hardware's block scheduler
// starts each CTA as an SM frees: heaviest first).
template <class Params>
struct FwdOneTileScheduler {
  static constexpr bool kPersistent = false;
  FwdTileOrder<Params> order;

  __device__ explicit FwdOneTileScheduler(const Params& p) : order(p) {}

  template <class Storage, class Body>
  __device__ __forceinline__ void producer_tiles(Storage&, Body&& body) const {
    body(order.at(int(blockIdx.x)));
  }
  template <class Storage, class Body>
  __device__ __forceinline__ void math_tiles(Storage&, Body&& body) const {
    body(order.at(int(blockIdx.x)));
  }

  static int64_t grid_size(int64_t num_tiles, int sms) { return num_tiles; }
};

// One CTA per SM (the math warps' 240 or 160 registers allow no second), each taking the grid
// order's next tile when its producer is done issuing the loads of the current one: CTA b's first
// tile is slot b, every later one gridDim.x + an atomicAdd on the call's zeroed tile counter
// (Params::tile_counter). The producer's thread fetches and hands each slot to the math warps
// through a two-entry ring in shared memory (tile_slot, its full and empty mbarriers); a slot past
// the last tile ends both roles. Greedy, heaviest first: a static order (heavy and light causal
// tiles paired, round robin) left every CTA's share a whole number of pairs, 3.1% over the ideal
// at hd128 causal 2k-8k (1,024 pairs on 132 SMs), where the greedy order comes within ~1%
// (scripts/fwd_tile_balance.py). Which CTA computes a tile changes no bit of it.
template <class Params>
struct FwdPersistentTileScheduler {
  static constexpr bool kPersistent = true;
  FwdTileOrder<Params> order;

  __device__ explicit FwdPersistentTileScheduler(const Params& p) : order(p) {}

  // Hand-over i (the CTA's i-th tile, or past the last one): ring entry i % kTileSlots, whose
  // full barrier completes once per use and whose empty barrier every math warp arrives on once it
  // has read the entry (the first use of an entry passes at once).
  template <class Storage>
  __device__ __forceinline__ static void publish(Storage& smem, int i, int slot) {
    const int entry = i % kTileSlots;
    cutlass::arch::ClusterBarrier::wait(&smem.slot_empty[entry], ((i / kTileSlots) & 1) ^ 1);
    smem.tile_slot[entry] = slot;
    cutlass::arch::ClusterBarrier::arrive(&smem.slot_full[entry]);  // release: the slot's store
  }

  // On the producer's one thread. Tile i + 1's slot is fetched and handed over as tile i's
  // producer work begins, where the producer would wait for the math to release tile i - 1's Q
  // anyway: no register holds it across the tile's loads (held there, the 24-register producer
  // spilled around every K/V load); it is read back from the ring afterwards.
  template <class Storage, class Body>
  __device__ __forceinline__ void producer_tiles(Storage& smem, Body&& body) const {
    publish(smem, 0, int(blockIdx.x));
    for (int i = 0;; ++i) {
      const int slot = smem.tile_slot[i % kTileSlots];  // this thread's own store
      if (slot >= order.num_slots) break;
      publish(smem, i + 1, int(gridDim.x) + atomicAdd(order.p.tile_counter, 1));
      body(order.at(slot));
    }
  }

  // On every math thread.
  template <class Storage, class Body>
  __device__ __forceinline__ void math_tiles(Storage& smem, Body&& body) const {
    for (int i = 0;; ++i) {
      const int entry = i % kTileSlots;
      cutlass::arch::ClusterBarrier::wait(&smem.slot_full[entry], (i / kTileSlots) & 1);
      const int slot = smem.tile_slot[entry];
      warp_arrive(&smem.slot_empty[entry]);
      if (slot >= order.num_slots) break;
      body(order.at(slot));
    }
  }

  static int64_t grid_size(int64_t num_tiles, int sms) { return std::min<int64_t>(num_tiles, sms); }
};

// The persistent kernel's scheduler, or the one-tile kernel's.
template <bool kPersistent, class Params>
using FwdScheduler = std::conditional_t<kPersistent, FwdPersistentTileScheduler<Params>,
                                        FwdOneTileScheduler<Params>>;

}  // namespace jax_dash::sm90::fwd
