// Host side of the sm90 forward: the kernel's parameters and grid (launch_fwd), the instantiation
// for a call's dtype, head_dim and mask (dispatch_fwd), and the kernel selection (run_fwd and
// JAX_DASH_SM90_FWD).
#include <cuda_runtime.h>

#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/mask.h"
#include "cuda/params.h"
#include "cuda/sm90/fwd/kernel.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/fwd/traits.cuh"
#include "cuda/sm90/launch.h"

namespace jax_dash::sm90 {
namespace {

using fwd::kThreadsPerWarpgroup;

template <class Element, int kHeadDim, bool kMask, bool kPersistent, bool kSegments,
          bool kNarrow = false>
cudaError_t launch_fwd(const AttentionParams& ap, cudaStream_t stream) {
  using Kernel = fwd::FwdKernelFor<Element, kHeadDim, kMask, kPersistent, kSegments, kNarrow>;
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

  auto kernel = fwd::fwd_kernel<Kernel>;
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

template <bool kMask, bool kPersistent = false, bool kSegments = false>
cudaError_t dispatch_fwd(const AttentionParams& p, cudaStream_t stream) {
  using Bf16 = cutlass::bfloat16_t;
  using Half = cutlass::half_t;
  const bool bf16 = p.dtype == DType::kBFloat16;
  switch (p.head_dim) {
    case 64:
      return bf16 ? launch_fwd<Bf16, 64, kMask, kPersistent, kSegments>(p, stream)
                  : launch_fwd<Half, 64, kMask, kPersistent, kSegments>(p, stream);
    case 128:
      return bf16 ? launch_fwd<Bf16, 128, kMask, kPersistent, kSegments>(p, stream)
                  : launch_fwd<Half, 128, kMask, kPersistent, kSegments>(p, stream);
    case 256:
      return bf16 ? launch_fwd<Bf16, 256, kMask, kPersistent, kSegments>(p, stream)
                  : launch_fwd<Half, 256, kMask, kPersistent, kSegments>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t run_fwd(const AttentionParams& p, cudaStream_t stream) {
  // The TMA descriptors and tile indices use 32-bit extents.
  if (p.seq_q > INT32_MAX || p.seq_kv > INT32_MAX || p.batch > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) return cudaErrorInvalidValue;
  if (!fwd_kernel_valid()) return cudaErrorInvalidValue;
  // The mask policy is in the one-tile kernel only, whatever the variable asks for.
  // Rows with segment ids take the instantiation that carries their code (kSegments).
  if (needs_masked_kernels(p)) {
    return p.q_segment_ids != nullptr ? dispatch_fwd<true, false, true>(p, stream)
                                      : dispatch_fwd<true>(p, stream);
  }
  if (fwd_uses_narrow(p)) {
    using Bf16 = cutlass::bfloat16_t;
    using Half = cutlass::half_t;
    return p.dtype == DType::kBFloat16
               ? launch_fwd<Bf16, 64, false, true, false, true>(p, stream)
               : launch_fwd<Half, 64, false, true, false, true>(p, stream);
  }
  if (fwd_uses_persistent(p)) return dispatch_fwd<false, true>(p, stream);
  return dispatch_fwd<false>(p, stream);
}

// JAX_DASH_SM90_FWD: unset or empty (the default): ws-persistent for keys of at most
// kPersistentMaxSeqKv tokens at head_dim 64 and 128 (the kernel's head dim; with 128-row tiles,
// ws-persistent-narrow, for causal calls of at most kNarrowMaxSeqKv keys at 64), ws otherwise;
// "ws": the one-tile kernel; "ws-persistent": the persistent one at every length (a call with a
// mask beyond causal runs "ws"'s masked kernel either way); "ws-persistent-narrow": the persistent
// one with 128-row tiles at head_dim 64 (ws-persistent elsewhere) at every length. All give the
// same bits, so the choice by length changes no result. The cut (H100, kernel-only): the persistent
// kernel was 2.1-7.3% faster than ws at 2k-4k tokens (round 8 call 4; it hides each tile's prologue
// and epilogue under the previous tile) and level at 8k. Causal at head_dim 128 needed heavy/light
// tile pairs to get there (ninth session call 1: 4k 0.532 -> 0.478 ms, ws 0.485); at 8k it stays
// within 1-2% of ws, so the cut stays at 4096.
namespace {
constexpr int64_t kPersistentMaxSeqKv = 4096;
constexpr int64_t kPersistentMaxHeadDim = 128;  // head_dim 256: not timed against ws yet
// The default's 128-row tiles at head_dim 64 (ws-persistent-narrow), causal only. Kernel-only on
// an H100 against the 192-row ws-persistent (round 13 call E, 3 rounds): causal 512 -4.1%, 1k
// -6.5% (the 128-row causal tiles pair heavy with light; 192 rows cannot, 192 not being a
// multiple of the 128-key tile), causal 2k +6.9%, 4k +5.8%, full 512 +4.8%, 1k +0.3%, 2k +9.0%
// (two math warpgroups leave the tensor cores waiting on the 64-column softmax).
constexpr int64_t kNarrowMaxSeqKv = 1024;
enum class FwdKernel { kAuto, kWs, kWsPersistent, kWsPersistentNarrow, kInvalid };
FwdKernel requested_fwd_kernel() {
  const char* v = std::getenv("JAX_DASH_SM90_FWD");
  if (v == nullptr || *v == '\0') return FwdKernel::kAuto;
  if (std::strcmp(v, "ws") == 0) return FwdKernel::kWs;
  if (std::strcmp(v, "ws-persistent") == 0) return FwdKernel::kWsPersistent;
  if (std::strcmp(v, "ws-persistent-narrow") == 0) return FwdKernel::kWsPersistentNarrow;
  return FwdKernel::kInvalid;
}
}  // namespace

bool fwd_kernel_valid() { return requested_fwd_kernel() != FwdKernel::kInvalid; }

// The persistent kernel with 128-row query tiles at head_dim 64 (elsewhere the tile table's rows
// are already at most 128, and ws-persistent-narrow runs ws-persistent): on request, and by
// default for causal calls of at most kNarrowMaxSeqKv keys.
bool fwd_uses_narrow(const AttentionParams& p) {
  const FwdKernel k = requested_fwd_kernel();
  return p.head_dim == 64 &&
         (k == FwdKernel::kWsPersistentNarrow ||
          (k == FwdKernel::kAuto && p.is_causal && p.seq_kv <= kNarrowMaxSeqKv));
}

bool fwd_uses_persistent(const AttentionParams& p) {
  const FwdKernel k = requested_fwd_kernel();
  return k == FwdKernel::kWsPersistent || k == FwdKernel::kWsPersistentNarrow ||
         (k == FwdKernel::kAuto && p.seq_kv <= kPersistentMaxSeqKv &&
          p.head_dim <= kPersistentMaxHeadDim);
}

}  // namespace jax_dash::sm90
