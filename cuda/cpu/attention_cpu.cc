// CPU forward and backward. Loops are written so the innermost loop runs over independent lanes
// (never a floating-point reduction), which lets the compiler vectorize without reassociating sums:
// the bits are those of the written order.
#include "cuda/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/cpu/dtype.h"
#include "cuda/dropout.h"
#include "cuda/cpu/thread_pool.h"

namespace jax_dash::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;

// Index helpers for the contiguous layouts documented in cuda/params.h.
struct Layout {
  const AttentionParams& p;
  int64_t q_index(int64_t b, int64_t i, int64_t h) const {
    return ((b * p.seq_q + i) * p.num_heads + h) * p.head_dim;
  }
  int64_t kv_index(int64_t b, int64_t j, int64_t kvh) const {
    return ((b * p.seq_kv + j) * p.num_kv_heads + kvh) * p.head_dim;
  }
  int64_t lse_index(int64_t b, int64_t h, int64_t i) const {
    return (b * p.num_heads + h) * p.seq_q + i;
  }
  int group_size() const { return p.num_heads / p.num_kv_heads; }
};

// Loads `rows` rows of one head into a dense [rows, head_dim] fp32 tile (rows past the end -> 0).
void load_rows(const void* base, DType dtype, int64_t first_index, int64_t row_stride,
               int64_t rows, int64_t valid_rows, int64_t head_dim, float* tile) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = tile + r * head_dim;
    if (r >= valid_rows) {
      std::fill(row, row + head_dim, 0.0f);
      continue;
    }
    const int64_t start = first_index + r * row_stride;
    for (int64_t d = 0; d < head_dim; ++d) row[d] = load_element(base, start + d, dtype);
  }
}

// transposed[d * cols + c] = tile[c * head_dim + d]
void transpose(const float* tile, int64_t cols, int64_t head_dim, float* transposed) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t d = 0; d < head_dim; ++d) transposed[d * cols + c] = tile[c * head_dim + d];
}

// out[r, c] = sum_d a[r, d] * bt[d, c]   (a: [rows, head_dim], bt: [head_dim, cols])
void matmul_abt(const float* a, const float* bt, int64_t rows, int64_t cols, int64_t head_dim,
                float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    float* out_row = out + r * cols;
    std::fill(out_row, out_row + cols, 0.0f);
    for (int64_t d = 0; d < head_dim; ++d) {
      const float a_rd = a[r * head_dim + d];
      const float* bt_row = bt + d * cols;
      for (int64_t c = 0; c < cols; ++c) out_row[c] += a_rd * bt_row[c];
    }
  }
}

// Which keys of a tile each query row sees (cuda/mask.h's predicate, evaluated once per tile
// pair): row r sees columns [begin[r], end[r]) of the tile (the band, the lengths and the extents
// give one contiguous range per row), and, when segments cut the tile (use_keep), only those of
// them with keep[r * cols + c].
struct RowSpans {
  std::vector<int64_t> begin, end;
  std::vector<uint8_t> keep;
  bool use_keep = false;
  int64_t cols = 0;
  RowSpans(int64_t rows, int64_t max_cols)
      : begin(rows), end(rows), keep(rows * max_cols) {}
  bool visible(int64_t r, int64_t c) const {
    return c >= begin[r] && c < end[r] && (!use_keep || keep[r * cols + c] != 0);
  }
};

// Classifies tile rows [row0, row0 + rows) x keys [col0, col0 + cols) of one batch row.
TileVisibility classify_tile(const MaskPolicy& mask, int64_t row0, int64_t rows, int64_t col0,
                             int64_t cols) {
  const int64_t row_end = std::min(row0 + rows, mask.band.seq_q);
  const int64_t col_end = std::min(col0 + cols, mask.band.seq_kv);
  SegmentRange q_segments{0, 0}, kv_segments{0, 0};
  if (mask.row.q_segment_ids != nullptr && row_end > row0 && col_end > col0) {
    q_segments = segment_range(mask.row.q_segment_ids, row0, row_end);
    kv_segments = segment_range(mask.row.kv_segment_ids, col0, col_end);
  }
  return mask.tile(row0, rows, col0, cols, q_segments, kv_segments);
}

