// The dK/dV epilogues of the sm90 warp-specialized backward, one struct per policy (a static
// store()), and DkDvEpilogue, which picks the policy of a call.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/bwd/postprocess.cuh"  // store_grad, accumulate_f32
#include "cuda/sm90/bwd/traits.cuh"
#include "cuda/sm90/named_barrier.cuh"

namespace jax_dash::sm90::bwd {

using namespace cute;

// Epilogue of one KV tile n (rows kv0..): dK = scale * sum dS^T Q and dV = sum P^T dO from the
// accumulators of the calling threads, `tid` their index among the `threads` that `sync`
// synchronises (a CTA barrier or a named barrier). Without GQA the values go straight to dk/dv;
// with GQA the query heads of a group add their partial dK_n/dV_n into fp32 workspace accumulators
// in dkv_ticket order, and the last one converts the sum and writes the output. With accumulate
// (float32 gradients) each output element gets output + value (store_grad).
template <class Element, int kHeadDim, class Acc, class Coords, class Sync>
__device__ __forceinline__ void store_dk_dv(const AttentionParams& p, const ScheduleProblem& sp,
                                            int tid, float scale, int64_t b, int h, int n,
                                            int64_t kv0, const Acc& dk, const Acc& dv,
                                            const Coords& coords, Sync sync) {
  using namespace cute;
  const int group = p.num_heads / p.num_kv_heads;
  const int kvh = h / group;
  const int64_t kv_row_stride = static_cast<int64_t>(p.num_kv_heads) * kHeadDim;
  const int64_t kv_out_base =
      (b * p.seq_kv) * kv_row_stride + static_cast<int64_t>(kvh) * kHeadDim;
  const bool f32 = p.grad_dtype == DType::kFloat32;
  if (group == 1) {
    CUTE_UNROLL
    for (int i = 0; i < size(dk); ++i) {
      const int r = get<0>(coords(i));
      const int c = get<1>(coords(i));
      if (kv0 + r < p.seq_kv) {
        const int64_t o = (kv0 + r) * kv_row_stride + c;
        store_grad<Element>(p.dk, kv_out_base + o, dk(i) * scale, f32, p.accumulate);
        store_grad<Element>(p.dv, kv_out_base + o, dv(i), f32, p.accumulate);
      }
    }
    return;
  }
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                     p.num_kv_heads, p.head_dim);
  const int64_t kv_head_linear = b * p.num_kv_heads + kvh;
  const int64_t rows_kv = static_cast<int64_t>(sp.num_kv_tiles) * sp.block_n;
  int32_t* sem = p.workspace_i32 + ws.dkv_semaphore + kv_head_linear * sp.num_kv_tiles + n;
  const int ticket = dkv_ticket(sp, h % group, n);
  if (tid == 0) spin_until_equal(sem, ticket);
  sync();
  float* dk_tile = p.workspace_f32 + ws.dk_accum + (kv_head_linear * rows_kv + kv0) * kHeadDim;
  float* dv_tile = p.workspace_f32 + ws.dv_accum + (kv_head_linear * rows_kv + kv0) * kHeadDim;
  const bool last = ticket == group - 1;
  CUTE_UNROLL
  for (int i = 0; i < size(dk); ++i) {
    const int r = get<0>(coords(i));
    const int c = get<1>(coords(i));
    float* dk_addr = dk_tile + r * kHeadDim + c;
    float* dv_addr = dv_tile + r * kHeadDim + c;
    const float dk_sum = __ldcg(dk_addr) + dk(i);
    const float dv_sum = __ldcg(dv_addr) + dv(i);
    if (last) {
      if (kv0 + r < p.seq_kv) {
        const int64_t o = (kv0 + r) * kv_row_stride + c;
        store_grad<Element>(p.dk, kv_out_base + o, dk_sum * scale, f32, p.accumulate);
        store_grad<Element>(p.dv, kv_out_base + o, dv_sum, f32, p.accumulate);
      }
    } else {
      __stcg(dk_addr, dk_sum);
      __stcg(dv_addr, dv_sum);
    }
  }
  if (!last) {
    __threadfence();
    sync();
    if (tid == 0) red_release_gpu_add(sem, 1);
  }
}

