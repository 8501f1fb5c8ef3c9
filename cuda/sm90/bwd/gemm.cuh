// The backward's wgmma chains: C (+)= A B over all K blocks of the operands' partitions, issued
// and committed as one batch; the caller waits with warpgroup_wait.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>

namespace jax_dash::sm90::bwd {

using namespace cute;

// Issues a wgmma chain C (+)= A B over all K blocks; the caller waits with warpgroup_wait.
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_ss(TiledMma& mma, TA const& tA, TB const& tB, TC& tC) {
  warpgroup_fence_operand(tC);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tA); ++k) {
    cute::gemm(mma, tA(_, _, k), tB(_, _, k), tC);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tC);
}

// Issues a wgmma chain C (+)= A B with A in registers; the caller waits with warpgroup_wait and
// must not change A's registers before then.
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_rs(TiledMma& mma, TA& tA, TB const& tB, TC& tC) {
  warpgroup_fence_operand(tA);
  warpgroup_fence_operand(tC);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tA); ++k) {
    cute::gemm(mma, tA(_, _, k), tB(_, _, k), tC);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tC);
  warpgroup_fence_operand(tA);
}

}  // namespace jax_dash::sm90::bwd