// Fills spans for the tile rows [row0, row0 + rows) x keys [col0, col0 + cols) (rows past seq_q
// and keys past seq_kv are never visible).
void fill_row_spans(const MaskPolicy& mask, TileVisibility visibility, int64_t row0, int64_t rows,
                    int64_t col0, int64_t cols, RowSpans& spans) {
  const int64_t key_limit = std::min<int64_t>(col0 + cols, mask.row.kv_length);
  spans.cols = cols;
  spans.use_keep = mask.row.q_segment_ids != nullptr && visibility == TileVisibility::kPartial;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    int64_t first = 0, last = 0;  // tile-relative [first, last)
    if (visibility != TileVisibility::kInvisible && i < mask.band.seq_q && i < mask.row.q_length) {
      first = std::max(mask.band.key_begin(i), col0) - col0;
      last = std::max(std::min(mask.band.key_end(i), key_limit) - col0, first);
    }
    spans.begin[r] = first;
    spans.end[r] = last;
    if (!spans.use_keep || last <= first) continue;  // (padding rows have no segment id)
    const int32_t query_segment = mask.row.q_segment_ids[i];
    for (int64_t c = first; c < last; ++c)
      spans.keep[r * cols + c] = mask.row.kv_segment_ids[col0 + c] == query_segment;
  }
}

// out[r, :] += sum over visible c of p[r, c] * b[c, :]   (p: [rows, cols], b: [cols, head_dim]).
// Masked columns are skipped, not multiplied by a zero p: a non-finite b row there must not reach
// out (0 * inf = NaN).
void matmul_acc_pb(const float* p, const float* b, int64_t rows, int64_t cols, int64_t head_dim,
                   const RowSpans& spans, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    float* out_row = out + r * head_dim;
    for (int64_t c = spans.begin[r]; c < spans.end[r]; ++c) {
      if (spans.use_keep && !spans.keep[r * cols + c]) continue;
      const float p_rc = p[r * cols + c];
      const float* b_row = b + c * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) out_row[d] += p_rc * b_row[d];
    }
  }
}

// out[c, :] += sum over visible r of p[r, c] * a[r, :]   (p: [rows, cols],
// a: [rows, head_dim]); masked (r, c) pairs are skipped, as in matmul_acc_pb.
void matmul_acc_ptb(const float* p, const float* a, int64_t rows, int64_t cols, int64_t head_dim,
                    const RowSpans& spans, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a_row = a + r * head_dim;
    for (int64_t c = spans.begin[r]; c < spans.end[r]; ++c) {
      if (spans.use_keep && !spans.keep[r * cols + c]) continue;
      const float p_rc = p[r * cols + c];
      float* out_row = out + c * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) out_row[d] += p_rc * a_row[d];
    }
  }
}

// The logit of a raw score: scale * q.k, soft-capped to cap * tanh(scale * q.k / cap) when
// cap > 0 (then *tanh_out gets the tanh, for the backward's derivative 1 - tanh^2).
inline float logit(float score, float scale, float cap, float* tanh_out) {
  const float scaled = score * scale;
  if (cap <= 0.0f) return scaled;
  const float t = std::tanh(scaled / cap);
  *tanh_out = t;
  return cap * t;
}

// Adds row[0..n) to the float32 gradient at element `start` of `base` (accumulate: the ring's
// running sum, aliased to the output): out = out + row, one float32 add each. Out of line so that
// no compiler contracts the add with the product that made the row into an FMA: the caller stores
// exactly the float32 value a call without accumulate writes, and the sum is then what a separate
// float32 add of that value (XLA's, in the ring without accumulate) gives.
[[gnu::noinline]] void add_to_grad(void* base, int64_t start, const float* row, int64_t n) {
  float* out = static_cast<float*>(base) + start;
  for (int64_t d = 0; d < n; ++d) out[d] = out[d] + row[d];
}

