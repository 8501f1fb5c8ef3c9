// CUDA segment_sum and its XLA FFI handler (the meaning and the order of the adds:
// cuda/segment_sum.h). Two launches on XLA's stream, no allocation, no synchronization:
//   1. offsets: one thread per segment boundary, a binary search in the sorted ids;
//   2. sums: one item per (segment, 16-byte column chunk), four items per thread; an item adds the
//      segment's rows in order into float32 registers and writes the chunk once. An empty segment
//      writes zeros, so the kernel also does the output's zero fill: the bytes moved are one read
//      of the rows and one write of the output.
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
constexpr int kItemsPerThread = 4;
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
__device__ inline void add_chunk(float (&sum)[kVec], const Chunk<T, kVec>& x) {
#pragma unroll
  for (int e = 0; e < kVec; ++e) sum[e] = __fadd_rn(sum[e], to_float(x.v[e]));
}

// Items (segment, column chunk) are numbered segment-major; a thread takes kItemsPerThread of
// them, a block apart, so a warp's stores stay contiguous. Most segments of an embedding gradient
// are empty or hold one row: the thread issues every item's offsets and first row before it
// waits on any, so its loads overlap instead of forming one chain per item (one item per thread
// left the kernel latency-bound at ~53% of the copy bandwidth). Rows after the first follow in
// order, kRowsInFlight loads at a time. The adds per item are unchanged: first row, then the
// rest in position order.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads, 2)
    segment_sum_kernel(const T* __restrict__ data, const int32_t* __restrict__ order,
                       const int32_t* __restrict__ offsets, T* __restrict__ out, int64_t row_size,
                       int64_t num_segments) {
  using C = Chunk<T, kVec>;
  // 32-bit item arithmetic (the handler refuses outputs of 2^31 chunks or more): fewer registers
  // and no 64-bit division.
  const uint32_t chunks_per_row = static_cast<uint32_t>(row_size / kVec);
  const uint32_t total = static_cast<uint32_t>(num_segments) * chunks_per_row;
  const C* columns = reinterpret_cast<const C*>(data);
  constexpr uint32_t kItemsPerBlock = uint32_t{kThreads} * kItemsPerThread;
  for (uint32_t base = blockIdx.x * kItemsPerBlock + threadIdx.x; base < total;
       base += gridDim.x * kItemsPerBlock) {
    uint32_t chunk[kItemsPerThread];
    int32_t begin[kItemsPerThread], end[kItemsPerThread];
#pragma unroll
    for (int u = 0; u < kItemsPerThread; ++u) {
      const uint32_t idx = base + u * kThreads;
      const uint32_t segment = idx < total ? idx / chunks_per_row : 0;
      chunk[u] = idx - segment * chunks_per_row;
      begin[u] = idx < total ? offsets[segment] : 0;
      end[u] = idx < total ? offsets[segment + 1] : 0;
    }
    C first[kItemsPerThread];
#pragma unroll
    for (int u = 0; u < kItemsPerThread; ++u) {
      if (begin[u] < end[u]) {
        const int64_t row = order != nullptr ? order[begin[u]] : begin[u];
        first[u] = columns[row * chunks_per_row + chunk[u]];
      }
    }
#pragma unroll
    for (int u = 0; u < kItemsPerThread; ++u) {
      const uint32_t idx = base + u * kThreads;
      if (idx >= total) break;
      float sum[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum[e] = 0.0f;
      if (begin[u] < end[u]) add_chunk<T, kVec>(sum, first[u]);
      const C* column = columns + chunk[u];
      int32_t r = begin[u] + 1;
      for (; r + kRowsInFlight <= end[u]; r += kRowsInFlight) {
        C rows[kRowsInFlight];
#pragma unroll
        for (int k = 0; k < kRowsInFlight; ++k) {
          const int64_t row = order != nullptr ? order[r + k] : r + k;
          rows[k] = column[row * chunks_per_row];
        }
#pragma unroll
        for (int k = 0; k < kRowsInFlight; ++k) add_chunk<T, kVec>(sum, rows[k]);
      }
      for (; r < end[u]; ++r) {
        const int64_t row = order != nullptr ? order[r] : r;
        add_chunk<T, kVec>(sum, column[row * chunks_per_row]);
      }
      C result;
#pragma unroll
      for (int e = 0; e < kVec; ++e) result.v[e] = from_float<T>(sum[e]);
      reinterpret_cast<C*>(out)[idx] = result;
    }
  }
}

int64_t grid_for(int64_t threads) {
  return std::max<int64_t>(1, std::min((threads + kThreads - 1) / kThreads, kMaxBlocks));
}

int64_t element_bytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

int64_t ceil_items(int64_t items) { return (items + kItemsPerThread - 1) / kItemsPerThread; }

template <typename T>
void launch_sums(const SegmentSumParams& p, cudaStream_t stream) {
  constexpr int kWide = kChunkBytes / sizeof(T);
  const T* data = static_cast<const T*>(p.data);
  T* out = static_cast<T*>(p.out);
  if (p.row_size % kWide == 0) {  // XLA's buffers are aligned, so every row is 16-byte aligned
    segment_sum_kernel<T, kWide><<<grid_for(ceil_items(p.num_segments * (p.row_size / kWide))),
                                   kThreads, 0, stream>>>(data, p.order, p.offsets, out, p.row_size,
                                             p.num_segments);
  } else {
    segment_sum_kernel<T, 1><<<grid_for(ceil_items(p.num_segments * p.row_size)), kThreads, 0,
                               stream>>>(
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
  // The sum kernel numbers its (segment, chunk) items in 32 bits (its grid-stride step is at most
  // 2^30 items, so no index wraps below 2^31 items).
  const int64_t items = p.num_segments * (p.row_size % (kChunkBytes / element_bytes(p.dtype)) == 0
                                              ? p.row_size / (kChunkBytes / element_bytes(p.dtype))
                                              : p.row_size);
  if (items >= (int64_t{1} << 31))
    return ffi::Error::InvalidArgument(
        "jax_dash segment_sum: the output has " + std::to_string(p.num_segments) + " x " +
        std::to_string(p.row_size) + " elements, too many for the CUDA kernel's 32-bit indexing "
        "(at most 2^31 - 1 16-byte chunks); split the rows over several calls");
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
