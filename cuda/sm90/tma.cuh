// TMA load descriptors over the attention tensors, shared by the forward and the warp-specialized
// backward: a [batch, seq, heads, head_dim] tensor is viewed as (seq, head_dim, heads, batch), so a
// tile is (rows of one head, head_dim) and rows past seq are zero-filled by the copy engine.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace jax_dash::sm90 {

// The (seq, head_dim, heads, batch) view of a [batch, seq, heads, head_dim] tensor.
template <int kHeadDim, class Element>
auto bshd_view(Element* ptr, int32_t seq, int32_t heads, int32_t batch) {
  using namespace cute;
  using GmemShape = Shape<int32_t, Int<kHeadDim>, int32_t, int32_t>;  // (seq, d, heads, batch)
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  const int64_t row_stride = int64_t(heads) * kHeadDim;
  return make_tensor(make_gmem_ptr(ptr), GmemShape{seq, Int<kHeadDim>{}, heads, batch},
                     GmemStride{row_stride, _1{}, int64_t(kHeadDim), row_stride * seq});
}

template <class Element, int kHeadDim, class SmemLayout>
auto make_bshd_tma(const Element* ptr, int32_t seq, int32_t heads, int32_t batch,
                   SmemLayout smem_layout) {
  return cute::make_tma_copy(cute::SM90_TMA_LOAD{}, bshd_view<kHeadDim>(ptr, seq, heads, batch),
                             smem_layout);
}

// The store counterpart: a box of `smem_layout` from shared memory to the tensor; rows past seq
// are not written.
template <class Element, int kHeadDim, class SmemLayout>
auto make_bshd_tma_store(Element* ptr, int32_t seq, int32_t heads, int32_t batch,
                         SmemLayout smem_layout) {
  return cute::make_tma_copy(cute::SM90_TMA_STORE{}, bshd_view<kHeadDim>(ptr, seq, heads, batch),
                             smem_layout);
}

}  // namespace jax_dash::sm90