// The factor dropout applies to the call's probability (b, h, i, j): 0 where dropped,
// 1 / (1 - rate) where kept, 1 without dropout. The mask is drawn at the global coordinates: the
// call's own plus p.dropout_offsets.
inline float dropout_factor(const AttentionParams& p, int64_t b, int64_t h, int64_t i,
                            int64_t j) {
  if (!p.has_dropout) return 1.0f;
  const int32_t* offset = p.dropout_offsets;  // (batch, head, q, kv), each >= 0
  const auto global = [](int64_t local, int32_t start) {
    return static_cast<uint32_t>(local) + static_cast<uint32_t>(start);
  };
  return dropout_keep(p.dropout_key0, p.dropout_key1, p.dropout_threshold, global(b, offset[0]),
                      global(h, offset[1]), global(i, offset[2]), global(j, offset[3]))
             ? p.dropout_scale
             : 0.0f;
}

// ---- forward ------------------------------------------------------------------------------------

void forward_tile(const AttentionParams& p, int64_t b, int64_t h, int64_t m) {
  const Layout L{p};
  const int64_t D = p.head_dim;
  const int64_t block_m = p.tiles.fwd_block_m;
  const int64_t block_n = p.tiles.fwd_block_n;
  const int64_t row0 = m * block_m;
  const int64_t rows = std::min(block_m, p.seq_q - row0);
  const int64_t kvh = h / L.group_size();
  const int64_t row_stride_q = p.num_heads * D;
  const int64_t row_stride_kv = p.num_kv_heads * D;
  const float scale = *p.scale_ptr;
  const MaskPolicy mask = mask_policy(p, b);

  std::vector<float> q(rows * D), k(block_n * D), kt(D * block_n), v(block_n * D);
  std::vector<float> s(rows * block_n), acc(rows * D, 0.0f);
  std::vector<float> row_max(rows, kNegInf), row_sum(rows, 0.0f);
  RowSpans spans(rows, block_n);
  load_rows(p.q, p.dtype, L.q_index(b, row0, h), row_stride_q, rows, rows, D, q.data());

  // Only the KV tiles of the band are visited; of those, tiles the data hides are skipped.
  const TileRange kv_tiles = band_kv_tiles(mask.band, block_m, block_n, static_cast<int>(m));
  for (int64_t n = kv_tiles.first; n < kv_tiles.end; ++n) {
    const int64_t col0 = n * block_n;
    const int64_t cols = std::min(block_n, p.seq_kv - col0);
    const TileVisibility visibility = classify_tile(mask, row0, rows, col0, cols);
    if (visibility == TileVisibility::kInvisible) continue;
    fill_row_spans(mask, visibility, row0, rows, col0, cols, spans);
    load_rows(p.k, p.dtype, L.kv_index(b, col0, kvh), row_stride_kv, cols, cols, D, k.data());
    load_rows(p.v, p.dtype, L.kv_index(b, col0, kvh), row_stride_kv, cols, cols, D, v.data());
    transpose(k.data(), cols, D, kt.data());
    matmul_abt(q.data(), kt.data(), rows, cols, D, s.data());
    for (int64_t r = 0; r < rows; ++r) {
      float* s_row = s.data() + r * cols;
      float tile_max = kNegInf;
      bool has_nan = std::isnan(row_max[r]);
      for (int64_t c = 0; c < cols; ++c) {
        float unused_tanh;
        s_row[c] = spans.visible(r, c) ? logit(s_row[c], scale, p.logits_soft_cap, &unused_tanh)
                                       : kNegInf;
        if (std::isnan(s_row[c])) has_nan = true;
        if (s_row[c] > tile_max) tile_max = s_row[c];
      }
      // NaN must reach the output, not be skipped by the max.
      const float new_max =
          has_nan ? std::numeric_limits<float>::quiet_NaN() : std::max(row_max[r], tile_max);
      if (new_max == kNegInf) {  // nothing visible yet in this row
        std::fill(s_row, s_row + cols, 0.0f);
        continue;
      }
      const float correction = std::exp(row_max[r] - new_max);
      float tile_sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        s_row[c] = std::exp(s_row[c] - new_max);
        tile_sum += s_row[c];
      }
      row_sum[r] = row_sum[r] * correction + tile_sum;
      row_max[r] = new_max;
      if (p.has_dropout)  // after the row sum: the normalization counts every probability
        for (int64_t c = 0; c < cols; ++c) s_row[c] *= dropout_factor(p, b, h, row0 + r, col0 + c);
      float* acc_row = acc.data() + r * D;
      for (int64_t d = 0; d < D; ++d) acc_row[d] *= correction;
    }
    matmul_acc_pb(s.data(), v.data(), rows, cols, D, spans, acc.data());
  }

  for (int64_t r = 0; r < rows; ++r) {
    const bool empty = row_sum[r] == 0.0f;  // the row sees no key
    const float inv_sum = empty ? 0.0f : 1.0f / row_sum[r];
    const int64_t out_start = L.q_index(b, row0 + r, h);
    for (int64_t d = 0; d < D; ++d)
      store_element(p.out, out_start + d, p.dtype, empty ? 0.0f : acc[r * D + d] * inv_sum);
    p.lse[L.lse_index(b, h, row0 + r)] = empty ? kNegInf : row_max[r] + std::log(row_sum[r]);
  }
}