// The dK/dV epilogue of a unit without GQA and with 16-bit gradients (tma_dkv_epilogue, the common
// case): dK * scale and dV, rounded to Element, go into K's and V's shared-memory tiles in the
// layout their TMA loads use (SmemLayoutKV), and one thread stores both tiles with TMA (rows past
// seq_kv are clipped by the copy engine). Elements 2i, 2i+1 of the accumulator are adjacent columns
// of one row (wgmma's C layout), so of one 16-byte chunk of the swizzled row: one st.shared.b32 per
// pair (cute's copy into a swizzled tile compiles to generic stores with 64-bit address math). One
// rounding of dk * scale and of dv to Element, as in every epilogue: the same bits.
// K and V are free once the first barrier has passed: this warpgroup's wgmmas of the unit are
// complete (the step loop's last wait) and the barrier waits for the other's (its dQ wgmma reads
// every K row). The producer writes K and V again only with the next unit's loads, issued after the
// next unit's publication barrier, and the leader (tid 0) waits for the stores' shared-memory reads
// before it arrives there (WsMainloop). Returns with the leader's stores committed, not waited for.
template <class Traits>
struct EpilogueTma {
  template <class ThrMma, class Acc>
  __device__ __forceinline__ static void store(const WsParams<Traits>& P,
                                               typename Traits::SharedStorage& smem,
                                               const ThrMma& thr_dkv, int tid, float scale, int b,
                                               int h, int n, const Acc& dk, const Acc& dv) {
    using Element = typename Traits::Element;
    using BlockN = typename Traits::BlockN;
    using HeadDim = typename Traits::HeadDim;
    Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKV{});  // (Bn, d)
    Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutKV{});
    Tensor tdKsK = thr_dkv.partition_C(sK);  // this thread's accumulator elements (tdKVc's coords)
    Tensor tdVsV = thr_dkv.partition_C(sV);
    static_assert(decltype(size(tdKsK))::value == decltype(size(dk))::value);
    // The other warpgroup's last wgmmas may still read K (dQ = dS K reads every K row).
    named_barrier_sync(kMathBarrier, Traits::kMathThreads);
    CUTE_UNROLL
    for (int i = 0; i < size(dk); i += 2) {
      st_shared_u32(&tdKsK(i), pack_pair(static_cast<Element>(dk(i) * scale),
                                         static_cast<Element>(dk(i + 1) * scale)));
      st_shared_u32(&tdVsV(i),
                    pack_pair(static_cast<Element>(dv(i)), static_cast<Element>(dv(i + 1))));
    }
    fence_async_shared();  // generic smem writes -> the TMA stores' reads
    named_barrier_sync(kMathBarrier, Traits::kMathThreads);
    if (tid == 0) {
      const AttentionParams& p = P.p;
      const auto shape = make_shape(static_cast<int32_t>(p.seq_kv), HeadDim{}, p.num_kv_heads,
                                    static_cast<int32_t>(p.batch));
      Tensor mdK = P.tma_dk.get_tma_tensor(shape);
      Tensor mdV = P.tma_dv.get_tma_tensor(shape);
      Tensor gdK = local_tile(mdK(_, _, h, b), Shape<BlockN, HeadDim>{}, make_coord(n, _0{}));
      Tensor gdV = local_tile(mdV(_, _, h, b), Shape<BlockN, HeadDim>{}, make_coord(n, _0{}));
      auto tma_dk = P.tma_dk.get_slice(_0{});
      auto tma_dv = P.tma_dv.get_slice(_0{});
      copy(P.tma_dk, tma_dk.partition_S(sK), tma_dk.partition_D(gdK));
      copy(P.tma_dv, tma_dv.partition_S(sV), tma_dv.partition_D(gdV));
      bulk_commit_group();
    }
  }
};

