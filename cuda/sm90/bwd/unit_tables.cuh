// A unit's visit order and tickets in shared memory, for the sm90 warp-specialized backward.
#pragma once

#include <cstdint>

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/named_barrier.cuh"

namespace jax_dash::sm90::bwd {

// Rows with lengths or segment ids (kMask): the unit's visit order and tickets with the band's steps
// that no query can see left out (past a length, or id ranges that do not meet: cuda/mask.h's tile
// test on bwd_tile_segments_kernel's ranges). A kept step's ticket is its rank among tile m's
// visible contributors in the band's ticket order (schedules.without_hidden_pairs), so the adds that
// remain keep the band's order and the bits are those of computing every step (a left-out pair adds
// only zeros). Called by all math threads (one named barrier); returns the number of kept steps,
// also stored to *unit_num_steps for the other roles. Out of line: it runs once per unit, and its
// loops must not weigh on the step loop's registers.
template <int kBlockM, int kBlockN, int kMathThreads>
__device__ __forceinline__ int visible_unit_tables(const AttentionParams& p, const ScheduleProblem& sp,
                                                WsUnit u, int tid, bool deterministic,
                                                const SegmentRange* tile_segments,
                                                int32_t* visit_m, int32_t* visit_ticket,
                                                int32_t* unit_num_steps) {
  const int band_steps = q_visit_count(sp, u.head_linear, u.n);
  const int64_t row_b = u.head_linear / p.num_heads;
  const MaskPolicy mp = mask_policy(p, row_b);
  const SegmentRange* row_segments = tile_segments + row_b * (sp.num_q_tiles + sp.num_kv_tiles);
  auto pair_visible = [&](int m, int n) JAX_DASH_INLINE {
    SegmentRange qr{1, 0}, kr{1, 0};  // unused without segment ids
    if (mp.row.q_segment_ids != nullptr) {
      qr = row_segments[m];
      kr = row_segments[sp.num_q_tiles + n];
    }
    return mp.tile(static_cast<int64_t>(m) * kBlockM, kBlockM, static_cast<int64_t>(n) * kBlockN,
                   kBlockN, qr, kr) != TileVisibility::kInvisible;
  };
  if (tid < 32) {  // the first math warp compacts the visit order, 32 steps at a time
    int kept = 0;
    for (int base = 0; base < band_steps; base += 32) {
      const int s = base + tid;
      int visit = 0;
      bool keep = false;
      if (s < band_steps) {
        visit = q_visit_tile(sp, u.head_linear, u.n, s);
        keep = pair_visible(visit, u.n);
      }
      const unsigned keep_mask = __ballot_sync(0xffffffffu, keep);
      if (keep) visit_m[kept + __popc(keep_mask & ((1u << tid) - 1u))] = visit;
      kept += __popc(keep_mask);
    }
    if (tid == 0) *unit_num_steps = kept;
  }
  named_barrier_sync(kMathBarrier, kMathThreads);
  const int num_steps = *unit_num_steps;
  const Schedule eff = effective_schedule(sp);
  const bool by_kv_tile =
      eff == Schedule::kAscending || eff == Schedule::kDescending || eff == Schedule::kMirror;
  for (int s = tid; s < num_steps && deterministic; s += kMathThreads) {
    const int m = visit_m[s];
    const int first = first_kv_tile(sp, m);
    int rank = 0;
    if (by_kv_tile) {  // band tickets by KV tile: count the visible tiles that go before n
      const bool mirror = eff == Schedule::kMirror;  // descending n
      const int lo = mirror ? u.n + 1 : first;
      const int hi = mirror ? first + num_kv_tiles_seen(sp, m) : u.n;
      for (int n2 = lo; n2 < hi; ++n2) rank += pair_visible(m, n2) ? 1 : 0;
    } else {
      const int ticket = dq_ticket(sp, u.head_linear, m, u.n);
      const int end = first + num_kv_tiles_seen(sp, m);
      for (int n2 = first; n2 < end; ++n2) {
        if (n2 != u.n && pair_visible(m, n2) && dq_ticket(sp, u.head_linear, m, n2) < ticket)
          ++rank;
      }
    }
    visit_ticket[s] = rank;
  }
  return num_steps;
}

}  // namespace jax_dash::sm90::bwd
