// Host side of the sm90 backward: the choice of the main kernel's instantiation (masked, dropout),
// its occupancy, and the dispatch of a call to the instantiation that runs it (launch_bwd.h:
// zeroing, preprocess, persistent main kernel, postprocess, compiled in the generated translation
// units). Never synchronizes; every launch is checked with cudaGetLastError.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <cutlass/numeric_types.h>

#include "cuda/mask.h"
#include "cuda/params.h"
#include "cuda/schedule.h"
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

using bwd::make_schedule_problem;
using bwd::resident_ctas;
using bwd::run_bwd_impl;
using bwd::total_items;
using bwd::WsTraits;

// The main kernel is the warp-specialized bwd/kernel.cuh ("ws-rs"), in one of six
// instantiations: plain; masked (kMask: a mask beyond causal and seq_kv, or no unit tables in the
// workspace, a long sequence over few heads), for windows and lengths only or with soft cap and
// segment ids too (kAllMasks); each with attention dropout (kDropout) or not. Their shared memory holds a KV tile's visit order and tickets (one entry per query
// tile), so a query longer than about 254k tokens (head_dim 128, H100) does not fit: the FFI
// handler refuses it with the longest that fits (BwdOccupancy::max_seq_q) and points to
// jax_dash.ring_attention. (The first kernel, bwd/classic_kernel.cuh, ran those queries with
// smaller tables and another bits version; it was deleted on 2026-11-26 with the variable
// JAX_DASH_SM90_BWD that selected it. The variants that lost their A/B tests against ws-rs,
// "ws", "ws-rs2" and "ws-rs-async", went before; maintainers/perf-notes.md.)
enum class BwdKernel {
  kWarpSpecializedRs,
  kWarpSpecializedRsBand,  // masked: windows and lengths only
  kWarpSpecializedRsMask,  // masked: every part of the policy
  kWarpSpecializedRsDropout,
  kWarpSpecializedRsBandDropout,
  kWarpSpecializedRsMaskDropout,
};
template <class Element, int kHeadDim>
using WsRsTraits = WsTraits<Element, kHeadDim, false>;
template <class Element, int kHeadDim>
using WsRsBandTraits = WsTraits<Element, kHeadDim, true, false, false>;
template <class Element, int kHeadDim>
using WsRsMaskTraits = WsTraits<Element, kHeadDim, true>;
template <class Element, int kHeadDim>
using WsRsDropoutTraits = WsTraits<Element, kHeadDim, false, true>;
template <class Element, int kHeadDim>
using WsRsBandDropoutTraits = WsTraits<Element, kHeadDim, true, true, false>;
template <class Element, int kHeadDim>
using WsRsMaskDropoutTraits = WsTraits<Element, kHeadDim, true, true>;

// Calls f(traits-tag) for the (dtype, head_dim) instantiation; false if there is none.
template <template <class, int> class Traits, class F>
bool dispatch_traits(const AttentionParams& p, F&& f) {
  const bool bf16 = p.dtype == DType::kBFloat16;
  const bool fp16 = p.dtype == DType::kFloat16;
  if (!bf16 && !fp16) return false;
  switch (p.head_dim) {
    case 64:
      if (bf16) f(Traits<cutlass::bfloat16_t, 64>{});
      else f(Traits<cutlass::half_t, 64>{});
      return true;
    case 128:
      if (bf16) f(Traits<cutlass::bfloat16_t, 128>{});
      else f(Traits<cutlass::half_t, 128>{});
      return true;
    case 256:
      if (bf16) f(Traits<cutlass::bfloat16_t, 256>{});
      else f(Traits<cutlass::half_t, 256>{});
      return true;
    default:
      return false;
  }
}

// The instantiation this problem runs (see BwdKernel).
BwdKernel bwd_kernel(const AttentionParams& p) {
  const bool tables = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                           p.num_kv_heads, p.head_dim).unit_tables;
  const bool masked = needs_masked_kernels(p) || !tables;
  const bool all = p.logits_soft_cap > 0.f || p.q_segment_ids != nullptr;
  if (p.has_dropout) {
    return !masked ? BwdKernel::kWarpSpecializedRsDropout
           : all   ? BwdKernel::kWarpSpecializedRsMaskDropout
                   : BwdKernel::kWarpSpecializedRsBandDropout;
  }
  return !masked ? BwdKernel::kWarpSpecializedRs
         : all   ? BwdKernel::kWarpSpecializedRsMask
                 : BwdKernel::kWarpSpecializedRsBand;
}

// Calls f(traits-tag) for the main kernel this problem runs; false if there is none (an
// unsupported dtype or head_dim).
template <class F>
bool dispatch(const AttentionParams& p, F&& f) {
  switch (bwd_kernel(p)) {
    case BwdKernel::kWarpSpecializedRs: return dispatch_traits<WsRsTraits>(p, f);
    case BwdKernel::kWarpSpecializedRsBand: return dispatch_traits<WsRsBandTraits>(p, f);
    case BwdKernel::kWarpSpecializedRsMask: return dispatch_traits<WsRsMaskTraits>(p, f);
    case BwdKernel::kWarpSpecializedRsDropout: return dispatch_traits<WsRsDropoutTraits>(p, f);
    case BwdKernel::kWarpSpecializedRsBandDropout:
      return dispatch_traits<WsRsBandDropoutTraits>(p, f);
    case BwdKernel::kWarpSpecializedRsMaskDropout:
      return dispatch_traits<WsRsMaskDropoutTraits>(p, f);
  }
  return false;
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

std::string kernel_selection_error() {
  if (!fwd_kernel_valid()) {
    return std::string("jax_dash: JAX_DASH_SM90_FWD='") + std::getenv("JAX_DASH_SM90_FWD") +
           "' names no forward kernel; leave it unset (the default picks ws-persistent or ws by "
           "length) or use ws, ws-persistent or ws-persistent-narrow";
  }
  return std::string();
}

}  // namespace jax_dash::sm90
