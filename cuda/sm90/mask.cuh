// Attention masks applied to a score tile held in wgmma accumulator registers.
//
// Top-left causal: query row i sees key column j iff j <= i. Keys at or past seq_kv (the zero-filled
// tail of a partial last KV tile) are always masked. Masked scores become -inf so that exp2 gives 0.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

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

}  // namespace jax_dash::sm90
