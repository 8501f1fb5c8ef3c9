// DASH backward schedules: the single source of truth for work items, Q-tile visit orders and the
// tickets that fix the order of every dQ (and GQA dK/dV) reduction. Used by the CPU kernels, the
// sm90 kernels and, through the extension, by jax_dash/schedules.py (DAG model and simulator).
//
// Vocabulary (per (batch, head), "head" below; head_linear = b * num_heads + h):
//   Nq  = ceil(seq_q / block_m) query tiles, Nkv = ceil(seq_kv / block_n) key/value tiles.
//   contribution (m, n): KV tile n adds its partial dQ into query tile m (only if the tile pair
//     is active under the static band of cuda/mask.h: causal, top-left, query i sees key j iff
//     j <= i, and/or a local window i - left <= j <= i + right). The Q tiles that see a KV tile
//     form one contiguous range [first_q_tile, end_q_tile), and so do the KV tiles a Q tile sees.
//   data masks (lengths, segment ids) are NOT part of the schedule: tickets come from the band
//     only. A pair the data hides is skipped (not computed); the order of the real adds is the
//     band's either way. The CPU kernels hand its ticket over (take it, give it up without adding),
//     so deadlock freedom is the static argument below as it is. The sm90 backward leaves such a
//     pair out of the item's visit order and gives a visible pair the ticket of its rank among the
//     tile's visible contributors in the band's ticket order (same adds, same order, same bits);
//     each of its waits is one the band's chain already implied (the chain ran through the
//     dropped pairs), so the argument still holds, with "step" read as the band's step
//     (jax_dash/schedules.py without_hidden_pairs models it; its deadlock sweep covers it).
//   item: one unit of work for one CTA (a KV tile, or a pair of KV tiles for symmetric_shift).
//     Items are numbered globally g = head_linear * items_per_head + item.
//   wave: the wave width W = the number of items resident at once (on the GPU the persistent grid,
//     min(resident CTAs from the occupancy query, total items); on the CPU kCpuWave). The GPU's
//     CTAs take items one at a time, in increasing g, from an atomic counter (in-order dynamic
//     fetch): a CTA that finishes an item takes the next untaken one.
//   slice: a head's own items [0, items_per_head) are cut into slices of W consecutive items,
//     slice k = items [kW, min((k+1)W, items_per_head)) (wave_slice below; the last one may be
//     shorter). Slices are PER HEAD: they do not depend on head_linear, the batch size, the number
//     of heads or the place of the head in the batch. When W >= items_per_head the whole head is
//     one slice.
//   ticket(m, n): the position of contribution (m, n) in tile m's reduction order; the tickets of
//     one tile are a permutation of 0..K(m)-1, K(m) = number of KV tiles that tile m sees. For
//     shift and symmetric_shift, [lo, hi) below are the slice holding the item: the contributions
//     of the head's earlier slices (lo items) come first, then the slice's in arrival order.
//
// Schedules (what each does, and what it becomes where its preconditions fail):
//   ascending   item = KV tile n; visits its Q tiles m ascending (its band range); ticket = rank
//               of n among the KV tiles tile m sees (ascending n; = n without a window).
//               FlashAttention-3's deterministic order. Every wait is on a smaller item, so it is
//               deadlock-free for any wave, and its tickets do not depend on the wave.
//   descending  as ascending, but Q tiles visited descending (the band range from its last tile).
//               Same tickets (so the same dQ bits). On any band every wait is on a smaller item.
//               Causal: every item starts on the last Q tile and item j idles only ~j*r.
//   shift       full mask: item n at step k visits m = (r n + k) mod Nq, r = shift_stride (every
//               item of a slice starts on a different tile); ticket = lo + arrival rank of n at
//               tile m among the slice's items [lo, hi), arrival ordered by (step, item). r is 1
//               unless Nq >= 2 Nkv (head_dim 128's 64-row Q tiles against 128-key tiles), where
//               r = floor(Nq / Nkv): the items start r tiles apart, so the contributions to a
//               tile arrive r steps apart and each ticket hand-over has r steps to land (with
//               r = 1 a head's items move in lockstep and every hand-over has one).
//               When a slice holds more items than Nq (R = hi - lo > Nq, so r = 1), items n and
//               n + Nq meet on the same tile at the same step and the smaller one goes first
//               (defined, no assertion).
//               Fallback: causal masks, and windows that cut any tile pair (a band), behave as
//               `descending` (the rotation needs every Q tile on every item).
//               Tickets depend on the slices, i.e. on min(W, Nkv) (see "What the bits depend on").
//   symmetric_shift  causal, seq_q == seq_kv, Nkv even, block_n >= block_m: item p (of Nkv/2)
//               takes the long KV column p then the short one Nkv-1-p, so every item has (nearly)
//               the same number of tile steps. With P = Nkv/2 and f = first_q_tile: the long column
//               visits f(p), f(p)+1, ..., f(P)-1 ascending, then Nq-1 down to f(P); the short column
//               visits Nq-1 down to f(Nkv-1-p). At every step the items of a slice are on distinct
//               Q tiles (items that move in step never wait on each other), and tickets follow that
//               arrival order: the head's earlier slices' contributions first, then the slice's
//               long columns (larger p first), then its short columns (larger p first).
//               Tickets depend on the slices, i.e. on min(W, Nkv/2).
//               Fallbacks: full mask -> `shift` (-> `descending` on a band); causal with odd Nkv,
//               seq_q != seq_kv, Nkv < 2, block_n < block_m, or a window that cuts the far
//               corner tile (Nq-1, 0) (then the tile structure is no longer causal's) ->
//               `descending`.
//   atomic      no tickets (fp32 atomics, any order); visit order of `descending`. dq_ticket
//               returns n, which the GPU ignores.
//   mirror      `descending` on the sequence read from its end: item i = KV tile Nkv-1-i (the
//               last KV tile first); it visits its band range ascending; ticket = rank of n among
//               the KV tiles tile m sees in DESCENDING n. Every wait is on the next larger KV
//               tile, a smaller item, so it is deadlock-free for any wave and its tickets do not
//               depend on the wave. Why: KV tile n reaches tile m at step m - first_q_tile(n),
//               so a tile's contributors arrive one a step, larger n first, in ticket order, and
//               a band cut by the sequence's end (a sliding window's last KV tiles, whose ranges
//               stop at Nq-1) only shortens the end of their visits. Under `descending` those
//               tiles all start on tile Nq-1 and queue on its ticket chain (jax_dash/schedules.py
//               simulate_pipeline: hd64, causal window 4096 at 2 x 8k, descending 1.17x atomic,
//               mirror 1.005x). A band cut at its start (a window's right side wider than its
//               left) is the mirror image: there `descending` is the one that does not queue.
// In every case the schedule enum the user asked for is kept; effective_schedule() says what the
// functions actually do. GQA dK/dV: the query heads of a group add their partial dK_n/dV_n in
// head order (dkv_ticket = head_in_group): always a smaller global item, wave-independent.
//
// What the bits depend on. ascending/descending/mirror (and every GQA dK/dV order): the head's
// shape only. shift/symmetric_shift: the head's shape and its slices, i.e. min(W, items_per_head);
// never head_linear, the batch size, the number of heads or how a call is sharded, so every
// schedule is batch- and sharding-invariant. On the GPU W = min(resident CTAs, total items) and
// total items >= items_per_head, so min(W, items_per_head) = min(resident CTAs, items_per_head): on
// a given GPU a head's tickets are the same in any batch. When resident CTAs >= items_per_head (132
// SMs, one backward CTA each: Nkv <= 132 for shift, Nkv <= 264 for symmetric_shift) the head is one
// slice and its tickets are also those of every GPU with at least as many resident CTAs and of the
// CPU kernels (W = kCpuWave = 132); longer heads get the bits of their GPU's resident-CTA count.
//
// Deadlock freedom. Assumed (both sm90 backward kernels do this, cuda/sm90/bwd/): G >= W CTAs,
// all co-resident (the grid never exceeds the occupancy query), take items one at a time in
// increasing global order from an atomic counter; a CTA that waits for a ticket keeps its item. Then no schedule deadlocks,
// for any W >= 1:
//   (1) Every ticket wait of an item x of head h and slice S is on a contribution of h's earlier
//       slices (their dQ contributions take the first tickets), of S itself, or of an earlier head
//       of x's GQA group (dkv_ticket = head_in_group). The first and last are global items
//       < min(S); S is a contiguous range of <= W global items that contains x.
//   (2) Inside S every wait is on a contribution at an earlier step of its item, or at the same step
//       of a smaller item (shift with R > Nq): (step, item) orders S's ticket and item-order edges,
//       so they form no cycle when all of S's items run at once.
//   (3) Suppose no CTA can progress. Let x be the smallest unfinished item; by in-order fetch every
//       item < x is finished. If x were untaken, every taken item would be < x, hence finished,
//       and a free CTA would take x; so x is held. If a CTA were free with items left, it would take
//       one; so either every item is taken, or the G CTAs hold G distinct unfinished items >= x and
//       the taken prefix reaches x + G - 1 >= min(S) + W - 1 >= max(S). Either way every item of S
//       is taken: its unfinished items are held, i.e. running together. Their waits outside S are
//       on finished items (1). Of their next nodes take the first in (step, item) order: by (2) it
//       waits only on finished nodes, so it runs. Contradiction.
// ascending, descending, mirror and atomic only ever wait on smaller items (or not at all), so
// they need only G >= 1. What does deadlock: fewer co-resident CTAs than a slice holds (a wave
// wider than what is resident), which is why the GPU takes W from the occupancy query, never a
// constant.
// jax_dash/schedules.py simulates in-order fetch and reports such deadlocks.
// Asynchronous release (modelled only: the "ws-rs-async" kernel that had it gave ws-rs's time and
// was deleted, maintainers/perf-notes.md): a releaser warp releases a node's ticket after the
// writer has seen its add complete, while the writer goes on to the next node's ticket. A node is
// finished at its release, which waits only on its own add (never on a ticket), and the CTA still
// fetches only after its item's last release, so (1)-(3) hold as they are;
// schedules.simulate_fetch(release=...) models it and its deadlock sweep runs in CI.
#pragma once

