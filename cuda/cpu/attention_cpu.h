// CPU reference kernels behind the same FFI targets as the Hopper kernels. Same tiles and the same
// dQ tickets as the GPU (cuda/tiles.h, cuda/schedule.h); fp32 accumulation. Work is split across
// threads only along independent outputs (one thread owns a whole output tile), so the bits do not
// depend on the thread count.
#pragma once


#include "cuda/params.h"

namespace jax_dash::cpu {

// Fills p.out and p.lse.
void forward(const AttentionParams& p);

// Fills p.dq, p.dk, p.dv (p.out, p.lse, p.dout are inputs). Uses p.workspace_f32 for dq_accum
// and dsum; the semaphores are unused on the CPU (the reduction order is enforced by construction).
void backward(const AttentionParams& p);

}  // namespace jax_dash::cpu
