// The dQ writer warp of the sm90 warp-specialized backward: adds each step's dQ partial into
// dq_accum in ticket order.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/bwd/pipeline.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/trace.cuh"
#include "cuda/sm90/bwd/traits.cuh"
#include "cuda/sm90/named_barrier.cuh"

namespace jax_dash::sm90::bwd {

using namespace cute;

// Q tile m's turn at its dq_accum tile under a deterministic schedule: a workspace counter of the
// contributions already added (cuda/schedule.h dq_ticket). The step whose ticket equals the count
// adds; it passes the turn on only once its adds are complete in global memory, not merely read
// from shared memory, so that the next holder's adds land after them.
struct DqTicket {
  int32_t* counter;
  __device__ __forceinline__ void wait(int32_t ticket) const { spin_until_equal(counter, ticket); }
  __device__ __forceinline__ void release() const {
    fence_async_global();  // the completed bulk reduction (async proxy) before the release
    red_release_gpu_add(counter, 1);
  }
};

// ---- dQ writer warps ----------------------------------------------------------------------------
// Per unit the Scheduler publishes, writer w's steps' dQ partials into dq_accum (visit_m,
// visit_ticket: the unit's visit order and tickets in shared memory): steps s with s % 2 == w, or
// (kdQInStage) those in Q/dO stage w; with one writer (Traits::kdQWriters: the masked kernels but
// the window/lengths one at head_dim 128) every step. A step's partial lies in buffer s %
// kdQStages, in two halves, one per math warpgroup (Traits::dq_chunk), each handed over on its own
// barrier pair: math warpgroup g stores its half of step s once the writer of step s - kdQStages
// has read g's half of that buffer (its dQ-empty barrier for g, or at the unit's start the writer
// whose barriers the math's first waits name), so writer w arrives on dq_empty_barrier(w, g) only.
// The writer reduces warpgroup 0's half, then 1's, and releases the ticket once both are complete
// (scripts/ws_protocol_model.py: one and two writers). kdQInStage: the whole partial of stage w on
// dq_full_barrier(w, 0), no dQ-empty barrier (the writer frees the stage).
template <class Traits_>
struct WsDqWriter {
  using Traits = Traits_;
  static constexpr int kWriters = Traits::kdQWriters;
  static_assert((kWriters == 1 || kWriters == 2) && Traits::kStages == 2,
                "one writer, or writer w taking the steps of parity w (or of Q/dO stage w)");
  static_assert(kWriters == 2 || Traits::kdQStages == 1,
                "one writer frees one buffer on its one dQ-empty barrier");
  // The writer of step s, and the dQ-empty barrier math warpgroup g waits on before storing its
  // half of step s.
  __device__ __forceinline__ static int writer_of(int s) { return s % kWriters; }
  __device__ __forceinline__ static int empty_barrier_before(int s, int g) {
    return dq_empty_barrier((s + Traits::kdQStages) % kWriters, g);  // the writer of s - kdQStages
  }
  template <class Scheduler, class Storage>
  __device__ __forceinline__ static void run(const WsParams<Traits>& P, Storage& smem,
                                             const int32_t* visit_m, const int32_t* visit_ticket,
                                             int w);
};

template <class Traits_>
template <class Scheduler, class Storage>
__device__ __forceinline__ void WsDqWriter<Traits_>::run(const WsParams<Traits>& P,
                                                        Storage& smem, const int32_t* visit_m,
                                                        const int32_t* visit_ticket, int w) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  const AttentionParams& p = P.p;
  const bool deterministic = P.sp.schedule != Schedule::kAtomic;
  const bool leader = cute::elect_one_sync();
  const int64_t rows_q = static_cast<int64_t>(P.sp.num_q_tiles) * kBlockM;
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                     p.num_kv_heads, p.head_dim);
  float* dq_accum = p.workspace_f32 + ws.dq_accum;
  int32_t* dq_sem = p.workspace_i32 + ws.dq_semaphore;
  const WsTracer<Traits::kTraced> tracer{P.trace != nullptr && leader ? smem.trace : nullptr};
  PipelineState<Traits::kStages> q_pipe;  // kdQInStage: the Q/dO ring, as the producer counts it

  WsUnit u;
  while (Scheduler::published(P, smem, &u)) {
    const int num_steps = u.num_steps;
    // The buffers are free for the unit's first steps (the previous unit's reductions were waited
    // for): this writer frees those whose first step waits on its barriers.
    if constexpr (!Traits::kdQInStage) {
      for (int j = 0; j < Traits::kdQStages && j < num_steps; ++j) {
        if (writer_of(j + Traits::kdQStages) == w) {
          named_barrier_arrive(dq_empty_barrier(w, 0), Traits::kdQThreads);
          named_barrier_arrive(dq_empty_barrier(w, 1), Traits::kdQThreads);
        }
      }
    }
    for (int s = 0; s < num_steps; ++s, q_pipe.advance()) {
      // This writer's steps only: s % 2 == w, or (kdQInStage) those in stage w (all with one).
      if ((Traits::kdQInStage ? q_pipe.index() % kWriters : writer_of(s)) != w) continue;
      // kdQInStage: the stage's barrier; otherwise the buffer's.
      const int buf = Traits::kdQInStage ? q_pipe.index()
                                         : (Traits::kdQStages == 1 ? 0 : s % Traits::kdQStages);
      const int m = visit_m[s];
      const DqTicket ticket{dq_sem + static_cast<int64_t>(u.head_linear) * P.sp.num_q_tiles + m};
      // Wait for the ticket first: the spin overlaps the math warpgroups' work on this step.
      if (deterministic && leader) {
        const long long t0 = tracer.start();
        ticket.wait(visit_ticket[s]);
        tracer.stop(kTraceWriterWaitTicket, t0);
        fence_async_global();  // the bulk reduction below is ordered after the acquire
      }
      __syncwarp();
      float* tile = dq_accum + (static_cast<int64_t>(u.head_linear) * rows_q +
                                static_cast<int64_t>(m) * kBlockM) * kHeadDim;
      // The first contribution (ticket 0, dq_first_store) is stored: dq_accum was not zeroed.
      const bool store = P.dq_first_store && visit_ticket[s] == 0;
      // Half h of the partial (Traits::dq_chunk), the second half of the index range from src.
      constexpr uint32_t kHalfBytes = Traits::kdQBytes / 2;
      auto put_half = [&](int h, const float* src) JAX_DASH_INLINE {
        float* dst = tile + h * (Traits::kdQFloats / 2);
        if (store) {
          bulk_store_f32(dst, src, kHalfBytes);
        } else {
          bulk_reduce_add_f32(dst, src, kHalfBytes);
        }
      };
      if constexpr (Traits::kdQInStage) {
        // The math arrives on its stage's barrier with the whole partial: its first half in the
        // stage's Q buffer, the second in its dO buffer.
        const long long t_full = tracer.start();
        named_barrier_sync(dq_full_barrier(buf, 0), Traits::kdQThreads);
        tracer.stop(kTraceWriterWaitdQFull, t_full);
        const long long t_reduce = tracer.start();
        if (leader) {
          put_half(0, reinterpret_cast<const float*>(smem.q[buf]));
          put_half(1, reinterpret_cast<const float*>(smem.dout[buf]));
          bulk_commit_group();
          bulk_wait_group_read_all();
          // The stage is read; the producer may load a later step's Q/dO into it.
          cutlass::arch::ClusterBarrier::arrive(&smem.q_empty[buf]);
        }
        __syncwarp();
        tracer.stop(kTraceWriterWaitReduce, t_reduce);
      } else {
        // Warpgroup g's half as its own bulk group once g has stored it, both halves in flight at
        // once (waited for one at a time, the second half's reduction started only after the
        // first's read, and the ticket's release came ~4% later at 1 x 32k: twenty-first session,
        // call 1); g's half of the buffer is free for step s + kdQStages once read.
        const bool frees = s + Traits::kdQStages < num_steps;
        for (int g = 0; g < 2; ++g) {
          const long long t_full = tracer.start();
          named_barrier_sync(dq_full_barrier(w, g), Traits::kdQThreads);
          tracer.stop(kTraceWriterWaitdQFull, t_full);
          if (leader) {
            put_half(g, smem.dq[buf] + g * (Traits::kdQFloats / 2));
            bulk_commit_group();
          }
        }
        const long long t_reduce = tracer.start();
        if (leader) bulk_wait_group_read<1>();  // warpgroup 0's half
        __syncwarp();
        if (frees) named_barrier_arrive(dq_empty_barrier(w, 0), Traits::kdQThreads);
        if (leader) bulk_wait_group_read<0>();  // warpgroup 1's half
        __syncwarp();
        if (frees) named_barrier_arrive(dq_empty_barrier(w, 1), Traits::kdQThreads);
        tracer.stop(kTraceWriterWaitReduce, t_reduce);
      }
      if (leader) {
        const long long t_complete = tracer.start();
        bulk_wait_group_all();
        tracer.stop(kTraceWriterComplete, t_complete);
        if (deterministic) {
          const long long t_release = tracer.start();
          ticket.release();
          tracer.stop(kTraceWriterRelease, t_release);
        }
      }
      __syncwarp();
    }
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);
  }
  if (leader) bulk_wait_group_all();
}

}  // namespace jax_dash::sm90::bwd
