// Host-side entry points of the Hopper kernels, called by the CUDA FFI handlers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/params.h"

namespace jax_dash::sm90 {

// Forward: fills p.out and p.lse. Never synchronizes; returns the first CUDA error.
cudaError_t run_fwd(const AttentionParams& p, cudaStream_t stream);

// How the backward's main kernel fits on the current device (from the occupancy query, never a
// constant). Its shared memory grows with the number of query tiles, so a long seq_q may not fit.
struct BwdOccupancy {
  int resident_ctas = 0;  // main-kernel CTAs resident at once; 0: one CTA does not fit
  int wave = 0;           // the schedules' wave width min(resident_ctas, items); 0: does not fit
  int64_t max_seq_q = 0;  // the longest seq_q whose CTA fits in shared memory (this head_dim)
};

// Queries only: launches nothing and never synchronizes.
cudaError_t bwd_occupancy(const AttentionParams& p, BwdOccupancy* out);

// Backward: preprocess (dsum, zeroed workspace), main (tickets of p.schedule), postprocess.
// p.wave must be in [1, bwd_occupancy(p).wave]. Never synchronizes; returns the first CUDA error.
// With JAX_DASH_SM90_BWD=ws (or ws-rs) in the environment a warp-specialized main kernel runs
// (opt-in until verified on a GPU); `trace`, if not null, then receives its per-role wait counters
// (bwd_trace_slots() per CTA, at least p.wave CTAs; cuda/sm90/bwd_main_ws.cuh WsTraceSlot).
cudaError_t run_bwd(const AttentionParams& p, cudaStream_t stream,
                    unsigned long long* trace = nullptr);
int bwd_trace_slots();
bool bwd_uses_warp_specialized();

}  // namespace jax_dash::sm90
