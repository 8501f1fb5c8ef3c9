// The math warpgroups of the sm90 warp-specialized backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/bwd/dq_writer.cuh"
#include "cuda/sm90/bwd/dropout.cuh"
#include "cuda/sm90/bwd/epilogue.cuh"
#include "cuda/sm90/bwd/gemm.cuh"
#include "cuda/sm90/bwd/pipeline.cuh"
#include "cuda/sm90/bwd/preprocess.cuh"  // kLog2e
#include "cuda/sm90/bwd/producer.cuh"
#include "cuda/sm90/bwd/scheduler.cuh"
#include "cuda/sm90/bwd/trace.cuh"
#include "cuda/sm90/bwd/traits.cuh"
#include "cuda/sm90/bwd/unit_tables.cuh"
#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/named_barrier.cuh"
#include "cuda/sm90/softmax.cuh"  // exp2_ftz

namespace jax_dash::sm90::bwd {

using namespace cute;

// Every value of a dQ partial as zero_plus(x): what it must be when it is stored as a Q tile's
// first contribution (WsParams::dq_first_store) instead of added into a zero.
template <class Frag>
__device__ __forceinline__ void zero_plus_all(Frag& f) {
  CUTE_UNROLL
  for (int i = 0; i < size(f); ++i) f(i) = zero_plus(f(i));
}

// The per-query values (lse, dsum) of a thread's S^T fragment columns, read in pairs: elements
// 2i and 2i+1 of the accumulator are adjacent q columns (value mode (2, 2, Bm/8) of the wgmma C
// layout, the first column even), so one 64-bit shared-memory load serves both. The scalar reads
// they replace were 32 loads a step.
template <int kN, class Coords>
__device__ __forceinline__ void load_column_pairs(const float* values, const Coords& tScS,
                                                  float (&out)[kN]) {
  CUTE_UNROLL
  for (int i = 0; i < kN; i += 2) {
    const float2 v = *reinterpret_cast<const float2*>(values + get<1>(tScS(i)));
    out[i] = v.x;
    out[i + 1] = v.y;
  }
}

// ---- math warpgroups ----------------------------------------------------------------------------
// The math warpgroups' unit loop: fetch a unit from the Scheduler (UnitScheduler), write its visit
// order and tickets to shared memory (visit_m, visit_ticket), run its steps, and end it with the
// Epilogue's dK/dV store (DkDvEpilogue). The mainloop names the roles that feed it: the producer
// (TMA loads of the steps' tiles) and the dQ writers (dQ partials into dq_accum in ticket order).
template <class Traits_>
struct WsMainloop {
  using Traits = Traits_;
  using Producer = WsProducer<Traits>;
  using DqWriter = WsDqWriter<Traits>;
  template <class Epilogue, class Scheduler, class Storage>
  __device__ __forceinline__ static void run(const WsParams<Traits>& P, Storage& smem,
                                             int32_t* visit_m, int32_t* visit_ticket);
};

template <class Traits_>
template <class Epilogue, class Scheduler, class Storage>
__device__ __forceinline__ void WsMainloop<Traits_>::run(const WsParams<Traits>& P,
                                                        Storage& smem, int32_t* visit_m,
                                                        int32_t* visit_ticket) {
  using Element = typename Traits::Element;
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kMathThreads = Traits::kMathThreads;
  const AttentionParams& p = P.p;
  const ScheduleProblem& sp = P.sp;
  const int tid = threadIdx.x - 128;  // 0..255 within the math warpgroups
  const bool deterministic = sp.schedule != Schedule::kAtomic;
  const float scale = *p.scale_ptr;  // read once: a device pointer (AttentionParams)
  const float scale_log2 = scale * kLog2e;
  // The mask beyond causal and seq_kv (cuda/mask.h; issue 13, first run on an H100 2026-11-23):
  // a window, lengths or segment ids. The items, visits and tickets already
  // follow the band (make_schedule_problem); lengths and segments only hide elements.
  const bool ext_mask = Traits::kMask && has_mask_policy(p);
  // Lengths or segment ids can hide whole tile pairs of the band: those steps are left out.
  const bool drop_hidden = Traits::kMask && (p.q_seq_lengths != nullptr ||
                                             p.kv_seq_lengths != nullptr ||
                                             p.q_segment_ids != nullptr);
  const float soft_cap = Traits::kAllMasks ? p.logits_soft_cap : 0.f;
  const float scale_over_cap = soft_cap > 0.f ? scale / soft_cap : 0.f;
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                     p.num_kv_heads, p.head_dim);
  int32_t* item_counter = p.workspace_i32 + ws.item_counter;
  // The unit tables (bwd_preprocess_kernel's, read-only here).
  const int32_t* unit_steps = p.workspace_i32 + ws.unit_steps;
  const int32_t* unit_visit = p.workspace_i32 + ws.unit_visit;
  const int32_t* unit_ticket = p.workspace_i32 + ws.unit_ticket;
  const SegmentRange* tile_segments =
      reinterpret_cast<const SegmentRange*>(p.workspace_i32 + ws.tile_segments);

  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKV{});   // (Bn, d)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutKV{});   // (Bn, d)
  Tensor sKt = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKt{});  // (d, Bn)

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  // kSplitD: each warpgroup computes the whole S^T / dP^T tile as its own 128 threads.
  auto thr_sdp = mma_sdp.get_thread_slice(tid % Traits::kSdPThreads);
  const bool first_warpgroup = tid < 128;
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  // The wgmma operands from shared memory (descriptors) depend on the warpgroup only: they are
  // partitioned by slices of the warpgroup's first thread, whose index the compiler knows to be
  // warp-uniform (a shuffle of lane 0's value). Sliced by tid instead, every descriptor was built
  // in per-thread registers, kept across the unit (stack slots) and moved to uniform registers
  // before each wgmma: ~70 instructions a step of 616 (the seventeenth session's ncu against FA3).
  const int warpgroup = __shfl_sync(0xffffffffu, tid / 128, 0);
  auto wg_sdp = mma_sdp.get_thread_slice((warpgroup * 128) % Traits::kSdPThreads);
  auto wg_dkv = mma_dkv.get_thread_slice(warpgroup * 128);
  auto wg_dq = mma_dq.get_thread_slice(warpgroup * 128);
  // dS^T from the S^T/dP^T accumulators to shared memory (not kSplitD: see the step loop).
  auto smem_copy_dS = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto thr_copy_dS = smem_copy_dS.get_thread_slice(tid % Traits::kSdPThreads);

  // kSplitD: the two 64-column halves of this warpgroup's dQ (TiledMmadQHalf), B = K^T rows
  // [128 w + 64 h, +64) of the (d, Bn) view.
  typename Traits::TiledMmadQHalf mma_dq_half;
  auto wg_dq_half = mma_dq_half.get_thread_slice(0);
  const int dq_block0 = 2 * warpgroup;
  Tensor tdQrKt0 = wg_dq_half.partition_fragment_B(
      local_tile(sKt, Shape<_64, BlockN>{}, make_coord(dq_block0, _0{})));
  Tensor tdQrKt1 = wg_dq_half.partition_fragment_B(
      local_tile(sKt, Shape<_64, BlockN>{}, make_coord(dq_block0 + 1, _0{})));
  Tensor tSrK = wg_sdp.partition_fragment_A(sK);  // (MMA, MMA_M, MMA_K) descriptors
  Tensor tSrV = wg_sdp.partition_fragment_A(sV);
  Tensor tdQrKt = wg_dq.partition_fragment_B(sKt);

  Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});
  Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<BlockN, HeadDim>{});
  Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<BlockN, HeadDim>{});
  Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<BlockM, HeadDim>{});
  static_assert(decltype(size(tdQrdQ))::value == Traits::kdQFloatsPerThread);

  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<BlockN, BlockM>{}));
  Tensor tdKVc = thr_dkv.partition_C(make_identity_tensor(Shape<BlockN, HeadDim>{}));
  const WsTracer<Traits::kTraced> tracer{P.trace != nullptr && tid == 0 ? smem.trace : nullptr};
  const long long t_begin = tracer.start();

  // kLseFirst: see the step loop. kNextS: each step's S^T is issued by the step before, behind
  // its dK and before its dQ goes to the writer (the warps' ~600 cycles a step of dQ waits, stores
  // and fences left the tensor cores idle once dK was done; H100: hd128 causal 2.5-5% faster,
  // hd64 5%, same bits; maintainers/perf-notes.md, twenty-third session); a unit's first at the
  // unit's start. It waits for the next step's Q while this step's stage is still held, so
  // it needs two Q/dO stages (scripts/ws_protocol_model.py, next_s). Also in the window/lengths
  // kernel at head_dim 128 (Traits::kBandStep).
  constexpr bool kLseFirst = Traits::kHeadDim == 128 && !Traits::kMask && !Traits::kDropout;
  constexpr bool kNextS =
      (!Traits::kMask && !Traits::kDropout && !Traits::kSplitD) || Traits::kBandStep;
  static_assert(!kNextS || Traits::kStages == 2, "kNextS: the next step's Q is in the other stage");
  Scheduler scheduler{P};
  PipelineState<Traits::kStages> q_pipe;  // the Q/dO ring (and the dS^T buffers: its count)
  // K/V's one buffer: its phase is the parity of the loads waited for. Kept a count: as a
  // PipelineState<1> it moved the two counters' registers (unmasked) or stack slots (masked).
  int kv_loads = 0;
  while (true) {
    const long long t_unit = tracer.start();
    scheduler.fetch_next(smem, item_counter, tid);
    tracer.stop(kTraceMathFetch, t_unit);
    const long long t_tables = tracer.start();
    const bool done = scheduler.done();
    WsUnit u{};
    int num_steps = 0;
    if (!done) {
      u = scheduler.unit();
      // Visit order and tickets of this unit go to shared memory: the producer, the writer and
      // the math read them at every step.
      if (drop_hidden) {
        num_steps = visible_unit_tables<kBlockM, kBlockN, kMathThreads>(
            p, sp, u, tid, deterministic, tile_segments, visit_m, visit_ticket,
            &smem.unit_num_steps);
      } else if (Traits::kMask && !ws.unit_tables) {
        // No unit tables in the workspace (a long sequence over few heads): this unit's, from
        // cuda/schedule.h (only the masked instantiation runs without them: bwd/launch.cu).
        num_steps = q_visit_count(sp, u.head_linear, u.n);
        for (int s = tid; s < num_steps; s += kMathThreads) {
          const int visit = q_visit_tile(sp, u.head_linear, u.n, s);
          visit_m[s] = visit;
          visit_ticket[s] = deterministic ? dq_ticket(sp, u.head_linear, visit, u.n) : 0;
        }
        if (tid == 0) smem.unit_num_steps = num_steps;
      } else {
        // The row of KV tile n of the unit tables (the same for every head), copied whole: the
        // loads do not wait for the step count (entries past it are never read).
        const int64_t row = static_cast<int64_t>(u.n) * sp.num_q_tiles;
        num_steps = __ldg(unit_steps + u.n);
        for (int s = tid; s < sp.num_q_tiles; s += kMathThreads) {
          visit_m[s] = __ldg(unit_visit + row + s);
          visit_ticket[s] = __ldg(unit_ticket + row + s);
        }
        if (tid == 0) smem.unit_num_steps = num_steps;
      }
    }
    tracer.stop(kTraceMathTables, t_tables);
    const long long t_publish = tracer.start();
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);  // publish unit and tables
    tracer.stop(kTraceMathPublish, t_publish);
    if (done) break;

    const int64_t b = u.head_linear / p.num_heads;
    const int h = u.head_linear % p.num_heads;
    const int64_t kv0 = static_cast<int64_t>(u.n) * kBlockN;
    // This batch row's whole mask (ext_mask only), in 32-bit limits (CompactMask says why).
    CompactMask policy{};
    if (ext_mask) policy = CompactMask::make(mask_policy(p, b));
    // kDropout: the unit's coordinates for the keep mask (bwd/dropout.cuh).
    [[maybe_unused]] const auto dropout = load_bwd_dropout<Traits::kDropout>(p, b, h, kv0);
    // Whether query q_row does not see key kv_row: the whole policy (ext_mask), else the
    // extents and causal.
    auto hidden = [&](int64_t kv_row, int64_t q_row) JAX_DASH_INLINE {
      return ext_mask
                 ? !policy.visible(static_cast<int32_t>(q_row), static_cast<int32_t>(kv_row))
                 : kv_row >= p.seq_kv || (p.is_causal && kv_row > q_row);
    };
    clear(tdKrdK);
    clear(tdVrdV);
    // S^T's accumulator (kNextS: in flight from one step into the next, never into the next unit).
    Tensor tSrS = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});  // (MMA, MMA_M, MMA_N)
    // kNextS: S^T of the step that takes Q/dO stage use `use`, once that stage is loaded.
    auto issue_s = [&](const PipelineState<Traits::kStages>& use) JAX_DASH_INLINE {
      const long long t_q = tracer.start();
      cutlass::arch::ClusterTransactionBarrier::wait(&smem.q_full[use.index()], use.phase());
      tracer.stop(kTraceMathWaitQ, t_q);
      Tensor sQ = make_tensor(make_smem_ptr(smem.q[use.index()]), typename Traits::SmemLayoutQ{});
      gemm_ss<true>(mma_sdp, tSrK, wg_sdp.partition_fragment_B(sQ), tSrS);
    };
    if (num_steps > 0) {
      const long long t0 = tracer.start();
      cutlass::arch::ClusterTransactionBarrier::wait(&smem.kv_full, kv_loads & 1);
      tracer.stop(kTraceMathWaitKV, t0);
      ++kv_loads;
      tracer.add(kTraceMathSteps, num_steps);
      if constexpr (kNextS) {
        // The unit's first S^T, after dK and dV are zeroed (left to the compiler, the zeroing
        // moved past the issue, and ptxas serialized every wgmma of the kernel).
        warpgroup_fence_operand(tdKrdK);
        warpgroup_fence_operand(tdVrdV);
        issue_s(q_pipe);
      }
    }
    tracer.stop(kTraceMathUnitStart, t_unit);
    tracer.add(kTraceMathUnits, 1);

    for (int step = 0; step < num_steps; ++step, q_pipe.advance()) {
      const int stage = q_pipe.index();
      const int ds_stage = Traits::kdSStages == 1 ? 0 : q_pipe.count % Traits::kdSStages;
      const int m = visit_m[step];
      // This step's partial is stored, not added (WsParams::dq_first_store): as zero_plus(x).
      const bool dq_first = P.dq_first_store && visit_ticket[step] == 0;
      if constexpr (!kNextS) {
        const long long t_q = tracer.start();
        cutlass::arch::ClusterTransactionBarrier::wait(&smem.q_full[stage], q_pipe.phase());
        tracer.stop(kTraceMathWaitQ, t_q);
      }

      Tensor sQ = make_tensor(make_smem_ptr(smem.q[stage]), typename Traits::SmemLayoutQ{});
      Tensor sdO = make_tensor(make_smem_ptr(smem.dout[stage]), typename Traits::SmemLayoutQ{});
      Tensor sQt = make_tensor(make_smem_ptr(smem.q[stage]), typename Traits::SmemLayoutQt{});
      Tensor sdOt = make_tensor(make_smem_ptr(smem.dout[stage]), typename Traits::SmemLayoutQt{});
      Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);
      Tensor tSrdO = wg_sdp.partition_fragment_B(sdO);
      const float* s_lse = smem.lse_log2[stage];
      const float* s_dsum = smem.dsum[stage];
      constexpr int kFrag = decltype(size(tSrS))::value;
      // kEarlyStats (head_dim >= 128; at 64, 32 values each, not 16, the registers held add
      // spills): lse and dsum are read before the waits for S^T and dP^T, their shared-memory
      // latency under the wgmmas (read after the waits, they stalled the loops' first
      // instructions). kLseFirst: lse even before the two wgmmas are issued. Read after their
      // issue, its loads queued behind the wgmmas' shared-memory operand reads (both SS: ~128 KB
      // a step for the two warpgroups) and came back only after dP^T's operands were read: the
      // exp loop's first FFMAs waited ~500 cycles a step on them (ncu, hd128 causal 2 x 8k;
      // twenty-second session, call 3), where S^T alone was done long before: 2-3% faster at
      // head_dim 128 (call 4). Not with dropout, whose keep bits are drawn during the issue (its
      // step loop then spilled more), and not at head_dim 256 or in the masked kernels, where
      // call 4 timed it 0.7% slower. (With kNextS, S^T is already in flight from the step before:
      // lse's loads come before dP^T's issue and the wait for S^T.)
      constexpr bool kEarlyStats = Traits::kHeadDim >= 128;
      float lse[kFrag];
      if constexpr (kLseFirst) load_column_pairs(s_lse, tScS, lse);
      if constexpr (kNextS) {
        // S^T was issued before the previous step's dQ hand-off (or at the unit's start), and is
        // waited for here, before dP^T's issue: waited for after it (below), ptxas cannot tell
        // which wgmma the wait retires across the loop and serializes them all.
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
      } else {
        gemm_ss<true>(mma_sdp, tSrK, tSrQ, tSrS);
      }
      gemm_ss<true>(mma_sdp, tSrV, tSrdO, tSrdP);

      const int64_t q0 = static_cast<int64_t>(m) * kBlockM;
      // kDropout: the step's keep bits, drawn while the two wgmmas run (they read no register
      // the Philox rounds write). keep(i): element i is kept; z_dp(i, x) is dP -> dP * Z.
      [[maybe_unused]] const auto keep = [&]() JAX_DASH_INLINE {
        if constexpr (Traits::kDropout) {
          return dropout.template keep_bits<kFrag>(tScS, q0);
        } else {
          return NoBwdDropout{};
        }
      }();
      auto z_dp = [&](int i, float dp) JAX_DASH_INLINE {
        if constexpr (Traits::kDropout) {
          return keep(i) ? dp * dropout.keep_scale : 0.f;
        } else {
          return dp;
        }
      };
      // Masks only where a tile crosses seq_kv or the causal diagonal (rows past seq_q have
      // lse_log2 = +inf, so their P is already 0).
      const bool need_mask =
          ext_mask ? policy.tile_needs_mask(q0, kBlockM, kv0, kBlockN)
                   : kv0 + kBlockN > p.seq_kv || (p.is_causal && kv0 + kBlockN - 1 > q0);
      if (Traits::kAllMasks && soft_cap > 0.f) {
        // logits = cap * tanh(scale * s / cap): P from the capped logit, and dS takes the
        // derivative 1 - tanh^2 (the scale itself is applied to dQ and dK at the end, as always).
        // One pass after both wgmmas, so that tanh is not kept across the wait.
        const float cap_log2 = soft_cap * kLog2e;
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        warpgroup_fence_operand(tSrdP);
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); ++i) {
          const int c = get<1>(tScS(i));
          const float t = tanhf(tSrS(i) * scale_over_cap);
          float prob = exp2_ftz(fmaf(t, cap_log2, -s_lse[c]));
          prob = need_mask && hidden(kv0 + get<0>(tScS(i)), q0 + c) ? 0.f : prob;
          tSrS(i) = prob;
          tSrdP(i) = prob * (z_dp(i, tSrdP(i)) - s_dsum[c]) * (1.f - t * t);
        }
      } else {
        float dsum[kFrag];
        if constexpr (kEarlyStats && !kLseFirst) load_column_pairs(s_lse, tScS, lse);
        warpgroup_wait<1>();
        warpgroup_fence_operand(tSrS);
        if constexpr (!kEarlyStats) load_column_pairs(s_lse, tScS, lse);
        // The mask test is per tile (need_mask), so the element loop has no branch in it: the
        // masked and the unmasked tile each get their own straight-line loop (the same
        // arithmetic).
        // (kSegments decided per tile: no branch in the element loop.)
        auto masked_probs = [&](auto segments) JAX_DASH_INLINE {
          constexpr bool kSegments = decltype(segments)::value;
          CUTE_UNROLL
          for (int i = 0; i < size(tSrS); ++i) {
            const float prob = exp2_ftz(fmaf(tSrS(i), scale_log2, -lse[i]));
            const bool visible = policy.template visible<kSegments>(
                static_cast<int32_t>(q0 + get<1>(tScS(i))),
                static_cast<int32_t>(kv0 + get<0>(tScS(i))));
            tSrS(i) = visible ? prob : 0.f;
          }
        };
        if (Traits::kAllMasks && need_mask && ext_mask && policy.has_segments()) {
          masked_probs(std::true_type{});
        } else if (need_mask && ext_mask) {
          masked_probs(std::false_type{});
        } else if (need_mask) {
          CUTE_UNROLL
          for (int i = 0; i < size(tSrS); ++i) {
            const int64_t kv_row = kv0 + get<0>(tScS(i));  // kv row
            const int64_t q_row = q0 + get<1>(tScS(i));    // q row
            const float prob = exp2_ftz(fmaf(tSrS(i), scale_log2, -lse[i]));
            const bool hidden = kv_row >= p.seq_kv || (p.is_causal && kv_row > q_row);
            tSrS(i) = hidden ? 0.f : prob;
          }
        } else {
          CUTE_UNROLL
          for (int i = 0; i < size(tSrS); ++i) {
            tSrS(i) = exp2_ftz(fmaf(tSrS(i), scale_log2, -lse[i]));
          }
        }
        if constexpr (kEarlyStats) load_column_pairs(s_dsum, tScS, dsum);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrdP);
        if constexpr (!kEarlyStats) load_column_pairs(s_dsum, tScS, dsum);
        CUTE_UNROLL
        for (int i = 0; i < size(tSrdP); ++i) {
          tSrdP(i) = tSrS(i) * (z_dp(i, tSrdP(i)) - dsum[i]);
        }
      }
      Tensor sdSt = make_tensor(make_smem_ptr(smem.dst[ds_stage]), typename Traits::SmemLayoutPt{});
      Tensor sdS = make_tensor(make_smem_ptr(smem.dst[ds_stage]), typename Traits::SmemLayoutdS{});
      Tensor tdQrdS = wg_dq.partition_fragment_A(sdS);
      Tensor tdVrdOt = wg_dkv.partition_fragment_B(sdOt);
      Tensor tdKrQt = wg_dkv.partition_fragment_B(sQt);
      // P^T and dS^T in 16 bits, in the accumulator's register order (kDropout: dV's P^T is the
      // dropped P * Z; dS^T took the undropped P above).
      Tensor rP = make_tensor<Element>(tSrS.layout());
      Tensor rdS = make_tensor<Element>(tSrdP.layout());
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        if constexpr (Traits::kDropout) {
          rP(i) = static_cast<Element>(keep(i) ? tSrS(i) * dropout.keep_scale : 0.f);
        } else {
          rP(i) = static_cast<Element>(tSrS(i));
        }
        rdS(i) = static_cast<Element>(tSrdP(i));
      }
      // The accumulator's value order (2, 2, Bm/8) is the register A fragment's
      // ((2, 2, 2), 1, Bm/16): only the layout changes (as for P in the forward).
      using RegA = Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockM / 16>>>;
      Tensor tdVrP = make_tensor(rP.data(), RegA{});
      Tensor tdKrdS = make_tensor(rdS.data(), RegA{});
      static_assert(decltype(size(tdVrP))::value == decltype(size(tSrS))::value);
      static_assert(decltype(size<1>(tSrS))::value == 1 && decltype(size<2>(tSrS))::value == 1,
                    "each thread must own one 64-row accumulator");
      // dV needs nothing from the other warpgroup: it is issued before the PdS barrier. With
      // stmatrix stores (head_dim <= 128) after the dS^T stores, whose latency then runs under
      // its issue instead of in the fence below (H100: 0.96-1.00x the time of dV first;
      // twenty-second session, call 1); otherwise (the 32-bit stores at head_dim 256, not
      // measured that way) and before a wait for the one dS^T buffer, first.
      constexpr bool kDvFirst = Traits::kSplitD || Traits::kdSStages == 1;
      if constexpr (kDvFirst) gemm_rs<false>(mma_dkv, tdVrP, tdVrdOt, tdVrdV);
      // With one dS^T buffer, the other warpgroup's dQ wgmma of the previous step may still read
      // it: wait until both warpgroups are past that step.
      if constexpr (Traits::kdSStages == 1) {
        const long long t_ds = tracer.start();
        named_barrier_sync(kMathBarrier, kMathThreads);
        tracer.stop(kTraceMathWaitPdS, t_ds);
      }
      if constexpr (Traits::kSplitD) {
        // Elements 2i, 2i+1 are adjacent q columns of one kv row: one 32-bit store per pair.
        // Both warpgroups hold the whole tile; each stores its half of the fragment.
        Tensor tPsdSt = thr_sdp.partition_C(sdSt);
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); i += 2) {
          if ((i < size(tSrS) / 2) != first_warpgroup) continue;
          st_shared_u32(&tPsdSt(i), pack_pair(rdS(i), rdS(i + 1)));
        }
      } else {
        // stmatrix: four 8 x 8 matrices of 16-bit values a warp instruction (8 of a thread's
        // elements), the swizzled addresses computed by CuTe as 32-bit shared-memory offsets.
        // The 32-bit stores it replaces each built a 64-bit generic address with the swizzle in
        // 64-bit arithmetic: 16 stores and ~60 address instructions a step.
        cute::copy(smem_copy_dS, thr_copy_dS.retile_S(rdS), thr_copy_dS.partition_D(sdSt));
      }
      if constexpr (!kDvFirst) gemm_rs<false>(mma_dkv, tdVrP, tdVrdOt, tdVrdV);
      fence_async_shared();  // generic smem stores -> wgmma reads
      const long long t_pds = tracer.start();
      named_barrier_sync(kPdSBarrier, kMathThreads);
      tracer.stop(kTraceMathWaitPdS, t_pds);

      if constexpr (Traits::kSplitD) {
        // dK now, dQ in halves below, once dK and dV are complete.
        gemm_rs<false>(mma_dkv, tdKrdS, tdKrQt, tdKrdK);
        warpgroup_wait<0>();  // dV, dK: this warpgroup is done with the stage's Q and dO
      } else {
        gemm_ss<true>(mma_dq, tdQrdS, tdQrKt, tdQrdQ);
        gemm_rs<false>(mma_dkv, tdKrdS, tdKrQt, tdKrdK);
        warpgroup_wait<1>();  // dV and dQ (wgmma groups complete in order); dK may still run
      }
      warpgroup_fence_operand(tdQrdQ);
      if constexpr (Traits::kdQInStage) {
        // Hand dQ to the writer in the step's own stage, once the other warpgroup's wgmmas are
        // done with it too (fragment order, Traits::dq_chunk: the first half of the chunks in
        // Q's buffer, the rest in dO's). The writer frees the stage (q_empty) after reading it.
        static_assert(Traits::kSplitD, "dQ goes into the stage only at head_dim 256 (kSplitD)");
        warpgroup_fence_operand(tdKrdK);
        warpgroup_fence_operand(tdVrdV);
        const long long t_stage = tracer.start();
        named_barrier_sync(kMathBarrier, kMathThreads);
        tracer.stop(kTraceMathWaitdQEmpty, t_stage);
        // Half h's 32 values are chunks 8h..8h+7 of the fragment: half 0 to Q's buffer, half 1
        // to dO's (chunk 8 + k at dq_chunk(8 + k, t) - half = dq_chunk(k, t) of dO's buffer).
        Tensor tdQrdS_h = wg_dq_half.partition_fragment_A(sdS);
        auto half = [&](const auto& tdQrKt_h, float4* dst) JAX_DASH_INLINE {
          Tensor acc = partition_fragment_C(mma_dq_half, Shape<BlockM, _64>{});
          static_assert(decltype(size(acc))::value * 2 == Traits::kdQFloatsPerThread);
          gemm_ss<true>(mma_dq_half, tdQrdS_h, tdQrKt_h, acc);
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc);
          if (dq_first) zero_plus_all(acc);
          CUTE_UNROLL
          for (int k = 0; k < Traits::kdQChunks / 2; ++k) {
            dst[Traits::dq_chunk(k, tid)] =
                make_float4(acc(4 * k), acc(4 * k + 1), acc(4 * k + 2), acc(4 * k + 3));
          }
        };
        half(tdQrKt0, reinterpret_cast<float4*>(smem.q[stage]));
        half(tdQrKt1, reinterpret_cast<float4*>(smem.dout[stage]));
        fence_async_shared();  // generic smem stores -> the writer's bulk reductions
        // No q_empty arrival here: the writer frees the stage.
        named_barrier_arrive(dq_full_barrier(stage, 0), Traits::kdQThreads);
      } else {
      // Hand this warpgroup's half of dQ to the writer: wait until it has read the half of the
      // previous partial in the buffer, store this one in fragment order (Traits::dq_chunk),
      // publish. Buffer step % kdQStages, free once the writer of step - kdQStages has read it;
      // then the writer of this step takes it (WsDqWriter: with two writer warps, by the step's
      // parity). Each warpgroup meets the writer on its own barriers: the two warpgroups meet
      // once a step (kPdSBarrier), not again here.
      const int dq_buf = Traits::kdQStages == 1 ? 0 : step % Traits::kdQStages;
      const long long t_empty = tracer.start();
      named_barrier_sync(DqWriter::empty_barrier_before(step, warpgroup), Traits::kdQThreads);
      tracer.stop(kTraceMathWaitdQEmpty, t_empty);
      float4* sdq = reinterpret_cast<float4*>(smem.dq[dq_buf]);
      if (dq_first) zero_plus_all(tdQrdQ);
      CUTE_UNROLL
      for (int k = 0; k < Traits::kdQChunks; ++k) {
        sdq[Traits::dq_chunk(k, tid)] =
            make_float4(tdQrdQ(4 * k), tdQrdQ(4 * k + 1), tdQrdQ(4 * k + 2), tdQrdQ(4 * k + 3));
      }
      if constexpr (kNextS) {
        // The next step's S^T, or at the unit's last step this step's again: ptxas serializes
        // every wgmma unless each path into the loop's top has one S^T in flight. The repeat
        // reads this step's stage, which the producer refills only for the next unit, after the
        // unit barrier; it is waited for below the loop.
        PipelineState<Traits::kStages> next = q_pipe;
        if (step + 1 < num_steps) next.advance();
        issue_s(next);
      }
      fence_async_shared();  // generic smem stores -> the writer's bulk reduction
      named_barrier_arrive(dq_full_barrier(DqWriter::writer_of(step), warpgroup),
                           Traits::kdQThreads);

      // dV, dK: this step no longer reads Q/dO of this stage (the next step's S^T may run on).
      warpgroup_wait<kNextS ? 1 : 0>();
      warpgroup_fence_operand(tdKrdK);
      warpgroup_fence_operand(tdVrdV);
      warp_arrive(&smem.q_empty[stage]);
      }  // !kdQInStage
    }

    // kNextS: the last step's repeated S^T (K's tile and the stage are reused after the barrier).
    if constexpr (kNextS) warpgroup_wait<0>();
    // Scheduler::kKVFirst: the producer loaded K and V before it knew the step count; they land
    // before the epilogue writes dK and dV into their tiles. (Waited for at the unit's start with
    // the steps' wait, the step loop's spills went from 2 to 10 instructions at head_dim 128.)
    if (Scheduler::kKVFirst && num_steps == 0) {
      cutlass::arch::ClusterTransactionBarrier::wait(&smem.kv_full, kv_loads & 1);
      ++kv_loads;
    }
    const long long t_epilogue = tracer.start();
    Epilogue::store(P, smem, thr_dkv, tid, scale, b, h, u.n, kv0, tdKrdK, tdVrdV, tdKVc);
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);  // every role is done with the unit
    tracer.stop(kTraceMathEpilogue, t_epilogue);
  }
  // The last dK/dV TMA stores complete before the kernel ends (their reads were waited for above).
  if (tid == 0) bulk_wait_group_all();
  tracer.stop(kTraceMathCycles, t_begin);
}

}  // namespace jax_dash::sm90::bwd
