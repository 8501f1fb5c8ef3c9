// Backward postprocess: dq = dq_accum * scale in the output dtype, the scale read from device
// memory (*scale_ptr) so that a traced scale needs no host copy (the main kernel sums unscaled
// partial dQ tiles in fp32; rows past seq_q are padding and never written).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jax_dash::sm90::bwd {

constexpr int kPostprocessThreads = 256;

// One thread per output element of dq [batch, seq_q, num_heads, head_dim].
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kPostprocessThreads)
    bwd_postprocess_dq_kernel(const float* __restrict__ dq_accum, Element* __restrict__ dq,
                              int64_t batch, int64_t seq_q, int num_heads, int64_t rows_q,
                              const float* __restrict__ scale_ptr) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kPostprocessThreads + threadIdx.x;
  const int64_t total = batch * seq_q * num_heads * kHeadDim;
  if (i >= total) return;
  const int d = static_cast<int>(i % kHeadDim);
  const int64_t rest = i / kHeadDim;
  const int h = static_cast<int>(rest % num_heads);
  const int64_t s = (rest / num_heads) % seq_q;
  const int64_t b = rest / (static_cast<int64_t>(num_heads) * seq_q);
  const float v = dq_accum[((b * num_heads + h) * rows_q + s) * kHeadDim + d];
  dq[i] = static_cast<Element>(v * *scale_ptr);
}

}  // namespace jax_dash::sm90::bwd