// The dK/dV epilogue with GQA or float32 gradients, staged through shared memory in float32:
// each of dK and dV in turn goes from the fragments to shared memory (16-byte chunks XOR-swizzled
// by row, so the fragments' 8-byte stores are conflict-free without padding: 64 KB a tensor at
// head_dim 128, which K, V, Q and dO hold), then moves in 16-byte coalesced chunks. With GQA the
// query heads of a group add into the float32 accumulators in dkv_ticket order (the chain of
// store_dk_dv, same adds: sum = accumulator + partial, so the same bits), the last one writes
// sum * scale (dK) and sum (dV) in the gradient dtype; without GQA (float32 gradients) the partial
// goes out directly. store_dk_dv did all of it one 4-byte element at a time. With accumulate
// (float32) what would be written is added to the output's value instead (accumulate_f32).
template <class Traits>
struct EpilogueStagedF32 {
  template <class Acc, class Coords>
  __device__ __forceinline__ static void store(const AttentionParams& p, const ScheduleProblem& sp,
                                               int tid, float scale, int64_t b, int h, int n,
                                               int64_t kv0, const Acc& dk, const Acc& dv,
                                               const Coords& coords, float* stage) {
    using Element = typename Traits::Element;
    constexpr int kHeadDim = Traits::kHeadDim;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kMathThreads = Traits::kMathThreads;
    using namespace cute;
    constexpr int kChunks = kHeadDim / 4;  // 16-byte chunks of a float32 row
    constexpr int kBatch = 4;              // chunks a thread moves with their loads in flight
    static_assert(kChunks >= 8 && kChunks % 8 == 0, "the swizzle permutes chunks in groups of 8");
    // Float index of (row, column): chunk c / 4 of row r at chunk (c / 4) ^ (2 * (r % 4)). A
    // half-warp's 8-byte fragment stores cover rows r..r+3, chunks {2k, 2k+1} each: 8 distinct
    // chunks, 128 bytes, every bank once; a quarter-warp's 16-byte reads of 8 consecutive chunks
    // of one row stay a permutation of them.
    auto staged = [&](int r, int c) JAX_DASH_INLINE {
      return r * kHeadDim + (((c / 4) ^ (2 * (r % 4))) * 4) + c % 4;
    };
    const int group = p.num_heads / p.num_kv_heads;
    const int kvh = h / group;
    const bool f32 = p.grad_dtype == DType::kFloat32;
    const int64_t kv_row_stride = static_cast<int64_t>(p.num_kv_heads) * kHeadDim;
    const int64_t out_base =
        (b * p.seq_kv + kv0) * kv_row_stride + static_cast<int64_t>(kvh) * kHeadDim;
    const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockN), p.seq_kv - kv0));
    const BwdWorkspaceLayout ws = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                       p.num_kv_heads, p.head_dim);
    const int64_t kv_head_linear = b * p.num_kv_heads + kvh;
    const int64_t rows_kv = static_cast<int64_t>(sp.num_kv_tiles) * sp.block_n;
    const int ticket = group > 1 ? dkv_ticket(sp, h % group, n) : 0;
    const bool last = ticket == group - 1;
    int32_t* sem = p.workspace_i32 + ws.dkv_semaphore + kv_head_linear * sp.num_kv_tiles + n;
    // The other warpgroup's last wgmmas may still read K, Q and dO; with GQA, wait for the turn.
    if (group > 1 && tid == 0) spin_until_equal(sem, ticket);
    named_barrier_sync(kMathBarrier, kMathThreads);
    // One tensor: fragments -> shared memory -> (accumulator, output) in 16-byte chunks.
    auto move = [&](const Acc& part, float out_scale, int64_t accum_offset, void* out)
                    JAX_DASH_INLINE {
      float* accum = p.workspace_f32 + accum_offset + (kv_head_linear * rows_kv + kv0) * kHeadDim;
      // Elements 2i, 2i+1 of the accumulator are adjacent columns of one row (wgmma's C layout).
      CUTE_UNROLL
      for (int i = 0; i < size(part); i += 2) {
        const int r = get<0>(coords(i));
        const int c = get<1>(coords(i));
        *reinterpret_cast<float2*>(stage + staged(r, c)) = make_float2(part(i), part(i + 1));
      }
      named_barrier_sync(kMathBarrier, kMathThreads);
      // kBatch chunks a thread at a time, their accumulator loads issued together (one at a time,
      // each a dependent L2/DRAM round trip, cost GQA ~30% of the backward at 4 x 4096, H100).
      // The group's first ticket reads nothing: the accumulator then holds zeros (the memset),
      // and 0 + partial is what it stores, the same bits.
      static_assert((kBlockN * kChunks) % (kMathThreads * kBatch) == 0,
                    "every thread moves whole batches of chunks");
      for (int x0 = tid; x0 < kBlockN * kChunks; x0 += kMathThreads * kBatch) {
        float4 a[kBatch];
        CUTE_UNROLL
        for (int u = 0; u < kBatch; ++u) {
          const int x = x0 + u * kMathThreads;
          a[u] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (group > 1 && ticket > 0)
            a[u] = __ldcg(reinterpret_cast<const float4*>(accum + (x / kChunks) * kHeadDim +
                                                          (x % kChunks) * 4));
        }
        CUTE_UNROLL
        for (int u = 0; u < kBatch; ++u) {
        const int x = x0 + u * kMathThreads;
        const int r = x / kChunks;
        const int c = (x % kChunks) * 4;
        float4 v = *reinterpret_cast<const float4*>(stage + staged(r, c));
        if (group > 1) {
          v = make_float4(__fadd_rn(a[u].x, v.x), __fadd_rn(a[u].y, v.y), __fadd_rn(a[u].z, v.z),
                          __fadd_rn(a[u].w, v.w));
          if (!last) {
            __stcg(reinterpret_cast<float4*>(accum + r * kHeadDim + c), v);
            continue;
          }
        }
        if (r >= rows) continue;
        const int64_t o = out_base + r * kv_row_stride + c;
        const float4 w =
            make_float4(v.x * out_scale, v.y * out_scale, v.z * out_scale, v.w * out_scale);
        if (f32) {
          float4* dst = reinterpret_cast<float4*>(static_cast<float*>(out) + o);
          if (p.accumulate) {  // the ring's running sum: dst = dst + w
            const float4 sum = *dst;
            *dst = make_float4(accumulate_f32(sum.x, w.x), accumulate_f32(sum.y, w.y),
                               accumulate_f32(sum.z, w.z), accumulate_f32(sum.w, w.w));
          } else {
            *dst = w;
          }
        } else {
          const uint2 packed =
              make_uint2(pack_pair(static_cast<Element>(w.x), static_cast<Element>(w.y)),
                         pack_pair(static_cast<Element>(w.z), static_cast<Element>(w.w)));
          *reinterpret_cast<uint2*>(static_cast<Element*>(out) + o) = packed;
        }
        }
      }
    };
    move(dk, scale, ws.dk_accum, p.dk);
    named_barrier_sync(kMathBarrier, kMathThreads);  // every chunk of dK read before dV's stores
    move(dv, 1.f, ws.dv_accum, p.dv);
    if (group > 1 && !last) {
      __threadfence();
      named_barrier_sync(kMathBarrier, kMathThreads);
      if (tid == 0) red_release_gpu_add(sem, 1);
    }
  }
};

