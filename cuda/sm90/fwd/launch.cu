// Host side of the sm90 forward: the instantiation for a call's dtype, head_dim and mask
// (dispatch_fwd) and the kernel selection (run_fwd and JAX_DASH_SM90_FWD). The launches
// themselves (launch_fwd: the kernel's parameters and grid) are compiled in the generated
// translation units of launch_fwd.h.
#include <cuda_runtime.h>

#include <cutlass/bfloat16.h>
#include <cutlass/half.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda/params.h"
#include "cuda/sm90/fwd/launch_fwd.h"
#include "cuda/sm90/launch.h"

namespace jax_dash::sm90 {
namespace {

using fwd::launch_fwd;

template <bool kMask, bool kPersistent = false, bool kSegments = false, bool kDropout = false>
cudaError_t dispatch_fwd(const AttentionParams& p, cudaStream_t stream) {
  using Bf16 = cutlass::bfloat16_t;
  using Half = cutlass::half_t;
  const bool bf16 = p.dtype == DType::kBFloat16;
  switch (p.head_dim) {
    case 64: {
      // Unmasked dropout at head_dim 64: 128-row tiles (fwd/instantiate.cu.in says why).
      constexpr bool kNarrow = kDropout && !kMask;
      return bf16 ? launch_fwd<Bf16, 64, kMask, kPersistent, kSegments, kNarrow, kDropout>(
                        p, stream)
                  : launch_fwd<Half, 64, kMask, kPersistent, kSegments, kNarrow, kDropout>(
                        p, stream);
    }
    case 128:
      return bf16 ? launch_fwd<Bf16, 128, kMask, kPersistent, kSegments, false, kDropout>(
                        p, stream)
                  : launch_fwd<Half, 128, kMask, kPersistent, kSegments, false, kDropout>(
                        p, stream);
    case 256:
      return bf16 ? launch_fwd<Bf16, 256, kMask, kPersistent, kSegments, false, kDropout>(
                        p, stream)
                  : launch_fwd<Half, 256, kMask, kPersistent, kSegments, false, kDropout>(
                        p, stream);
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
  // Dropout (issue 33) is in the one-tile kernels only, whatever the variable asks for.
  if (p.has_dropout) {
    if (p.dropout_key_ptr == nullptr || p.dropout_offsets == nullptr) return cudaErrorInvalidValue;
    if (needs_masked_kernels(p)) {
      return p.q_segment_ids != nullptr ? dispatch_fwd<true, false, true, true>(p, stream)
                                        : dispatch_fwd<true, false, false, true>(p, stream);
    }
    return dispatch_fwd<false, false, false, true>(p, stream);
  }
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
// kPersistentMaxSeqKv tokens (the kernel's head dim up to 128; with 128-row tiles,
// ws-persistent-narrow, for causal calls of at most kNarrowMaxSeqKv keys at 64), ws otherwise;
// "ws": the one-tile kernel; "ws-persistent": the persistent one at every length (a call with a
// mask beyond causal runs "ws"'s masked kernel either way); "ws-persistent-narrow": the persistent
// one with 128-row tiles at head_dim 64 (ws-persistent elsewhere) at every length. All give the
// same bits, so the choice by length changes no result. The cut (H100, kernel-only): the persistent
// kernel was 2.1-7.3% faster than ws at 2k-4k tokens (round 8 call 4; it hides each tile's prologue
// and epilogue under the previous tile). Since its tiles come from a tile counter (2026-11-28,
// thirty-second session call 1, 3 rounds) it is 3.6% faster at 8k causal at head_dim 64 (its
// static order had left it 14% slower), a tie at 16k; at head_dim 128 1.5-3.1% faster at 8k
// (2026-11-27, twenty-fourth session call 9), 1.0% slower at 16k causal. (Head_dim 64 full at 8k:
// 0.7% slower with the static order, not timed with the counter.)
namespace {
constexpr int64_t kPersistentMaxSeqKv = 8192;
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
         (k == FwdKernel::kAuto &&
          p.seq_kv <= kPersistentMaxSeqKv &&
          p.head_dim <= kPersistentMaxHeadDim);
}

}  // namespace jax_dash::sm90
