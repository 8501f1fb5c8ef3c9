// Host side of the sm90 backward: workspace zeroing, preprocess, persistent main kernel,
// postprocess. Never synchronizes; every launch is checked with cudaGetLastError.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cutlass/numeric_types.h>

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/bwd/classic_kernel.cuh"
#include "cuda/sm90/bwd/kernel.cuh"
#include "cuda/sm90/bwd/postprocess.cuh"
#include "cuda/sm90/bwd/preprocess.cuh"
#include "cuda/sm90/launch.h"

namespace jax_dash::sm90 {
namespace {

using bwd::BwdTraits;
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
enum class BwdKernel { kClassic, kWarpSpecializedRs, kWarpSpecializedRsMask, kInvalid };
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


ScheduleProblem make_schedule_problem(const AttentionParams& p, int wave) {
  return schedule_problem(p, tile_config(p.head_dim), std::max(wave, 1));
}

int64_t total_items(const ScheduleProblem& sp) {
  return static_cast<int64_t>(sp.num_heads) * items_per_head(sp);
}

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

template <class Traits>
auto main_kernel() {
  if constexpr (Traits::kWarpSpecialized) {
    return bwd::bwd_main_ws_kernel<bwd::BwdWsKernelFor<Traits>>;
  } else {
    return bwd::bwd_main_kernel<Traits>;
  }
}

// Whether Traits is a masked instantiation (bwd/kernel.cuh kMask; the classic kernel has none).
template <class Traits>
constexpr bool has_mask_policy_instance() {
  if constexpr (Traits::kWarpSpecialized) {
    return Traits::kMask;
  } else {
    return false;
  }
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

// Resident CTAs of the main kernel for this problem (its smem grows with Nq); 0 if one CTA does not
// fit (seq_q beyond about 450k tokens at head_dim 128). *max_seq_q: the longest seq_q that fits.
template <class Traits>
cudaError_t resident_ctas(const AttentionParams& p, int* out, int64_t* max_seq_q = nullptr) {
  *out = 0;
  auto kernel = main_kernel<Traits>();
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if constexpr (Traits::kWarpSpecialized) {
    // setmaxnreg moves registers between warpgroups inside the CTA's allocation: the math
    // warpgroups' increase would wait forever if the launch allocation were smaller than the sum.
    cudaFuncAttributes attr{};
    if ((err = cudaFuncGetAttributes(&attr, kernel)) != cudaSuccess) return err;
    constexpr int kNeeded =
        (Traits::kServiceRegisters * 128 + Traits::kMathRegisters * Traits::kMathThreads) /
        Traits::kThreads;
    if (attr.numRegs < kNeeded) return cudaErrorInvalidConfiguration;
  }
  int max_smem = 0;
  if ((err = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    device)) != cudaSuccess)
    return err;
  if (max_seq_q != nullptr) {
    // smem_bytes is affine in Nq: the fixed part plus a per-Q-tile part.
    const int64_t per_tile = Traits::smem_bytes(1) - Traits::smem_bytes(0);
    *max_seq_q = std::max<int64_t>(0, (max_smem - Traits::smem_bytes(0)) / per_tile) *
                 Traits::kBlockM;
  }
  const int64_t smem = Traits::smem_bytes(ceil_div(p.seq_q, Traits::kBlockM));
  if (smem > max_smem) return cudaSuccess;
  if ((err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem))) != cudaSuccess)
    return err;
  int sms = 0;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Traits::kThreads,
                                                      static_cast<size_t>(smem));
  if (err != cudaSuccess) return err;
  *out = per_sm * sms;
  return cudaSuccess;
}