// ---- backward -----------------------------------------------------------------------------------

// Per-thread scratch for recomputing one (m, n) tile pair of the backward.
struct BackwardScratch {
  std::vector<float> q, dout, k, kt, v, vt, s, dp, lse, dsum;
  RowSpans spans;  // keys of the KV tile each query row sees
  BackwardScratch(int64_t block_m, int64_t block_n, int64_t D)
      : q(block_m * D), dout(block_m * D), k(block_n * D), kt(D * block_n), v(block_n * D),
        vt(D * block_n), s(block_m * block_n), dp(block_m * block_n), lse(block_m),
        dsum(block_m), spans(block_m, block_n) {}
};

// Loads Q_m, dO_m, lse, dsum of query tile m (rows past seq_q are zero and fully masked).
void load_query_tile(const AttentionParams& p, const float* dsum_head, int64_t b, int64_t h,
                     int64_t m, BackwardScratch& t) {
  const Layout L{p};
  const int64_t D = p.head_dim;
  const int64_t block_m = p.tiles.bwd_block_m;
  const int64_t row0 = m * block_m;
  const int64_t rows = std::min(block_m, p.seq_q - row0);
  load_rows(p.q, p.dtype, L.q_index(b, row0, h), p.num_heads * D, block_m, rows, D, t.q.data());
  load_rows(p.dout, p.dtype, L.q_index(b, row0, h), p.num_heads * D, block_m, rows, D,
            t.dout.data());
  for (int64_t r = 0; r < block_m; ++r) {
    t.lse[r] = r < rows ? p.lse[L.lse_index(b, h, row0 + r)] : kNegInf;
    t.dsum[r] = r < rows ? dsum_head[row0 + r] : 0.0f;
  }
}

// Loads K_n, V_n (and their transposes) of kv head kvh.
void load_key_tile(const AttentionParams& p, int64_t b, int64_t kvh, int64_t n,
                   BackwardScratch& t) {
  const Layout L{p};
  const int64_t D = p.head_dim;
  const int64_t block_n = p.tiles.bwd_block_n;
  const int64_t col0 = n * block_n;
  const int64_t cols = std::min(block_n, p.seq_kv - col0);
  load_rows(p.k, p.dtype, L.kv_index(b, col0, kvh), p.num_kv_heads * D, block_n, cols, D,
            t.k.data());
  load_rows(p.v, p.dtype, L.kv_index(b, col0, kvh), p.num_kv_heads * D, block_n, cols, D,
            t.v.data());
  transpose(t.k.data(), block_n, D, t.kt.data());
  transpose(t.v.data(), block_n, D, t.vt.data());
}

