// The one POD struct that crosses FFI -> kernel launch, on the CPU and on the GPU.
#pragma once

#include <cstdint>

#include "cuda/compat.h"
#include "cuda/mask.h"
#include "cuda/schedule.h"
#include "cuda/tiles.h"

namespace jax_dash {

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// All tensors are contiguous, row-major:
//   q, out, dout, dq : [batch, seq_q,  num_heads,    head_dim]  (dq, dk, dv in grad_dtype)
//   k, v, dk, dv     : [batch, seq_kv, num_kv_heads, head_dim]
//   lse              : [batch, num_heads, seq_q]  (float32, natural log)
//   q_seq_lengths, kv_seq_lengths : [batch] int32;  q_segment_ids : [batch, seq_q] int32;
//   kv_segment_ids : [batch, seq_kv] int32 (nullptr when the call has none)
// With accumulate, dq, dk and dv hold the float32 sums on entry and get sum + gradient.
struct AttentionParams {
  int64_t batch;
  int64_t seq_q;
  int64_t seq_kv;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  DType dtype;
  DType grad_dtype;  // dq, dk, dv: dtype, or float32 for the ring's carried accumulators
  // Float32 gradients only: the call adds its gradients to what dq, dk and dv hold (the ring's
  // running sums, passed as operands aliased to them): out = out + g, g the value the call would
  // write otherwise, one float32 add (never fused with the product that made g). Read only where
  // the gradients are written (epilogues, postprocess), never in a kernel's step loop.
  bool accumulate;
  // The softmax scale: a 0-d float32 operand of the FFI call, so a new scale is new data, not a
  // new executable. On the GPU a device pointer that kernels read (never the host: no sync); on
  // the CPU a host pointer.
  const float* scale_ptr;
  bool is_causal;
  Schedule schedule;
  TileConfig tiles;
  int32_t wave;  // backward work items resident at once (the schedules' wave width)

  // The mask beyond is_causal (cuda/mask.h). Zero-initialized = none of it, so code that fills
  // the struct field by field without knowing these gets a full or causal mask.
  bool has_window;
  int64_t window_left;     // key j >= i - window_left  (kUnboundedBand: no limit on that side)
  int64_t window_right;    // key j <= i + window_right
  float logits_soft_cap;   // > 0: logits = cap * tanh(scale * q.k / cap); 0: no cap
  const int32_t* q_seq_lengths;   // queries i >= q_seq_lengths[b] see nothing
  const int32_t* kv_seq_lengths;  // keys j >= kv_seq_lengths[b] are seen by none
  const int32_t* q_segment_ids;   // query i sees key j only if the ids are equal
  const int32_t* kv_segment_ids;

  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;

  // Backward only (but workspace_i32, below).
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* workspace_f32;    // laid out by bwd_workspace_layout()
  // The backward's, laid out by bwd_workspace_layout(); the Hopper forward's: one int32, the
  // persistent kernel's tile counter (zeroed by its launch; fwd/scheduler.cuh).
  int32_t* workspace_i32;