// dq_first_store: run_bwd_impl's decision (it skipped dq_accum's memset), for the kernel's writer.
template <class Traits>
void launch_main(const AttentionParams& p, const ScheduleProblem& sp, int64_t items, int64_t grid,
                 bool dq_first_store, unsigned long long* trace, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(Traits::smem_bytes(sp.num_q_tiles));
  if constexpr (Traits::kWarpSpecialized) {
    using Element = typename Traits::Element;
    bwd::WsParams<Traits> P{};
    P.p = p;
    P.sp = sp;
    P.total_items = items;
    P.trace = trace;
    P.dq_first_store = dq_first_store;
    const auto seq_q = static_cast<int32_t>(p.seq_q);
    const auto seq_kv = static_cast<int32_t>(p.seq_kv);
    const auto batch = static_cast<int32_t>(p.batch);
    P.tma_q = Traits::make_tma(static_cast<const Element*>(p.q), seq_q, p.num_heads, batch,
                               typename Traits::SmemLayoutQ{});
    P.tma_do = Traits::make_tma(static_cast<const Element*>(p.dout), seq_q, p.num_heads, batch,
                                typename Traits::SmemLayoutQ{});
    P.tma_k = Traits::make_tma(static_cast<const Element*>(p.k), seq_kv, p.num_kv_heads, batch,
                               typename Traits::SmemLayoutKV{});
    P.tma_v = Traits::make_tma(static_cast<const Element*>(p.v), seq_kv, p.num_kv_heads, batch,
                               typename Traits::SmemLayoutKV{});
    if (bwd::tma_dkv_epilogue(p)) {  // dK, dV have K's shape and dtype
      P.tma_dk = Traits::make_tma_store_kv(static_cast<Element*>(p.dk), seq_kv, p.num_kv_heads,
                                           batch);
      P.tma_dv = Traits::make_tma_store_kv(static_cast<Element*>(p.dv), seq_kv, p.num_kv_heads,
                                           batch);
    }
    bwd::bwd_main_ws_kernel<bwd::BwdWsKernelFor<Traits>>
        <<<static_cast<unsigned>(grid), Traits::kThreads, smem, stream>>>(P);
  } else {
    bwd::bwd_main_kernel<Traits>
        <<<static_cast<unsigned>(grid), Traits::kThreads, smem, stream>>>(p, sp, items);
  }
}

