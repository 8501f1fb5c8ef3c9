// The segment-id ranges of the backward's tiles (the masked instantiation with segment ids). A
// kernel that is not a template: this header is included by launch.cu alone, so that it is compiled
// once (every translation unit that includes a non-template kernel compiles it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/mask.h"
#include "cuda/params.h"
#include "cuda/sm90/mask.cuh"

namespace jax_dash::sm90::bwd {

// With segment ids: the id range of every query tile and every key tile of each batch row, over
// the rows and keys that have a length (a tile wholly past its length gets an empty range, lo > hi),
// into tile_segments[b * (Nq + Nkv) + t] (query tiles t < Nq, then key tiles). The masked main
// kernel's tile test (cuda/mask.h MaskPolicy::tile) reads them to leave out the tile pairs that no
// query of the tile can see (bwd/kernel.cuh). One warp per tile; grid (tiles / warps, rows).
constexpr int kTileSegmentWarps = 4;

__global__ void __launch_bounds__(kTileSegmentWarps * 32)
    bwd_tile_segments_kernel(const AttentionParams p, int block_m, int block_n, int num_q_tiles,
                             int num_kv_tiles, SegmentRange* __restrict__ tile_segments) {
  const int tiles = num_q_tiles + num_kv_tiles;
  const int t = static_cast<int>(blockIdx.x) * kTileSegmentWarps + static_cast<int>(threadIdx.x / 32);
  if (t >= tiles) return;  // whole warps
  for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
    const MaskRow row = mask_policy(p, b).row;
    const SegmentRange r = t < num_q_tiles
                               ? query_tile_segments(row, p.seq_q, int64_t(t) * block_m, block_m)
                               : kv_tile_segments(row, p.seq_kv, t - num_q_tiles, block_n);
    if (threadIdx.x % 32 == 0) tile_segments[b * tiles + t] = r;
  }
}

}  // namespace jax_dash::sm90::bwd