// The dK/dV epilogue of the masked instantiation when the TMA one does not apply: store_dk_dv
// over the math threads. With the staged float32 epilogue its step loop's spills grew
// (ptxas, hd128: 48 -> 185 local loads).
template <class Traits>
struct EpilogueDirect {
  template <class Acc, class Coords>
  __device__ __forceinline__ static void store(const AttentionParams& p, const ScheduleProblem& sp,
                                               int tid, float scale, int64_t b, int h, int n,
                                               int64_t kv0, const Acc& dk, const Acc& dv,
                                               const Coords& coords) {
    store_dk_dv<typename Traits::Element, Traits::kHeadDim>(
        p, sp, tid, scale, b, h, n, kv0, dk, dv, coords,
        [] { named_barrier_sync(kMathBarrier, Traits::kMathThreads); });
  }
};

// dK = scale * sum dS^T Q, dV = sum P^T dO of one unit, by the math threads: the policy is the
// call's (tma_dkv_epilogue: no GQA and 16-bit gradients, in every instantiation, the masked one
// too: the epilogue sees no mask and rows past seq_kv are clipped), else the instantiation's. A
// run-time test, not a type chosen at launch: one kernel per (dtype, head_dim, mask) serves every
// GQA ratio and gradient dtype.
template <class Traits>
struct DkDvEpilogue {
  template <class ThrMma, class Acc, class Coords>
  __device__ __forceinline__ static void store(const WsParams<Traits>& P,
                                               typename Traits::SharedStorage& smem,
                                               const ThrMma& thr_dkv, int tid, float scale,
                                               int64_t b, int h, int n, int64_t kv0,
                                               const Acc& dk, const Acc& dv,
                                               const Coords& coords) {
    using SharedStorage = typename Traits::SharedStorage;
    const AttentionParams& p = P.p;
    if (tma_dkv_epilogue(p)) {
      EpilogueTma<Traits>::store(P, smem, thr_dkv, tid, scale, static_cast<int>(b), h, n, dk, dv);
    } else if constexpr (!Traits::kMask) {
      // Staged in float32 from K on, over the shared memory no role reads until the unit
      // barrier: up to the dQ buffers, or (kdQInStage) up to Q (the writer may still read dQ
      // from the Q/dO stages).
      constexpr size_t kStageEnd =
          (Traits::kdQInStage ? offsetof(SharedStorage, q) : offsetof(SharedStorage, dq)) -
          offsetof(SharedStorage, k);
      static_assert(kStageEnd >= Traits::kBlockN * Traits::kHeadDim * sizeof(float),
                    "the staging region holds one staged float32 tile");
      EpilogueStagedF32<Traits>::store(p, P.sp, tid, scale, b, h, n, kv0, dk, dv, coords,
                                       reinterpret_cast<float*>(smem.k));
    } else {
      EpilogueDirect<Traits>::store(p, P.sp, tid, scale, b, h, n, kv0, dk, dv, coords);
    }
  }
};

}  // namespace jax_dash::sm90::bwd
