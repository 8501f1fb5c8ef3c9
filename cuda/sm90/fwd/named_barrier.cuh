// Named-barrier ids of the sm90 forward (fwd/kernel.cuh), in one place so that no two roles'
// barriers can collide.
#pragma once

#include "cuda/sm90/fwd/traits.cuh"

namespace jax_dash::sm90::fwd {

// Named barriers (0 is __syncthreads).
enum FwdBarrier : int {
  // Turn-taking: math warpgroup w issues its wgmmas after a sync on kTurnBarrier + w and hands the
  // turn to the next one, (w + 1) % warpgroups, with an arrive (ids 1-3).
  kTurnBarrier = 1,
  // kTmaStoreO: one per math warpgroup for its epilogue (ids 4-6).
  kEpilogueBarrier = 4,
};
// Each turn barrier counts the two warpgroups that meet there (128 arriving, 128 waiting).
constexpr int kTurnThreads = 2 * kThreadsPerWarpgroup;

}  // namespace jax_dash::sm90::fwd