// With Q_m/dO_m and K_n/V_n loaded: t.s <- P, t.dp <- dS = P * (dP - D) (times the soft cap's
// derivative 1 - tanh^2), t.spans <- the keys each row sees (none for padding rows and rows that
// see no key). With dropout (factor z: 0 or 1 / (1 - rate)) t.s <- z P, the probabilities dV
// sees, and dS = P * (z dP - D).
void recompute_p_and_ds(const AttentionParams& p, const MaskPolicy& mask,
                        TileVisibility visibility, int64_t b, int64_t h, int64_t m, int64_t n,
                        BackwardScratch& t) {
  const int64_t D = p.head_dim;
  const int64_t block_m = p.tiles.bwd_block_m;
  const int64_t block_n = p.tiles.bwd_block_n;
  const float scale = *p.scale_ptr;
  fill_row_spans(mask, visibility, m * block_m, block_m, n * block_n, block_n, t.spans);
  matmul_abt(t.q.data(), t.kt.data(), block_m, block_n, D, t.s.data());
  matmul_abt(t.dout.data(), t.vt.data(), block_m, block_n, D, t.dp.data());
  for (int64_t r = 0; r < block_m; ++r) {
    if (t.lse[r] == kNegInf) t.spans.end[r] = t.spans.begin[r];  // the row sees no key at all
    for (int64_t c = 0; c < block_n; ++c) {
      const int64_t idx = r * block_n + c;
      const bool live = t.spans.visible(r, c);
      float tanh_value = 0.0f;
      const float prob =
          live ? std::exp(logit(t.s[idx], scale, p.logits_soft_cap, &tanh_value) - t.lse[r])
               : 0.0f;
      const float z = live ? dropout_factor(p, b, h, m * block_m + r, n * block_n + c) : 1.0f;
      float ds = live ? prob * ((p.has_dropout ? z * t.dp[idx] : t.dp[idx]) - t.dsum[r]) : 0.0f;
      if (p.logits_soft_cap > 0.0f) ds *= 1.0f - tanh_value * tanh_value;
      t.s[idx] = p.has_dropout ? z * prob : prob;
      t.dp[idx] = ds;
    }
  }
}

float* dsum_of_head(const AttentionParams& p, const BwdWorkspaceLayout& w, int64_t b,
                    int64_t h) {
  const int64_t padded_rows = ceil_div(p.seq_q, p.tiles.bwd_block_m) * p.tiles.bwd_block_m;
  return p.workspace_f32 + w.dsum + (b * p.num_heads + h) * padded_rows;
}

// D = rowsum(dO * O) and lse * log2(e), padded rows zero / +inf, like the GPU preprocess.
void backward_preprocess(const AttentionParams& p, const BwdWorkspaceLayout& w) {
  const Layout L{p};
  const int64_t D = p.head_dim;
  const int64_t padded_rows = ceil_div(p.seq_q, p.tiles.bwd_block_m) * p.tiles.bwd_block_m;
  parallel_for(p.batch * p.num_heads, [&](int64_t bh) {
    const int64_t b = bh / p.num_heads, h = bh % p.num_heads;
    float* dsum = p.workspace_f32 + w.dsum + bh * padded_rows;
    float* lse_log2 = p.workspace_f32 + w.lse_log2 + bh * padded_rows;
    for (int64_t i = 0; i < padded_rows; ++i) {
      if (i >= p.seq_q) {
        dsum[i] = 0.0f;
        lse_log2[i] = std::numeric_limits<float>::infinity();
        continue;
      }
      const int64_t start = L.q_index(b, i, h);
      float total = 0.0f;
      for (int64_t d = 0; d < D; ++d)
        total += load_element(p.dout, start + d, p.dtype) * load_element(p.out, start + d, p.dtype);
      dsum[i] = total;
      lse_log2[i] = p.lse[L.lse_index(b, h, i)] * kLog2e;
    }
  });
}

