// Hopper (sm_90a) attention forward: out = softmax(scale * Q K^T) V and lse, per (batch, head).
//
// One CTA computes one query tile of one (batch, head), 128 rows (192 at head_dim 64; tiles.h) with
// one consumer warpgroup per 64 rows. K/V tiles stream through a 2-stage shared-memory ring filled
// by TMA (one elected thread issues the copies; mbarriers carry the byte counts). S = Q K^T is a
// wgmma with both operands in shared memory; the online softmax runs on the accumulator registers;
// P is converted to 16 bits in registers and O += P V is a wgmma with A from registers. Each
// warpgroup pipelines its loop: S of the next KV tile is issued together with P V of the current
// one, so the tensor cores work while the softmax runs. KV tiles are visited last to first so the
// tiles that need element-wise masks (causal diagonal, partial last tile) come first and the rest
// run mask-free.
//
// Warp-specialized (stages F1 + F2 of the kernel plan, not in this repository): a third
// warpgroup, registers lowered to 24, issues every TMA load; each K/V stage has an "empty" mbarrier
// that each math warp arrives on once its wgmma has read the stage (K_j after S_j, V_j after
// P_j V_j), so no CTA-wide barrier runs in the loop; and the math warpgroups (registers raised to
// 240 with two, 160 with three) take turns issuing their wgmmas (one named barrier per warpgroup,
// "ping-pong" with two), so one warpgroup's softmax runs while the others' wgmmas use the tensor
// cores. (The first kernel, without a producer warpgroup, "classic", took 12-19% longer at 8k-16k
// tokens on an H100 on 2026-11-23 and is deleted: maintainers/perf-notes.md.)
//
// The kernel only sets up the barriers, moves registers between warpgroups and dispatches the
// roles, each in its own file: FwdProducer (producer.cuh) and FwdMainloop (mainloop.cuh, which
// ends each tile with FwdEpilogue, epilogue.cuh), over the tiles of FwdScheduler (scheduler.cuh)
// and the KV ranges of FwdKvRange (tile.cuh); traits.cuh holds the shapes, the shared storage and
// the parameters, pipeline.cuh the ring's stage and phase, named_barrier.cuh the barrier ids.
#pragma once

#include <cuda_runtime.h>

#include <cute/arch/cluster_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/fwd/mainloop.cuh"
#include "cuda/sm90/fwd/producer.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/fwd/tile.cuh"
#include "cuda/sm90/fwd/traits.cuh"

namespace jax_dash::sm90::fwd {

// kMask: the instantiation that carries the mask policy beyond causal and seq_kv (window, lengths,
// segment ids, soft cap); calls without them run the kMask = false kernel, compiled as before.
// kSegments (kMask only): the call has segment ids; its KV ranges are narrowed by segment-id
// ranges and its tiles tested on them. Masked calls without segment ids run kSegments = false,
// which has none of that code (it cost the window point 6-9% of its forward when it was there).
// kPersistent (JAX_DASH_SM90_FWD=ws-persistent; stage F4): one CTA per SM takes query
// tiles blockIdx.x, blockIdx.x + gridDim.x, ... (heaviest first, as the one-tile grid orders them);
// the K/V stage ring and Q's barrier run on across tiles, and the math warps release Q (q_empty)
// after a tile's last S = Q K^T, so the producer loads the next tile's Q and first K/V while the
// math finishes the tile (last P V, normalisation, epilogue stores). Per tile the arithmetic is
// the one-tile kernel's: the same bits.
// kNarrow: the unmasked kernel with kNarrowRows' 128-row query tiles (head_dim 64, whose tile
// table says 192): JAX_DASH_SM90_FWD=ws-persistent-narrow. A row's arithmetic does not depend on
// the query tile: the same bits.
template <class Element, int kHeadDim, bool kMask, bool kPersistent = false,
          bool kSegments = false, bool kNarrow = false>
__global__ void __launch_bounds__(
    FwdKernelTraits<Element, kHeadDim, kMask || kNarrow, kPersistent>::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdKernelParams<
               FwdKernelTraits<Element, kHeadDim, kMask || kNarrow, kPersistent>> p) {
  static_assert(!kPersistent || !kMask, "the persistent loop is written for the unmasked kernel");
  static_assert(!kSegments || kMask, "segment ids are part of the mask policy");
  using Traits = FwdKernelTraits<Element, kHeadDim, kMask || kNarrow, kPersistent>;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;

  extern __shared__ char smem_raw[];
  // Aligned by offsetting smem_raw itself (as the backward does) rather than through an integer.
  // (This alone did not make the epilogue's stores to the O slices STS: st_shared_u32 does.)
  const uint32_t smem_base = cute::cast_smem_ptr_to_uint(smem_raw);
  auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(
      smem_raw + (1024 - smem_base % 1024) % 1024);

  const FwdScheduler<kPersistent, FwdKernelParams<Traits>> scheduler(p);
  const FwdKvRange<Traits, kMask, kSegments> kv_range(p);

  // Q (BLK_M,D); K and V (BLK_N,D,STAGES); V seen as (D,BLK_N,STAGES) for P V.
  Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});

  const bool is_leader = threadIdx.x == 0;
  if (is_leader) {
    Barrier::init(&smem.bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      Barrier::init(&smem.bar_k[s], 1);
      Barrier::init(&smem.bar_v[s], 1);
      cutlass::arch::ClusterBarrier::init(&smem.k_empty[s], Traits::kMathWarps);
      cutlass::arch::ClusterBarrier::init(&smem.v_empty[s], Traits::kMathWarps);
    }
    if constexpr (kPersistent) {
      cutlass::arch::ClusterBarrier::init(&smem.q_empty, Traits::kMathWarps);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();  // the only CTA-wide barrier

  if (threadIdx.x < kThreadsPerWarpgroup) {
    // Producer warpgroup: every TMA load (fwd/producer.cuh).
    warpgroup_registers_decrease<Traits::kProducerRegisters>();
    FwdProducer<Traits, kPersistent, kSegments>::run(p, smem, scheduler, kv_range, sQ, sK, sV);
    return;
  }
  warpgroup_registers_increase<Traits::kMathRegisters>();
  FwdMainloop<Traits, kMask, kPersistent, kSegments>::run(p, smem, scheduler, kv_range, sQ, sK,
                                                          sVt);
}

}  // namespace jax_dash::sm90::fwd
