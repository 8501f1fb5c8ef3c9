// Producer of the sm90 forward: the warpgroup whose first thread issues every TMA load (Q of each
// tile, then K_j and V_j of each KV iteration into their stage of the ring).
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/fwd/pipeline.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/fwd/tile.cuh"
#include "cuda/sm90/fwd/traits.cuh"

namespace jax_dash::sm90::fwd {

template <class Traits, bool kPersistent, bool kSegments>
struct FwdProducer {
  using Params = FwdKernelParams<Traits>;
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  // The persistent scheduler's producer_tiles runs on one thread (it fetches and publishes each
  // slot once); kSegments walks the tiles with a whole warp, so only the one-tile kernel has it.
  static_assert(!(kPersistent && kSegments), "segment ids run the one-tile kernel only");

  // Q once per tile, then K_j and V_j into their stage as soon as every math warp has released the
  // stage's previous tile (the first use of a stage passes at once); with kPersistent the next
  // tile's Q once every math warp has released this one's. kSegments: the first warp walks the
  // tiles (FwdKvRange may narrow a tile's KV range with warp shuffles: every lane takes part) and
  // its first thread waits and issues the loads; otherwise that thread alone. sQ (BLK_M,D) and
  // sK, sV (BLK_N,D,STAGES) are the shared-memory tiles the math warpgroups read.
  template <class Scheduler, class KvRange, class TensorQ, class TensorKV>
  __device__ __forceinline__ static void run(const Params& p,
                                             typename Traits::SharedStorage& smem,
                                             const Scheduler& scheduler, const KvRange& kv_range,
                                             const TensorQ& sQ, const TensorKV& sK,
                                             const TensorKV& sV) {
    // TMA views of this CTA's tiles.
    Tensor mQ = p.tma_q.get_tma_tensor(make_shape(p.seq_q, HeadDim{}, p.num_heads, p.batch));
    Tensor mK = p.tma_k.get_tma_tensor(
        make_shape(max(p.seq_kv, 1), HeadDim{}, p.num_kv_heads, p.batch));
    Tensor mV = p.tma_v.get_tma_tensor(
        make_shape(max(p.seq_kv, 1), HeadDim{}, p.num_kv_heads, p.batch));
    auto tma_q = p.tma_q.get_slice(_0{});
    auto tma_k = p.tma_k.get_slice(_0{});
    auto tma_v = p.tma_v.get_slice(_0{});
    Tensor tQsQ = tma_q.partition_D(sQ);
    Tensor tKsK = tma_k.partition_D(sK);  // (TMA,TMA_N,TMA_D,STAGES)
    Tensor tVsV = tma_v.partition_D(sV);

    // Iteration j of a tile's KV loop visits n_block = n_hi - 1 - j, in the stage KvPipelineState
    // gives. K and V are loaded separately because the math's pipelined loop frees a K stage one
    // iteration before the V stage of the same j.
    auto load_q = [&](const FwdTile& t) JAX_DASH_INLINE {
      Tensor gQ = local_tile(mQ(_, _, t.head, t.batch), Shape<BlockM, HeadDim>{},
                             make_coord(t.m_block, _0{}));  // (BLK_M,D)
      Barrier::arrive_and_expect_tx(&smem.bar_q, Traits::kQBytes);
      copy(p.tma_q.with(smem.bar_q), tma_q.partition_S(gQ), tQsQ);
    };
    auto load_k = [&](const FwdTile& t, int j, int stage) JAX_DASH_INLINE {
      Tensor gK = local_tile(mK(_, _, t.kv_head, t.batch), Shape<BlockN, HeadDim>{},
                             make_coord(t.n_hi - 1 - j, _0{}));  // (BLK_N,D)
      Barrier::arrive_and_expect_tx(&smem.bar_k[stage], Traits::kKVStageBytes);
      copy(p.tma_k.with(smem.bar_k[stage]), tma_k.partition_S(gK), tKsK(_, _, _, stage));
    };
    auto load_v = [&](const FwdTile& t, int j, int stage) JAX_DASH_INLINE {
      Tensor gV = local_tile(mV(_, _, t.kv_head, t.batch), Shape<BlockN, HeadDim>{},
                             make_coord(t.n_hi - 1 - j, _0{}));  // (BLK_N,D)
      Barrier::arrive_and_expect_tx(&smem.bar_v[stage], Traits::kKVStageBytes);
      copy(p.tma_v.with(smem.bar_v[stage]), tma_v.partition_S(gV), tVsV(_, _, _, stage));
    };

    const bool is_leader = threadIdx.x == 0;
    if (kSegments ? threadIdx.x < 32 : is_leader) {
      KvPipelineState kv_pipe;
      QPipelineState q_pipe;
      scheduler.producer_tiles(smem, [&](const TileCoord& coord) JAX_DASH_INLINE {
        const FwdTile t = kv_range.tile(coord);
        if (t.n_end == 0) return;
        if (is_leader) {
          if constexpr (kPersistent) {
            if (q_pipe.q_count > 0) {
              cutlass::arch::ClusterBarrier::wait(&smem.q_empty, q_pipe.empty_phase());
            }
          }
          load_q(t);
          for (int j = 0; j < t.n_end; ++j) {
            const KvSlot slot = kv_pipe.kv(j);
            const int stage = slot.stage();
            const int empty_phase = slot.empty_phase();
            cutlass::arch::ClusterBarrier::wait(&smem.k_empty[stage], empty_phase);
            load_k(t, j, stage);
            cutlass::arch::ClusterBarrier::wait(&smem.v_empty[stage], empty_phase);
            load_v(t, j, stage);
          }
        }
        if constexpr (kSegments) __syncwarp();
        kv_pipe.advance(t.n_end);
        q_pipe.advance();
      });
    }
  }
};

}  // namespace jax_dash::sm90::fwd