// dK_n, dV_n of kv head kvh: the query heads of its group add their partials in dkv_ticket order,
// and each head's partial accumulates its Q tiles in the schedule's visit order.
void backward_kv_tile(const AttentionParams& p, const BwdWorkspaceLayout& w,
                      const ScheduleProblem& sp, int64_t b, int64_t kvh, int64_t n) {
  const Layout L{p};
  const int64_t D = p.head_dim;
  const int64_t block_n = p.tiles.bwd_block_n;
  const int group = L.group_size();
  const int64_t block_m = p.tiles.bwd_block_m;
  const MaskPolicy mask = mask_policy(p, b);
  BackwardScratch t(block_m, block_n, D);
  load_key_tile(p, b, kvh, n, t);

  std::vector<int> head_order(group);
  for (int g = 0; g < group; ++g) head_order[dkv_ticket(sp, g, static_cast<int>(n))] = g;

  std::vector<float> dk(block_n * D, 0.0f), dv(block_n * D, 0.0f);
  std::vector<float> dk_part(block_n * D), dv_part(block_n * D);
  for (int g : head_order) {
    const int64_t h = kvh * group + g;
    const int head_linear = static_cast<int>(b * p.num_heads + h);
    const float* dsum = dsum_of_head(p, w, b, h);
    std::fill(dk_part.begin(), dk_part.end(), 0.0f);
    std::fill(dv_part.begin(), dv_part.end(), 0.0f);
    const int steps = q_visit_count(sp, head_linear, static_cast<int>(n));
    for (int step = 0; step < steps; ++step) {
      const int64_t m = q_visit_tile(sp, head_linear, static_cast<int>(n), step);
      // The schedule visits the band's Q tiles; tiles the data hides are skipped, not computed.
      const TileVisibility visibility = classify_tile(mask, m * block_m, block_m, n * block_n,
                                                      block_n);
      if (visibility == TileVisibility::kInvisible) continue;
      load_query_tile(p, dsum, b, h, m, t);
      recompute_p_and_ds(p, mask, visibility, b, h, m, n, t);
      matmul_acc_ptb(t.s.data(), t.dout.data(), block_m, block_n, D, t.spans, dv_part.data());
      matmul_acc_ptb(t.dp.data(), t.q.data(), block_m, block_n, D, t.spans, dk_part.data());
    }
    for (int64_t i = 0; i < block_n * D; ++i) {
      dk[i] += dk_part[i];
      dv[i] += dv_part[i];
    }
  }

  const int64_t col0 = n * block_n;
  const int64_t cols = std::min(block_n, p.seq_kv - col0);
  const float scale = *p.scale_ptr;
  if (p.accumulate) {  // float32: dk += dk * scale, dv += dv (the values written below)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t start = L.kv_index(b, col0 + c, kvh);
      for (int64_t d = 0; d < D; ++d) dk_part[d] = dk[c * D + d] * scale;
      add_to_grad(p.dk, start, dk_part.data(), D);
      add_to_grad(p.dv, start, dv.data() + c * D, D);
    }
    return;
  }
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t start = L.kv_index(b, col0 + c, kvh);
    for (int64_t d = 0; d < D; ++d) {
      store_element(p.dk, start + d, p.grad_dtype, dk[c * D + d] * scale);
      store_element(p.dv, start + d, p.grad_dtype, dv[c * D + d]);
    }
  }
}

// KV tiles in the order their partials are added to dQ tile m: position ticket(m, n) holds n.
std::vector<int> ticket_order(const ScheduleProblem& sp, int head_linear, int m) {
  const int count = dq_ticket_count(sp, m);
  std::vector<int> order(count, -1);
  for (int n = 0; n < sp.num_kv_tiles; ++n) {
    if (!tile_active(sp, m, n)) continue;
    const int ticket = dq_ticket(sp, head_linear, m, n);
    if (ticket < 0 || ticket >= count || order[ticket] != -1)
      throw std::logic_error("schedule.h tickets of dQ tile " + std::to_string(m) +
                             " are not a permutation (ticket " + std::to_string(ticket) +
                             " for kv tile " + std::to_string(n) + ")");
    order[ticket] = n;
  }
  for (int n : order)
    if (n < 0) throw std::logic_error("schedule.h: a dQ ticket was never assigned");
  return order;
}

