// Math warpgroups of the sm90 forward: per query tile, S = Q K^T and O += P V on the tensor cores
// with the online softmax between them, taking turns with the other math warpgroups to issue their
// wgmmas, then the epilogue (FwdEpilogue). Each warpgroup owns 64 query rows of the tile.
#pragma once

#include <cuda_runtime.h>

#include <cute/arch/cluster_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>
#include <type_traits>

#include "cuda/mask.h"
#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/fwd/dropout.cuh"
#include "cuda/sm90/fwd/pipeline.cuh"
#include "cuda/sm90/fwd/producer.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/fwd/tile.cuh"
#include "cuda/sm90/fwd/traits.cuh"
#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/named_barrier.cuh"
#include "cuda/sm90/softmax.cuh"

namespace jax_dash::sm90::fwd {

// Each turn barrier (cuda/sm90/named_barrier.cuh kTurnBarrier) counts the two warpgroups that meet
// there (128 arriving, 128 waiting).
constexpr int kTurnThreads = 2 * kThreadsPerWarpgroup;

// kMask: the instantiation that carries the mask policy beyond causal and seq_kv (window, lengths,
// segment ids, soft cap); calls without them run the kMask = false kernel, compiled as before.
// kSegments (kMask only): the call has segment ids; its KV ranges are narrowed by segment-id
// ranges and its tiles tested on them. Masked calls without segment ids run kSegments = false,
// which has none of that code (it cost the window point 6-9% of its forward when it was there).
// kPersistent (the scheduler's; JAX_DASH_SM90_FWD=ws-persistent; stage F4): the K/V stage ring and
// Q's barrier run on across a CTA's tiles, and the math warps release Q (q_empty) after a tile's
// last S = Q K^T, so the producer loads the next tile's Q and first K/V while the math finishes
// the tile (last P V, normalisation, epilogue stores). Per tile the arithmetic is the one-tile
// kernel's: the same bits.
// kDropout (issue 33; the one-tile kernels, masked or not): attention dropout on each tile's P
// after the row sums (fwd/dropout.cuh); its parameters are FwdDropoutKernelParams.
// The mainloop names the roles that feed it: the producer (TMA loads of the same tiles) and the KV
// range of each tile under the mask.
template <class Traits_, bool kMask_, bool kPersistent_, bool kSegments_, bool kDropout_ = false>
struct FwdMainloop {
  using Traits = Traits_;
  static constexpr bool kMask = kMask_;
  static constexpr bool kPersistent = kPersistent_;
  static constexpr bool kSegments = kSegments_;
  static constexpr bool kDropout = kDropout_;
  static_assert(!kPersistent || !kMask, "the persistent loop is written for the unmasked kernel");
  static_assert(!kSegments || kMask, "segment ids are part of the mask policy");
  static_assert(!kDropout || !kPersistent, "dropout is instantiated in the one-tile kernels");
  // The persistent kernel's turns run on across tiles at head_dim 64 (see the turn-taking in run):
  // H100 driver forward 0.8-5.6% faster there (causal 512-1k -5..-6%), 0.3-0.8% slower at 128
  // (maintainers/perf-notes.md, twenty-fourth session, call 1).
  static constexpr bool kChainTurns = kPersistent && Traits::HeadDim::value == 64;
  // Whether the rescale of a still-zero O before a tile's first P V is skipped (see the step
  // loop): H100 driver forward 0.6-0.9% faster at head_dim 128; at 64 a tie or slower (causal 1k
  // +0.9%), so those kernels keep it; 256 not measured (twenty-sixth session, call 1).
  static constexpr bool kSkipZeroRescale = Traits::HeadDim::value == 128;
  using Producer = FwdProducer<Traits, kPersistent, kSegments>;
  using KvRange = FwdKvRange<Traits, kMask, kSegments>;

  using Element = typename Traits::ElementType;
  using Params =
      std::conditional_t<kDropout, FwdDropoutKernelParams<Traits>, FwdKernelParams<Traits>>;
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;

