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
  // shared by its query tiles in L2.
  const int64_t per_wave = ceil_div(int64_t(sms), int64_t(p.num_m_blocks));
  p.group_heads = static_cast<int32_t>(
      std::min<int64_t>(int64_t(ap.num_heads) * ap.batch, std::max<int64_t>(1, per_wave)));
  // Causal tiles paired heavy-with-light where their KV lengths add up to the same total (the
  // query tile a whole number of KV tiles): a static round robin of equal pairs balances the CTAs,
  // where the snake order of single tiles left hd128 causal 4k ~18% above the ideal in a model
  // (scripts/fwd_tile_balance.py).
  p.pair_causal = kPersistent && ap.is_causal && Traits::kBlockM % Traits::kBlockN == 0;
  // The tile order's divisors (FwdTileOrder, in 32 bits: the slots must stay below 2^31).
  const int64_t heads_total = int64_t(ap.num_heads) * batch;
  const int64_t per_head = fwd_slots_per_head(p.num_m_blocks, p.pair_causal);
  if (per_head * heads_total > int64_t(INT32_MAX)) return cudaErrorInvalidConfiguration;
  p.group_tiles_div = cutlass::FastDivmod(static_cast<int>(per_head * p.group_heads));
  p.group_size_div = cutlass::FastDivmod(p.group_heads);
  const int64_t last_group = heads_total % p.group_heads;
  p.last_group_size_div =
      cutlass::FastDivmod(static_cast<int>(last_group > 0 ? last_group : p.group_heads));
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
  const int64_t num_pairs =
      ceil_div(int64_t(p.num_m_blocks), int64_t(2)) * ap.num_heads * ap.batch;
  const int64_t grid =
      Kernel::Scheduler::grid_size(num_tiles, num_pairs, p.pair_causal, sms);
  kernel<<<dim3(static_cast<unsigned>(grid)), dim3(Kernel::kThreads), Kernel::kSmemBytes,
           stream>>>(p);
  return cudaGetLastError();
}

}  // namespace jax_dash::sm90::fwd