template <class Traits>
cudaError_t run_bwd_impl(const AttentionParams& p, unsigned long long* trace,
                         cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                     p.num_kv_heads, p.head_dim);
  const ScheduleProblem sp = make_schedule_problem(p, p.wave);
  const int64_t rows_q = static_cast<int64_t>(sp.num_q_tiles) * Traits::kBlockM;
  const int64_t items = total_items(sp);
  cudaError_t err;

  // Zero what is summed into or counted: dq_accum (unless the main kernel stores each Q tile's
  // first contribution: WsParams::dq_first_store), the GQA accumulators, all int32 counters.
  bool dq_first_store = false;
  if constexpr (Traits::kWarpSpecialized) {
    dq_first_store = items > 0 && bwd::dq_first_store_applies<Traits>(sp);
  }
  if (!dq_first_store &&
      (err = cudaMemsetAsync(p.workspace_f32 + ws.dq_accum, 0,
                             (ws.dsum - ws.dq_accum) * sizeof(float), stream)) != cudaSuccess)
    return err;
  if (ws.f32_size > ws.dk_accum &&
      (err = cudaMemsetAsync(p.workspace_f32 + ws.dk_accum, 0,
                             (ws.f32_size - ws.dk_accum) * sizeof(float), stream)) != cudaSuccess)
    return err;
  if (ws.i32_size > 0 && (err = cudaMemsetAsync(p.workspace_i32, 0, ws.i32_size * sizeof(int32_t),
                                                stream)) != cudaSuccess)
    return err;

  const int64_t pre_rows = p.batch * p.num_heads * rows_q;
  if (pre_rows > 0) {
    // The warp-specialized kernel's unit tables come from the preprocess's last blocks.
    bwd::UnitTables tables{};
    if constexpr (Traits::kWarpSpecialized) {
      if (items > 0 && ws.unit_tables) {
        tables.sp = sp;
        tables.deterministic = sp.schedule != Schedule::kAtomic;
        tables.steps = p.workspace_i32 + ws.unit_steps;
        tables.visit = p.workspace_i32 + ws.unit_visit;
        tables.ticket = p.workspace_i32 + ws.unit_ticket;
        tables.blocks = ceil_div(static_cast<int64_t>(sp.num_q_tiles) * sp.num_kv_tiles,
                                 int64_t{bwd::kPreprocessWarps} * 32);
      }
    }
    // A warp's rows belong to one head (rows_q is whole Q tiles).
    constexpr int kRowsPerBlock = bwd::preprocess_rows_per_block<kHeadDim>();
    static_assert(Traits::kBlockM % bwd::preprocess_rows_per_warp<kHeadDim>() == 0);
    const int64_t blocks = ceil_div(pre_rows, kRowsPerBlock) + tables.blocks;
    bwd::bwd_preprocess_kernel<Element, kHeadDim>
        <<<static_cast<unsigned>(blocks), bwd::kPreprocessWarps * 32, 0, stream>>>(
            static_cast<const Element*>(p.out), static_cast<const Element*>(p.dout), p.lse,
            p.workspace_f32 + ws.dsum, p.workspace_f32 + ws.lse_log2, p.batch, p.seq_q,
            p.num_heads, rows_q, tables);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }

  if (has_mask_policy_instance<Traits>() && p.q_segment_ids != nullptr && p.batch > 0) {
    const int tiles = sp.num_q_tiles + sp.num_kv_tiles;
    const dim3 blocks(static_cast<unsigned>(ceil_div(tiles, bwd::kTileSegmentWarps)),
                      static_cast<unsigned>(std::min<int64_t>(p.batch, 65535)));
    bwd::bwd_tile_segments_kernel<<<blocks, bwd::kTileSegmentWarps * 32, 0, stream>>>(
        p, sp.block_m, sp.block_n, sp.num_q_tiles, sp.num_kv_tiles,
        reinterpret_cast<SegmentRange*>(p.workspace_i32 + ws.tile_segments));
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }

  if (items > 0) {
    // Only the masked instantiation builds its unit tables itself (bwd_kernel never picks another
    // without them; a guard against reading the workspace's empty table regions).
    if (Traits::kWarpSpecialized && !has_mask_policy_instance<Traits>() && !ws.unit_tables)
      return cudaErrorInvalidConfiguration;
    int resident = 0;
    if ((err = resident_ctas<Traits>(p, &resident)) != cudaSuccess) return err;
    if (resident < 1) return cudaErrorInvalidConfiguration;  // seq_q too long for the smem tables
    // Never more CTAs than can be resident together (a ticket wait must never wait on a CTA that
    // is not running) and never more than there are items.
    const int64_t grid = std::min<int64_t>({static_cast<int64_t>(std::max(p.wave, 1)),
                                            static_cast<int64_t>(resident), items});
    launch_main<Traits>(p, sp, items, grid, dq_first_store, trace, stream);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }

  if constexpr (Traits::kWarpSpecialized) {
    if (p.batch * p.seq_q * p.num_heads > 0) {
      // 16-bit gradients leave through a shared-memory tile in 16-byte row chunks (accumulate
      // comes only with float32 gradients: ffi_common.h describe_accumulate).
      const bool staged = p.grad_dtype != DType::kFloat32 &&
                          reinterpret_cast<uintptr_t>(p.dq) % 16 == 0;
      const dim3 blocks(static_cast<unsigned>(p.batch * p.num_heads),
                        static_cast<unsigned>(sp.num_q_tiles));
      bwd::bwd_postprocess_dq_fragment_kernel<Traits>
          <<<blocks, Traits::kMathThreads, 0, stream>>>(p.workspace_f32 + ws.dq_accum,
                                                        p.dq, p.seq_q, p.num_heads, rows_q,
                                                        p.scale_ptr,
                                                        p.grad_dtype == DType::kFloat32,
                                                        p.accumulate, sp, dq_first_store,
                                                        staged);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  const int64_t dq_elems = p.batch * p.seq_q * p.num_heads * kHeadDim;
  if (dq_elems > 0) {
    const int64_t blocks = ceil_div(dq_elems, bwd::kPostprocessThreads);
    bwd::bwd_postprocess_dq_kernel<Element, kHeadDim>
        <<<static_cast<unsigned>(blocks), bwd::kPostprocessThreads, 0, stream>>>(
            p.workspace_f32 + ws.dq_accum, p.dq, p.batch, p.seq_q, p.num_heads, rows_q,
            p.scale_ptr, p.grad_dtype == DType::kFloat32, p.accumulate);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  return cudaSuccess;
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
