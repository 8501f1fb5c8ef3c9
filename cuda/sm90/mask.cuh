// Attention masks applied to a score tile held in wgmma accumulator registers.
//
// Top-left causal: query row i sees key column j iff j <= i. Keys at or past seq_kv (the zero-filled
// tail of a partial last KV tile) are always masked. Masked scores become -inf so that exp2 gives 0.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>
#include <cstdint>

#include "cuda/mask.h"

namespace jax_dash::sm90 {

struct AttentionMask {
  int64_t seq_kv;
  bool is_causal;

  // Does KV tile n (columns [n*block_n, (n+1)*block_n)) need element-wise masking for a query tile
  // whose first row is row_begin? Interior tiles skip the per-element work.
  __device__ __forceinline__ bool tile_needs_mask(int64_t row_begin, int64_t col_begin,
                                                  int block_n) const {
    const int64_t col_last = col_begin + block_n - 1;
    return col_last >= seq_kv || (is_causal && col_last > row_begin);
  }

  // scores: rows x cols view of the accumulator; coords: same shape, (row, col) within the tile.
  template <class ScoreTensor, class CoordTensor>
  __device__ __forceinline__ void apply(ScoreTensor& scores, CoordTensor const& coords,
                                        int64_t row_begin, int64_t col_begin) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores); ++i) {
      const int64_t row = row_begin + cute::get<0>(coords(i));
      const int64_t col = col_begin + cute::get<1>(coords(i));
      if (col >= seq_kv || (is_causal && col > row)) scores(i) = -INFINITY;
    }
  }
};

// cuda/mask.h's MaskPolicy of one batch row, for the masked kernel instantiations (issue 13):
// the per-tile test, and the per-element predicate with the segment test chosen per tile (kSegments)
// and segment ids read at clamped indices, so an unrolled loop over a tile has no branch in it.
struct PolicyMask {
  MaskPolicy m;

  __device__ __forceinline__ bool has_segments() const { return m.row.q_segment_ids != nullptr; }

  // Tiles that need the per-element predicate: cut by the band, crossing a length, or any tile
  // when segment ids are present (they are data).
  __device__ __forceinline__ bool tile_needs_mask(int64_t r0, int rows, int64_t c0,
                                                  int cols) const {
    return m.band.tile(r0, rows, c0, cols) != TileVisibility::kFull ||
           r0 + rows > m.row.q_length || c0 + cols > m.row.kv_length || has_segments();
  }

  template <bool kSegments>
  __device__ __forceinline__ bool visible(int64_t i, int64_t j) const {
    bool v = i < m.row.q_length && j < m.row.kv_length && m.band.visible(i, j);
    if constexpr (kSegments) {
      const int64_t ic = i < m.band.seq_q ? i : m.band.seq_q - 1;
      const int64_t jc = j < m.band.seq_kv ? j : m.band.seq_kv - 1;
      v = v && m.row.q_segment_ids[ic >= 0 ? ic : 0] == m.row.kv_segment_ids[jc >= 0 ? jc : 0];
    }
    return v;
  }
  __device__ __forceinline__ bool visible(int64_t i, int64_t j) const {
    return has_segments() ? visible<true>(i, j) : visible<false>(i, j);
  }

  // scores: rows x cols view of a (query rows, key columns) accumulator tile; -inf where hidden.
  template <class ScoreTensor, class CoordTensor>
  __device__ __forceinline__ void apply(ScoreTensor& scores, CoordTensor const& coords,
                                        int64_t row_begin, int64_t col_begin) const {
    if (has_segments()) {
      apply_impl<true>(scores, coords, row_begin, col_begin);
    } else {
      apply_impl<false>(scores, coords, row_begin, col_begin);
    }
  }
  template <bool kSegments, class ScoreTensor, class CoordTensor>
  __device__ __forceinline__ void apply_impl(ScoreTensor& scores, CoordTensor const& coords,
                                             int64_t row_begin, int64_t col_begin) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores); ++i) {
      const int64_t row = row_begin + cute::get<0>(coords(i));
      const int64_t col = col_begin + cute::get<1>(coords(i));
      scores(i) = visible<kSegments>(row, col) ? scores(i) : -INFINITY;
    }
  }
};

// logits = cap * tanh(scale * s / cap), in log2 units (scale_over_cap = scale / cap).
template <class Tensor>
__device__ __forceinline__ void soft_cap_scores(Tensor& scores, float scale_over_cap,
                                                float cap_log2) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(scores); ++i) {
    scores(i) = cap_log2 * tanhf(scores(i) * scale_over_cap);
  }
}

}  // namespace jax_dash::sm90
