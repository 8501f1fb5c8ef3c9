// The classic backward main kernel for sm90, the kernel of the long-query fallback (queries
// beyond the warp-specialized kernel's shared-memory visit tables) and of
// JAX_DASH_SM90_BWD=classic: one persistent CTA of two consumer warpgroups walks work items (KV
// tiles) in increasing global order; per KV tile it keeps K_n, V_n in shared memory and dK_n, dV_n
// in registers, visits the Q tiles of the schedule and adds each partial dQ_m into dq_accum in the
// order fixed by the tickets of cuda/schedule.h (or with fp32 atomics for Schedule::kAtomic).
//
// All five products (bwd/traits.cuh BwdTileTraits) are wgmma with both operands in shared memory
// (SS), P^T included.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/async_ops.cuh"  // ticket acquire/release, st_shared_u32
#include "cuda/sm90/bwd/epilogue.cuh"  // store_dk_dv
#include "cuda/sm90/bwd/gemm.cuh"
#include "cuda/sm90/bwd/preprocess.cuh"  // kLog2e
#include "cuda/sm90/bwd/traits.cuh"  // BwdTileTraits

namespace jax_dash::sm90::bwd {

using namespace cute;

template <class Element_, int kHeadDim_>
struct BwdTraits : BwdTileTraits<Element_, kHeadDim_> {
  using Tile = BwdTileTraits<Element_, kHeadDim_>;
  using typename Tile::Element;
  using typename Tile::BlockM;
  using typename Tile::BlockN;
  using typename Tile::HeadDim;
  using Tile::kHeadDim;
  using Tile::kBlockM;
  using Tile::kBlockN;
  using Tile::kWarpgroups;
  using Tile::kThreads;
  static constexpr bool kWarpSpecialized = false;
  // The classic kernel (bwd_main_kernel) runs head_dim 64 and 128, where each consumer warpgroup
  // owns 64 KV rows; at 256 (64 KV rows a tile) only the warp-specialized kernel runs, which
  // splits the head dim between its warpgroups (WsTraits::kSplitD).
  static constexpr bool kClassicShape = kBlockN == 64 * kWarpgroups;

  // cp.async, 16 bytes per thread per copy, rows of head_dim elements: thread t copies chunk
  // t % kChunksPerRow of rows t / kChunksPerRow + i * kRowsPerPass.
  static constexpr int kChunksPerRow = kHeadDim * int(sizeof(Element)) / 16;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kBlockM % kRowsPerPass == 0 && kBlockN % kRowsPerPass == 0);
  // At hd 64 (S/dP accumulators twice as large) the hand-written copy made ptxas spill inside the
  // step loop and was slower; there the copy stays a CuTe tiled copy (checked on the SASS and
  // timed on an H100: maintainers/perf-notes.md).
  static constexpr bool kHandWrittenCopy = kHeadDim == 128;
  using GmemTiledCopy = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{},
      Layout<Shape<Int<kRowsPerPass>, Int<kChunksPerRow>>, Stride<Int<kChunksPerRow>, _1>>{},
      Layout<Shape<_1, Int<16 / int(sizeof(Element))>>>{}));

  static constexpr int kStages = 2;  // Q/dO double buffering
  static constexpr int kSmemAlign = 1024;  // 128-byte swizzle atoms repeat every 1024 bytes
  struct SharedStorage {
    alignas(kSmemAlign) Element k[kBlockN * kHeadDim];
    alignas(kSmemAlign) Element v[kBlockN * kHeadDim];
    alignas(kSmemAlign) Element q[kStages][kBlockM * kHeadDim];
    alignas(kSmemAlign) Element dout[kStages][kBlockM * kHeadDim];
    alignas(kSmemAlign) Element pt[kBlockN * kBlockM];
    alignas(kSmemAlign) Element dst[kBlockN * kBlockM];
    alignas(16) float lse_log2[kStages][kBlockM];
    alignas(16) float dsum[kStages][kBlockM];
    int64_t item;  // current work item and KV tile within it (set by thread 0)
    int32_t kv_in_item;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + kSmemAlign;
  // Dynamic smem: SharedStorage plus the visit-order and ticket tables of one KV tile.
  static int64_t smem_bytes(int64_t num_q_tiles) {
    return kSmemBytes + 2 * num_q_tiles * int64_t(sizeof(int32_t));
  }
};


// Fire-and-forget fp32 add of two adjacent floats at L2 (8-byte aligned address).
__device__ __forceinline__ void red_add_f32x2(float* ptr, float x, float y) {
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};" ::"l"(ptr), "f"(x), "f"(y)
               : "memory");
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  const uint32_t s = cute::cast_smem_ptr_to_uint(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}


