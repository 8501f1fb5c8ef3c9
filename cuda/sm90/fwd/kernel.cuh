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
// The kernel is a composition of role types, in the manner of FlashAttention-3's hopper/ kernels:
// FwdKernel<Mainloop, Epilogue, Scheduler> only sets up the barriers, moves registers between
// warpgroups and dispatches the roles, each in its own file: the mainloop (FwdMainloop,
// mainloop.cuh: the math warpgroups' tile loop, which names its producer, FwdProducer in
// producer.cuh, its KV ranges, FwdKvRange in tile.cuh, and with kDropout the keep mask, FwdDropout
// in dropout.cuh), the epilogue policy (epilogue.cuh), the tile scheduler (scheduler.cuh). The launch (launch.cu) picks the three types per instantiation
// (FwdKernelFor); fwd_kernel is the __global__ over such a type. traits.cuh holds the shapes, the
// shared storage and the parameters, pipeline.cuh the ring's stage and phase, and
// cuda/sm90/named_barrier.cuh the barrier ids of both directions.
#pragma once

#include <cuda_runtime.h>

#include <cute/arch/cluster_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/fwd/epilogue.cuh"
#include "cuda/sm90/fwd/mainloop.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/fwd/tile.cuh"
#include "cuda/sm90/fwd/traits.cuh"

namespace jax_dash::sm90::fwd {

template <class Mainloop_, class Epilogue_, class Scheduler_>
struct FwdKernel {
  using Mainloop = Mainloop_;
  using Epilogue = Epilogue_;
  using Scheduler = Scheduler_;
  using Traits = typename Mainloop::Traits;
  using Params = typename Mainloop::Params;  // FwdKernelParams, or with dropout's operands
  using Producer = typename Mainloop::Producer;
  using KvRange = typename Mainloop::KvRange;
  // The persistent mainloop and producer carry their pipelines across the scheduler's tiles.
  static_assert(Scheduler::kPersistent == Mainloop::kPersistent);
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kSmemBytes = Traits::kSmemBytes;

  // One CTA: smem_raw is the dynamic shared memory (kSmemBytes, SharedStorage plus its alignment).
  __device__ __forceinline__ void operator()(const Params& p, char* smem_raw) const {
    using Barrier = cutlass::arch::ClusterTransactionBarrier;
    // Aligned by offsetting smem_raw itself (as the backward does) rather than through an integer.
    // (This alone did not make the epilogue's stores to the O slices STS: st_shared_u32 does.)
    const uint32_t smem_base = cute::cast_smem_ptr_to_uint(smem_raw);
    auto& smem = *reinterpret_cast<typename Traits::SharedStorage*>(
        smem_raw + (1024 - smem_base % 1024) % 1024);

    const Scheduler scheduler(p);
    const KvRange kv_range(p);

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
      if constexpr (Mainloop::kPersistent) {
        cutlass::arch::ClusterBarrier::init(&smem.q_empty, Traits::kMathWarps);
        for (int e = 0; e < kTileSlots; ++e) {
          cutlass::arch::ClusterBarrier::init(&smem.slot_full[e], 1);
          cutlass::arch::ClusterBarrier::init(&smem.slot_empty[e], Traits::kMathWarps);
        }
      }
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();  // the only CTA-wide barrier

    if (threadIdx.x < kThreadsPerWarpgroup) {
      // Producer warpgroup: every TMA load (fwd/producer.cuh).
      warpgroup_registers_decrease<Traits::kProducerRegisters>();
      Producer::run(p, smem, scheduler, kv_range, sQ, sK, sV);
      return;
    }
    warpgroup_registers_increase<Traits::kMathRegisters>();
    Mainloop::template run<Epilogue>(p, smem, scheduler, kv_range, sQ, sK, sVt);
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1)
    fwd_kernel(const __grid_constant__ typename Kernel::Params p) {
  extern __shared__ char smem_raw[];
  Kernel{}(p, smem_raw);
}

// The kernel of one instantiation: kMask, kSegments (fwd/mainloop.cuh); kPersistent
// (JAX_DASH_SM90_FWD=ws-persistent; stage F4): one CTA per SM takes query tiles blockIdx.x,
// blockIdx.x + gridDim.x, ... (heaviest first, as the one-tile grid orders them; scheduler.cuh);
// kNarrow: the unmasked kernel with kNarrowRows' 128-row query tiles (head_dim 64, whose tile
// table says 192): JAX_DASH_SM90_FWD=ws-persistent-narrow. A row's arithmetic does not depend on
// the query tile: the same bits. kDropout: attention dropout (fwd/dropout.cuh; one-tile kernels
// only). The epilogue policy is the traits' (kTmaStoreO).
template <class Traits, bool kMask, bool kPersistent, bool kSegments, bool kDropout>
using FwdKernelWith = FwdKernel<FwdMainloop<Traits, kMask, kPersistent, kSegments, kDropout>,
                                FwdEpilogue<Traits>,
                                FwdScheduler<kPersistent, FwdKernelParams<Traits>>>;
template <class Element, int kHeadDim, bool kMask, bool kPersistent = false,
          bool kSegments = false, bool kNarrow = false, bool kDropout = false>
using FwdKernelFor =
    FwdKernelWith<FwdKernelTraits<Element, kHeadDim, kMask || kNarrow, kPersistent>, kMask,
                  kPersistent, kSegments, kDropout>;

}  // namespace jax_dash::sm90::fwd
