// Attention masks applied to a score tile held in wgmma accumulator registers.
//
// Top-left causal: query row i sees key column j iff j <= i. Keys at or past seq_kv (the zero-filled
// tail of a partial last KV tile) are always masked. Masked scores become -inf so that exp2 gives 0.
#pragma once

#include <cute/tensor.hpp>

#include <climits>
#include <cmath>
#include <cstdint>

#include "cuda/mask.h"
#include "cuda/sm90/async_ops.cuh"  // JAX_DASH_INLINE

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

  // scores: the (rows, cols) view of the accumulator (as_rows_cols); coords: the same view of its
  // (row, col) coordinates within the tile. Per row one 32-bit limit, the row's first hidden
  // column of the tile (the band's key_end, cuda/mask.h, less col_begin; at most seq_kv < 2^31):
  // per element one 32-bit compare with the column offset instead of two 64-bit coordinates and
  // tests. The hidden set is the element-wise rule's (col >= seq_kv or, causal, col > row).
  template <class ScoreRC, class CoordRC>
  __device__ __forceinline__ void apply(ScoreRC& scores, CoordRC const& coords, int64_t row_begin,
                                        int64_t col_begin) const {
    static_assert(decltype(cute::rank(scores))::value == 2, "expects the (rows, cols) view");
    const MaskBand band{0, seq_kv, is_causal, false, 0, 0};  // key_end reads seq_kv and causal only
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores); ++r) {
      // (key_end does not depend on the row without causal: not computed there)
      const int64_t key_end =
          is_causal ? band.key_end(row_begin + cute::get<0>(coords(r, 0))) : seq_kv;
      const int64_t first_hidden = key_end - col_begin;
      const int limit = static_cast<int>(first_hidden > 0 ? first_hidden : 0);
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        if (static_cast<int>(cute::get<1>(coords(r, c))) >= limit) scores(r, c) = -INFINITY;
      }
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
  // Without segment ids the predicate above, per row, is one interval of the tile's columns:
  // query i sees key j iff i < q_end = min(seq_q, q_length), j < kv_end = min(seq_kv, kv_length),
  // i - j <= band_left and j - i <= band_right. With e = i - col_begin and c = j - col_begin that
  // is max(0, e - left) <= c < min(kv_end - col_begin, e + right + 1), nothing for i >= q_end.
  // The limits are clamped into [0, 2^30] and the band to 2^40 (kUnboundedBand): |e| < 2^32 and c
  // is below the tile's width, so neither clamp changes a test. Each element then takes two 32-bit
  // compares with its column offset where visible<false> tested both 64-bit coordinates (H100
  // window forward: ~2,400 instructions a warp and masked tile; maintainers/perf-notes.md,
  // twenty-sixth session, call 4). The interval is MaskBand's [key_begin(i), key_end(i)) cut at
  // kv_length; written out here so that its clamps at 0 and seq_kv fold into the 32-bit ones
  // (calling the two cost 65 more instructions and 44 bytes of spills in the hd128 dropout kernel).
  // The same hidden set as apply_impl<false>: the same bits. scores, coords: (rows, cols) views.
  template <class ScoreRC, class CoordRC>
  __device__ __forceinline__ void apply_rows(ScoreRC& scores, CoordRC const& coords,
                                             int64_t row_begin, int64_t col_begin) const {
    static_assert(decltype(cute::rank(scores))::value == 2, "expects the (rows, cols) view");
    constexpr int64_t kMaxOffset = int64_t{1} << 30;  // above any tile's width
    const int64_t q_end = min(m.band.seq_q, m.row.q_length);
    const int64_t kv_end = min(m.band.seq_kv, m.row.kv_length) - col_begin;
    const int64_t left = min(m.band.band_left(), kUnboundedBand);
    const int64_t right = min(m.band.band_right(), kUnboundedBand);
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores); ++r) {
      const int64_t i = row_begin + cute::get<0>(coords(r, 0));
      const int64_t e = i - col_begin;
      const int64_t lo = max(e - left, int64_t{0});
      const int64_t hi = i < q_end ? min(kv_end, e + right + 1) : int64_t{0};
      const int lo32 = static_cast<int>(min(lo, kMaxOffset));
      const int hi32 = static_cast<int>(max(min(hi, kMaxOffset), int64_t{0}));
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        const int col = static_cast<int>(cute::get<1>(coords(r, c)));
        if (col < lo32 || col >= hi32) scores(r, c) = -INFINITY;
      }
    }
  }
  // The element predicate over a tile, -inf where hidden (kSegments: with the ids' test); the
  // forward's masked step runs it with segment ids, and apply_rows without.
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

// PolicyMask's predicate in the 32-bit form the backward's step loop keeps across its steps (the
// masked instantiation): the row's extents and the band as four int32 limits, beside the segment
// ids' pointers. PolicyMask's MaskPolicy is ten 64-bit values, live across the loop with the
// accumulators: ptxas spilled them (bf16 head_dim 128: 387 local loads and stores between the step
// loop's first and last wgmma, against one in the unmasked kernel). The same predicate: query i
// sees key j iff i < q_end, j < kv_end, i - j <= left and j - i <= right (and, with segment ids,
// equal ids), where q_end = min(seq_q, q_length), kv_end = min(seq_kv, kv_length), and left and
// right are the band's, clamped to INT32_MAX (i - j of two positions below 2^31 fits in 32 bits).
struct CompactMask {
  int32_t q_end;
  int32_t kv_end;
  int32_t left;
  int32_t right;
  const int32_t* q_segment_ids;   // this row's [seq_q], or nullptr
  const int32_t* kv_segment_ids;  // this row's [seq_kv], or nullptr

