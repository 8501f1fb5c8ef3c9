// Warp-specialized backward main kernel for sm90, the default backward ("ws-rs"; stages S1-S3 of
// the kernel plan; maintainers/perf-notes.md).
//
// Work items, visit orders and tickets of cuda/schedule.h, the tile products of traits.cuh's
// BwdTileTraits, with the work split by role:
//
//   warpgroup 0 ("service", registers lowered to kServiceRegisters)
//     warp 0  PRODUCER: TMA of K_n, V_n once per unit (kv_full); per step TMA of Q_m, dO_m and bulk
//             copies of lse_log2_m, dsum_m into a 2-stage ring (q_full / q_empty mbarriers). In
//             the unmasked kernels K_n, V_n and the first step's stage as soon as the first math
//             thread hands it the fetched unit (unit_fetched; scheduler.cuh kKVFirst), under the
//             math's copy of the unit's tables.
//     warps 1-2  dQ WRITERS (warp 1 only in the masked kernels but the window/lengths one at
//             head_dim 128, Traits::kdQWriters): writer w = warp - 1 takes the steps s of a
//             unit with s % 2 == w (with kdQInStage, those in Q/dO stage w), in visit order:
//             waits for tile m's ticket, takes each math
//             warpgroup's half of the step's dQ partial from shared memory (that warpgroup's dQFull
//             barrier), reduce-adds it into dq_accum with a bulk asynchronous reduction (ticket 0
//             with dq_first_store: stores it with a bulk copy, dq_accum being unzeroed), frees the
//             half once it has been read (the warpgroup's dQEmpty barrier), waits for both
//             reductions to complete in global memory, then releases the ticket: while one
//             writer waits for its reductions and releases, the other takes the next step. Step s
//             uses buffer s % kdQStages (two at head_dim 64).
//             With kdQInStage (head_dim 256) the partial lies in the step's own Q/dO stage and
//             the writer, once it has read it, frees the stage for the producer (q_empty).
//     warp 3 (and warp 2 with one writer)  exits.
//   warpgroups 1-2 ("math", registers raised to kMathRegisters): only wgmma, softmax and dS; each
//             owns 64 KV rows and keeps dK, dV in registers; writes dK, dV at the end of a unit
//             (without GQA, 16-bit: into K's and V's tiles and out with two TMA stores).
//
// A unit's visit order and tickets come from the unit tables that bwd_preprocess_kernel fills once
// per call (one row per KV tile, the same for every head): the math copies the unit's row into
// shared memory at its start. The masked instantiation builds its own where rows have lengths or
// segment ids (visible_unit_tables) or where the workspace has no tables (params.h unit_tables).
// A unit is one KV tile of one item (a symmetric_shift item has two). Units are fetched by the
// first math thread, in increasing global item order, only after every role has finished the
// previous unit (the writer's last ticket release and the math epilogue included): one item per CTA
// at a time, so the deadlock argument of cuda/schedule.h applies. Inside a CTA every wait points to an earlier step of the same unit.
//
// dq_accum is kept in "fragment order": the (Bm, d) tile of Q tile m is stored as the dQ
// accumulator registers of the 256 math threads, one contiguous half per math warpgroup, 16-byte
// chunk k of thread t at float4 index k * 128 + t % 128 of its half (Traits::dq_chunk). A bulk
// reduction then adds one contiguous block per warpgroup and step, and the smem stores are
// conflict-free; bwd_postprocess_dq_fragment_kernel maps it back to rows and columns.
//
// dV += P^T dO and dK += dS^T Q take their A operand from registers (stage S3: the 16-bit P^T and
// dS^T in the S^T/dP^T accumulator layout, which is the layout of a register A fragment), so P^T
// never goes through shared memory; dS^T still does, for dQ. Issue order dV (before the math
// barrier), dQ, dK. (The variant with every product from shared memory, "ws", was 4-21% slower and
// is deleted: maintainers/perf-notes.md.)
//
// Bits: every dq_accum element receives one fp32 add per contribution in ticket order; P is
// computed as ex2.approx.ftz(fma(S, scale*log2e, -lse*log2e)) (one rounding fewer than the first,
// "classic" kernel, deleted on 2026-11-26, whose gradients were another bits version).
//
// The roles live in files of their own (cuda/sm90/bwd/), in the manner of FlashAttention-3's
// hopper/ directory, and the kernel is a composition of role types: BwdWsKernel<Mainloop, Epilogue,
// Scheduler> only initialises the barriers, moves registers between the warpgroups and dispatches
// the roles; bwd_main_ws_kernel is the __global__ over such a type, and the launch picks the three
// types (BwdWsKernelFor):
//   traits.cuh         tile shapes, MMA types, shared storage, TMA descriptors, WsParams
//   scheduler.cuh      work units: the math's in-order fetch, the others' hand-off (UnitScheduler)
//   unit_tables.cuh    a unit's visit order and tickets with hidden steps left out (kMask)
//   pipeline.cuh       stage index and barrier phase of the rings (PipelineState)
//   producer.cuh       the producer warp (TMA loads; WsProducer)
//   dq_writer.cuh      the dQ writer warp (WsDqWriter) and Q tile m's ticket (DqTicket)
//   mainloop.cuh       the math warpgroups: the step loop of the five products (WsMainloop, which
//                      names its producer and writer)
//   epilogue.cuh       the dK/dV epilogue policies (EpilogueTma, EpilogueStagedF32,
//                      EpilogueDirect) and the choice among them (DkDvEpilogue)
//   gemm.cuh           the wgmma chains (operands from shared memory or A from registers)
//   trace.cuh          the opt-in per-role wait trace (compiled out of head_dim 128's unmasked
//                      kernel of the calls without one: traits.cuh kTraced)
// (the named-barrier ids of both directions are in cuda/sm90/named_barrier.cuh)
// and, beside them, preprocess.cuh,
// postprocess.cuh and launch.cu (the host side: workspace, launches, kernel choice).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/bwd/epilogue.cuh"
#include "cuda/sm90/bwd/mainloop.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/trace.cuh"
#include "cuda/sm90/bwd/traits.cuh"
#include "cuda/sm90/named_barrier.cuh"

