// A query tile of the sm90 forward as every role sees it: the scheduler's coordinates, and the KV
// tiles the call's mask leaves it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/mask.h"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/fwd/traits.cuh"
#include "cuda/sm90/mask.cuh"

namespace jax_dash::sm90::fwd {

// Its query block, head, batch row and the KV tiles it sees, [n_lo, n_hi), visited last to first
// (n_end of them).
struct FwdTile {
  int m_block, head, batch, kv_head, n_lo, n_hi, n_end;
  int64_t row_begin;
  PolicyMask policy;        // kMask: this batch row's whole mask
  SegmentRange q_segments;  // kMask with segment ids: the query rows' id range
};

// The KV range of each tile: causal and seq_kv; with kMask the band, the row's lengths and
// (kSegments) its documents' segment-id ranges.
template <class Traits, bool kMask, bool kSegments>
struct FwdKvRange {
  using Params = FwdKernelParams<Traits>;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;

  const Params& p;
  int num_kv_blocks;

  __device__ explicit FwdKvRange(const Params& params)
      : p(params), num_kv_blocks(int((int64_t(params.seq_kv) + kBlockN - 1) / kBlockN)) {}

  // kSegments: every lane of the calling warp takes part (the segment ranges use warp shuffles).
  __device__ __forceinline__ FwdTile tile(const TileCoord& c) const {
    FwdTile t;
    t.m_block = c.m_block;
    t.head = c.head;
    t.batch = c.batch;
    t.kv_head = t.head / (p.num_heads / p.num_kv_heads);
    t.row_begin = int64_t(t.m_block) * kBlockM;
    const int64_t row_last = min(t.row_begin + kBlockM, int64_t(p.seq_q)) - 1;
    t.n_lo = 0;
    t.n_hi = p.is_causal ? min(num_kv_blocks, int(row_last / kBlockN) + 1) : num_kv_blocks;
    t.policy = PolicyMask{};
    t.q_segments = SegmentRange{1, 0};  // empty: set below where the row has segment ids
    if (kMask && p.has_mask) {
      t.policy.m = MaskPolicy{p.band, mask_row(p.q_lengths, p.kv_lengths, p.q_segments,
                                               p.kv_segments, p.seq_q, p.seq_kv, t.batch)};
      const TileRange band_tiles = band_kv_tiles(p.band, kBlockM, kBlockN, t.m_block);
      t.n_lo = band_tiles.first;
      t.n_hi = int(min(int64_t(band_tiles.end), ceil_div(t.policy.m.row.kv_length, kBlockN)));
      if (t.row_begin >= t.policy.m.row.q_length) t.n_hi = t.n_lo;  // every row past its length
      if (kSegments && t.n_lo < t.n_hi) {  // packed rows: the documents' tiles only
        t.q_segments = query_tile_segments(t.policy.m.row, p.seq_q, t.row_begin, kBlockM);
        narrow_kv_tiles_by_segments(t.policy.m.row, t.q_segments, p.seq_kv, kBlockN, t.n_lo,
                                    t.n_hi);
      }
    }
    t.n_end = max(t.n_hi - t.n_lo, 0);
    return t;
  }
};

}  // namespace jax_dash::sm90::fwd
