// Work units of the sm90 warp-specialized backward: what a unit is, and how the producer and the
// dQ writer receive the unit the math warpgroups fetched.
#pragma once

#include <cstdint>

#include "cuda/schedule.h"
#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/bwd/traits.cuh"
#include "cuda/sm90/named_barrier.cuh"

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

// The work-unit schedule, in the role of FA3's tile scheduler: one item per CTA at a time, taken in
// increasing global order, so that cuda/schedule.h's deadlock argument applies (a ticket wait only
// ever waits on an item some resident CTA already holds). The math warpgroups fetch (the first
// math thread takes the rest of its item, else the next untaken item, only after every role has
// finished the previous unit) and publish a unit at the unit barrier; the producer and the writer
// receive it there.
template <class Traits>
struct UnitScheduler {
  using Storage = typename Traits::SharedStorage;
  // The parameters by reference, read where they are used: a copy of a field would hold a
  // register for the whole kernel where a read of the constant bank costs none.
  const WsParams<Traits>& P;
  int64_t item = -1;  // the math's current unit: its global item ...
  int kv = 0;         // ... and KV tile within the item

  // Math threads: fetch the next unit into shared memory and read it back (kMathBarrier).
  __device__ __forceinline__ void fetch_next(Storage& smem, int32_t* item_counter, int tid) {
    if (tid == 0) {
      const ScheduleProblem& sp = P.sp;
      const bool same_item =
          item >= 0 && kv + 1 < item_num_kv_tiles(sp, static_cast<int>(item % items_per_head(sp)));
      const int64_t next = same_item ? item : static_cast<int64_t>(atomicAdd(item_counter, 1));
      smem.unit_item = next;
      smem.unit_kv = same_item ? kv + 1 : 0;
    }
    named_barrier_sync(kMathBarrier, Traits::kMathThreads);
    item = smem.unit_item;
    kv = smem.unit_kv;
  }
  __device__ __forceinline__ bool done() const { return item >= P.total_items; }
  // The fetched unit, its steps not yet known (the unit tables give them).
  __device__ __forceinline__ WsUnit unit() const { return read_unit(P.sp, item, kv, 0); }

  // The producer's and the writer's hand-off: waits at the unit barrier for the unit the math
  // warpgroups published; false when there is no work left.
  __device__ __forceinline__ static bool published(const WsParams<Traits>& params,
                                                   const Storage& smem, WsUnit* u) {
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);
    const int64_t item = smem.unit_item;
    if (item >= params.total_items) return false;
    *u = read_unit(params.sp, item, smem.unit_kv, smem.unit_num_steps);
    return true;
  }
};

}  // namespace jax_dash::sm90::bwd