// dQ tile m of head h: partials dS_mn K_n summed into dq_accum in ticket order.
void backward_q_tile(const AttentionParams& p, const BwdWorkspaceLayout& w,
                     const ScheduleProblem& sp, int64_t b, int64_t h, int64_t m) {
  const Layout L{p};
  const int64_t D = p.head_dim;
  const int64_t block_m = p.tiles.bwd_block_m;
  const int64_t block_n = p.tiles.bwd_block_n;
  const int64_t padded_rows = ceil_div(p.seq_q, block_m) * block_m;
  const int head_linear = static_cast<int>(b * p.num_heads + h);
  const int64_t kvh = h / L.group_size();
  const MaskPolicy mask = mask_policy(p, b);
  BackwardScratch t(block_m, block_n, D);
  load_query_tile(p, dsum_of_head(p, w, b, h), b, h, m, t);

  float* dq_accum = p.workspace_f32 + w.dq_accum + ((b * p.num_heads + h) * padded_rows +
                                                    m * block_m) * D;
  std::fill(dq_accum, dq_accum + block_m * D, 0.0f);
  std::vector<float> partial(block_m * D);
  // Tickets come from the static band. A pair the data (lengths, segments) hides still holds its
  // ticket and gives it up without adding, so the order of the real adds is the band's.
  for (int n : ticket_order(sp, head_linear, static_cast<int>(m))) {
    const TileVisibility visibility = classify_tile(mask, m * block_m, block_m, n * block_n,
                                                    block_n);
    if (visibility == TileVisibility::kInvisible) continue;
    load_key_tile(p, b, kvh, n, t);
    recompute_p_and_ds(p, mask, visibility, b, h, m, n, t);
    std::fill(partial.begin(), partial.end(), 0.0f);
    matmul_acc_pb(t.dp.data(), t.k.data(), block_m, block_n, D, t.spans, partial.data());
    for (int64_t i = 0; i < block_m * D; ++i) dq_accum[i] += partial[i];
  }

  const int64_t rows = std::min(block_m, p.seq_q - m * block_m);
  const float scale = *p.scale_ptr;
  if (p.accumulate) {  // float32: dq += dq_accum * scale (the value written below)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t d = 0; d < D; ++d) partial[d] = dq_accum[r * D + d] * scale;
      add_to_grad(p.dq, L.q_index(b, m * block_m + r, h), partial.data(), D);
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t start = L.q_index(b, m * block_m + r, h);
    for (int64_t d = 0; d < D; ++d)
      store_element(p.dq, start + d, p.grad_dtype, dq_accum[r * D + d] * scale);
  }
}

}  // namespace

void forward(const AttentionParams& p) {
  const int64_t num_q_tiles = ceil_div(p.seq_q, p.tiles.fwd_block_m);
  parallel_for(p.batch * p.num_heads * num_q_tiles, [&](int64_t task) {
    const int64_t m = task % num_q_tiles;
    const int64_t bh = task / num_q_tiles;
    forward_tile(p, bh / p.num_heads, bh % p.num_heads, m);
  });
}

void backward(const AttentionParams& p) {
  const BwdWorkspaceLayout w = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                    p.num_kv_heads, p.head_dim);
  std::fill(p.workspace_i32, p.workspace_i32 + w.i32_size, 0);
  std::fill(p.workspace_f32 + w.dk_accum, p.workspace_f32 + w.f32_size, 0.0f);
  backward_preprocess(p, w);
  const ScheduleProblem sp = schedule_problem(p, p.tiles, p.wave);

  const int64_t num_kv_tiles = sp.num_kv_tiles;
  parallel_for(p.batch * p.num_kv_heads * num_kv_tiles, [&](int64_t task) {
    const int64_t n = task % num_kv_tiles;
    const int64_t bkv = task / num_kv_tiles;
    backward_kv_tile(p, w, sp, bkv / p.num_kv_heads, bkv % p.num_kv_heads, n);
  });

  const int64_t num_q_tiles = sp.num_q_tiles;
  parallel_for(p.batch * p.num_heads * num_q_tiles, [&](int64_t task) {
    const int64_t m = task % num_q_tiles;
    const int64_t bh = task / num_q_tiles;
    backward_q_tile(p, w, sp, bh / p.num_heads, bh % p.num_heads, m);
  });
}

}  // namespace jax_dash::cpu
