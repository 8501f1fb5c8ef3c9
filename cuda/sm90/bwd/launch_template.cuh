// Definitions of launch_bwd.h's per-instantiation host code: the main kernel's occupancy
// (resident_ctas) and a call's zeroing, preprocess, main kernel and dQ postprocess (run_bwd_impl).
// Included only by the translation units generated from instantiate.cu.in, each of which
// instantiates them for one (dtype, head_dim, mask kind).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/bwd/kernel.cuh"
#include "cuda/sm90/bwd/launch_bwd.h"
#include "cuda/sm90/bwd/postprocess.cuh"
#include "cuda/sm90/bwd/preprocess.cuh"

namespace jax_dash::sm90::bwd {

// Calls f(kernel) for each main kernel a call of Traits may launch, stopping at the first error:
// Traits's own and, with kUntracedTwin, the one compiled without the trace that launch_main runs
// when a call passes no trace buffer (the same shared memory, threads and launch bounds).
template <class Traits, class F>
cudaError_t for_each_main_kernel(F&& f) {
  cudaError_t err = f(bwd_main_ws_kernel<BwdWsKernelFor<Traits>>);
  if constexpr (Traits::kUntracedTwin) {
    if (err == cudaSuccess) err = f(bwd_main_ws_kernel<BwdWsKernelFor<typename Traits::Untraced>>);
  }
  return err;
}

template <class Traits>
cudaError_t resident_ctas(const AttentionParams& p, int* out, int64_t* max_seq_q) {
  *out = 0;
  auto kernel = bwd_main_ws_kernel<BwdWsKernelFor<Traits>>;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  // setmaxnreg moves registers between warpgroups inside the CTA's allocation: the math
  // warpgroups' increase would wait forever if the launch allocation were smaller than the sum.
  constexpr int kNeeded =
      (Traits::kServiceRegisters * 128 + Traits::kMathRegisters * Traits::kMathThreads) /
      Traits::kThreads;
  err = for_each_main_kernel<Traits>([](auto main_kernel) {
    cudaFuncAttributes attr{};
    const cudaError_t e = cudaFuncGetAttributes(&attr, main_kernel);
    if (e != cudaSuccess) return e;
    return attr.numRegs < kNeeded ? cudaErrorInvalidConfiguration : cudaSuccess;
  });
  if (err != cudaSuccess) return err;
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
  err = for_each_main_kernel<Traits>([smem](auto main_kernel) {
    return cudaFuncSetAttribute(main_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(smem));
  });
  if (err != cudaSuccess) return err;
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
  if constexpr (Traits::kUntracedTwin) {
    if (trace == nullptr) {  // WsTraits::kTraced: the kernel without the trace's code
      launch_main<typename Traits::Untraced>(p, sp, items, grid, dq_first_store, nullptr, stream);
      return;
    }
  }
  const size_t smem = static_cast<size_t>(Traits::smem_bytes(sp.num_q_tiles));
  using Element = typename Traits::Element;
  WsParams<Traits> P{};
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
  if (tma_dkv_epilogue(p)) {  // dK, dV have K's shape and dtype
    P.tma_dk = Traits::make_tma_store_kv(static_cast<Element*>(p.dk), seq_kv, p.num_kv_heads,
                                         batch);
    P.tma_dv = Traits::make_tma_store_kv(static_cast<Element*>(p.dv), seq_kv, p.num_kv_heads,
                                         batch);
  }
  bwd_main_ws_kernel<BwdWsKernelFor<Traits>>
      <<<static_cast<unsigned>(grid), Traits::kThreads, smem, stream>>>(P);
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
  const bool dq_first_store = items > 0 && dq_first_store_applies<Traits>(sp);
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
    UnitTables tables{};
    if (items > 0 && ws.unit_tables) {
      tables.sp = sp;
      tables.deterministic = sp.schedule != Schedule::kAtomic;
      tables.steps = p.workspace_i32 + ws.unit_steps;
      tables.visit = p.workspace_i32 + ws.unit_visit;
      tables.ticket = p.workspace_i32 + ws.unit_ticket;
      tables.blocks = ceil_div(static_cast<int64_t>(sp.num_q_tiles) * sp.num_kv_tiles,
                               int64_t{kPreprocessWarps} * 32);
    }
    // A warp's rows belong to one head (rows_q is whole Q tiles).
    constexpr int kRowsPerBlock = preprocess_rows_per_block<kHeadDim>();
    static_assert(Traits::kBlockM % preprocess_rows_per_warp<kHeadDim>() == 0);
    const int64_t blocks = ceil_div(pre_rows, kRowsPerBlock) + tables.blocks;
    // Instantiated in the (dtype, head_dim)'s unmasked unit only (launch_bwd.h).
    if ((err = launch_preprocess<Element, kHeadDim>(p, ws, rows_q, blocks, tables, stream)) !=
        cudaSuccess)
      return err;
  }

  if (Traits::kMask && p.q_segment_ids != nullptr && p.batch > 0) {
    // Compiled in launch.cu (a kernel that is not a template: tile_segments.cuh).
    if ((err = launch_tile_segments(
             p, sp, reinterpret_cast<SegmentRange*>(p.workspace_i32 + ws.tile_segments),
             stream)) != cudaSuccess)
      return err;
  }

  if (items > 0) {
    // Only the masked instantiation builds its unit tables itself (bwd_kernel never picks another
    // without them; a guard against reading the workspace's empty table regions).
    if (!Traits::kMask && !ws.unit_tables)
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

  if (p.batch * p.seq_q * p.num_heads > 0) {
    // 16-bit gradients leave through a shared-memory tile in 16-byte row chunks (accumulate
    // comes only with float32 gradients: ffi_common.h describe_accumulate).
    const bool staged = p.grad_dtype != DType::kFloat32 &&
                        reinterpret_cast<uintptr_t>(p.dq) % 16 == 0;
    const dim3 blocks(static_cast<unsigned>(p.batch * p.num_heads),
                      static_cast<unsigned>(sp.num_q_tiles));
    bwd_postprocess_dq_fragment_kernel<Traits>
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

}  // namespace jax_dash::sm90::bwd
