// Host side of the sm90 backward: the choice of main kernel (JAX_DASH_SM90_BWD, the long-query
// fallback, the masked instantiation), its occupancy, and the dispatch of a call to the
// instantiation that runs it (launch_bwd.h: zeroing, preprocess, persistent main kernel,
// postprocess, compiled in the generated translation units). Never synchronizes; every launch is
// checked with cudaGetLastError.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cutlass/numeric_types.h>

#include "cuda/mask.h"
#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/bwd/classic_kernel.cuh"  // BwdTraits
#include "cuda/sm90/bwd/launch_bwd.h"
#include "cuda/sm90/bwd/tile_segments.cuh"
#include "cuda/sm90/bwd/traits.cuh"
#include "cuda/sm90/launch.h"

namespace jax_dash::sm90 {

namespace bwd {

cudaError_t launch_tile_segments(const AttentionParams& p, const ScheduleProblem& sp,
                                 SegmentRange* tile_segments, cudaStream_t stream) {
  const int tiles = sp.num_q_tiles + sp.num_kv_tiles;
  const dim3 blocks(static_cast<unsigned>(ceil_div(tiles, kTileSegmentWarps)),
                    static_cast<unsigned>(std::min<int64_t>(p.batch, 65535)));
  bwd_tile_segments_kernel<<<blocks, kTileSegmentWarps * 32, 0, stream>>>(
      p, sp.block_m, sp.block_n, sp.num_q_tiles, sp.num_kv_tiles, tile_segments);
  return cudaGetLastError();
}

}  // namespace bwd

namespace {

using bwd::BwdTraits;
using bwd::make_schedule_problem;
using bwd::resident_ctas;
using bwd::run_bwd_impl;
using bwd::total_items;
using bwd::WsTraits;

// Which main kernel runs (JAX_DASH_SM90_BWD, read at each call): the warp-specialized
// bwd/kernel.cuh ("ws-rs", the default when unset or empty; stages S1-S3), or the first kernel
// bwd/classic_kernel.cuh ("classic"). Both have the same items, visit orders and tickets; the
// warp-specialized kernel's gradients are another bits version than bwd/classic_kernel.cuh's
// (docs/determinism.md). A query too long for the warp-specialized kernel's shared-memory tables
// (about 254k tokens at head_dim 128) runs the classic kernel, whose tables are smaller (about
// 450k). That fallback is why "classic" stays selectable: it runs the fallback's kernel at any
// length, so that the driver and the GPU tests check it on small problems (it is not a faster
// choice: 11.99 against ws-rs's 7.06 ms at head_dim 128 full 8k, maintainers/perf-notes.md).
// A call with a mask beyond causal (window, lengths, segment ids, soft cap) runs the ws-rs kernel's
// masked instantiation (kMask); the classic kernel does not carry the mask policy.
// The variants that lost their A/B tests against ws-rs (perf-notes) are deleted: "ws" (every
// product from shared memory), "ws-rs2" (two dQ buffers at every head dim) and "ws-rs-async"
// (ticket releases on a releaser warp).
// A call with dropout runs an instantiation with kDropout, whatever the variable asks for (the
// classic kernel has no dropout): ws-rs's (kWarpSpecializedRsDropout) or, where ws-rs would take
// its masked instantiation, that one's (kWarpSpecializedRsMaskDropout).
enum class BwdKernel {
  kClassic,
  kWarpSpecializedRs,
  kWarpSpecializedRsMask,
  kWarpSpecializedRsDropout,
  kWarpSpecializedRsMaskDropout,
  kInvalid
};
BwdKernel requested_bwd_kernel() {
  const char* v = std::getenv("JAX_DASH_SM90_BWD");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "ws-rs") == 0) {
    return BwdKernel::kWarpSpecializedRs;
  }
  if (std::strcmp(v, "classic") == 0) return BwdKernel::kClassic;
  return BwdKernel::kInvalid;
}
template <class Element, int kHeadDim>
using WsRsTraits = WsTraits<Element, kHeadDim, false>;
template <class Element, int kHeadDim>
using WsRsMaskTraits = WsTraits<Element, kHeadDim, true>;
template <class Element, int kHeadDim>
using WsRsDropoutTraits = WsTraits<Element, kHeadDim, false, true>;
template <class Element, int kHeadDim>
using WsRsMaskDropoutTraits = WsTraits<Element, kHeadDim, true, true>;


// Calls f(traits-tag) for the (dtype, head_dim) instantiation; false if there is none. Head dim
// 256 has only the register-sourced warp-specialized kernel (kWith256: ws-rs and its masked
// instantiation; bwd/kernel.cuh kSplitD).
template <template <class, int> class Traits, bool kWith256 = false, class F>
bool dispatch_traits(const AttentionParams& p, F&& f) {
  const bool bf16 = p.dtype == DType::kBFloat16;
  const bool fp16 = p.dtype == DType::kFloat16;
  if (!bf16 && !fp16) return false;
  if (p.head_dim == 64) {
    if (bf16) f(Traits<cutlass::bfloat16_t, 64>{});
    else f(Traits<cutlass::half_t, 64>{});
    return true;
  }
  if (p.head_dim == 128) {
    if (bf16) f(Traits<cutlass::bfloat16_t, 128>{});
    else f(Traits<cutlass::half_t, 128>{});
    return true;
  }
  if constexpr (kWith256) {
    if (p.head_dim == 256) {
      if (bf16) f(Traits<cutlass::bfloat16_t, 256>{});
      else f(Traits<cutlass::half_t, 256>{});
      return true;
    }
  }
  return false;
}

// Whether one CTA of Traits' main kernel fits in the device's shared memory for this seq_q.
template <class Traits>
bool fits_shared_memory(const AttentionParams& p) {
  int device = 0, max_smem = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return false;
  }
  return Traits::smem_bytes(ceil_div(p.seq_q, Traits::kBlockM)) <= max_smem;
}

