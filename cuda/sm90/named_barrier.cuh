// Named-barrier ids of the sm90 kernels, both directions in one place so that a reader sees every
// id and no two roles' barriers can collide. Id 0 is __syncthreads; a CTA has 16 (0-15). The
// forward and the backward run in kernels of their own, so their ids may coincide; the pre- and
// postprocess kernels use none.
#pragma once

#include <cuda_runtime.h>

namespace jax_dash::sm90 {

namespace fwd {

// The forward (fwd/kernel.cuh FwdKernel): two or three math warpgroups and a producer warpgroup.
enum FwdBarrier : int {
  // Turn-taking: math warpgroup w issues its wgmmas after a sync on kTurnBarrier + w and hands the
  // turn to the next one, (w + 1) % warpgroups, with an arrive (ids 1-3; fwd/mainloop.cuh).
  kTurnBarrier = 1,
  // kTmaStoreO: one per math warpgroup for its epilogue (ids 4-6; fwd/epilogue.cuh).
  kEpilogueBarrier = 4,
};

}  // namespace fwd

namespace bwd {

// The warp-specialized backward (bwd/kernel.cuh BwdWsKernel): a producer warp, two dQ writer
// warps and two math warpgroups.
enum WsBarrier : int {
  kUnitBarrier = 1,  // producer warp + writer warps + math: a unit is published / finished
  kPdSBarrier = 2,   // math: dS^T of this step is in shared memory
  kMathBarrier = 3,  // math only: unit fetch, single-buffered dS^T, GQA epilogue
  // Ids 4-11: the dQ hand-off (bwd/dq_writer.cuh), a full/empty pair per (writer w, math
  // warpgroup g): dq_full_barrier(w, g), dq_empty_barrier(w, g).
  kdQBarriers = 4,
};
// Math warpgroup g arrives, writer w syncs: g's half of the writer's step's dQ partial is in shared
// memory (kdQInStage: the whole partial of Q/dO stage w, both warpgroups arriving on g = 0's id).
__device__ __forceinline__ int dq_full_barrier(int w, int g) {
  return kdQBarriers + 4 * g + 2 * w;
}
// Writer w arrives, math warpgroup g syncs: the writer has read g's half of the buffer, which may
// be overwritten.
__device__ __forceinline__ int dq_empty_barrier(int w, int g) {
  return kdQBarriers + 4 * g + 2 * w + 1;
}

}  // namespace bwd

}  // namespace jax_dash::sm90
