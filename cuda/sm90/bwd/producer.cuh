// The producer warp of the sm90 warp-specialized backward: TMA loads of K and V once per unit,
// and of each step's Q, dO, lse_log2 and dsum into the two-stage ring.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/params.h"
#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/bwd/pipeline.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/trace.cuh"
#include "cuda/sm90/bwd/traits.cuh"
#include "cuda/sm90/named_barrier.cuh"

namespace jax_dash::sm90::bwd {

using namespace cute;

// ---- producer warp ------------------------------------------------------------------------------
// Per unit the Scheduler publishes (UnitScheduler::fetched), K and V once and each step's Q/dO
// stage in visit order (visit_m: the unit's visit order in shared memory); with kKVFirst, K, V and
// the first step's stage before the unit's tables are published.
template <class Traits_>
struct WsProducer {
  using Traits = Traits_;
  template <class Scheduler, class Storage>
  __device__ __forceinline__ static void run(const WsParams<Traits>& P, Storage& smem,
                                             const int32_t* visit_m);
};

template <class Traits_>
template <class Scheduler, class Storage>
__device__ __forceinline__ void WsProducer<Traits_>::run(const WsParams<Traits>& P,
                                                        Storage& smem, const int32_t* visit_m) {
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  const AttentionParams& p = P.p;
  const bool leader = cute::elect_one_sync();
  const int32_t seq_q = static_cast<int32_t>(p.seq_q);
  const int32_t seq_kv = static_cast<int32_t>(p.seq_kv);
  const int32_t batch = static_cast<int32_t>(p.batch);
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t rows_q = static_cast<int64_t>(P.sp.num_q_tiles) * kBlockM;
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                     p.num_kv_heads, p.head_dim);
  const float* lse_log2_g = p.workspace_f32 + ws.lse_log2;
  const float* dsum_g = p.workspace_f32 + ws.dsum;
  const int32_t* unit_steps = p.workspace_i32 + ws.unit_steps;  // the unit tables (kKVFirst)
  const int32_t* unit_visit = p.workspace_i32 + ws.unit_visit;
  const WsTracer<Traits::kTraced> tracer{P.trace != nullptr && leader ? smem.trace : nullptr};

  Tensor mQ = P.tma_q.get_tma_tensor(make_shape(seq_q, HeadDim{}, p.num_heads, batch));
  Tensor mdO = P.tma_do.get_tma_tensor(make_shape(seq_q, HeadDim{}, p.num_heads, batch));
  Tensor mK = P.tma_k.get_tma_tensor(make_shape(seq_kv, HeadDim{}, p.num_kv_heads, batch));
  Tensor mV = P.tma_v.get_tma_tensor(make_shape(seq_kv, HeadDim{}, p.num_kv_heads, batch));
  auto tma_q = P.tma_q.get_slice(_0{});
  auto tma_do = P.tma_do.get_slice(_0{});
  auto tma_k = P.tma_k.get_slice(_0{});
  auto tma_v = P.tma_v.get_slice(_0{});
  Tensor tKsK = tma_k.partition_D(make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKV{}));
  Tensor tVsV = tma_v.partition_D(make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutKV{}));

  PipelineState<Traits::kStages> q_pipe;  // the Q/dO ring, as the math and the writer count it
  auto load_kv = [&](const WsUnit& unit) JAX_DASH_INLINE {
    if (!leader) return;
    const int b = unit.head_linear / p.num_heads;
    const int kvh = unit.head_linear % p.num_heads / group;
    Tensor gK = local_tile(mK(_, _, kvh, b), Shape<BlockN, HeadDim>{}, make_coord(unit.n, _0{}));
    Tensor gV = local_tile(mV(_, _, kvh, b), Shape<BlockN, HeadDim>{}, make_coord(unit.n, _0{}));
    Barrier::arrive_and_expect_tx(&smem.kv_full, Traits::kKVBytes);
    copy(P.tma_k.with(smem.kv_full), tma_k.partition_S(gK), tKsK);
    copy(P.tma_v.with(smem.kv_full), tma_v.partition_S(gV), tVsV);
  };
  // The unit's Q and dO tiles as TMA sources, (TMA, TMA_M, TMA_D, Nq) each.
  auto q_tiles = [&](const WsUnit& unit) JAX_DASH_INLINE {
    const int b = unit.head_linear / p.num_heads;
    const int h = unit.head_linear % p.num_heads;
    return cute::make_tuple(
        tma_q.partition_S(local_tile(mQ(_, _, h, b), Shape<BlockM, HeadDim>{}, make_coord(_, _0{}))),
        tma_do.partition_S(local_tile(mdO(_, _, h, b), Shape<BlockM, HeadDim>{}, make_coord(_, _0{}))));
  };
  // Q tile m's Q, dO, lse_log2 and dsum into the ring's next stage, once the math has freed it.
  auto load_stage = [&](const auto& tiles, const WsUnit& unit, int m) JAX_DASH_INLINE {
    const int stage = q_pipe.index();
    // The first use of each stage passes at once (waiting for the phase before the first).
    const long long t0 = tracer.start();
    cutlass::arch::ClusterBarrier::wait(&smem.q_empty[stage], q_pipe.phase() ^ 1);
    tracer.stop(kTraceProducerWaitEmpty, t0);
    if (leader) {
      Tensor sQ = make_tensor(make_smem_ptr(smem.q[stage]), typename Traits::SmemLayoutQ{});
      Tensor sdO = make_tensor(make_smem_ptr(smem.dout[stage]), typename Traits::SmemLayoutQ{});
      Barrier::arrive_and_expect_tx(&smem.q_full[stage], Traits::kQStageBytes);
      copy(P.tma_q.with(smem.q_full[stage]), get<0>(tiles)(_, _, _, m), tma_q.partition_D(sQ));
      copy(P.tma_do.with(smem.q_full[stage]), get<1>(tiles)(_, _, _, m),
           tma_do.partition_D(sdO));
      const int64_t row0 = static_cast<int64_t>(unit.head_linear) * rows_q +
                           static_cast<int64_t>(m) * kBlockM;
      bulk_copy_g2s(smem.lse_log2[stage], lse_log2_g + row0, kBlockM * sizeof(float),
                    &smem.q_full[stage]);
      bulk_copy_g2s(smem.dsum[stage], dsum_g + row0, kBlockM * sizeof(float),
                    &smem.q_full[stage]);
    }
    __syncwarp();
    q_pipe.advance();
  };
  WsUnit u;
  int fetches = 0;  // Scheduler::kKVFirst: the units fetched (the unit_fetched mbarrier's phase)
  // Scheduler::kKVFirst: K and V, and the unit's first Q/dO stage (its Q tile and step count read
  // from the unit tables in global memory), as soon as the unit is fetched, before its tables are
  // published.
  while (Scheduler::fetched(P, smem, fetches, &u, [&](const WsUnit& unit) JAX_DASH_INLINE {
    if constexpr (Scheduler::kKVFirst) {
      load_kv(unit);
      if (__ldg(unit_steps + unit.n) > 0) {
        load_stage(q_tiles(unit), unit,
                   __ldg(unit_visit + static_cast<int64_t>(unit.n) * P.sp.num_q_tiles));
      }
    }
  })) {
    const int num_steps = u.num_steps;
    if (!Scheduler::kKVFirst && num_steps > 0) load_kv(u);
    const auto tiles = q_tiles(u);
    for (int s = Scheduler::kKVFirst && num_steps > 0 ? 1 : 0; s < num_steps; ++s) {
      load_stage(tiles, u, visit_m[s]);
    }
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);
  }
}

}  // namespace jax_dash::sm90::bwd
