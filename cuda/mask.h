// The attention mask as one policy, shared by the schedules (cuda/schedule.h), the CPU kernels and,
// later, the GPU mainloops. __host__ __device__, no allocation, no pointers it owns.
//
// Query i of batch row b sees key j iff all of these hold (each part optional):
//   band      -band_right <= i - j <= band_left, where
//               causal (top-left, as jax.nn.dot_product_attention) gives i - j >= 0,
//               local_window_size (left, right) gives i - left <= j <= i + right,
//             and both together: band_left = left, band_right = min(right, 0);
//   lengths   i < query_seq_lengths[b] and j < key_value_seq_lengths[b];
//   segments  query_segment_ids[b, i] == key_value_segment_ids[b, j];
//   and i < seq_q, j < seq_kv (the tensors' extents).
// The band is static (a compile-time property of the call: is_causal and the window); lengths and
// segments are data, known per batch row only at run time.
//
// Why the band is a contiguous diagonal strip: the visible (i, j) are those with i - j in a fixed
// interval [-band_right, band_left], so for any tile of rows [r0, r1) and columns [c0, c1) the
// values i - j fill the interval [r0 - c1 + 1, r1 - 1 - c0] and the tile is
//   invisible  iff that interval misses [-band_right, band_left],
//   full       iff it lies inside it,
//   partial    otherwise (the per-element predicate decides).
// Per KV tile the visible Q tiles therefore form one contiguous range, and per Q tile the visible
// KV tiles too (schedule.h builds the tickets on these ranges).
#pragma once

#include <cstdint>

#include "cuda/compat.h"

namespace jax_dash {

// The extent of an unbounded side of the band (no window, no causal limit): larger than any
// sequence the kernels take (they index with int64 and sequences are < 2^31).
constexpr int64_t kUnboundedBand = int64_t{1} << 40;

enum class TileVisibility : int32_t {
  kInvisible = 0,  // no (i, j) of the tile is visible: skipped, never computed
  kPartial = 1,    // some are: compute, then apply the per-element predicate
  kFull = 2,       // every (i, j) of the tile is visible: no per-element predicate needed
};

// The static part: extents, causal and window. Fields zero-initialized mean "full mask", so a
// struct filled field by field from older code stays a full or causal mask.
struct MaskBand {
  int64_t seq_q;
  int64_t seq_kv;
  bool is_causal;
  bool has_window;
  int64_t window_left;   // key j >= i - window_left   (has_window only; >= 0)
  int64_t window_right;  // key j <= i + window_right  (has_window only; >= 0)

  // Visible pairs have band_right() >= j - i and i - j <= band_left().
  JAX_DASH_HD int64_t band_left() const { return has_window ? window_left : kUnboundedBand; }
  JAX_DASH_HD int64_t band_right() const {
    const int64_t right = has_window ? window_right : kUnboundedBand;
    return is_causal ? (right < 0 ? right : 0) : right;
  }

  // The same band seen from the keys: key j sees query i iff query i sees key j here.
  JAX_DASH_HD MaskBand transposed() const {
    return MaskBand{seq_kv, seq_q, false, true, band_right(), band_left()};
  }

  // The per-element predicate of the band and the extents.
  JAX_DASH_HD bool visible(int64_t i, int64_t j) const {
    const int64_t diff = i - j;
    return i >= 0 && i < seq_q && j >= 0 && j < seq_kv && diff <= band_left() &&
           -diff <= band_right();
  }

  // Keys query i sees, as the range [key_begin(i), key_end(i)) (empty when begin >= end).
  JAX_DASH_HD int64_t key_begin(int64_t i) const {
    const int64_t first = i - band_left();
    return first > 0 ? first : 0;
  }
  JAX_DASH_HD int64_t key_end(int64_t i) const {
    const int64_t end = i + band_right() + 1;
    return end < seq_kv ? end : seq_kv;
  }

  // Rows [r0, r0 + rows) x columns [c0, c0 + cols), clipped to the extents.
  JAX_DASH_HD TileVisibility tile(int64_t r0, int64_t rows, int64_t c0, int64_t cols) const {
    const int64_t r1 = r0 + rows < seq_q ? r0 + rows : seq_q;
    const int64_t c1 = c0 + cols < seq_kv ? c0 + cols : seq_kv;
    if (r1 <= r0 || c1 <= c0) return TileVisibility::kInvisible;
    const int64_t min_diff = r0 - (c1 - 1), max_diff = (r1 - 1) - c0;
    if (min_diff > band_left() || -max_diff > band_right()) return TileVisibility::kInvisible;
    const bool inside_band = max_diff <= band_left() && -min_diff <= band_right();
    const bool whole_tile = r1 == r0 + rows && c1 == c0 + cols;
    return inside_band && whole_tile ? TileVisibility::kFull : TileVisibility::kPartial;
  }
};

// The data part of one batch row: lengths (already clipped to the extents by the caller or not:
// they are only compared against) and segment ids (nullptr = no segments).
struct MaskRow {
  int64_t q_length;       // queries i >= q_length see nothing
  int64_t kv_length;      // keys j >= kv_length are seen by no query
  const int32_t* q_segment_ids;   // [seq_q] of this row, or nullptr
  const int32_t* kv_segment_ids;  // [seq_kv] of this row, or nullptr

