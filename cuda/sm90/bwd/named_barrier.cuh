// Named-barrier ids of the sm90 warp-specialized backward (bwd/kernel.cuh), in one place so that
// no two roles' barriers can collide.
#pragma once

#include <cuda_runtime.h>

namespace jax_dash::sm90::bwd {

// Named barriers (0 is __syncthreads).
enum WsBarrier : int {
  kUnitBarrier = 1,     // producer warp + writer warp + math: a unit is published / finished
  kPdSBarrier = 2,      // math: dS^T of this step is in shared memory
  kdQFullBarrier = 3,   // math arrive, writer sync: the step's dQ partial is in shared memory
  kdQEmptyBarrier = 4,  // writer arrive, math sync: the dQ buffer may be overwritten
  kMathBarrier = 5,     // math only: unit fetch, single-buffered dS^T, GQA epilogue
  kdQFullBarrier1 = 6,  // the same pair for the second dQ buffer (kdQStages == 2)
  kdQEmptyBarrier1 = 7,
};
// The full/empty barrier pair of dQ buffer j.
__device__ __forceinline__ int dq_full_barrier(int j) {
  return j ? kdQFullBarrier1 : kdQFullBarrier;
}
__device__ __forceinline__ int dq_empty_barrier(int j) {
  return j ? kdQEmptyBarrier1 : kdQEmptyBarrier;
}

}  // namespace jax_dash::sm90::bwd
