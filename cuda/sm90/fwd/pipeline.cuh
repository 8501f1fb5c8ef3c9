// Where a role of the sm90 forward stands in the K/V shared-memory ring and in Q's barrier, in
// place of stage and phase arithmetic written out at each wait.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/fwd/traits.cuh"

namespace jax_dash::sm90::fwd {

// One KV iteration of this CTA (all its tiles counted): its stage of the ring, and the phase in
// which the stage's full barrier completes for it. Its empty barrier completes in the other one
// before the producer may refill the stage (so the first use of a stage passes at once).
struct KvSlot {
  int count;

  __device__ __forceinline__ int stage() const { return count % kStages; }
  __device__ __forceinline__ int full_phase() const { return (count / kStages) & 1; }
  __device__ __forceinline__ int empty_phase() const { return full_phase() ^ 1; }
  __device__ __forceinline__ KvSlot previous() const { return KvSlot{count - 1}; }
};

// Each role counts its own KV iterations and Q loads; they agree because every role visits the
// same tiles in the same order. Both counts stay 0 without kPersistent.
struct KvPipelineState {
  int kv_base = 0;  // this CTA's KV iterations before the current tile

  // Iteration j of the current tile.
  __device__ __forceinline__ KvSlot kv(int j) const { return KvSlot{kv_base + j}; }
  __device__ __forceinline__ void advance(int n_end) { kv_base += n_end; }
};

// Q's barrier completes once per tile that has KV tiles.
struct QPipelineState {
  int q_count = 0;  // this CTA's Q loads before the current tile

  __device__ __forceinline__ int full_phase() const { return q_count & 1; }
  // Persistent: the phase in which the math warps released the previous tile's Q (q_count > 0).
  __device__ __forceinline__ int empty_phase() const { return (q_count - 1) & 1; }
  __device__ __forceinline__ void advance() { ++q_count; }
};

}  // namespace jax_dash::sm90::fwd