  __device__ __forceinline__ static CompactMask make(const MaskPolicy& m) {
    auto clamp32 = [](int64_t x) JAX_DASH_INLINE {
      return static_cast<int32_t>(x < INT32_MAX ? (x > INT32_MIN ? x : INT32_MIN) : INT32_MAX);
    };
    CompactMask c;
    c.q_end = clamp32(min(m.band.seq_q, m.row.q_length));
    c.kv_end = clamp32(min(m.band.seq_kv, m.row.kv_length));
    c.left = clamp32(m.band.band_left());
    c.right = clamp32(m.band.band_right());
    c.q_segment_ids = m.row.q_segment_ids;
    c.kv_segment_ids = m.row.kv_segment_ids;
    return c;
  }

  __device__ __forceinline__ bool has_segments() const { return q_segment_ids != nullptr; }

  // Whether the tile rows [q0, q0 + rows) x keys [kv0, kv0 + cols) has a hidden pair (PolicyMask::
  // tile_needs_mask: not wholly inside the extents and the band, or segment ids present).
  __device__ __forceinline__ bool tile_needs_mask(int64_t q0, int rows, int64_t kv0,
                                                  int cols) const {
    const bool full = q0 + rows <= q_end && kv0 + cols <= kv_end &&
                      (q0 + rows - 1) - kv0 <= left && (kv0 + cols - 1) - q0 <= right;
    return !full || has_segments();
  }

  // Query i sees key j (both below 2^31); kSegments: the ids read at indices clamped into the row
  // (an unrolled loop has no branch; a pair past an extent is hidden whatever its ids).
  template <bool kSegments>
  __device__ __forceinline__ bool visible(int32_t i, int32_t j) const {
    const int32_t d = i - j;
    bool v = i < q_end && j < kv_end && d <= left && -d <= right;
    if constexpr (kSegments) {
      const int32_t ic = max(min(i, q_end - 1), 0);
      const int32_t jc = max(min(j, kv_end - 1), 0);
      v = v && q_segment_ids[ic] == kv_segment_ids[jc];
    }
    return v;
  }
  __device__ __forceinline__ bool visible(int32_t i, int32_t j) const {
    return has_segments() ? visible<true>(i, j) : visible<false>(i, j);
  }
};

// The smallest and largest of ids[begin, end), computed by a whole warp (every lane of it calls
// this and gets the result); an empty range gives lo > hi, which meets no other range.
__device__ __forceinline__ SegmentRange warp_segment_range(const int32_t* ids, int64_t begin,
                                                           int64_t end) {
  int32_t lo = INT32_MAX, hi = INT32_MIN;
  for (int64_t x = begin + int64_t(threadIdx.x % 32); x < end; x += 32) {
    const int32_t id = __ldg(ids + x);
    lo = min(lo, id);
    hi = max(hi, id);
  }
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
  }
  return SegmentRange{lo, hi};
}

// Narrows the KV tiles [n_lo, n_hi) of a query tile (its rows' id range q) to those whose key ids
// can equal one of the tile's query ids: a KV tile whose id range does not meet the query rows'
// range holds no pair with equal ids, so no query of the tile sees any of its keys and skipping it
// changes nothing (a fully hidden tile adds exact zeros to the softmax sums and to O). Exact for any
// ids; for packed rows (non-decreasing ids) what remains is the tiles of the documents the query
// tile touches. Rows past the query length see nothing (their ids are not read); keys past the
// key length are not read either. Called by whole warps: the ranges use warp shuffles.
// The segment-id range of the query rows [r0, r0 + block_m) that have a length (whole warp).
__device__ __forceinline__ SegmentRange query_tile_segments(const MaskRow& row, int64_t seq_q,
                                                            int64_t r0, int block_m) {
  return warp_segment_range(row.q_segment_ids, r0, min(min(r0 + block_m, seq_q), row.q_length));
}

// The segment-id range of KV tile n's keys that have a length (whole warp).
__device__ __forceinline__ SegmentRange kv_tile_segments(const MaskRow& row, int64_t seq_kv, int n,
                                                         int block_n) {
  const int64_t c0 = int64_t(n) * block_n;
  return warp_segment_range(row.kv_segment_ids, c0,
                            min(c0 + block_n, min(seq_kv, row.kv_length)));
}

__device__ __forceinline__ void narrow_kv_tiles_by_segments(const MaskRow& row, SegmentRange q,
                                                            int64_t seq_kv, int block_n, int& n_lo,
                                                            int& n_hi) {
  auto meets = [&](int n) JAX_DASH_INLINE {
    const SegmentRange kv = kv_tile_segments(row, seq_kv, n, block_n);
    return q.lo <= q.hi && kv.lo <= kv.hi && !(q.hi < kv.lo || kv.hi < q.lo);
  };
  while (n_lo < n_hi && !meets(n_lo)) ++n_lo;
  while (n_hi > n_lo && !meets(n_hi - 1)) --n_hi;
}

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
