// Definition of launch_fwd (launch_fwd.h): the kernel's parameters, grid and launch. Included only
// by the translation units generated from instantiate.cu.in, each of which instantiates it for one
// (dtype, head_dim, mask kind).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/mask.h"
#include "cuda/params.h"
#include "cuda/sm90/fwd/dropout.cuh"
#include "cuda/sm90/fwd/kernel.cuh"
#include "cuda/sm90/fwd/launch_fwd.h"
#include "cuda/sm90/fwd/traits.cuh"

namespace jax_dash::sm90::fwd {

template <class Element, int kHeadDim, bool kMask, bool kPersistent, bool kSegments,
          bool kNarrow, bool kDropout>
cudaError_t launch_fwd(const AttentionParams& ap, cudaStream_t stream) {
  using Kernel = FwdKernelFor<Element, kHeadDim, kMask, kPersistent, kSegments, kNarrow, kDropout>;
  using Traits = typename Kernel::Traits;
  typename Kernel::Params p{};
  const auto seq_q = static_cast<int32_t>(ap.seq_q);
  const auto seq_kv = static_cast<int32_t>(ap.seq_kv);
  const auto batch = static_cast<int32_t>(ap.batch);
  const int64_t num_tiles = ceil_div(ap.seq_q, Traits::kBlockM) * ap.num_heads * ap.batch;
  if (num_tiles == 0) return cudaSuccess;  // nothing to write (and no valid descriptor for Q)
  if (num_tiles > int64_t(INT32_MAX)) return cudaErrorInvalidConfiguration;
  // A zero-length K/V still needs a valid descriptor; no tile of it is ever loaded.
  const int32_t seq_kv_desc = seq_kv > 0 ? seq_kv : 1;
  p.tma_q = Traits::make_tma(static_cast<const Element*>(ap.q), seq_q, ap.num_heads, batch,
                             typename Traits::SmemLayoutQ{});
  p.tma_k = Traits::make_tma(static_cast<const Element*>(ap.k), seq_kv_desc, ap.num_kv_heads,
                             batch, typename Traits::SmemLayoutKVStage{});
  p.tma_o = Traits::make_tma_store(static_cast<Element*>(ap.out), seq_q, ap.num_heads, batch);
  p.tma_v = Traits::make_tma(static_cast<const Element*>(ap.v), seq_kv_desc, ap.num_kv_heads,
                             batch, typename Traits::SmemLayoutKVStage{});
  p.seq_q = seq_q;
  p.seq_kv = seq_kv;
  p.num_heads = ap.num_heads;
  p.num_kv_heads = ap.num_kv_heads;
  p.batch = batch;
  p.num_m_blocks = static_cast<int32_t>(ceil_div(ap.seq_q, Traits::kBlockM));
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return err;
  sms = std::max(sms, 1);
  // About one wave of tiles per group of heads: taken head-major across all heads (the order
  // before), the CTAs of a wave at 2k tokens each read another head's K and V, and every query
  // tile's read of them came from HBM; grouped, a wave reads ~ceil(SMs / Nq) heads' K and V, each
  // shared by its query tiles in L2. The last kTailGroups groups (the last perhaps partial) form
  // one block (FwdTileOrder).
  const int64_t heads_total = int64_t(ap.num_heads) * batch;
  const int64_t per_wave = ceil_div(int64_t(sms), int64_t(p.num_m_blocks));
  p.group_heads = static_cast<int32_t>(std::min<int64_t>(heads_total, std::max<int64_t>(1, per_wave)));
  const int64_t num_groups = ceil_div(heads_total, int64_t(p.group_heads));
  p.tail_first_head =
      static_cast<int32_t>(std::max<int64_t>(0, num_groups - kTailGroups) * p.group_heads);
  // The tile order works in 32 bits (num_tiles < 2^31 above).
  p.tail_first_slot = static_cast<int32_t>(int64_t(p.tail_first_head) * p.num_m_blocks);
  p.group_tiles_div = cutlass::FastDivmod(static_cast<int>(int64_t(p.num_m_blocks) * p.group_heads));
  p.group_size_div = cutlass::FastDivmod(p.group_heads);
  p.tail_size_div = cutlass::FastDivmod(static_cast<int>(heads_total - p.tail_first_head));
  p.heads_div = cutlass::FastDivmod(ap.num_heads);
  p.scale = ap.scale_ptr;
  p.is_causal = ap.is_causal;
  p.out = ap.out;
  p.lse = ap.lse;
  p.has_mask = has_mask_policy(ap);
  p.band = mask_band(ap);
  p.q_lengths = ap.q_seq_lengths;
  p.kv_lengths = ap.kv_seq_lengths;
  p.q_segments = ap.q_segment_ids;
  p.kv_segments = ap.kv_segment_ids;
  p.soft_cap = ap.logits_soft_cap;
  if constexpr (kDropout) {
    p.dropout = FwdDropoutParams{ap.dropout_key_ptr, ap.dropout_offsets, ap.dropout_threshold,
                                 ap.dropout_scale};
  }

  auto kernel = fwd_kernel<Kernel>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Kernel::kSmemBytes);
  if (err != cudaSuccess) return err;
  // setmaxnreg moves registers between warpgroups inside the launch allocation: the math
  // warpgroups' increase would wait forever if that allocation were smaller than the split.
  cudaFuncAttributes attr{};
  if ((err = cudaFuncGetAttributes(&attr, kernel)) != cudaSuccess) return err;
  constexpr int kNeeded = (Traits::kProducerRegisters * kThreadsPerWarpgroup +
                           Traits::kMathRegisters * Traits::kMathThreads) /
                          Traits::kThreads;
  if (attr.numRegs < kNeeded) return cudaErrorInvalidConfiguration;
  const int64_t grid = Kernel::Scheduler::grid_size(num_tiles, sms);
  if constexpr (kPersistent) {
    // A fetched slot is gridDim.x + the counter, in 32 bits.
    if (num_tiles > int64_t(INT32_MAX) - grid) return cudaErrorInvalidConfiguration;
    // The persistent scheduler's tile counter (fwd/scheduler.cuh): one int32 of the caller's
    // (AttentionParams::workspace_i32), zeroed on the stream before the kernel.
    if (ap.workspace_i32 == nullptr) return cudaErrorInvalidValue;
    p.tile_counter = ap.workspace_i32;
    if ((err = cudaMemsetAsync(p.tile_counter, 0, sizeof(int32_t), stream)) != cudaSuccess) {
      return err;
    }
  }
  kernel<<<dim3(static_cast<unsigned>(grid)), dim3(Kernel::kThreads), Kernel::kSmemBytes,
           stream>>>(p);
  return cudaGetLastError();
}

}  // namespace jax_dash::sm90::fwd
