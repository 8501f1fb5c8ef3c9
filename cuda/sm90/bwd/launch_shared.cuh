// Definitions of the launches that the instantiations of one (dtype, head_dim) share (launch_bwd.h:
// launch_preprocess). Included only by the unmasked instantiation file of
// each (dtype, head_dim) generated from instantiate.cu.in, which instantiates them, so that each of
// their kernels is compiled once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/params.h"
#include "cuda/sm90/bwd/launch_bwd.h"
#include "cuda/sm90/bwd/preprocess.cuh"

namespace jax_dash::sm90::bwd {

template <class Element, int kHeadDim>
cudaError_t launch_preprocess(const AttentionParams& p, const BwdWorkspaceLayout& ws,
                              int64_t rows_q, int64_t blocks, const UnitTables& tables,
                              cudaStream_t stream) {
  // 16-byte loads; the main kernel's TMA loads of dout need the same alignment, which XLA's
  // buffers have.
  if (reinterpret_cast<uintptr_t>(p.out) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.dout) % 16 != 0)
    return cudaErrorMisalignedAddress;
  bwd_preprocess_kernel<Element, kHeadDim>
      <<<static_cast<unsigned>(blocks), kPreprocessWarps * 32, 0, stream>>>(
          static_cast<const Element*>(p.out), static_cast<const Element*>(p.dout), p.lse,
          p.workspace_f32 + ws.dsum, p.workspace_f32 + ws.lse_log2, p.batch, p.seq_q,
          p.num_heads, rows_q, tables);
  return cudaGetLastError();
}

}  // namespace jax_dash::sm90::bwd
