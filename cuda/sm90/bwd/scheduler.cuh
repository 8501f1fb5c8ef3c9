// Work units of the sm90 warp-specialized backward: what a unit is, and how the producer and the
// dQ writer receive the unit the math warpgroups fetched.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

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
// ever waits on an item some resident CTA already holds). The first math thread fetches (the rest
// of its item, else the next untaken item, only after every role has finished the previous unit);
// the math warpgroups copy the unit's visit order, tickets and step count into shared memory and
// publish the unit and its tables to the producer and the writers at the unit barrier.
template <class Traits>
struct UnitScheduler {
  using Storage = typename Traits::SharedStorage;
  // kKVFirst (the unmasked kernels, whose units come from the unit tables): the first math thread
  // also hands the fetched unit to the producer at once (the unit_fetched mbarrier), which loads
  // the unit's K and V and its first Q/dO stage while the math copies the tables (~2k cycles a
  // unit at head_dim 128: maintainers/perf-notes.md, thirtieth session); the math waits for K
  // and V in every unit, one without steps too (before its epilogue). The masked kernels load
  // them once the step count is known, and not for a unit without steps (lengths may hide many).
  // (A named barrier shared by the producer and the math would be an aligned barrier in the
  // math, which PTX allows only if every participant runs that same instruction, or an unaligned
  // one, with which ptxas spilled in the math's step loop.)
  static constexpr bool kKVFirst = !Traits::kMask;
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
    if (tid == 0) {
      // The previous unit's dK/dV TMA stores (EpilogueTma) read K's and V's tiles: they must be
      // read before the producer may load the next unit's K and V into them. Waited for by the
      // first math thread alone, after the barrier: the other math threads go on to the tables.
      bulk_wait_group_read_all();
      if constexpr (kKVFirst) cutlass::arch::ClusterBarrier::arrive(&smem.unit_fetched);
    }
    item = smem.unit_item;
    kv = smem.unit_kv;
  }
  __device__ __forceinline__ bool done() const { return item >= P.total_items; }
  // The fetched unit, its steps not yet known (the unit tables give them).
  __device__ __forceinline__ WsUnit unit() const { return read_unit(P.sp, item, kv, 0); }

  // The writers' hand-off: waits at the unit barrier for the unit the math warpgroups published
  // with its tables; false when there is no work left.
  __device__ __forceinline__ static bool published(const WsParams<Traits>& params,
                                                   const Storage& smem, WsUnit* u) {
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);
    const int64_t item = smem.unit_item;
    if (item >= params.total_items) return false;
    *u = read_unit(params.sp, item, smem.unit_kv, smem.unit_num_steps);
    return true;
  }
  // The producer's: with kKVFirst, the fetched unit (fetches: the units waited for so far, the
  // mbarrier's phase) and on_unit(unit) with its step count not yet known, where there is a unit;
  // then published().
  template <class OnUnit>
  __device__ __forceinline__ static bool fetched(const WsParams<Traits>& params, Storage& smem,
                                                 int& fetches, WsUnit* u, OnUnit&& on_unit) {
    if constexpr (kKVFirst) {
      cutlass::arch::ClusterBarrier::wait(&smem.unit_fetched, fetches & 1);
      ++fetches;
      const int64_t item = smem.unit_item;
      if (item < params.total_items) on_unit(read_unit(params.sp, item, smem.unit_kv, 0));
    }
    return published(params, smem, u);
  }
};

}  // namespace jax_dash::sm90::bwd
