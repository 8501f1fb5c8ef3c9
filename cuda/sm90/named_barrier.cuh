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
  kUnitBarrier = 1,     // producer warp + writer warps + math: a unit is published / finished
  kPdSBarrier = 2,      // math: dS^T of this step is in shared memory
  kdQFullBarrier = 3,   // math arrive, writer 0 sync: its step's dQ partial is in shared memory
  kdQEmptyBarrier = 4,  // writer 0 arrive, math sync: the dQ buffer it read may be overwritten
  kMathBarrier = 5,     // math only: unit fetch, single-buffered dS^T, GQA epilogue
  kdQFullBarrier1 = 6,  // the same pair for dQ writer 1 (dq_writer.cuh: two writer warps)
  kdQEmptyBarrier1 = 7,
};
// The full/empty barrier pair of dQ writer j.
__device__ __forceinline__ int dq_full_barrier(int j) {
  return j ? kdQFullBarrier1 : kdQFullBarrier;
}
__device__ __forceinline__ int dq_empty_barrier(int j) {
  return j ? kdQEmptyBarrier1 : kdQEmptyBarrier;
}

}  // namespace bwd

}  // namespace jax_dash::sm90