  // Every tile of this CTA, on a math thread (registers already raised), each ending with the
  // Epilogue's store (fwd/epilogue.cuh). sQ (BLK_M,D), sK (BLK_N,D,STAGES) and sVt
  // (D,BLK_N,STAGES) are the producer's shared-memory tiles.
  template <class Epilogue, class Scheduler, class TensorQ, class TensorK, class TensorVt>
  __device__ __forceinline__ static void run(const Params& p,
                                             typename Traits::SharedStorage& smem,
                                             const Scheduler& scheduler, const KvRange& kv_range,
                                             const TensorQ& sQ, const TensorK& sK,
                                             const TensorVt& sVt) {
    const int num_kv_blocks = kv_range.num_kv_blocks;
    const unsigned math_tid = threadIdx.x - kThreadsPerWarpgroup;
    // Broadcast from lane 0 so that ptxas knows the index is warp-uniform: branches and barrier ids
    // that depend on it then keep the warp provably converged. With the plain division, inside the
    // persistent kernel's tile loop ptxas built every wgmma descriptor in vector registers (four
    // R2UR before each HGMMA of S = Q K^T, two before each of P V: on the other warpgroup's
    // critical path in the ping-pong) and guarded the softmax's shuffles with a run-time
    // convergence check.
    const int math_wg =
        __shfl_sync(0xffffffffu, static_cast<int>(math_tid / kThreadsPerWarpgroup), 0);
    typename Traits::TiledMmaQK mma_qk;
    typename Traits::TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(math_tid);
    auto thr_pv = mma_pv.get_thread_slice(math_tid);
    // The shared-memory operands' descriptors depend on the warpgroup only: partitioned by the
    // warp-uniform math_wg, so that ptxas keeps them in uniform registers. Partitioned by the
    // thread (as the accumulators are), Q's descriptor lived in vector registers and each HGMMA of
    // S = Q K^T waited behind two R2UR and their arithmetic, on the path that holds the other
    // warpgroup's turn (H100, hd128 causal 8 x 2k: 3.4% fewer instructions without; driver forward
    // 0.6-1.8% faster; maintainers/perf-notes.md, twenty-fourth session, calls 4 and 6).
    auto wg_qk = mma_qk.get_thread_slice(math_wg * kThreadsPerWarpgroup);
    auto wg_pv = mma_pv.get_thread_slice(math_wg * kThreadsPerWarpgroup);
    Tensor tSrQ = wg_qk.partition_fragment_A(sQ);    // (MMA,MMA_M,MMA_K) descriptors
    Tensor tSrK = wg_qk.partition_fragment_B(sK);    // (MMA,MMA_N,MMA_K,STAGES)
    Tensor tOrVt = wg_pv.partition_fragment_B(sVt);  // (MMA,MMA_N,MMA_K,STAGES)
    Tensor tSrS = partition_fragment_C(mma_qk, Shape<BlockM, BlockN>{});   // (MMA,MMA_M,MMA_N) fp32
    Tensor tOrO = partition_fragment_C(mma_pv, Shape<BlockM, HeadDim>{});  // (MMA,MMA_M,MMA_N) fp32
    // Coordinates of S and of O.
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<BlockM, BlockN>{}));
    Tensor tOcO = thr_pv.partition_C(make_identity_tensor(Shape<BlockM, HeadDim>{}));
    Tensor scores = as_rows_cols(tSrS);  // (ROWS, COLS) view
    Tensor out_acc = as_rows_cols(tOrO);
    Tensor score_coords = make_tensor(tScS.data(), accumulator_rows_cols(tScS.layout()));
    Tensor out_coords = make_tensor(tOcO.data(), accumulator_rows_cols(tOcO.layout()));
    constexpr int kRows = decltype(size<0>(scores))::value;

    // P in 16 bits, re-read as the A operand of P V: the accumulator's (2, 2, BLK_N/8) value order
    // equals the register A fragment's ((2, 2, 2), 1, BLK_N/16) order, so only the layout changes.
    Tensor tOrP_storage = make_tensor<Element>(tSrS.layout());
    Tensor tOrP = make_tensor(tOrP_storage.data(),
                              Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>>{});
    static_assert(decltype(size(tOrP))::value == decltype(size(tSrS))::value);
    static_assert(decltype(size<1>(tSrS))::value == 1 && decltype(size<2>(tSrS))::value == 1,
                  "each thread must own one 64-row accumulator");

