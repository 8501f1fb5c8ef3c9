// Tile-size table shared by the CPU and the Hopper kernels. The CPU kernels use the same tiles so
// that the backward's tickets (and therefore dQ's summation order) are the GPU's.
#pragma once

#include <cstdint>

#include "cuda/compat.h"

namespace jax_dash {

struct TileConfig {
  int32_t fwd_block_m;  // query rows per forward work item
  int32_t fwd_block_n;  // key rows per forward inner step
  int32_t bwd_block_m;  // query rows per backward Q tile (the dQ reduction unit)
  int32_t bwd_block_n;  // key rows per backward KV tile (one work item)
};

// One row per head-dim class; the "why" of each is the register/shared-memory budget of the
// sm90 kernels (one CTA per SM for the backward, accumulators in registers).
JAX_DASH_HD constexpr TileConfig tile_config(int head_dim) {
  // <= 64: small accumulators, so large tiles in both directions. The forward takes 192 query
  // rows, three math warpgroups in turn: at 64 columns a warpgroup's softmax (64 ex2 per thread
  // on a 16-per-clock unit) outlasts one other warpgroup's two wgmmas, so with two warpgroups the
  // tensor cores wait on it; with three it runs under the other two's. (A row's arithmetic does
  // not depend on the query tile: the forward's bits are the same at 128 or 192 rows. The masked
  // forward kernels stay at 128 rows: fwd/traits.cuh, kNarrowRows.)
  if (head_dim <= 64) return TileConfig{192, 128, 128, 128};
  // <= 128: dK/dV accumulators (2 x 128 x 128 fp32) fill the registers of two warpgroups, so the
  // backward takes 64 query rows per step.
  if (head_dim <= 128) return TileConfig{128, 128, 64, 128};
  // <= 256: shared memory holds K and V of 256 columns only at 64/80 rows.
  return TileConfig{128, 64, 64, 64};
}

JAX_DASH_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace jax_dash