namespace jax_dash::sm90::bwd {

using namespace cute;

template <class Mainloop_, class Epilogue_, class Scheduler_>
struct BwdWsKernel {
  using Mainloop = Mainloop_;
  using Epilogue = Epilogue_;
  using Scheduler = Scheduler_;
  using Traits = typename Mainloop::Traits;
  using Params = WsParams<Traits>;
  using Producer = typename Mainloop::Producer;
  using DqWriter = typename Mainloop::DqWriter;
  static constexpr int kThreads = Traits::kThreads;

  // One CTA: smem_raw is the dynamic shared memory (Traits::smem_bytes: SharedStorage, then the
  // unit's visit order and tickets, num_q_tiles entries each).
  __device__ __forceinline__ void operator()(const Params& P, char* smem_raw) const {
    using SharedStorage = typename Traits::SharedStorage;
    // Align by offsetting smem_raw itself (not through an integer round trip) so that derived
    // pointers stay in the shared window and the compiler keeps shared-memory loads and stores.
    const uint32_t smem_base = cute::cast_smem_ptr_to_uint(smem_raw);
    const uint32_t smem_pad =
        (Traits::kSmemAlign - smem_base % Traits::kSmemAlign) % Traits::kSmemAlign;
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw + smem_pad);
    int32_t* visit_m = reinterpret_cast<int32_t*>(&smem + 1);
    int32_t* visit_ticket = visit_m + P.sp.num_q_tiles;

    const int warp = cutlass::canonical_warp_idx_sync();
    if (threadIdx.x == 0) {
      for (int i = 0; i < kWsTraceSlots; ++i) smem.trace[i] = 0;
      cutlass::arch::ClusterTransactionBarrier::init(&smem.kv_full, 1);
      cutlass::arch::ClusterBarrier::init(&smem.unit_fetched, 1);
      for (int s = 0; s < Traits::kStages; ++s) {
        cutlass::arch::ClusterTransactionBarrier::init(&smem.q_full[s], 1);
        // kdQInStage: the writer frees a stage (one arrival), else every math warp.
        cutlass::arch::ClusterBarrier::init(&smem.q_empty[s],
                                            Traits::kdQInStage ? 1 : Traits::kMathWarps);
      }
      cutlass::arch::fence_barrier_init();
    }
    if (warp == 0 && cute::elect_one_sync()) {
      cute::prefetch_tma_descriptor(P.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(P.tma_do.get_tma_descriptor());
      cute::prefetch_tma_descriptor(P.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(P.tma_v.get_tma_descriptor());
      if (tma_dkv_epilogue(P.p)) {
        cute::prefetch_tma_descriptor(P.tma_dk.get_tma_descriptor());
        cute::prefetch_tma_descriptor(P.tma_dv.get_tma_descriptor());
      }
    }
    __syncthreads();  // the only CTA-wide barrier: barriers initialised

    if (warp < 4) {
      warpgroup_registers_decrease<Traits::kServiceRegisters>();
      if (warp == 0) Producer::template run<Scheduler>(P, smem, visit_m);
      else if (warp <= Traits::kdQWriters) {
        DqWriter::template run<Scheduler>(P, smem, visit_m, visit_ticket, warp - 1);
      }
    } else {
      warpgroup_registers_increase<Traits::kMathRegisters>();
      Mainloop::template run<Epilogue, Scheduler>(P, smem, visit_m, visit_ticket);
    }
    if (Traits::kTraced && P.trace != nullptr) {
      // Each role's representative thread wrote only its own slots, and every role has passed the
      // last unit barrier; the math warpgroups (the last to finish) publish the counters.
      if (warp >= 4) {
        named_barrier_sync(kMathBarrier, Traits::kMathThreads);
        if (threadIdx.x == 128) {
          for (int i = 0; i < kWsTraceSlots; ++i)
            P.trace[static_cast<int64_t>(blockIdx.x) * kWsTraceSlots + i] = smem.trace[i];
        }
      }
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    bwd_main_ws_kernel(const __grid_constant__ typename Kernel::Params P) {
  extern __shared__ char smem_raw[];
  Kernel{}(P, smem_raw);
}

// The kernel of one WsTraits instantiation: the dK/dV epilogue is chosen per call among the
// policies (DkDvEpilogue: one kernel serves every GQA ratio and gradient dtype).
template <class Traits>
using BwdWsKernelFor =
    BwdWsKernel<WsMainloop<Traits>, DkDvEpilogue<Traits>, UnitScheduler<Traits>>;

}  // namespace jax_dash::sm90::bwd