  // Attention dropout (cuda/dropout.h; the CPU kernels and the Hopper forward): with has_dropout the
  // probability of the call's element (b, h, i, j) is kept iff dropout_keep(dropout_key0,
  // dropout_key1, dropout_threshold, b + o[0], h + o[1], i + o[2], j + o[3]) with
  // o = dropout_offsets (uint32 additions), and then scaled by dropout_scale = 1 / (1 - rate).
  // The softmax's normalization uses every probability.
  // The threshold is 16 bits (a draw is): with it beside has_dropout the struct keeps its size
  // with dropout_key_ptr below, so the kernels that take AttentionParams by value (the backward's)
  // compile to the same code as before the pointer (maintainers/perf-notes.md, issue 33).
  bool has_dropout;
  uint16_t dropout_threshold;
  uint32_t dropout_key0;
  uint32_t dropout_key1;
  float dropout_scale;
  // The global coordinates of the call's element (0, 0, 0, 0): int32 [4] = (batch, head, q, kv),
  // each >= 0, an FFI operand (traced under shard_map and the ring, where a call is one block of a
  // larger problem), so a new offset is new data, not a new executable. h is a query head (GQA:
  // the key/value heads follow from the query heads). As scale_ptr: on the GPU a device pointer
  // that kernels read (never the host: no sync); on the CPU a host pointer. Read only with
  // has_dropout.
  const int32_t* dropout_offsets;
  // The GPU's dropout key: uint32 [2] (the FFI operand, a device buffer that the handler cannot
  // read without a sync), read by the kernels once per CTA in place of dropout_key0/1; nullptr on
  // the CPU, whose handlers copy the host key into dropout_key0/1. At the end of the struct so that
  // no field before it moves.
  const uint32_t* dropout_key_ptr;
};

// The schedules' view of a call (cuda/schedule.h): its tiles, extents, band and wave width. The
// CPU kernels pass their own tiles; the Hopper backward passes tile_config(head_dim).
JAX_DASH_HD inline ScheduleProblem schedule_problem(const AttentionParams& p, const TileConfig& t,
                                                    int32_t wave) {
  ScheduleProblem s{};
  s.num_q_tiles = static_cast<int32_t>(ceil_div(p.seq_q, t.bwd_block_m));
  s.num_kv_tiles = static_cast<int32_t>(ceil_div(p.seq_kv, t.bwd_block_n));
  s.block_m = t.bwd_block_m;
  s.block_n = t.bwd_block_n;
  s.seq_q = p.seq_q;
  s.seq_kv = p.seq_kv;
  s.is_causal = p.is_causal;
  s.num_heads = static_cast<int32_t>(p.batch * p.num_heads);
  s.wave = wave;
  s.schedule = p.schedule;
  s.has_window = p.has_window;
  s.window_left = p.window_left;
  s.window_right = p.window_right;
  return s;
}

// The whole mask of batch row b: the band and that row's lengths and segment ids.
JAX_DASH_HD inline MaskPolicy mask_policy(const AttentionParams& p, int64_t b) {
  return MaskPolicy{mask_band(p), mask_row(p.q_seq_lengths, p.kv_seq_lengths, p.q_segment_ids,
                                           p.kv_segment_ids, p.seq_q, p.seq_kv, b)};
}

// A mask beyond causal and the extents: a window, lengths or segment ids (cuda/mask.h).
JAX_DASH_HD inline bool has_mask_policy(const AttentionParams& p) {
  return p.has_window || p.q_seq_lengths != nullptr || p.kv_seq_lengths != nullptr ||
         p.q_segment_ids != nullptr;
}

// What only the masked instantiations of the Hopper kernels carry: such a mask or a soft cap.
JAX_DASH_HD inline bool needs_masked_kernels(const AttentionParams& p) {
  return has_mask_policy(p) || p.logits_soft_cap > 0.0f;
}

// Offsets (in elements) of the backward workspace regions. Every size is batch * (per-sequence
// size), so a buffer sized for one batch stacks linearly under vmap.
struct BwdWorkspaceLayout {
  // float32 buffer
  int64_t dq_accum;   // [batch, num_heads, Nq * bwd_block_m, head_dim]
  int64_t dsum;       // [batch, num_heads, Nq * bwd_block_m]   D = rowsum(dO * O)
  int64_t lse_log2;   // [batch, num_heads, Nq * bwd_block_m]   lse * log2(e), padded
  int64_t dk_accum;   // [batch, num_kv_heads, Nkv * bwd_block_n, head_dim]  (GQA only)
  int64_t dv_accum;   // same as dk_accum                                     (GQA only)
  int64_t f32_size;
  // int32 buffer
  int64_t dq_semaphore;   // [batch, num_heads, Nq]
  int64_t dkv_semaphore;  // [batch, num_kv_heads, Nkv]  (GQA only)
  int64_t item_counter;   // [batch]: element 0 = next sm90 backward work item (sized by batch)
  int64_t tile_segments;  // [batch, Nq + Nkv] SegmentRange (2 x int32): with segment ids, the id
                          // range of each query tile, then of each key tile (sm90 backward only)
  // The unit tables of the sm90 warp-specialized backward (filled by bwd_preprocess_kernel, the
  // same for every head and batch row): a KV tile's number of steps, its visit order and the
  // tickets of its steps. Not scaled by batch, and quadratic in the sequence (8 * Nq * Nkv bytes),
  // so they are laid out only while they stay within 1/4 of dQ's float32 accumulator
  // (unit_tables; about seq_kv <= 128k x batch x heads at head_dim 128): a long sequence over few
  // heads has none, and the sm90 backward then runs its masked instantiation, which builds each
  // unit's tables in the kernel (bwd/launch.cu), with the same bits but ~13% slower (4 heads of
  // 128k tokens, H200, 2026-11-26; the bound was 1/16 before, which left the ring's head groups
  // without tables). Empty regions otherwise.
  bool unit_tables;
  int64_t unit_steps;   // [Nkv]
  int64_t unit_visit;   // [Nkv, Nq]: entry (n, s) = the s-th Q tile of KV tile n (s < steps[n])
  int64_t unit_ticket;  // [Nkv, Nq]: the ticket of that step (0 for atomic)
  int64_t i32_size;
};

JAX_DASH_HD inline BwdWorkspaceLayout bwd_workspace_layout(int64_t batch, int64_t seq_q,
                                                          int64_t seq_kv, int64_t num_heads,
                                                          int64_t num_kv_heads, int64_t head_dim) {
  const TileConfig t = tile_config(static_cast<int>(head_dim));
  const int64_t nq = ceil_div(seq_q, t.bwd_block_m);
  const int64_t nkv = ceil_div(seq_kv, t.bwd_block_n);
  const int64_t rows_q = nq * t.bwd_block_m;
  const int64_t rows_kv = nkv * t.bwd_block_n;
  const bool gqa = num_heads != num_kv_heads;
  BwdWorkspaceLayout w{};
  int64_t off = 0;
  w.dq_accum = off;
  off += batch * num_heads * rows_q * head_dim;
  w.dsum = off;
  off += batch * num_heads * rows_q;
  w.lse_log2 = off;
  off += batch * num_heads * rows_q;
  w.dk_accum = off;
  off += gqa ? batch * num_kv_heads * rows_kv * head_dim : 0;
  w.dv_accum = off;
  off += gqa ? batch * num_kv_heads * rows_kv * head_dim : 0;
  w.f32_size = off;
  off = 0;
  w.dq_semaphore = off;
  off += batch * num_heads * nq;
  w.dkv_semaphore = off;
  off += gqa ? batch * num_kv_heads * nkv : 0;
  w.item_counter = off;
  off += batch;
  w.tile_segments = off;
  off += batch * (nq + nkv) * 2;
  w.unit_tables = 4 * (nkv + 2 * nkv * nq) <= batch * num_heads * rows_q * head_dim;
  const int64_t table_rows = w.unit_tables ? nkv : 0;
  w.unit_steps = off;
  off += table_rows;
  w.unit_visit = off;
  off += table_rows * nq;
  w.unit_ticket = off;
  off += table_rows * nq;
  w.i32_size = off;
  return w;
}

}  // namespace jax_dash