// Calls f(traits-tag) for kernel k's (dtype, head_dim) instantiation; false if there is none (an
// unknown JAX_DASH_SM90_BWD, an unsupported dtype or head_dim).
template <class F>
bool dispatch_kernel(BwdKernel k, const AttentionParams& p, F&& f) {
  switch (k) {
    case BwdKernel::kWarpSpecializedRs: return dispatch_traits<WsRsTraits, true>(p, f);
    case BwdKernel::kWarpSpecializedRsMask: return dispatch_traits<WsRsMaskTraits, true>(p, f);
    case BwdKernel::kWarpSpecializedRsDropout:
      return dispatch_traits<WsRsDropoutTraits, true>(p, f);
    case BwdKernel::kWarpSpecializedRsMaskDropout:
      return dispatch_traits<WsRsMaskDropoutTraits, true>(p, f);
    case BwdKernel::kClassic: return dispatch_traits<BwdTraits>(p, f);
    case BwdKernel::kInvalid: break;
  }
  return false;
}

// The main kernel this problem runs: the requested one, where ws-rs takes its masked instantiation
// for a call with a mask beyond causal or without the workspace's unit tables, and a
// warp-specialized kernel whose tables do not fit (a long query) falls back to classic. A masked
// call that ends on a kernel without the mask policy gets kInvalid.
BwdKernel bwd_kernel(const AttentionParams& p) {
  const bool masked = needs_masked_kernels(p);
  // Without the unit tables (a long sequence over few heads: bwd_workspace_layout) only the masked
  // instantiation has visit orders and tickets: it builds them in the kernel, with the same bits.
  const bool tables = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                           p.num_kv_heads, p.head_dim).unit_tables;
  const bool needs_mask_instance = masked || !tables;
  auto fits = [&](BwdKernel kernel) {
    bool ok = true;
    dispatch_kernel(kernel, p, [&](auto traits) { ok = fits_shared_memory<decltype(traits)>(p); });
    return ok;
  };
  BwdKernel k = requested_bwd_kernel();
  if (p.has_dropout && k != BwdKernel::kInvalid) {
    // Dropout: its instantiation, whose tables must fit (a query too long for them is refused).
    const BwdKernel d = needs_mask_instance ? BwdKernel::kWarpSpecializedRsMaskDropout
                                            : BwdKernel::kWarpSpecializedRsDropout;
    return fits(d) ? d : BwdKernel::kInvalid;
  }
  // Head dim 256 has ws-rs only: a classic request runs it too, and a query too long for its
  // tables is refused by the occupancy check (ffi_sm90.cu), there being no classic kernel.
  if (p.head_dim == 256 && k != BwdKernel::kInvalid) {
    return needs_mask_instance ? BwdKernel::kWarpSpecializedRsMask : BwdKernel::kWarpSpecializedRs;
  }
  if (k == BwdKernel::kWarpSpecializedRs && needs_mask_instance) {
    k = BwdKernel::kWarpSpecializedRsMask;
  }
  if ((k == BwdKernel::kWarpSpecializedRs || k == BwdKernel::kWarpSpecializedRsMask) && !fits(k)) {
    k = BwdKernel::kClassic;
  }
  if (masked && k != BwdKernel::kWarpSpecializedRsMask) return BwdKernel::kInvalid;
  return k;
}

// Calls f(traits-tag) for the main kernel this problem runs; false if there is none.
template <class F>
bool dispatch(const AttentionParams& p, F&& f) {
  return dispatch_kernel(bwd_kernel(p), p, f);
}

}  // namespace

cudaError_t bwd_occupancy(const AttentionParams& p, BwdOccupancy* out) {
  *out = BwdOccupancy{};
  int resident = 0;
  cudaError_t err = cudaErrorInvalidValue;  // unsupported dtype / head_dim
  dispatch(p, [&](auto traits) {
    err = resident_ctas<decltype(traits)>(p, &resident, &out->max_seq_q);
  });
  if (err != cudaSuccess) return err;
  out->resident_ctas = resident;
  if (resident < 1) return cudaSuccess;
  const int64_t items = total_items(make_schedule_problem(p, resident));
  out->wave = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(resident, items)));
  return cudaSuccess;
}

cudaError_t run_bwd(const AttentionParams& p, cudaStream_t stream, unsigned long long* trace) {
  cudaError_t err = cudaErrorInvalidValue;  // unsupported dtype / head_dim
  dispatch(p, [&](auto traits) { err = run_bwd_impl<decltype(traits)>(p, trace, stream); });
  return err;
}

int bwd_trace_slots() { return bwd::kWsTraceSlots; }

bool bwd_uses_warp_specialized(const AttentionParams& p) {
  const BwdKernel k = bwd_kernel(p);
  return k != BwdKernel::kClassic && k != BwdKernel::kInvalid;
}

std::string kernel_selection_error() {
  if (requested_bwd_kernel() == BwdKernel::kInvalid) {
    return std::string("jax_dash: JAX_DASH_SM90_BWD='") + std::getenv("JAX_DASH_SM90_BWD") +
           "' names no backward kernel; leave it unset (the default, ws-rs) or use ws-rs or "
           "classic (the kernel that runs queries too long for ws-rs)";
  }
  if (!fwd_kernel_valid()) {
    return std::string("jax_dash: JAX_DASH_SM90_FWD='") + std::getenv("JAX_DASH_SM90_FWD") +
           "' names no forward kernel; leave it unset (the default picks ws-persistent or ws by "
           "length) or use ws, ws-persistent or ws-persistent-narrow";
  }
  return std::string();
}

}  // namespace jax_dash::sm90
