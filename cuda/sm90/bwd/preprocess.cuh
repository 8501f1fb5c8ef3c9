// Backward preprocess: dsum = rowsum(dO * O) in fp32 and lse in log2 units, both padded to whole Q
// tiles so that the main kernel never tests row bounds when it reads them.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include <cute/config.hpp>  // CUTE_UNROLL

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/mask.cuh"

namespace jax_dash::sm90::bwd {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kPreprocessWarps = 8;  // rows per block (one warp per row)

// The unit tables of the warp-specialized backward (BwdWorkspaceLayout unit_steps, unit_visit,
// unit_ticket): for every KV tile n, its number of steps, the Q tile of each step and that step's
// ticket, as cuda/schedule.h defines them. The schedule's functions do not depend on the head (nor
// on head_linear), so one table serves every head and batch row; the main kernel copies a unit's
// row into shared memory instead of evaluating them (64-bit divisions, the band's ranges) at every
// unit start. sp is the main kernel's problem (its wave included: shift's and symmetric_shift's
// tickets depend on it). blocks == 0: no tables (the masked instantiation builds a unit's own).
struct UnitTables {
  ScheduleProblem sp;
  bool deterministic;  // false (atomic): tickets 0
  int32_t* steps;
  int32_t* visit;
  int32_t* ticket;
  int64_t blocks;  // blocks of kPreprocessWarps * 32 entries over Nkv * Nq
};

__device__ __forceinline__ void fill_unit_tables(const UnitTables& t, int64_t block) {
  const int64_t nq = t.sp.num_q_tiles;
  const int64_t entry = block * (kPreprocessWarps * 32) + threadIdx.x;
  if (entry >= nq * t.sp.num_kv_tiles) return;
  const int n = static_cast<int>(entry / nq);
  const int s = static_cast<int>(entry % nq);
  const int steps = q_visit_count(t.sp, 0, n);
  if (s == 0) t.steps[n] = steps;
  if (s >= steps) return;
  const int m = q_visit_tile(t.sp, 0, n, s);
  t.visit[entry] = m;
  t.ticket[entry] = t.deterministic ? dq_ticket(t.sp, 0, m, n) : 0;
}

// Rows of one warp: 512 elements of each tensor (hd64: 8 rows, hd128: 4, hd256: 2), two 16-byte
// loads a lane. One row a warp left a warp with a few hundred bytes in flight and made 65k tiny
// blocks: 36-60% of DRAM peak on an H100 (maintainers/perf-notes.md, thirteenth session).
template <int kHeadDim>
constexpr int preprocess_rows_per_warp() {
  static_assert(512 % kHeadDim == 0, "head_dim 64, 128 or 256");
  return 512 / kHeadDim;
}
// Padded rows of one block of the preprocess.
template <int kHeadDim>
constexpr int preprocess_rows_per_block() {
  return kPreprocessWarps * preprocess_rows_per_warp<kHeadDim>();
}

// One warp per preprocess_rows_per_warp consecutive (batch, head, padded row)s, which belong to one
// head (rows_q is a multiple of every Q tile, and so of the rows a warp takes). Each row's
// arithmetic is the one-row-a-warp kernel's, operation for operation: lane l sums o * do over the
// columns l, l + 32, ... as an FMA chain from 0, then a fixed xor butterfly, so dsum has the same
// bits. The warp's rows arrive in shared memory first, as 16-byte loads (out and dout 16-byte
// aligned: launch_preprocess), and each lane reads its columns from there. (Two-byte loads
// straight into the FMA chains cost ~450 instructions a warp, most of them addresses, and the
// kernel ran at ~72% of DRAM peak on an H100: maintainers/perf-notes.md, twenty-ninth session.)
// Rows >= seq_q get dsum 0 and lse_log2 +inf, which makes P = exp2(s - lse_log2) exactly 0
// there; so does a row whose lse is -inf (it saw no key). The last tables.blocks blocks fill the
// unit tables instead.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kPreprocessWarps * 32)
    bwd_preprocess_kernel(const Element* __restrict__ out, const Element* __restrict__ dout,
                          const float* __restrict__ lse, float* __restrict__ dsum,
                          float* __restrict__ lse_log2, int64_t batch, int64_t seq_q,
                          int num_heads, int64_t rows_q, const UnitTables tables) {
  constexpr int kRows = preprocess_rows_per_warp<kHeadDim>();
  constexpr int kPerLane = kHeadDim / 32;  // columns of one row a lane sums
  constexpr int kElems = kRows * kHeadDim;  // one tensor's elements of a warp's rows: 512
  constexpr int kChunk = 16 / static_cast<int>(sizeof(Element));  // elements of a 16-byte load
  constexpr int kChunksPerLane = kElems / kChunk / 32;
  static_assert(kHeadDim % 32 == 0, "a row is whole warps of columns");
  static_assert(kHeadDim % kChunk == 0 && kChunksPerLane * kChunk * 32 == kElems,
                "a row is whole 16-byte chunks, a warp's rows whole loads of every lane");
  __shared__ alignas(16) Element stage[kPreprocessWarps][2][kElems];
  const int lane = threadIdx.x % 32;
  const int64_t total_rows = batch * num_heads * rows_q;
  const int64_t row_blocks = ceil_div(total_rows, preprocess_rows_per_block<kHeadDim>());
  if (static_cast<int64_t>(blockIdx.x) >= row_blocks) {
    fill_unit_tables(tables, static_cast<int64_t>(blockIdx.x) - row_blocks);
    return;
  }
  const int64_t first_row =
      (static_cast<int64_t>(blockIdx.x) * kPreprocessWarps + threadIdx.x / 32) * kRows;
  if (first_row >= total_rows) return;  // whole warps
  const int64_t row0 = first_row % rows_q;  // the warp's rows: row0 .. row0 + kRows - 1 of head bh
  const int64_t bh = first_row / rows_q;
  const int64_t b = bh / num_heads;
  const int h = static_cast<int>(bh % num_heads);
  // Element e of row r: out[row_base(r) + e]; rows past seq_q read as +0 (zero bits).
  auto row_base = [&](int r) { return ((b * seq_q + row0 + r) * num_heads + h) * kHeadDim; };
  Element* const so = stage[threadIdx.x / 32][0];
  Element* const sg = stage[threadIdx.x / 32][1];

  uint4 o[kChunksPerLane];
  uint4 g[kChunksPerLane];
  CUTE_UNROLL
  for (int i = 0; i < kChunksPerLane; ++i) {
    const int chunk = lane + 32 * i;
    const int r = chunk / (kHeadDim / kChunk);
    const int64_t at = row_base(r) + (chunk % (kHeadDim / kChunk)) * kChunk;
    const bool valid = row0 + r < seq_q;
    o[i] = valid ? __ldg(reinterpret_cast<const uint4*>(out + at)) : make_uint4(0, 0, 0, 0);
    g[i] = valid ? __ldg(reinterpret_cast<const uint4*>(dout + at)) : make_uint4(0, 0, 0, 0);
  }
  CUTE_UNROLL
  for (int i = 0; i < kChunksPerLane; ++i) {
    reinterpret_cast<uint4*>(so)[lane + 32 * i] = o[i];
    reinterpret_cast<uint4*>(sg)[lane + 32 * i] = g[i];
  }
  __syncwarp();

  float mine = 0.f;  // lane r < kRows: row r's sum
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    // A row past seq_q sums zeros: +0, as the one-row kernel's untouched accumulator.
    float acc = 0.f;
    CUTE_UNROLL
    for (int j = 0; j < kPerLane; ++j) {
      const int e = r * kHeadDim + lane + 32 * j;
      acc = fmaf(static_cast<float>(so[e]), static_cast<float>(sg[e]), acc);
    }
    // Fixed butterfly order: the same bits every run.
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == r) mine = acc;
  }
  if (lane < kRows) {
    const int64_t row = row0 + lane;
    dsum[first_row + lane] = mine;
    float l2 = INFINITY;
    if (row < seq_q) {
      const float l = lse[bh * seq_q + row];
      if (l != -INFINITY) l2 = l * kLog2e;
    }
    lse_log2[first_row + lane] = l2;
  }
}

}  // namespace jax_dash::sm90::bwd