    const AttentionMask mask{p.seq_kv, p.is_causal};
    const float scale = *p.scale;
    const float scale_log2 = scale * kLog2e;  // the softmax runs on exp2
    // Fold the scale into the exponent (softmax_scores below): every call with a positive scale and
    // no soft cap. A zero or negative scale (allowed, if odd) takes the scale-first path.
    const bool fold = !(kMask && p.soft_cap > 0.f) && scale_log2 > 0.f;
    const float exponent_factor = fold ? scale_log2 : 1.f;
    [[maybe_unused]] const auto dropout = load_fwd_dropout<kDropout>(p);
    KvPipelineState kv_pipe;
    QPipelineState q_pipe;
    // kChainTurns: whether this CTA has taken turns yet (they then run on from tile to tile).
    bool turns_begun = false;
    scheduler.math_tiles(smem, [&](const TileCoord& coord) JAX_DASH_INLINE {
      const FwdTile tile = kv_range.tile(coord);
      const int n_hi = tile.n_hi, n_end = tile.n_end;
      const int64_t row_begin = tile.row_begin;
      const PolicyMask& policy = tile.policy;
      // Turn-taking (ping-pong with two warpgroups, round robin with three): each math warpgroup
      // has n_end + 1 turns (prologue, n_end - 1 iterations, epilogue). The first warpgroup goes
      // first (the last one's opening arrive); the last one's final hand-over is skipped so that
      // every arrive meets a sync, and each tile starts afresh. kChainTurns: the turns run on from
      // tile to tile instead: the last warpgroup's final hand-over lets the first one issue the
      // next tile's first S while the others finish this tile (normalisation, epilogue), where a
      // fresh start had it wait for the last one's epilogue; the opening arrive comes once a CTA,
      // and the first warpgroup takes the last hand-over after its last tile. Modelled in
      // scripts/ws_protocol_model.py (forward, 2 and 3 warpgroups, chain).
      constexpr int kLastWg = Traits::kWarpgroups - 1;
      const int last_turn = n_end;
      auto turn_begin = [&]() JAX_DASH_INLINE {
        named_barrier_sync(kTurnBarrier + math_wg, kTurnThreads);
      };
      auto turn_end = [&](int turn) JAX_DASH_INLINE {
        if (kChainTurns || !(math_wg == kLastWg && turn == last_turn)) {
          const int next = math_wg == kLastWg ? 0 : math_wg + 1;
          named_barrier_arrive(kTurnBarrier + next, kTurnThreads);
        }
      };
      if (math_wg == kLastWg && n_end > 0 && !(kChainTurns && turns_begun)) {
        named_barrier_arrive(kTurnBarrier, kTurnThreads);
      }
      if (n_end > 0) turns_begun = true;
      // kPersistent: Q is free for the next tile's load once this warp's last S = Q K^T is
      // complete.
      auto release_q_after = [&](int j) JAX_DASH_INLINE {
        if constexpr (kPersistent) {
          if (j == n_end - 1) warp_arrive(&smem.q_empty);
        }
      };

      OnlineSoftmax<kRows> softmax;
      softmax.init();
      clear(tOrO);

      // Software pipeline inside each warpgroup: iteration j issues S_j = Q K_j^T and then O +=
      // P_{j-1} V_{j-1} back to back, and runs the softmax of S_j while both wgmmas are on the
      // tensor cores; only the 16-bit conversion of P_j waits for the P V. Iteration 0 (prologue)
      // has no P V, and the last P V runs after the loop.
      auto issue_qk = [&](int j) JAX_DASH_INLINE {
        const KvSlot slot = kv_pipe.kv(j);
        const int stage = slot.stage();
        Barrier::wait(&smem.bar_k[stage], slot.full_phase());
        mma_qk.accumulate_ = GMMA::ScaleOut::Zero;
        warpgroup_fence_operand(tSrS);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tSrQ); ++k) {
          gemm(mma_qk, tSrQ(_, _, k), tSrK(_, _, k, stage), tSrS);
          mma_qk.accumulate_ = GMMA::ScaleOut::One;
        }
        warpgroup_commit_batch();
      };
      auto issue_pv = [&](int j) JAX_DASH_INLINE {
        const KvSlot slot = kv_pipe.kv(j);
        const int stage = slot.stage();
        Barrier::wait(&smem.bar_v[stage], slot.full_phase());
        warpgroup_fence_operand(tOrP_storage);
        warpgroup_fence_operand(tOrO);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tOrP); ++k) {
          gemm(mma_pv, tOrP(_, _, k), tOrVt(_, _, k, stage), tOrO);
        }
        warpgroup_commit_batch();
      };
      // Scale and mask S_j (already complete in registers), then the first half of the softmax.
      // With a positive scale and no soft cap (fold: uniform across the CTA) S stays unscaled, is
      // masked to -inf as it is, and the scale goes into the exponent's FFMA
      // (OnlineSoftmax::update_scores); otherwise it is scaled first and the factor is 1.
      float correction[kRows];
      auto softmax_scores = [&](int j) JAX_DASH_INLINE {
        if (kMask && p.soft_cap > 0.f) {
          soft_cap_scores(tSrS, scale / p.soft_cap, p.soft_cap * kLog2e);
        } else if (!fold) {
          CUTE_UNROLL
          for (int i = 0; i < size(tSrS); ++i) tSrS(i) *= scale_log2;
        }
        const int64_t col_begin = int64_t(n_hi - 1 - j) * kBlockN;
        if (kMask && p.has_mask) {
          // With segment ids a tile inside one document on both sides needs no element test (the
          // tile test of cuda/mask.h on the two id ranges); without, the band and the lengths
          // decide. (kSegments: this call's rows have segment ids; the instantiation without them
          // carries no segment code at all, so its registers are those of the band and lengths
          // alone.)
          if constexpr (kSegments) {
            const bool needs_mask =
                policy.m.tile(row_begin, kBlockM, col_begin, kBlockN, tile.q_segments,
                              kv_tile_segments(policy.m.row, p.seq_kv, n_hi - 1 - j, kBlockN)) !=
                TileVisibility::kFull;
            if (needs_mask) {
              policy.template apply_impl<true>(scores, score_coords, row_begin, col_begin);
            }
          } else if (policy.tile_needs_mask(row_begin, kBlockM, col_begin, kBlockN)) {
            policy.apply_rows(scores, score_coords, row_begin, col_begin);
          }
        } else if (mask.tile_needs_mask(row_begin, col_begin, kBlockN)) {
          mask.apply(scores, score_coords, row_begin, col_begin);
        }
        softmax.update_scores(scores, exponent_factor, correction);
        if constexpr (kDropout) {
          dropout.apply(tSrS, tScS, tile.batch, tile.head, row_begin, col_begin);
        }
      };
      auto scores_to_p = [&]() JAX_DASH_INLINE {
        CUTE_UNROLL
        for (int i = 0; i < size(tSrS); ++i) tOrP_storage(i) = static_cast<Element>(tSrS(i));
      };

      // Unmasked: the KV steps before `first` are hidden from every row of this warpgroup (causal:
      // its 64 rows end before the tile's last ones, e.g. the first one or two warpgroups of a
      // 192-row tile at head_dim 64; any mask: rows past seq_q). The warpgroup still takes those
      // turns and releases their K and V stages, in the turn where it would have (K_t in turn t,
      // V_{t-1} in turn t: the ordering the model checks), but issues no wgmma and starts its
      // softmax at step `first`. A step that no row of the warpgroup sees leaves the online softmax
      // as it found it (max -inf, sum 0, O +0: softmax.cuh), so the bits are the same. (kMask keeps
      // every step: its warpgroups' ranges are not derived here.) The first computing turn of a
      // skipping warpgroup waits for V_{first-1}'s load before it releases that stage, so the
      // protocol holds for any combination of skipped steps, even a tile in which no warpgroup
      // computes every step (the kernel makes none: the warpgroup holding the tile's last valid row
      // has `first` 0); scripts/ws_protocol_model.py, with loads landing late, checks every one.
      int first = 0;
      if constexpr (!kMask) {
        const int64_t wg_row = row_begin + int64_t(math_wg) * kWarpgroupRows;
        if (wg_row >= p.seq_q) {
          first = n_end;
        } else if (p.is_causal) {
          const int64_t wg_last = min(wg_row + kWarpgroupRows, int64_t(p.seq_q)) - 1;
          first = n_hi - min(num_kv_blocks, int(wg_last / kBlockN) + 1);
        }
      }
      if (n_end > 0) {
        Barrier::wait(&smem.bar_q, q_pipe.full_phase());
        for (int t = 0; t < first; ++t) {  // skipped turns
          // The turn's waits stay: a later parity wait of this warpgroup on a stage is then never
          // two phases ahead of it (without them, a warpgroup whose skipped steps covered a
          // stage's previous use could pass its wait on the stage's older phase: the model found
          // that deadlock where no warpgroup of a tile computes every step).
          turn_begin();
          const KvSlot slot = kv_pipe.kv(t);
          Barrier::wait(&smem.bar_k[slot.stage()], slot.full_phase());
          if (t > 0) {
            Barrier::wait(&smem.bar_v[slot.previous().stage()], slot.previous().full_phase());
          }
          warp_arrive(&smem.k_empty[slot.stage()]);
          if (t > 0) warp_arrive(&smem.v_empty[slot.previous().stage()]);
          release_q_after(t);
          turn_end(t);
        }
        if (first < n_end) {
          turn_begin();
          issue_qk(first);
          turn_end(first);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tSrS);
          warp_arrive(&smem.k_empty[kv_pipe.kv(first).stage()]);
          // V_{first-1} landed (its phase is this wait's: this warpgroup holds it).
          if (first > 0) {
            const KvSlot v_slot = kv_pipe.kv(first).previous();
            Barrier::wait(&smem.bar_v[v_slot.stage()], v_slot.full_phase());
            warp_arrive(&smem.v_empty[v_slot.stage()]);
          }
          release_q_after(first);
          softmax_scores(first);
          scores_to_p();
        }
      }

      // On entry to iteration j: P_{j-1} is in registers, O holds the sum up to P_{j-2} V_{j-2},
      // and correction[] is the factor of step j-1 (O is scaled by it before P_{j-1} V_{j-1} is
      // added). The rescale runs while S_j is on the tensor cores; after the barrier only the
      // 16-bit conversion and the wgmma issue separate the two P V wgmmas.
      for (int iter = first + 1; iter < n_end; ++iter) {
        turn_begin();
        issue_qk(iter);
        // O's last P V completed in the previous iteration. Before the tile's first P V, O is the
        // +0 of clear() and every factor is finite and >= 0 (OnlineSoftmax::update_scores), so
        // the rescale would leave it +0: kSkipZeroRescale skips it (the same bits).
        if (!kSkipZeroRescale || iter > first + 1) softmax.rescale(out_acc, correction);
        issue_pv(iter - 1);
        turn_end(iter);
        warpgroup_wait<1>();  // S_iter is complete; P_{iter-1} V_{iter-1} may still run
        warpgroup_fence_operand(tSrS);
        warp_arrive(&smem.k_empty[kv_pipe.kv(iter).stage()]);
        release_q_after(iter);
        softmax_scores(iter);  // overwrites correction[], consumed by the rescale above
        warpgroup_fence_operand(tSrS);
        // Scheduling fence, a no-op wait on a barrier phase that has completed. Without a
        // basic-block boundary here ptxas hoists the wgmma wait below to the top of the softmax's
        // block (seen in the SASS with nvcc 13.0), which runs the whole softmax after P V instead
        // of under it; the try-wait loop is such a boundary. The one-tile kernel waits on Q's
        // barrier, whose only phase has completed (not on K_iter's: the producer may have refilled
        // that stage already). The persistent kernel not on Q's barrier either, which can be two
        // phases on once every warp has released this tile's Q (a parity wait would then block for
        // good), but on V_{iter-1}'s stage, whose phase this warp waited for in issue_pv and which
        // cannot move before this warp's v_empty release below.
        if constexpr (kPersistent) {
          const KvSlot v_slot = kv_pipe.kv(iter).previous();
          Barrier::wait(&smem.bar_v[v_slot.stage()], v_slot.full_phase());
        } else {
          Barrier::wait(&smem.bar_q, q_pipe.full_phase());
        }
        warpgroup_wait<0>();   // the P V wgmma is done with O and with the P registers
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP_storage);
        warp_arrive(&smem.v_empty[kv_pipe.kv(iter).previous().stage()]);
        scores_to_p();
      }
      if (n_end > 0) {
        turn_begin();
        if (first < n_end) {
          if (!kSkipZeroRescale || first < n_end - 1) {  // else O is still +0
            softmax.rescale(out_acc, correction);
          }
          issue_pv(n_end - 1);
        } else {  // every step skipped: the turn's wait only (see the skipped turns above)
          const KvSlot v_slot = kv_pipe.kv(n_end).previous();
          Barrier::wait(&smem.bar_v[v_slot.stage()], v_slot.full_phase());
        }
        turn_end(last_turn);
        if (first < n_end) {
          warpgroup_wait<0>();
          warpgroup_fence_operand(tOrO);
        }
        // The last V stage of the tile: the one-tile kernel ends here, the persistent one reuses
        // it.
        if constexpr (kPersistent) warp_arrive(&smem.v_empty[kv_pipe.kv(n_end).previous().stage()]);
      }

      float lse[kRows];
      softmax.finalize(out_acc, lse);

      Epilogue::store(p, smem, tile, tOrO, out_coords, lse, math_tid, math_wg);
      if (n_end > 0) {
        kv_pipe.advance(n_end);
        q_pipe.advance();
      }
    });
    // kChainTurns: the last warpgroup's hand-over after its last tile.
    if (kChainTurns && math_wg == 0 && turns_begun) {
      named_barrier_sync(kTurnBarrier, kTurnThreads);
    }
    Epilogue::finish(math_tid);
  }
};

}  // namespace jax_dash::sm90::fwd