__device__ __forceinline__ void cp_async_16_zfill(uint32_t smem, const void* gmem, bool valid) {
  // With src-size 0 nothing is read and the 16 bytes are zero-filled.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// Copies kRows x head_dim rows of one or two tensors with the same row stride (row stride
// row_stride elements, row 0 valid) to swizzled smem tiles of one layout; rows at or past
// rows_valid are zero-filled so that out-of-range keys/queries contribute exact zeros. Written out
// by hand (not a CuTe tiled copy over an identity tensor): this runs every step, and the generic
// version cost ~500 instructions of 64-bit address math per warp per tile. The pass loop is kept
// rolled and the thread index re-read (volatile, so not hoisted) so that the copy needs only a few
// registers next to the live accumulators (hd 64 spilled inside the step loop otherwise).
template <class Traits, int kRows, int kTensors, class SmemLayout>
__device__ __forceinline__ void load_rows(const typename Traits::Element* const (&gbase)[kTensors],
                                          int64_t row_stride, int64_t rows_valid,
                                          typename Traits::Element* const (&smem)[kTensors],
                                          SmemLayout layout) {
  using Element = typename Traits::Element;
  if constexpr (!Traits::kHandWrittenCopy) {
    const int tid = threadIdx.x;
    typename Traits::GmemTiledCopy tiled_copy;
    auto thr_copy = tiled_copy.get_thread_slice(tid);
    Tensor c_tile = make_identity_tensor(Shape<Int<kRows>, Int<Traits::kHeadDim>>{});
    Tensor tc = thr_copy.partition_S(c_tile);  // (CPY, CPY_M, CPY_K)
    CUTE_UNROLL
    for (int t = 0; t < kTensors; ++t) {
      Tensor g_tile = make_tensor(make_gmem_ptr(gbase[t]),
                                  make_shape(Int<kRows>{}, Int<Traits::kHeadDim>{}),
                                  make_stride(row_stride, _1{}));  // (kRows, d)
      Tensor tg = thr_copy.partition_S(g_tile);
      Tensor ts = thr_copy.partition_D(make_tensor(make_smem_ptr(smem[t]), layout));
      CUTE_UNROLL
      for (int i = 0; i < size<1>(tg); ++i) {
        if (get<0>(tc(0, i, 0)) < rows_valid) {
          cute::copy(tiled_copy, tg(_, i, _), ts(_, i, _));
        } else {
          cute::clear(ts(_, i, _));
        }
      }
    }
    return;
  }
  constexpr int kChunk = 16 / int(sizeof(Element));  // elements per 16-byte copy
  uint32_t tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  const int r0 = static_cast<int>(tid) / Traits::kChunksPerRow;
  const int c0 = (static_cast<int>(tid) % Traits::kChunksPerRow) * kChunk;
  Tensor s_first = make_tensor(make_smem_ptr(smem[0]), layout);
  const uint32_t s_first_base = cute::cast_smem_ptr_to_uint(smem[0]);
#pragma unroll 1
  for (int r = r0; r < kRows; r += Traits::kRowsPerPass) {
    const bool valid = r < rows_valid;
    const int64_t g_off = valid ? r * row_stride + c0 : 0;
    // The swizzle of these layouts acts on the smem address, so the offset is taken through a
    // tensor over a real smem pointer (evaluating the layout alone gives the unswizzled offset).
    // Every destination is 1024-byte aligned, so one offset serves all of them.
    const uint32_t s_off = cute::cast_smem_ptr_to_uint(&s_first(r, c0)) - s_first_base;
    CUTE_UNROLL
    for (int t = 0; t < kTensors; ++t) {
      cp_async_16_zfill(cute::cast_smem_ptr_to_uint(smem[t]) + s_off, gbase[t] + g_off, valid);
    }
  }
}


template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_main_kernel(const AttentionParams p, const ScheduleProblem sp, const int64_t total_items) {
  static_assert(Traits::kClassicShape && Traits::kHeadDim <= 128,
                "the classic backward runs head_dim 64 and 128 (each warpgroup owns 64 KV rows)");
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;

  extern __shared__ char smem_raw[];
  // Align by offsetting smem_raw itself (not via an integer round trip), so the compiler still
  // knows every derived pointer is shared memory: LDS/STS with 32-bit addresses instead of generic
  // LD/ST with 64-bit address math. The padding is computed on the shared-window address, the one
  // the swizzle and the wgmma descriptors see.
  const uint32_t smem_base = cute::cast_smem_ptr_to_uint(smem_raw);
  const uint32_t smem_pad =
      (Traits::kSmemAlign - smem_base % Traits::kSmemAlign) % Traits::kSmemAlign;
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw + smem_pad);

  const int tid = threadIdx.x;
  const bool deterministic = sp.schedule != Schedule::kAtomic;
  const float scale = *p.scale_ptr;  // read once: a device pointer (AttentionParams)
  const float scale_log2 = scale * kLog2e;
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t rows_q = static_cast<int64_t>(sp.num_q_tiles) * kBlockM;
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                     p.num_kv_heads, p.head_dim);
  float* dq_accum = p.workspace_f32 + ws.dq_accum;
  const float* dsum_g = p.workspace_f32 + ws.dsum;
  const float* lse_log2_g = p.workspace_f32 + ws.lse_log2;
  int32_t* dq_sem = p.workspace_i32 + ws.dq_semaphore;
  int32_t* item_counter = p.workspace_i32 + ws.item_counter;
  // Per-KV-tile tables (Nq entries each) placed after SharedStorage; see visit_table_bytes.
  int32_t* visit_m = reinterpret_cast<int32_t*>(&smem + 1);
  int32_t* visit_ticket = visit_m + sp.num_q_tiles;

  const int64_t q_row_stride = static_cast<int64_t>(p.num_heads) * kHeadDim;
  const int64_t kv_row_stride = static_cast<int64_t>(p.num_kv_heads) * kHeadDim;

  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKV{});   // (Bn, d)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutKV{});   // (Bn, d)
  Tensor sKt = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKt{});  // (d, Bn)
  Tensor sPt = make_tensor(make_smem_ptr(smem.pt), typename Traits::SmemLayoutPt{});  // (Bn, Bm)
  Tensor sdSt = make_tensor(make_smem_ptr(smem.dst), typename Traits::SmemLayoutPt{});  // (Bn, Bm)
  Tensor sdS = make_tensor(make_smem_ptr(smem.dst), typename Traits::SmemLayoutdS{});  // (Bm, Bn)

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  Tensor tSrK = thr_sdp.partition_fragment_A(sK);  // (MMA, MMA_M, MMA_K) descriptors
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPt);
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdSt);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);

  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});    // (MMA, MMA_M, MMA_N)
  Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});
  Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<BlockN, HeadDim>{});
  Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<BlockN, HeadDim>{});
  Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<BlockM, HeadDim>{});

  // Coordinates of each accumulator element, for masks and global addresses.
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<BlockN, BlockM>{}));
  Tensor tdKVc = thr_dkv.partition_C(make_identity_tensor(Shape<BlockN, HeadDim>{}));
  Tensor tdQc = thr_dq.partition_C(make_identity_tensor(Shape<BlockM, HeadDim>{}));
  Tensor tPsPt = thr_sdp.partition_C(sPt);
  Tensor tPsdSt = thr_sdp.partition_C(sdSt);

  if (tid == 0) {
    smem.item = -1;
    smem.kv_in_item = 0;
  }
  // One KV tile per iteration (a symmetric_shift item has two): a nested per-item loop keeps
  // item-level values live next to dK/dV and spills.
  while (true) {
    __syncthreads();  // smem of the previous KV tile is no longer read
    if (tid == 0) {
      // Items are handed out in increasing global order. ascending/descending only wait on
      // smaller items (already taken), so they cannot deadlock; shift/symmetric_shift also wait on
      // larger items of the same per-head slice (at most p.wave consecutive items), which is safe
      // only because p.wave <= resident CTAs (the occupancy query) and items are taken in order,
      // so a whole slice is always held (argument in cuda/schedule.h).
      const int64_t prev = smem.item;
      const int next_j = smem.kv_in_item + 1;
      const bool same_item =
          prev >= 0 && next_j < item_num_kv_tiles(sp, static_cast<int>(prev % items_per_head(sp)));
      smem.item = same_item ? prev : static_cast<int64_t>(atomicAdd(item_counter, 1));
      smem.kv_in_item = same_item ? next_j : 0;
    }
    __syncthreads();
    const int64_t g = smem.item;
    const int j = smem.kv_in_item;
    if (g >= total_items) break;
    const int per_head = items_per_head(sp);
    const int head_linear = static_cast<int>(g / per_head);
    const int item = static_cast<int>(g % per_head);
    const int64_t b = head_linear / p.num_heads;
    const int h = head_linear % p.num_heads;
    const int kvh = h / group;
    const Element* q_head = static_cast<const Element*>(p.q) + b * p.seq_q * q_row_stride +
                            static_cast<int64_t>(h) * kHeadDim;
    const Element* do_head = static_cast<const Element*>(p.dout) + b * p.seq_q * q_row_stride +
                             static_cast<int64_t>(h) * kHeadDim;
    const Element* k_head = static_cast<const Element*>(p.k) + b * p.seq_kv * kv_row_stride +
                            static_cast<int64_t>(kvh) * kHeadDim;
    const Element* v_head = static_cast<const Element*>(p.v) + b * p.seq_kv * kv_row_stride +
                            static_cast<int64_t>(kvh) * kHeadDim;

    auto load_q_stage = [&](int stage, int m) {
      const int64_t row0 = static_cast<int64_t>(m) * kBlockM;
      const Element* const src[2] = {q_head + row0 * q_row_stride, do_head + row0 * q_row_stride};
      Element* const dst[2] = {smem.q[stage], smem.dout[stage]};
      load_rows<Traits, kBlockM>(src, q_row_stride, p.seq_q - row0, dst,
                                 typename Traits::SmemLayoutQ{});
      constexpr int kVecs = kBlockM / 4;  // 16-byte copies of fp32 rows
      const int64_t off = static_cast<int64_t>(head_linear) * rows_q + row0;
      if (tid < kVecs) {
        cp_async_16(&smem.lse_log2[stage][4 * tid], lse_log2_g + off + 4 * tid);
      } else if (tid < 2 * kVecs) {
        cp_async_16(&smem.dsum[stage][4 * (tid - kVecs)], dsum_g + off + 4 * (tid - kVecs));
      }
    };

    {
      const int n = item_kv_tile(sp, item, j);
      const int64_t kv0 = static_cast<int64_t>(n) * kBlockN;
      const Element* const src[2] = {k_head + kv0 * kv_row_stride, v_head + kv0 * kv_row_stride};
      Element* const dst[2] = {smem.k, smem.v};
      load_rows<Traits, kBlockN>(src, kv_row_stride, p.seq_kv - kv0, dst,
                                 typename Traits::SmemLayoutKV{});
      // Visit order and tickets of this KV tile go to smem while no accumulator is live: the
      // schedule functions are too register-hungry to evaluate next to dK/dV in the step loop.
      const int num_steps = q_visit_count(sp, head_linear, n);
      for (int s = tid; s < num_steps; s += Traits::kThreads) {
        const int visit = q_visit_tile(sp, head_linear, n, s);
        visit_m[s] = visit;
        visit_ticket[s] = deterministic ? dq_ticket(sp, head_linear, visit, n) : 0;
      }
      __syncthreads();
      if (num_steps > 0) load_q_stage(0, visit_m[0]);
      cp_async_fence();
      clear(tdKrdK);
      clear(tdVrdV);

      for (int step = 0; step < num_steps; ++step) {
        const int m = visit_m[step];
        const int stage = step % Traits::kStages;
        cp_async_wait<0>();  // this step's stage: the only group in flight
        cutlass::arch::fence_view_async_shared();  // cp.async writes -> wgmma (async proxy) reads
        // This stage is visible to all, and every thread has waited for all wgmmas of the previous
        // step (warpgroup_wait<0> at its end), so the other stage and P^T/dS^T are free again.
        __syncthreads();

        Tensor sQ = make_tensor(make_smem_ptr(smem.q[stage]), typename Traits::SmemLayoutQ{});
        Tensor sdO = make_tensor(make_smem_ptr(smem.dout[stage]), typename Traits::SmemLayoutQ{});
        Tensor sQt = make_tensor(make_smem_ptr(smem.q[stage]), typename Traits::SmemLayoutQt{});
        Tensor sdOt =
            make_tensor(make_smem_ptr(smem.dout[stage]), typename Traits::SmemLayoutQt{});
        Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
        Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
        gemm_ss<true>(mma_sdp, tSrK, tSrQ, tSrS);
        gemm_ss<true>(mma_sdp, tSrV, tSrdO, tSrdP);
        if (step + 1 < num_steps) {
          // Prefetch the next Q/dO tile into the other stage (free, see the barrier above); its
          // address math runs while the S^T/dP^T wgmmas are in flight, and it lands during the step.
          load_q_stage(stage ^ 1, visit_m[step + 1]);
          cp_async_fence();
        }

        const float* s_lse = smem.lse_log2[stage];
        const float* s_dsum = smem.dsum[stage];
        const int64_t q0 = static_cast<int64_t>(m) * kBlockM;
        // Masks only where a tile crosses seq_kv or the causal diagonal (rows past seq_q have
        // lse_log2 = +inf, so their P is already 0).
        const bool need_mask =
            kv0 + kBlockN > p.seq_kv || (p.is_causal && kv0 + kBlockN - 1 > q0);
        warpgroup_wait<1>();
        warpgroup_fence_operand(tSrS);
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); ++i) {
          const int r = get<0>(tScS(i));  // kv row in tile
          const int c = get<1>(tScS(i));  // q row in tile
          float prob = exp2f(tSrS(i) * scale_log2 - s_lse[c]);
          if (need_mask) {
            const int64_t kv = kv0 + r;
            if (kv >= p.seq_kv || (p.is_causal && kv > q0 + c)) prob = 0.f;
          }
          tSrS(i) = prob;
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrdP);
        CUTE_UNROLL
        for (int i = 0; i < size(tSrdP); ++i) {
          const int c = get<1>(tScS(i));
          tSrdP(i) = tSrS(i) * (tSrdP(i) - s_dsum[c]);
        }
        // Elements 2i, 2i+1 are adjacent q columns of one kv row, and the 128-byte swizzle moves
        // whole 16-byte chunks, so they stay adjacent (4-byte aligned) in smem: one 32-bit store
        // per pair instead of two 16-bit ones.
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); i += 2) {
          st_shared_u32(&tPsPt(i), pack_pair(static_cast<Element>(tSrS(i)),
                                              static_cast<Element>(tSrS(i + 1))));
          st_shared_u32(&tPsdSt(i), pack_pair(static_cast<Element>(tSrdP(i)),
                                               static_cast<Element>(tSrdP(i + 1))));
        }
        cutlass::arch::fence_view_async_shared();  // generic smem stores -> wgmma reads
        __syncthreads();

        Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);
        Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);
        // dQ first: its add into dq_accum (ticket wait, reductions, release) then runs while the
        // dV and dK wgmmas are still in flight.
        gemm_ss<true>(mma_dq, tdQrdS, tdQrKt, tdQrdQ);
        gemm_ss<false>(mma_dkv, tdVrPt, tdVrdOt, tdVrdV);
        gemm_ss<false>(mma_dkv, tdKrdSt, tdKrQt, tdKrdK);

        int32_t* sem = dq_sem + static_cast<int64_t>(head_linear) * sp.num_q_tiles + m;
        if (deterministic && tid == 0) spin_until_equal(sem, visit_ticket[step]);
        warpgroup_wait<2>();  // the dQ group (wgmma groups complete in order)
        warpgroup_fence_operand(tdQrdQ);
        if (deterministic) __syncthreads();  // our turn on tile m, for every thread

        float* dq_tile = dq_accum + (static_cast<int64_t>(head_linear) * rows_q + q0) * kHeadDim;
        // Fragment elements 2i, 2i+1 are adjacent columns of one row (wgmma accumulator layout).
        constexpr int kPairs = decltype(size(tdQrdQ))::value / 2;
        auto dq_addr = [&](int k) {
          const int r = get<0>(tdQc(2 * k));
          const int c = get<1>(tdQc(2 * k));
          return dq_tile + r * kHeadDim + c;
        };
        // One fp32 reduction per element at L2 (red.global.add.v2.f32, no round trip to the SM).
        // Deterministic schedules add only while holding tile m's ticket, and release it only
        // after the CTA barrier, so the adds of successive contributors reach each element in
        // ticket order: the same sequence of fp32 additions, hence the same bits, on every run.
        CUTE_UNROLL
        for (int k = 0; k < kPairs; ++k) red_add_f32x2(dq_addr(k), tdQrdQ(2 * k), tdQrdQ(2 * k + 1));
        if (deterministic) {
          // bar.sync orders every thread's reductions before thread 0's release at GPU scope
          // (release is cumulative, PTX memory model), so the next ticket holder's acquire sees
          // them all; no per-thread fence is needed.
          __syncthreads();
          if (tid == 0) red_release_gpu_add(sem, 1);
        }
        // dV/dK done before the next step's barrier, which then also means: no wgmma of this step
        // still reads Q/dO of this stage or P^T/dS^T.
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdKrdK);
        warpgroup_fence_operand(tdVrdV);
      }
      cp_async_wait<0>();  // K/V loads of a tile that visits no Q tile

      // Epilogue: dK = scale * sum dS^T Q, dV = sum P^T dO.
      store_dk_dv<Element, kHeadDim>(p, sp, tid, scale, b, h, n, kv0, tdKrdK, tdVrdV, tdKVc,
                                     [] { __syncthreads(); });
    }
  }
}

}  // namespace jax_dash::sm90::bwd

