// Backward postprocess: dq = dq_accum * scale in the output dtype, the scale read from device
// memory (*scale_ptr) so that a traced scale needs no host copy (the main kernel sums unscaled
// partial dQ tiles in fp32; rows past seq_q are padding and never written). With accumulate
// (float32 only) dq = dq + dq_accum * scale: the ring's running sum, aliased to dq.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cute/tensor.hpp>

#include "cuda/schedule.h"
#include "cuda/sm90/async_ops.cuh"  // pack_pair

namespace jax_dash::sm90::bwd {

// sum + value as a separate float32 add (add.rn, which neither nvcc nor ptxas contracts with the
// product that made value into an FMA): what XLA's float32 add of the stored value gives, so an
// accumulating call (AttentionParams::accumulate) has the bits of a call without it plus that add.
__device__ __forceinline__ float accumulate_f32(float sum, float value) {
  return __fadd_rn(sum, value);
}

// dq, dk, dv element i of a gradient buffer: in the input dtype, or in float32 (unrounded) when the
// call asked for float32 gradients (AttentionParams::grad_dtype, ring attention's accumulators),
// then added to the element's value with accumulate (the ring's running sums).
template <class Element>
__device__ __forceinline__ void store_grad(void* base, int64_t i, float value, bool f32,
                                           bool accumulate) {
  if (f32) {
    float* out = static_cast<float*>(base) + i;
    *out = accumulate ? accumulate_f32(*out, value) : value;
  } else {
    static_cast<Element*>(base)[i] = static_cast<Element>(value);
  }
}

// Bytes of one row of the 16-bit staging tile of bwd_postprocess_dq_fragment_kernel: the row's
// 16-bit values plus 16 bytes, so that a warp's fragment stores (8 rows, 16 bytes each) start 4
// banks apart and hit 32 distinct banks.
template <int kHeadDim>
constexpr int dq_stage_pitch() {
  return kHeadDim * 2 + 16;
}

// For the main kernel's fragment-order dq_accum (bwd/kernel.cuh): one CTA per
// (head, Q tile) (heads on grid x, which has room for batch * heads beyond 65535); thread t reads
// the 16-byte chunks Traits::dq_chunk(k, t) of the tile (coalesced, all before the first use) and
// finds each value's (row, column) through the dQ MMA's thread slice, exactly as the math thread
// that stored it. The value written is dq_accum * scale rounded once to the output dtype, in
// every path:
// - 16-bit gradients with a 16-byte aligned dq (staged): the rounded pairs go into a shared-memory
//   tile in row order, and the tile leaves in 16-byte chunks, whole rows at a time. Stored straight
//   from the fragments, a warp's 4-byte stores left half-written 32-byte sectors over 8 rows, which
//   L2 filled from DRAM and wrote back whole: 224 us at hd128 2k B8 H16 on an H100, 37% of DRAM
//   peak (maintainers/perf-notes.md, thirteenth session);
// - otherwise straight from the fragments: adjacent column pairs as one store (float32 pairs fill
//   whole sectors).
template <class Traits>
__global__ void __launch_bounds__(Traits::kMathThreads)
    bwd_postprocess_dq_fragment_kernel(const float* __restrict__ dq_accum,
                                       void* __restrict__ dq, int64_t seq_q,
                                       int num_heads, int64_t rows_q,
                                       const float* __restrict__ scale_ptr, bool f32,
                                       bool accumulate, const ScheduleProblem sp,
                                       bool first_store, bool staged) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kThreads = Traits::kMathThreads;
  constexpr int kChunks = Traits::kdQChunks;  // 16-byte chunks a thread reads
  constexpr int kPitch = dq_stage_pitch<kHeadDim>();
  static_assert(sizeof(Element) == 2 && kPitch % 16 == 0);
  __shared__ alignas(16) unsigned char stage[kBlockM * kPitch];
  const int tid = threadIdx.x;
  const int64_t head_linear = blockIdx.x;
  const int m = blockIdx.y;
  const int64_t b = head_linear / num_heads;
  const int h = static_cast<int>(head_linear % num_heads);
  typename Traits::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tdQc = thr_dq.partition_C(
      make_identity_tensor(Shape<typename Traits::BlockM, typename Traits::HeadDim>{}));
  static_assert(decltype(size(tdQc))::value == Traits::kdQFloatsPerThread);
  const float4* tile = reinterpret_cast<const float4*>(
      dq_accum + (head_linear * rows_q + static_cast<int64_t>(m) * kBlockM) * kHeadDim);
  const int64_t row_stride = static_cast<int64_t>(num_heads) * kHeadDim;
  const float scale = *scale_ptr;
  // With first_store (WsParams::dq_first_store) dq_accum was not zeroed, and a Q tile the band
  // gives no KV tile was never written: it reads as the zero it would have held.
  const bool unwritten = first_store && num_kv_tiles_seen(sp, m) == 0;
  const int64_t head_offset = b * seq_q * row_stride + static_cast<int64_t>(h) * kHeadDim;
  float4 v[kChunks];
  CUTE_UNROLL
  for (int k = 0; k < kChunks; ++k) {
    v[k] = unwritten ? make_float4(0.f, 0.f, 0.f, 0.f) : tile[Traits::dq_chunk(k, tid)];
  }
  if (staged) {
    CUTE_UNROLL
    for (int k = 0; k < kChunks; ++k) {
      const float vals[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
      CUTE_UNROLL
      for (int i = 0; i < 4; i += 2) {
        // Fragment values 2j, 2j + 1 are adjacent columns of one row (wgmma accumulator layout).
        const int r = get<0>(tdQc(4 * k + i));
        const int c = get<1>(tdQc(4 * k + i));
        *reinterpret_cast<uint32_t*>(stage + r * kPitch + c * 2) =
            pack_pair(static_cast<Element>(vals[i] * scale),
                      static_cast<Element>(vals[i + 1] * scale));
      }
    }
    __syncthreads();
    constexpr int kRowChunks = kHeadDim * 2 / 16;  // 16-byte chunks of one output row
    static_assert(kBlockM * kRowChunks % kThreads == 0);
    CUTE_UNROLL
    for (int k = 0; k < kBlockM * kRowChunks / kThreads; ++k) {
      const int x = k * kThreads + tid;
      const int r = x / kRowChunks;
      const int c = x % kRowChunks;
      const int64_t row = static_cast<int64_t>(m) * kBlockM + r;
      if (row < seq_q) {
        *reinterpret_cast<uint4*>(static_cast<Element*>(dq) + head_offset + row * row_stride +
                                  c * 8) = *reinterpret_cast<const uint4*>(stage + r * kPitch + c * 16);
      }
    }
    return;
  }
  CUTE_UNROLL
  for (int k = 0; k < kChunks; ++k) {
    const float vals[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
    CUTE_UNROLL
    for (int i = 0; i < 4; i += 2) {
      const int64_t row = static_cast<int64_t>(m) * kBlockM + get<0>(tdQc(4 * k + i));
      const int col = get<1>(tdQc(4 * k + i));
      if (row < seq_q) {
        const int64_t o = head_offset + row * row_stride + col;
        if (f32) {
          float2* out = reinterpret_cast<float2*>(static_cast<float*>(dq) + o);
          float2 w = make_float2(vals[i] * scale, vals[i + 1] * scale);
          if (accumulate) {
            const float2 sum = *out;
            w = make_float2(accumulate_f32(sum.x, w.x), accumulate_f32(sum.y, w.y));
          }
          *out = w;
        } else {
          *reinterpret_cast<uint32_t*>(static_cast<Element*>(dq) + o) =
              pack_pair(static_cast<Element>(vals[i] * scale),
                        static_cast<Element>(vals[i + 1] * scale));
        }
      }
    }
  }
}

}  // namespace jax_dash::sm90::bwd
