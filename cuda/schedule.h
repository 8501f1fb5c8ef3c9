// DASH backward schedules: the single source of truth for work items, Q-tile visit orders and the
// tickets that fix the order of every dQ (and GQA dK/dV) reduction. Used by the CPU kernels, the
// sm90 kernels and, through the extension, by jax_dash/schedules.py.
//
// Vocabulary (per (batch, head), "head" below):
//   Nq  = ceil(seq_q / block_m) query tiles, Nkv = ceil(seq_kv / block_n) key/value tiles.
//   contribution (m, n): KV tile n adds its partial dQ into query tile m (only if the tile pair
//     is active under the mask).
//   item: one unit of work for one CTA (a KV tile, or a pair of KV tiles for symmetric_shift).
//   ticket(m, n): the position of contribution (m, n) in tile m's reduction order; the tickets of
//     one tile are a permutation of 0..K(m)-1.
//   wave: number of items resident at once (the persistent grid size on the GPU).
//
// STATUS: ascending and descending are complete; shift and symmetric_shift currently fall back to
// ascending order (filled in by the schedules work).
#pragma once

#include <cstdint>

#include "cuda/compat.h"

namespace jax_dash {

enum class Schedule : int32_t {
  kAscending = 0,
  kDescending = 1,
  kShift = 2,
  kSymmetricShift = 3,
  kAtomic = 4,  // no tickets: races; visit order of descending
};

struct ScheduleProblem {
  int32_t num_q_tiles;   // Nq
  int32_t num_kv_tiles;  // Nkv
  int32_t block_m;
  int32_t block_n;
  int64_t seq_q;
  int64_t seq_kv;
  bool is_causal;
  int32_t num_heads;  // (batch * heads): number of independent heads of work
  int32_t wave;       // items resident at once, >= 1
  Schedule schedule;
};

// Is tile pair (m, n) touched by the mask? Top-left causal: query i sees key j iff j <= i.
JAX_DASH_HD inline bool tile_active(const ScheduleProblem& p, int m, int n) {
  if (!p.is_causal) return true;
  const int64_t last_q = static_cast<int64_t>(m + 1) * p.block_m - 1;  // last row of tile m
  return static_cast<int64_t>(n) * p.block_n <= last_q;
}

// Q tiles that see KV tile n form the suffix [first_q_tile(n), Nq).
JAX_DASH_HD inline int first_q_tile(const ScheduleProblem& p, int n) {
  if (!p.is_causal) return 0;
  const int64_t first = (static_cast<int64_t>(n) * p.block_n) / p.block_m;
  return first < p.num_q_tiles ? static_cast<int>(first) : p.num_q_tiles;
}

// KV tiles seen by Q tile m form the prefix [0, num_kv_tiles_seen(m)).
JAX_DASH_HD inline int num_kv_tiles_seen(const ScheduleProblem& p, int m) {
  if (!p.is_causal) return p.num_kv_tiles;
  const int64_t last_q = static_cast<int64_t>(m + 1) * p.block_m - 1;
  const int64_t seen = last_q / p.block_n + 1;
  return seen < p.num_kv_tiles ? static_cast<int>(seen) : p.num_kv_tiles;
}

// ---- work items -------------------------------------------------------------------------------

JAX_DASH_HD inline int items_per_head(const ScheduleProblem& p) { return p.num_kv_tiles; }

JAX_DASH_HD inline int item_num_kv_tiles(const ScheduleProblem&, int /*item*/) { return 1; }

// j-th KV tile of an item (j < item_num_kv_tiles).
JAX_DASH_HD inline int item_kv_tile(const ScheduleProblem&, int item, int /*j*/) { return item; }

// ---- visit orders -----------------------------------------------------------------------------

// Number of Q tiles that KV tile n visits, and the step-th of them, for head `head`.
JAX_DASH_HD inline int q_visit_count(const ScheduleProblem& p, int /*head*/, int n) {
  return p.num_q_tiles - first_q_tile(p, n);
}

JAX_DASH_HD inline int q_visit_tile(const ScheduleProblem& p, int /*head*/, int n, int step) {
  const int first = first_q_tile(p, n);
  if (p.schedule == Schedule::kAscending) return first + step;
  return p.num_q_tiles - 1 - step;  // descending (also atomic and the not-yet-written ones)
}

// ---- tickets ----------------------------------------------------------------------------------

// K(m): number of contributions to dQ tile m.
JAX_DASH_HD inline int dq_ticket_count(const ScheduleProblem& p, int m) {
  return num_kv_tiles_seen(p, m);
}

// ticket(m, n) for an active (m, n) of head `head`.
JAX_DASH_HD inline int dq_ticket(const ScheduleProblem&, int /*head*/, int /*m*/, int n) {
  return n;
}

// Order of the GQA dK/dV reduction: query head `head_in_group` of its group adds its partial
// dK_n/dV_n at this position.
JAX_DASH_HD inline int dkv_ticket(const ScheduleProblem&, int head_in_group, int /*n*/) {
  return head_in_group;
}

}  // namespace jax_dash
