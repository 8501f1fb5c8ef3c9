// Online softmax over wgmma accumulator tiles, in registers.
//
// A warpgroup's 64 x N fp32 accumulator gives each thread 2 rows (r and r + 8) and, per 8-column
// chunk, 2 adjacent columns; the 4 threads of a quad share a row. Row reductions are therefore a
// thread-local loop followed by two xor-shuffles inside the quad.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

namespace jax_dash::sm90 {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Accumulator layout ((2, 2, N/8), MMA_M, MMA_N) -> (rows, cols) = ((2, MMA_M), (2, N/8, MMA_N)):
// value mode 0 steps a column, mode 1 steps 8 rows, mode 2 steps 8 columns.
template <class Layout>
__device__ __forceinline__ constexpr auto accumulator_rows_cols(Layout layout) {
  using namespace cute;
  static_assert(rank(Layout{}) == 3, "expected an (MMA, MMA_M, MMA_N) accumulator layout");
  static_assert(rank<0>(Layout{}) == 3, "expected a wgmma accumulator value mode (2, 2, N/8)");
  return make_layout(make_layout(get<0, 1>(layout), get<1>(layout)),
                     make_layout(get<0, 0>(layout), get<0, 2>(layout), get<2>(layout)));
}

template <class Tensor>
__device__ __forceinline__ auto as_rows_cols(Tensor&& t) {
  return cute::make_tensor(t.data(), accumulator_rows_cols(t.layout()));
}

// exp2 on the special-function unit alone. exp2f() also rescales inputs below -126 so that it can
// return denormals, three extra instructions per score in the softmax's critical loop; here such
// results (< 2^-126 of the row maximum) are flushed to 0, which no output can notice.
// ex2.approx(-inf) is +0, which the masking relies on.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Running max (in log2 units of scaled scores) and running partial sum per row of this thread.
// Sums stay thread-local until finalize(): the quad shares the row max, so the partial sums are
// rescaled by the same factors and add up exactly at the end.
template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];

  __device__ __forceinline__ void init() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // scores (rows x cols, fp32) hold scores in log2 units once multiplied by factor (> 0); masked
  // entries are -inf. Replaces them with exp2(factor * score - new_max), one FFMA and one ex2 per
  // score, and returns in correction[r] the factor by which the output accumulator rows must be
  // rescaled; row_max[] is kept in log2 units. Split from rescale() so that the forward can do
  // this part while the previous tile's P V wgmma still owns the output accumulator.
  // The forward passes its raw scores with factor = scale * log2(e) when the scale is positive:
  // the row max of the scaled scores is then the scaled row max (round-to-nearest is monotone), so
  // row_max[] and correction[] are those of scaling first, and the probabilities have one rounding
  // fewer. With factor 1 (scores scaled already, e.g. soft-capped), fma(s, 1, -m) rounds once like
  // s - m: the scale-first arithmetic to the bit.
  template <class ScoreRC>
  __device__ __forceinline__ void update_scores(ScoreRC& scores, float factor,
                                                float (&correction)[kRows]) {
    using namespace cute;
    static_assert(decltype(size<0>(scores))::value == kRows, "row count mismatch");
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float tile_max = -INFINITY;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) tile_max = fmaxf(tile_max, scores(r, c));
      const float new_max = fmaxf(row_max[r], quad_max(tile_max) * factor);
      // A row that has seen only masked keys keeps max -inf; subtracting 0 keeps exp2 at 0 and
      // avoids (-inf) - (-inf) = NaN.
      const float base = new_max == -INFINITY ? 0.f : new_max;
      correction[r] = exp2_ftz(row_max[r] - base);
      row_max[r] = new_max;
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        const float p = exp2_ftz(fmaf(scores(r, c), factor, -base));
        scores(r, c) = p;
        sum += p;
      }
      row_sum[r] = row_sum[r] * correction[r] + sum;
    }
  }

  template <class OutRC>
  __device__ __forceinline__ void rescale(OutRC& acc_out, const float (&correction)[kRows]) {
    using namespace cute;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(acc_out); ++c) acc_out(r, c) *= correction[r];
    }
  }

  // Normalizes the output rows; returns the natural-log LSE of row r in lse[r]. A row that saw no
  // key gets output 0 and lse -inf.
  template <class OutRC>
  __device__ __forceinline__ void finalize(OutRC& acc_out, float (&lse)[kRows]) {
    using namespace cute;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_sum(row_sum[r]);
      const bool empty = sum == 0.f;
      const float inv = empty ? 0.f : 1.f / sum;
      lse[r] = empty ? -INFINITY : (row_max[r] + log2f(sum)) * kLn2;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(acc_out); ++c) acc_out(r, c) *= inv;
    }
  }
};

}  // namespace jax_dash::sm90
