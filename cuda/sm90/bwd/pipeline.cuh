// Which buffer of a ring a use takes, and which phase of that buffer's mbarrier it waits for, for
// the sm90 warp-specialized backward's Q/dO ring (and the dS^T buffers, which follow its count).
#pragma once

#include <cuda_runtime.h>

namespace jax_dash::sm90::bwd {

// A count of uses, not an (index, phase) pair stepped per use: the arithmetic the roles did by
// hand, so the same code. Each role counts every use since the kernel began (all units), and the
// stage and phase it derives are the ones its peers derive from their counts.
template <int kStages>
struct PipelineState {
  int count = 0;  // uses so far, all units
  __device__ __forceinline__ int index() const { return count % kStages; }
  __device__ __forceinline__ int phase() const { return (count / kStages) & 1; }
  __device__ __forceinline__ void advance() { ++count; }
};

}  // namespace jax_dash::sm90::bwd
