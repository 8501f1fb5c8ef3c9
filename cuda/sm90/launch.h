// Host-side entry points of the Hopper kernels, called by the CUDA FFI handlers.
#pragma once

#include <cuda_runtime.h>

#include "cuda/params.h"

namespace jax_dash::sm90 {

// Forward: fills p.out and p.lse. Never synchronizes; returns the first CUDA error.
cudaError_t run_fwd(const AttentionParams& p, cudaStream_t stream);

// Number of backward CTAs that can be resident at once on the current device (from the occupancy
// query, never a constant): the schedules' wave width.
int bwd_wave(const AttentionParams& p);

// Backward: preprocess (dsum, zeroed workspace), main (tickets of p.schedule), postprocess.
// p.wave must be <= bwd_wave(p). Never synchronizes; returns the first CUDA error.
// With JAX_DASH_SM90_BWD=ws in the environment the warp-specialized main kernel runs (opt-in until
// verified on a GPU); `trace`, if not null, then receives its per-role wait counters
// (bwd_trace_slots() per CTA, at least bwd_wave(p) CTAs; cuda/sm90/bwd_main_ws.cuh WsTraceSlot).
cudaError_t run_bwd(const AttentionParams& p, cudaStream_t stream,
                    unsigned long long* trace = nullptr);
int bwd_trace_slots();
bool bwd_uses_warp_specialized();

}  // namespace jax_dash::sm90