#include <cstdint>

#include "cuda/compat.h"
#include "cuda/mask.h"

namespace jax_dash {

enum class Schedule : int32_t {
  kAscending = 0,
  kDescending = 1,
  kShift = 2,
  kSymmetricShift = 3,
  kAtomic = 4,  // no tickets: races; visit order of descending
  kMirror = 5,  // descending on the sequence read from its end (the header comment)
  kLastSchedule = kMirror,  // the largest valid value (argument checks)
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
  int32_t wave;       // items resident at once; values < 1 are treated as 1
  Schedule schedule;
  // The static band beyond causal (cuda/mask.h): zero-initialized = no window.
  bool has_window;
  int64_t window_left;   // key j >= i - window_left
  int64_t window_right;  // key j <= i + window_right
};

// The static mask of a problem (extents, causal, window): what tickets are built on. For a
// ScheduleProblem and for the AttentionParams of a call (cuda/params.h), which name them alike.
template <class Problem>
JAX_DASH_HD inline MaskBand mask_band(const Problem& p) {
  MaskBand band{};
  band.seq_q = p.seq_q;
  band.seq_kv = p.seq_kv;
  band.is_causal = p.is_causal;
  band.has_window = p.has_window;
  band.window_left = p.window_left;
  band.window_right = p.window_right;
  return band;
}

// Fills Nq and Nkv from the sequence lengths and tile sizes.
JAX_DASH_HD inline ScheduleProblem problem_from_lengths(int64_t seq_q, int64_t seq_kv,
                                                        int32_t block_m, int32_t block_n,
                                                        bool is_causal, int32_t num_heads,
                                                        int32_t wave, Schedule schedule) {
  ScheduleProblem p{};
  p.num_q_tiles = static_cast<int32_t>((seq_q + block_m - 1) / block_m);
  p.num_kv_tiles = static_cast<int32_t>((seq_kv + block_n - 1) / block_n);
  p.block_m = block_m;
  p.block_n = block_n;
  p.seq_q = seq_q;
  p.seq_kv = seq_kv;
  p.is_causal = is_causal;
  p.num_heads = num_heads;
  p.wave = wave;
  p.schedule = schedule;
  return p;
}

// Is tile pair (m, n) touched by the static band? Some real query row of tile m sees some real
// key of tile n (rows past seq_q and keys past seq_kv do not count).
JAX_DASH_HD inline bool tile_active(const ScheduleProblem& p, int m, int n) {
  return mask_band(p).tile(static_cast<int64_t>(m) * p.block_m, p.block_m,
                           static_cast<int64_t>(n) * p.block_n, p.block_n) !=
         TileVisibility::kInvisible;
}

// Q tiles that see KV tile n form the contiguous range [first_q_tile(n), end_q_tile(n)) (the
// band is a diagonal strip, cuda/mask.h); empty ranges are [Nq, Nq). Causal without a window:
// the suffix [first_q_tile(n), Nq).
JAX_DASH_HD inline int first_q_tile(const ScheduleProblem& p, int n) {
  const TileRange r = band_q_tiles(mask_band(p), p.block_m, p.block_n, n);
  return r.first < r.end ? r.first : p.num_q_tiles;
}

JAX_DASH_HD inline int end_q_tile(const ScheduleProblem& p, int n) {
  const TileRange r = band_q_tiles(mask_band(p), p.block_m, p.block_n, n);
  return r.first < r.end ? r.end : p.num_q_tiles;
}

// KV tiles seen by Q tile m form the range [first_kv_tile(m), first_kv_tile(m) +
// num_kv_tiles_seen(m)); causal without a window: the prefix [0, num_kv_tiles_seen(m)).
JAX_DASH_HD inline int first_kv_tile(const ScheduleProblem& p, int m) {
  const TileRange r = band_kv_tiles(mask_band(p), p.block_m, p.block_n, m);
  return r.first < r.end ? r.first : 0;
}

JAX_DASH_HD inline int num_kv_tiles_seen(const ScheduleProblem& p, int m) {
  const TileRange r = band_kv_tiles(mask_band(p), p.block_m, p.block_n, m);
  return r.first < r.end ? r.end - r.first : 0;
}

// Does every tile pair take part (no tile is cut away by the band)? With the band's
// monotonicity the two far corners decide.
JAX_DASH_HD inline bool band_covers_all_tiles(const ScheduleProblem& p) {
  return tile_active(p, p.num_q_tiles - 1, 0) && tile_active(p, 0, p.num_kv_tiles - 1);
}

JAX_DASH_HD inline int wave_width(const ScheduleProblem& p) { return p.wave < 1 ? 1 : p.wave; }

// ---- fallbacks --------------------------------------------------------------------------------

// symmetric_shift's pairing needs equal-length causal columns that pair up: Nkv even, square
// causal mask, and first_q_tile strictly increasing (block_n >= block_m) so that a slice's items
// are on distinct Q tiles at every step.
// A window must cut no tile pair that causal keeps (the far corner (Nq-1, 0) decides), so that the
// tile structure is exactly causal's.
JAX_DASH_HD inline bool symmetric_shift_applies(const ScheduleProblem& p) {
  return p.is_causal && p.seq_q == p.seq_kv && p.num_kv_tiles >= 2 && p.num_kv_tiles % 2 == 0 &&
         p.block_n >= p.block_m && tile_active(p, p.num_q_tiles - 1, 0);
}

// shift's rotation needs every Q tile on every item: a full mask whose window (if any) cuts no
// tile pair.
JAX_DASH_HD inline bool shift_applies(const ScheduleProblem& p) {
  return !p.is_causal && band_covers_all_tiles(p);
}

// The schedule the functions below implement for this problem (see the header comment).
JAX_DASH_HD inline Schedule effective_schedule(const ScheduleProblem& p) {
  switch (p.schedule) {
    case Schedule::kShift:
      return shift_applies(p) ? Schedule::kShift : Schedule::kDescending;
    case Schedule::kSymmetricShift:
      if (!p.is_causal) return shift_applies(p) ? Schedule::kShift : Schedule::kDescending;
      return symmetric_shift_applies(p) ? Schedule::kSymmetricShift : Schedule::kDescending;
    case Schedule::kAscending:
    case Schedule::kDescending:
    case Schedule::kAtomic:
    case Schedule::kMirror:
      return p.schedule;
  }
  return Schedule::kDescending;  // out-of-range enum values (rejected earlier by the FFI layer)
}

// ---- work items -------------------------------------------------------------------------------

JAX_DASH_HD inline int items_per_head(const ScheduleProblem& p) {
  return effective_schedule(p) == Schedule::kSymmetricShift ? p.num_kv_tiles / 2 : p.num_kv_tiles;
}

JAX_DASH_HD inline int item_num_kv_tiles(const ScheduleProblem& p, int /*item*/) {
  return effective_schedule(p) == Schedule::kSymmetricShift ? 2 : 1;
}

// j-th KV tile of an item (j < item_num_kv_tiles): symmetric_shift does the long column first;
// mirror takes the KV tiles from the last.
// (mirror never falls back, so the requested schedule says it; testing it before the fallbacks
// kept ptxas from spilling more in the hd128 dropout backward: 224 -> 512 bytes otherwise.)
JAX_DASH_HD inline int item_kv_tile(const ScheduleProblem& p, int item, int j) {
  if (p.schedule == Schedule::kMirror) return p.num_kv_tiles - 1 - item;
  if (effective_schedule(p) != Schedule::kSymmetricShift) return item;
  return j == 0 ? item : p.num_kv_tiles - 1 - item;
}

// The item that processes KV tile n (inverse of item_kv_tile).
JAX_DASH_HD inline int kv_tile_item(const ScheduleProblem& p, int n) {
  const int mirror = p.num_kv_tiles - 1 - n;
  if (p.schedule == Schedule::kMirror) return mirror;
  if (effective_schedule(p) != Schedule::kSymmetricShift) return n;
  return n < mirror ? n : mirror;
}

// The slice of this head's items that holds `item`: [first, end). first = the head's items in
// earlier slices. Per head: independent of `head` (kept for the callers) and of head_linear.
struct WaveSlice {
  int first;
  int end;
};

JAX_DASH_HD inline WaveSlice wave_slice(const ScheduleProblem& p, int /*head*/, int item) {
  const int64_t per_head = items_per_head(p);
  const int64_t width = wave_width(p);
  const int64_t first = (static_cast<int64_t>(item) / width) * width;
  const int64_t end = first + width;
  WaveSlice s;
  s.first = static_cast<int>(first);
  s.end = static_cast<int>(end < per_head ? end : per_head);
  return s;
}

// ---- visit orders -----------------------------------------------------------------------------

// shift's stride r (the header comment): floor(Nq / Nkv) where that is >= 2, else 1. r Nkv <= Nq,
// so a head's items start on distinct Q tiles.
JAX_DASH_HD inline int shift_stride(const ScheduleProblem& p) {
  return p.num_kv_tiles > 0 && p.num_q_tiles >= 2 * p.num_kv_tiles
             ? p.num_q_tiles / p.num_kv_tiles
             : 1;
}

// Number of Q tiles that KV tile n visits (the same for every schedule).
JAX_DASH_HD inline int q_visit_count(const ScheduleProblem& p, int /*head*/, int n) {
  return end_q_tile(p, n) - first_q_tile(p, n);
}

// The step-th Q tile that KV tile n of head `head` visits (step < q_visit_count).
JAX_DASH_HD inline int q_visit_tile(const ScheduleProblem& p, int /*head*/, int n, int step) {
  const int nq = p.num_q_tiles;
  switch (effective_schedule(p)) {
    case Schedule::kAscending:
    case Schedule::kMirror:
      return first_q_tile(p, n) + step;
    case Schedule::kShift:  // full mask only
      return static_cast<int>((static_cast<int64_t>(shift_stride(p)) * n + step) % nq);
    case Schedule::kSymmetricShift: {
      const int half = p.num_kv_tiles / 2;
      const int split = first_q_tile(p, half);  // long columns ascend below it, descend above
      if (n >= half) return nq - 1 - step;      // short column
      const int ascending_steps = split - first_q_tile(p, n);
      if (step < ascending_steps) return first_q_tile(p, n) + step;
      return nq - 1 - (step - ascending_steps);
    }
    case Schedule::kDescending:
    case Schedule::kAtomic:
      break;
  }
  return end_q_tile(p, n) - 1 - step;
}

// ---- tickets ----------------------------------------------------------------------------------

// K(m): number of contributions to dQ tile m.
JAX_DASH_HD inline int dq_ticket_count(const ScheduleProblem& p, int m) {
  return num_kv_tiles_seen(p, m);
}

namespace detail {

// #{z in [0, z_end) : z mod period < k}, for z_end >= 0.
JAX_DASH_HD inline int64_t count_low_residues(int64_t z_end, int64_t period, int64_t k) {
  const int64_t rem = z_end % period;
  return (z_end / period) * k + (rem < k ? rem : k);
}

// shift: rank of item n's arrival at tile m among the slice's items [lo, hi). Item x reaches m at
// step (m - x) mod Nq; ties (possible only when hi - lo > Nq) go to the smaller item.
JAX_DASH_HD inline int shift_arrival_rank(int nq, int lo, int hi, int m, int n) {
  const int64_t period = nq;
  const int64_t step = ((static_cast<int64_t>(m) - n) % period + period) % period;
  // Items x in [lo, hi) with (m - x) mod Nq < step: substitute z = m - x + bias, z >= 0.
  const int64_t bias = (static_cast<int64_t>(hi) / period + 1) * period;
  const int64_t z_first = m - hi + 1 + bias;
  const int64_t z_last = m - lo + bias;
  const int64_t earlier_steps =
      count_low_residues(z_last + 1, period, step) - count_low_residues(z_first, period, step);
  const int64_t same_step_smaller = (static_cast<int64_t>(n) - lo) / period;
  return static_cast<int>(earlier_steps + same_step_smaller);
}

// #{x in [lo, hi) : a < r x <= b}, for 0 <= lo, r >= 1, b >= 0 (a may be negative: then every
// x >= 0 is above it).
JAX_DASH_HD inline int64_t count_multiples_in(int64_t lo, int64_t hi, int64_t r, int64_t a,
                                              int64_t b) {
  const int64_t above = a < 0 ? 0 : a / r + 1;
  const int64_t below = b / r;
  const int64_t first = above > lo ? above : lo;
  const int64_t last = below < hi - 1 ? below : hi - 1;
  return last >= first ? last - first + 1 : 0;
}

// shift with stride r >= 2 (then r Nkv <= Nq, so r x < Nq and no two items meet): rank of item n's
// arrival at tile m among the slice's items [lo, hi). Item x reaches m at step (m - r x) mod Nq,
// which is < step(n) iff r x lies in (m - step, m] or, wrapping, in (m - step + Nq, m + Nq].
JAX_DASH_HD inline int strided_shift_arrival_rank(int nq, int r, int lo, int hi, int m, int n) {
  const int64_t period = nq;
  const int64_t step = ((static_cast<int64_t>(m) - static_cast<int64_t>(r) * n) % period +
                        period) % period;
  return static_cast<int>(count_multiples_in(lo, hi, r, m - step, m) +
                          count_multiples_in(lo, hi, r, m - step + period, m + period));
}

// symmetric_shift: ticket of (m, n), n a column of pair item p (see the header comment).
JAX_DASH_HD inline int symmetric_shift_ticket(const ScheduleProblem& p, int head, int m, int n) {
  const int nkv = p.num_kv_tiles;
  const int half = nkv / 2;
  const bool long_column = n < half;
  const int item = long_column ? n : nkv - 1 - n;
  const WaveSlice s = wave_slice(p, head, item);
  const int seen = num_kv_tiles_seen(p, m);
  // Contributions to m from this head's earlier slices: long columns p < seen, short columns
  // nkv-1-p < seen.
  const int long_before = s.first < seen ? s.first : seen;
  const int short_before = s.first - (nkv - seen) > 0 ? s.first - (nkv - seen) : 0;
  const int before = long_before + short_before;
  if (m < first_q_tile(p, half)) {
    // Only long columns reach m, at step m - first_q_tile(p): larger p arrives first.
    const int end = s.end < seen ? s.end : seen;
    return before + (end - 1 - item);
  }
  // Every long column of the slice reaches m before any short column; within each, larger p
  // first.
  const int rank_in_kind = s.end - 1 - item;
  return before + (long_column ? rank_in_kind : (s.end - s.first) + rank_in_kind);
}

}  // namespace detail

// ticket(m, n) for an active (m, n) of head `head`.
JAX_DASH_HD inline int dq_ticket(const ScheduleProblem& p, int head, int m, int n) {
  switch (effective_schedule(p)) {
    case Schedule::kShift: {
      const WaveSlice s = wave_slice(p, head, n);
      const int r = shift_stride(p);
      return s.first + (r == 1 ? detail::shift_arrival_rank(p.num_q_tiles, s.first, s.end, m, n)
                                : detail::strided_shift_arrival_rank(p.num_q_tiles, r, s.first,
                                                                     s.end, m, n));
    }
    case Schedule::kSymmetricShift:
      return detail::symmetric_shift_ticket(p, head, m, n);
    case Schedule::kMirror:  // descending n over the KV tiles m sees
      return first_kv_tile(p, m) + num_kv_tiles_seen(p, m) - 1 - n;
    case Schedule::kAscending:
    case Schedule::kDescending:
    case Schedule::kAtomic:
      break;
  }
  return n - first_kv_tile(p, m);  // ascending n over the KV tiles m sees
}

// Order of the GQA dK/dV reduction: query head `head_in_group` of its group adds its partial
// dK_n/dV_n at this position. Always a smaller global item than the waiter: wave-independent.
JAX_DASH_HD inline int dkv_ticket(const ScheduleProblem&, int head_in_group, int /*n*/) {
  return head_in_group;
}

}  // namespace jax_dash
