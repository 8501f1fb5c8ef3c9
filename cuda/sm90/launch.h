// Host-side entry points of the Hopper kernels, called by the CUDA FFI handlers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/params.h"

namespace jax_dash::sm90 {

// Which kernels run is read from the environment at each call:
//   JAX_DASH_SM90_FWD  unset or empty (the default): ws-persistent up to 4096 keys at head_dim
//                      64 and 8192 at 128 (ws-persistent-narrow for causal calls of up to 1024
//                      keys at 64), ws otherwise;
//                      ws: producer warpgroup, ping-pong math warpgroups, one query tile per CTA;
//                      ws-persistent: the same looping over tiles (one CTA per SM);
//                      ws-persistent-narrow: ws-persistent with 128-row query tiles at head_dim 64.
//                      All give the same bits.
// (The backward has one kernel, bwd/kernel.cuh: no variable.)
// kernel_selection_error(): empty if the variable is valid, else a message naming it and the
// values allowed (the handlers return it before enqueuing anything).
std::string kernel_selection_error();
bool fwd_kernel_valid();
bool fwd_uses_persistent(const AttentionParams& p);  // this call runs ws-persistent
bool fwd_uses_narrow(const AttentionParams& p);  // ... with 128-row tiles (head_dim 64)

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
// `trace`, if not null, receives the main kernel's per-role wait counters (bwd_trace_slots() per
// CTA, at least p.wave CTAs; cuda/sm90/bwd/trace.cuh WsTraceSlot).
cudaError_t run_bwd(const AttentionParams& p, cudaStream_t stream,
                    unsigned long long* trace = nullptr);
int bwd_trace_slots();

}  // namespace jax_dash::sm90
