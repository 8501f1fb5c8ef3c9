// Work units of the sm90 warp-specialized backward: what a unit is, and how the producer and the
// dQ writer receive the unit the math warpgroups fetched.
#pragma once

#include <cstdint>

#include "cuda/schedule.h"
#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/bwd/named_barrier.cuh"
#include "cuda/sm90/bwd/traits.cuh"

namespace jax_dash::sm90::bwd {

// A unit as every role sees it: its head and KV tile (from the global item and the KV tile's index
// within the item), and its number of steps.
struct WsUnit {
  int head_linear;
  int n;  // KV tile
  int num_steps;
};

__device__ __forceinline__ WsUnit read_unit(const ScheduleProblem& sp, int64_t item, int kv,
                                           int num_steps) {
  const int per_head = items_per_head(sp);
  return WsUnit{static_cast<int>(item / per_head),
                item_kv_tile(sp, static_cast<int>(item % per_head), kv), num_steps};
}

// The producer's and the writer's unit hand-off: waits at the unit barrier for the unit the math
// warpgroups published; false when there is no work left.
template <class Traits, class Storage>
__device__ __forceinline__ bool published_unit(const WsParams<Traits>& P, const Storage& smem,
                                               WsUnit* u) {
  named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);
  const int64_t item = smem.unit_item;
  if (item >= P.total_items) return false;
  *u = read_unit(P.sp, item, smem.unit_kv, smem.unit_num_steps);
  return true;
}

}  // namespace jax_dash::sm90::bwd