  JAX_DASH_HD bool visible(int64_t i, int64_t j) const {
    return i < q_length && j < kv_length &&
           (q_segment_ids == nullptr || q_segment_ids[i] == kv_segment_ids[j]);
  }
};

// Batch row b's data from the call's arrays (any may be nullptr: that part is absent).
JAX_DASH_HD inline MaskRow mask_row(const int32_t* q_seq_lengths, const int32_t* kv_seq_lengths,
                                    const int32_t* q_segment_ids, const int32_t* kv_segment_ids,
                                    int64_t seq_q, int64_t seq_kv, int64_t b) {
  MaskRow row{};
  row.q_length = q_seq_lengths != nullptr ? q_seq_lengths[b] : seq_q;
  row.kv_length = kv_seq_lengths != nullptr ? kv_seq_lengths[b] : seq_kv;
  if (q_segment_ids != nullptr) {
    row.q_segment_ids = q_segment_ids + b * seq_q;
    row.kv_segment_ids = kv_segment_ids + b * seq_kv;
  }
  return row;
}

// The smallest and largest segment id of a tile's rows (or columns): two tiles whose ranges do not
// overlap share no segment; two tiles of one equal id are segment-wise full.
struct SegmentRange {
  int32_t lo;
  int32_t hi;
};

JAX_DASH_HD inline SegmentRange segment_range(const int32_t* ids, int64_t begin, int64_t end) {
  SegmentRange r{ids[begin], ids[begin]};
  for (int64_t x = begin + 1; x < end; ++x) {
    r.lo = ids[x] < r.lo ? ids[x] : r.lo;
    r.hi = ids[x] > r.hi ? ids[x] : r.hi;
  }
  return r;
}

// The whole policy for one batch row: the static band refined by the row's data. The tile test is
// conservative where it must be (it never calls a tile invisible or full that is not).
struct MaskPolicy {
  MaskBand band;
  MaskRow row;

  JAX_DASH_HD bool visible(int64_t i, int64_t j) const {
    return band.visible(i, j) && row.visible(i, j);
  }

  // q_segments / kv_segments: the tile's segment ranges (ignored without segments).
  JAX_DASH_HD TileVisibility tile(int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                                  SegmentRange q_segments, SegmentRange kv_segments) const {
    const TileVisibility static_part = band.tile(r0, rows, c0, cols);
    if (static_part == TileVisibility::kInvisible) return static_part;
    if (r0 >= row.q_length || c0 >= row.kv_length) return TileVisibility::kInvisible;
    bool full = static_part == TileVisibility::kFull && r0 + rows <= row.q_length &&
                c0 + cols <= row.kv_length;
    if (row.q_segment_ids != nullptr) {
      if (q_segments.hi < kv_segments.lo || kv_segments.hi < q_segments.lo)
        return TileVisibility::kInvisible;
      full = full && q_segments.lo == q_segments.hi && kv_segments.lo == kv_segments.hi &&
             q_segments.lo == kv_segments.lo;
    }
    return full ? TileVisibility::kFull : TileVisibility::kPartial;
  }
};

// ---- tile ranges of the static band (what the schedules and the tickets are built on) ----------

// A range of tiles [first, end) (empty when first >= end).
struct TileRange {
  int32_t first;
  int32_t end;
};

// KV tiles that Q tile m sees: the range [first, end).
JAX_DASH_HD inline TileRange band_kv_tiles(const MaskBand& band, int64_t block_m, int64_t block_n,
                                           int m) {
  const int64_t num_kv_tiles = (band.seq_kv + block_n - 1) / block_n;
  const int64_t r0 = static_cast<int64_t>(m) * block_m;
  const int64_t r1 = r0 + block_m < band.seq_q ? r0 + block_m : band.seq_q;
  int64_t first_col = r0 - band.band_left();
  int64_t last_col = r1 - 1 + band.band_right();
  first_col = first_col > 0 ? first_col : 0;
  last_col = last_col < band.seq_kv - 1 ? last_col : band.seq_kv - 1;
  TileRange r{0, 0};
  if (r1 <= r0 || last_col < first_col) return r;
  r.first = static_cast<int32_t>(first_col / block_n);
  const int64_t end = last_col / block_n + 1;
  r.end = static_cast<int32_t>(end < num_kv_tiles ? end : num_kv_tiles);
  return r;
}

// Q tiles of block_m rows that see KV tile n (block_n columns): the range [first, end). The
// transposed question of band_kv_tiles.
JAX_DASH_HD inline TileRange band_q_tiles(const MaskBand& band, int64_t block_m, int64_t block_n,
                                          int n) {
  return band_kv_tiles(band.transposed(), block_n, block_m, n);
}

}  // namespace jax_dash
