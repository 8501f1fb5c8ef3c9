// CUDA segment_sum and its XLA FFI handler (the meaning and the order of the adds:
// cuda/segment_sum.h). Two launches on XLA's stream, no allocation, no synchronization:
//   1. offsets: one thread per segment boundary, a binary search in the sorted ids;
//   2. sums: one thread per (segment, 16-byte column chunk), which adds the segment's rows in
//      order into float32 registers and writes the chunk once. An empty segment writes zeros,
//      so the kernel also does the output's zero fill: the bytes moved are one read of the rows
//      and one write of the output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/segment_sum.h"
#include "cuda/sm90/handlers.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_dash::sm90 {
namespace {

constexpr int kThreads = 256;
// Rows whose loads are issued before their adds: a hot segment (a frequent token) is a chain of
// dependent adds per thread, so its loads must be in flight together.
constexpr int kRowsInFlight = 8;
// One (segment, chunk) item per thread. Tried on an H200 (2026-11-26): four items per thread with
// every item's offsets and first row loaded up front (105 registers, 2 blocks per SM) took
// bf16 0.603 -> 0.662 ms and float32 0.953 -> 0.835 ms at 32768 x 4096 -> 128256 rows; it lost
// on bf16, the embedding-gradient case, and was not kept
// (benchmarks/results/2026-11-26-h200-embedding/NOTES.md, call 4).
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this
constexpr int kChunkBytes = 16;

__global__ void segment_offsets_kernel(const int32_t* __restrict__ sorted_ids, int64_t num_rows,
                                       int64_t num_segments, int32_t* __restrict__ offsets) {
  for (int64_t s = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; s <= num_segments;
       s += int64_t{gridDim.x} * blockDim.x) {
    int64_t lo = 0, hi = num_rows;  // first position whose id is >= s
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (sorted_ids[mid] < s) lo = mid + 1; else hi = mid;
    }
    offsets[s] = static_cast<int32_t>(lo);
  }
}

template <typename T> __device__ inline float to_float(T x);
template <> __device__ inline float to_float<float>(float x) { return x; }
template <> __device__ inline float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T> __device__ inline T from_float(float x);
template <> __device__ inline float from_float<float>(float x) { return x; }
template <> __device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// kVec elements of T moved as one load/store (16 bytes when the row size allows it).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Chunk {
  T v[kVec];
};

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    segment_sum_kernel(const T* __restrict__ data, const int32_t* __restrict__ order,
                       const int32_t* __restrict__ offsets, T* __restrict__ out, int64_t row_size,
                       int64_t num_segments) {
  using C = Chunk<T, kVec>;
  const int64_t chunks_per_row = row_size / kVec;
  const int64_t total = num_segments * chunks_per_row;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t segment = idx / chunks_per_row;
    const int64_t chunk = idx - segment * chunks_per_row;
    const int32_t begin = offsets[segment], end = offsets[segment + 1];
    const C* column = reinterpret_cast<const C*>(data) + chunk;
    float sum[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum[e] = 0.0f;
    int32_t r = begin;
    for (; r + kRowsInFlight <= end; r += kRowsInFlight) {
      C rows[kRowsInFlight];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        const int64_t row = order != nullptr ? order[r + u] : r + u;
        rows[u] = column[row * chunks_per_row];
      }
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u)
#pragma unroll
        for (int e = 0; e < kVec; ++e) sum[e] = __fadd_rn(sum[e], to_float(rows[u].v[e]));
    }
    for (; r < end; ++r) {
      const int64_t row = order != nullptr ? order[r] : r;
      const C x = column[row * chunks_per_row];
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum[e] = __fadd_rn(sum[e], to_float(x.v[e]));
    }
    C result;
#pragma unroll
    for (int e = 0; e < kVec; ++e) result.v[e] = from_float<T>(sum[e]);
    reinterpret_cast<C*>(out)[idx] = result;
  }
}

int64_t grid_for(int64_t threads) {
  return std::max<int64_t>(1, std::min((threads + kThreads - 1) / kThreads, kMaxBlocks));
}

template <typename T>
void launch_sums(const SegmentSumParams& p, cudaStream_t stream) {
  constexpr int kWide = kChunkBytes / sizeof(T);
  const T* data = static_cast<const T*>(p.data);
  T* out = static_cast<T*>(p.out);
  if (p.row_size % kWide == 0) {  // XLA's buffers are aligned, so every row is 16-byte aligned
    segment_sum_kernel<T, kWide><<<grid_for(p.num_segments * (p.row_size / kWide)), kThreads, 0,
                                   stream>>>(data, p.order, p.offsets, out, p.row_size,
                                             p.num_segments);
  } else {
    segment_sum_kernel<T, 1><<<grid_for(p.num_segments * p.row_size), kThreads, 0, stream>>>(
        data, p.order, p.offsets, out, p.row_size, p.num_segments);
  }
}

ffi::Error SegmentSumImpl(cudaStream_t stream, ffi::AnyBuffer data,
                          ffi::Buffer<ffi::S32> sorted_ids, ffi::Buffer<ffi::S32> order,
                          bool has_order, ffi::Result<ffi::AnyBuffer> out,
                          ffi::Result<ffi::Buffer<ffi::S32>> offsets) {
  SegmentSumParams p;
  if (ffi::Error e = describe_segment_sum(data, sorted_ids, order, has_order, *out, *offsets, &p);
      e.failure())
    return e;
  segment_offsets_kernel<<<grid_for(p.num_segments + 1), kThreads, 0, stream>>>(
      p.sorted_ids, p.num_rows, p.num_segments, p.offsets);
  if (p.num_segments > 0 && p.row_size > 0) {
    switch (p.dtype) {
      case DType::kFloat32: launch_sums<float>(p, stream); break;
      case DType::kFloat16: launch_sums<__half>(p, stream); break;
      case DType::kBFloat16: launch_sums<__nv_bfloat16>(p, stream); break;
    }
  }
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess)
    return ffi::Error::Internal(std::string("jax_dash segment_sum: kernel launch failed: ") +
                                cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_dash::sm90

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashSegmentSumCuda, jax_dash::sm90::SegmentSumImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // XLA's stream
                                  .Arg<ffi::AnyBuffer>()          // data [rows, row_size]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // sorted_ids [rows]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // order [rows] (or empty)
                                  .Attr<bool>("has_order")        // order used
                                  .Ret<ffi::AnyBuffer>()          // out [num_segments, row_size]
                                  .Ret<ffi::Buffer<ffi::S32>>()   // offsets [num_segments + 1]
);
