// Traits of the sm90 backward: the tile shapes, MMA types and shared-memory layouts of its five
// products (BwdTileTraits), and for the warp-specialized kernel the shared-memory layout every
// role shares (Storage), the TMA descriptors and the kernel's parameter block (WsParams).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/bwd/trace.cuh"
#include "cuda/sm90/tma.cuh"

namespace jax_dash::sm90::bwd {

using namespace cute;

// Tile shapes, MMA types and shared-memory layouts of the backward's five products (WsTraits takes
// them from here):
//   S^T  = K_n  Q_m^T    (kv, q)  over d     A = K  (K-major)      B = Q   (K-major)
//   dP^T = V_n  dO_m^T   (kv, q)  over d     A = V  (K-major)      B = dO  (K-major)
//   dV  += P^T  dO_m     (kv, d)  over q     A = P^T (K-major)     B = dO^T view (MN-major)
//   dK  += dS^T Q_m      (kv, d)  over q     A = dS^T (K-major)    B = Q^T view (MN-major)
//   dQ   = dS   K_n      (q, d)   over kv    A = dS view (MN-major) B = K^T view (MN-major)
// Computing S and dP transposed puts the KV rows on the M side, so each warpgroup owns 64 KV rows
// and P^T / dS^T come out of the accumulators already in the layout the dV / dK products read.
// kThreads: the two math warpgroups' threads, over which the tiled MMAs are laid out.
template <class Element_, int kHeadDim_>
struct BwdTileTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr TileConfig kTiles = tile_config(kHeadDim);
  static constexpr int kBlockM = kTiles.bwd_block_m;
  static constexpr int kBlockN = kTiles.bwd_block_n;
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = kWarpgroups * 128;
  static_assert(kBlockM == 64 || kBlockM == 128, "wgmma N of the S/dP products");
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
                "sm90 backward supports head_dim 64, 128 and 256");

  using BlockM = Int<kBlockM>;
  using BlockN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;

  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BlockM, HeadDim>, GMMA::Major::K,
                           GMMA::Major::K>(),
      Layout<Shape<_2, _1, _1>>{}));
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, HeadDim, BlockM>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  // dQ tile (Bm, d): two warpgroups split the rows when Bm = 128, else the head dim.
  static constexpr bool kdQSplitM = kBlockM == 128;
  using dQAtomShape = std::conditional_t<kdQSplitM, Shape<_64, HeadDim, BlockN>,
                                         Shape<_64, Int<kHeadDim / 2>, BlockN>>;
  using dQAtomLayout =
      std::conditional_t<kdQSplitM, Layout<Shape<_2, _1, _1>>, Layout<Shape<_1, _2, _1>>>;
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, dQAtomShape, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      dQAtomLayout{}));

  using SmemLayoutKV = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                              Shape<BlockN, HeadDim>{}));  // (Bn, d)
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                             Shape<BlockM, HeadDim>{}));  // (Bm, d)
  using SmemLayoutPt = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                              Shape<BlockN, BlockM>{}));  // (Bn, Bm)
  // Transposed views of the same bytes: (i, j) of the view is (j, i) of the stored tile.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<HeadDim, BlockM>{}, Stride<BlockM, _1>{})));  // (d, Bm)
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<HeadDim, BlockN>{}, Stride<BlockN, _1>{})));  // (d, Bn)
  using SmemLayoutdS = decltype(composition(
      SmemLayoutPt{}, make_layout(Shape<BlockM, BlockN>{}, Stride<BlockN, _1>{})));  // (Bm, Bn)

};

// kMask: the instantiation that carries the mask policy beyond causal and seq_kv (window, lengths,
// segment ids, soft cap); calls without them run kMask = false, compiled as before. kDropout
// (issue 33): attention dropout (bwd/dropout.cuh), beside either.
// kAllMasks (with kMask): soft cap and segment ids compiled in too. The masked instantiations
// without them (kAllMasks false: windows and lengths only) run the calls that use neither: with
// their code paths in the step loop, ptxas spilled the window path's registers at head_dim 64
// (276 local loads and stores between the step loop's wgmmas; 47 without them).
//
// kTraced: the per-role trace (trace.cuh) compiled in, run when a call passes a trace buffer
// (tests/sm90_check.cu bench). With kUntracedTwin (head_dim 128, unmasked, no dropout) a call
// without a trace runs the same kernel compiled without it (Untraced): its step loop loses 36 of
// 1049 instructions (the predicated clock reads and counter adds) and one of two spills; on an
// H100 its backward took 0.980-0.987x the traced kernel's at causal 2k-16k (same bits;
// maintainers/perf-notes.md, thirty-first session). Not at head_dim 64: there ptxas then
// serialized the step's wgmmas for want of registers (8-12% slower).
template <class Element_, int kHeadDim_, bool kMask_, bool kDropout_ = false,
          bool kAllMasks_ = true, bool kTraced_ = true>
struct WsTraits {
  static constexpr bool kTraced = kTraced_;
  static constexpr bool kUntracedTwin = kTraced_ && kHeadDim_ == 128 && !kMask_ && !kDropout_;
  using Untraced = WsTraits<Element_, kHeadDim_, kMask_, kDropout_, kAllMasks_, false>;
  using Base = BwdTileTraits<Element_, kHeadDim_>;
  // kSplitD (head_dim 256, 64 KV rows a tile): K, V, dK and dV of 256 columns do not fit two
  // warpgroups owning 64 KV rows each, so both math warpgroups take all 64 KV rows, each owns half
  // of dK's and dV's columns (64 + 64 accumulator registers), and each computes the whole S^T and
  // dP^T (64 x 64 over d; the two compute the same bits, and each stores half of P^T / dS^T).
  // S and dP are done twice (7 products' work instead of 5) in exchange for no hand-off of P or dP
  // between the warpgroups.
  static constexpr bool kSplitD = kHeadDim_ == 256;
  // kdQInStage (with kSplitD): two Q/dO stages and a 64 KB dQ buffer do not fit in 227 KB (K, V,
  // two stages of Q and dO at 32 KB each: 192 KB), so the step's dQ partial (64 KB of fp32, the
  // size of one stage's Q and dO) is stored into the step's own stage once both math warpgroups'
  // wgmmas are done with it, and the writer frees the stage for the producer (q_empty, its one
  // arrival) once its bulk reductions have read it. Each stage has its own dQ-full barrier and
  // there is no dQ-empty barrier (scripts/ws_protocol_model.py, dq_in_stage). With one stage and
  // a separate dQ buffer (the first head_dim-256 kernel) the math waited 19-38% of its cycles for
  // the next step's Q/dO (H100, 2026-11-25).
  static_assert(kSplitD == (Base::kBlockN == 64), "64 KV rows a tile only at head_dim 256");
  static constexpr bool kMask = kMask_;
  static constexpr bool kDropout = kDropout_;
  static constexpr bool kAllMasks = kMask_ && kAllMasks_;
  // The window/lengths kernel without dropout at head_dim 128 runs the unmasked kernel's step:
  // two dQ writers (below) and S^T a step ahead (mainloop.cuh kNextS). H100 driver, window 4096,
  // causal: backward 4.4-5.2% faster than with one writer and S^T in its step, same bits; at
  // head_dim 64 the same was 1-2% slower, S^T a step ahead alone 2.5-3.9% slower (its step loop
  // spills more), so it stays as it was (maintainers/perf-notes.md, twenty-fourth session).
  static constexpr bool kBandStep = kMask_ && !kAllMasks && !kDropout_ && kHeadDim_ == 128;
  // dQ buffers between the math warpgroups and the writer: with two the math may run two steps
  // ahead of the writer (the second buffer's 32 KB come from the dS^T double buffer, see
  // kdSStages). Two at head_dim 64: 5.0-7.2% fewer cycles per step than one (H100, 2k-16k,
  // maintainers/perf-notes.md, third session call 2). One at 128, where two gave no consistent
  // gain: +0.4..+1.6% in that call, -4.3..+1.7% under shift (sixth session call 9), within 1.1%
  // (eleventh session call D, thirteenth session call J). The masked instantiation has one at
  // every head dim.
  static constexpr int kdQStages = kHeadDim_ == 64 && !kMask ? 2 : 1;
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = Base::kBlockM;
  static constexpr int kBlockN = Base::kBlockN;
  static constexpr int kMathThreads = Base::kThreads;  // two warpgroups
  static constexpr int kMathWarps = kMathThreads / 32;
  static constexpr int kThreads = 128 + kMathThreads;
  // Two dQ writer warps in the unmasked kernels (dq_writer.cuh), writer w taking the steps s of a
  // unit with s % 2 == w (with kdQInStage the steps in Q/dO stage w): each waits for its own
  // reductions to complete and releases their tickets while the other takes the next step. Writer
  // w has its own dQ-full and dQ-empty barriers (named_barrier.cuh dq_full_barrier(w, g),
  // dq_empty_barrier(w, g)). The masked kernels keep one (but kBandStep): with two, their
  // backward was 2-5% slower (H100, 16k tokens: sliding window and packed documents at head_dim
  // 64, packed at 128; maintainers/perf-notes.md, twentieth session, call 12).
  static constexpr int kdQWriters = !kMask || kBandStep ? 2 : 1;
  // The unit barrier's threads: the producer warp, the writer warps, the math warpgroups.
  static constexpr int kUnitThreads = 32 * (1 + kdQWriters) + kMathThreads;
  static constexpr bool kdQInStage = kSplitD;
  // The threads of a dQ-full/dQ-empty barrier: one writer warp and the math warpgroup whose half
  // of the partial it hands over, or (kdQInStage, one barrier per stage) both warpgroups.
  static constexpr int kdQThreads = 32 + (kdQInStage ? kMathThreads : 128);
  static constexpr int kServiceRegisters = 24;
  static constexpr int kMathRegisters = 240;
  static_assert(kServiceRegisters * 128 + kMathRegisters * kMathThreads <= 65536,
                "register file of one SM");
  static constexpr int kStages = 2;  // Q/dO ring

  using BlockM = typename Base::BlockM;
  using BlockN = typename Base::BlockN;
  using HeadDim = typename Base::HeadDim;
  // S^T, dP^T: the two warpgroups split the KV rows, or (kSplitD) each computes all of them.
  using TiledMmaSdP = std::conditional_t<
      kSplitD,
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float,
                                                   Shape<_64, BlockM, HeadDim>, GMMA::Major::K,
                                                   GMMA::Major::K>(),
                              Layout<Shape<_1, _1, _1>>{})),
      typename Base::TiledMmaSdP>;
  static constexpr int kSdPThreads = kSplitD ? 128 : kMathThreads;  // threads of one S^T tile
  // dV, dK: the warpgroups split the KV rows, or (kSplitD) the head dim.
  using dKVAtomShape = Shape<_64, Int<kSplitD ? kHeadDim / 2 : kHeadDim>, BlockM>;
  using dKVAtomLayout =
      std::conditional_t<kSplitD, Layout<Shape<_1, _2, _1>>, Layout<Shape<_2, _1, _1>>>;
  // dV, dK: A = P^T / dS^T from registers.
  using TiledMmadKV =
      decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, dKVAtomShape,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              dKVAtomLayout{}));
  using TiledMmadQ = typename Base::TiledMmadQ;
  // kSplitD: dQ of one warpgroup's 128 columns in two 64-column halves, one warpgroup each, after
  // its dK and dV are complete. With dQ's 64 accumulators live beside dK's and dV's 128 and the
  // 16-bit P^T / dS^T operands, ptxas serialized every wgmma of the kernel ("insufficient register
  // resources", C7512). Half h of warpgroup w holds values 32h..32h+31 of TiledMmadQ's fragment
  // (the same rows and columns), so the fragment order of dq_accum is unchanged.
  using TiledMmadQHalf = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, _64, BlockN>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));
  using SmemLayoutKV = typename Base::SmemLayoutKV;  // (Bn, d)
  using SmemLayoutQ = typename Base::SmemLayoutQ;    // (Bm, d)
  using SmemLayoutPt = typename Base::SmemLayoutPt;  // (Bn, Bm)
  using SmemLayoutQt = typename Base::SmemLayoutQt;  // (d, Bm) view
  using SmemLayoutKt = typename Base::SmemLayoutKt;  // (d, Bn) view
  using SmemLayoutdS = typename Base::SmemLayoutdS;  // (Bm, Bn) view

  static constexpr int kdQFloats = kBlockM * kHeadDim;
  static constexpr int kdQFloatsPerThread = kdQFloats / kMathThreads;
  static_assert(kdQFloatsPerThread % 4 == 0, "dQ goes to shared memory in 16-byte chunks");
  static constexpr uint32_t kdQBytes = kdQFloats * sizeof(float);
  static constexpr int kdQChunks = kdQFloatsPerThread / 4;  // 16-byte chunks of a thread
  // "Fragment order" of a dQ partial (its shared-memory buffer and its dq_accum tile): the float4
  // index of chunk k of math thread t. Each warpgroup's chunks form one contiguous half, which it
  // hands to the writer on its own barriers (thread-major inside: chunk k of thread t at
  // k * 128 + t % 128 of the half); with kdQInStage, whose partial lies in a Q/dO stage and is
  // handed over whole, k * kMathThreads + t (the first half of the index range in Q's buffer).
  __host__ __device__ static constexpr int dq_chunk(int k, int t) {
    return kdQInStage ? k * kMathThreads + t : (t / 128) * (kdQChunks * 128) + k * 128 + t % 128;
  }
  static_assert(!kdQInStage || 2 * kBlockM * kHeadDim * sizeof(Element) == kdQBytes,
                "kdQInStage: one stage's Q and dO hold exactly one dQ partial");

  template <int kdSStages>
  struct Storage {
    // The dK/dV epilogue writes dK and dV into k and v (EpilogueTma), or (GQA, float32
    // gradients) stages them from k on, over everything up to q (kdQInStage: the writer may still
    // read the last steps' dQ from their Q/dO stages) or up to dq.
    alignas(1024) Element k[kBlockN * kHeadDim];
    alignas(1024) Element v[kBlockN * kHeadDim];
    alignas(1024) Element dst[kdSStages][kBlockN * kBlockM];
    alignas(1024) Element q[kStages][kBlockM * kHeadDim];
    alignas(1024) Element dout[kStages][kBlockM * kHeadDim];
    // 16 bytes that keep dq 128 bytes past dout, where P^T's 16-byte placeholder was (P^T lived
    // in shared memory only in the deleted variant "ws"). Without them dq, lse_log2, dsum and the
    // barriers move down by 128 bytes and ptxas computes some of their addresses with other
    // instructions (the math's q_full wait in the step loop and the writer's bulk-reduction source
    // among them; SASS compared 2026-11-26, maintainers/perf-notes.md). Remove them only with an
    // A/B on a GPU.
    alignas(16) char dq_offset_pad[16];
    // The dQ buffers (kdQInStage: a 16-byte placeholder, the partials live in the Q/dO stages).
    alignas(128) float dq[kdQInStage ? 1 : kdQStages][kdQInStage ? 4 : kdQFloats];
    alignas(16) float lse_log2[kStages][kBlockM];
    alignas(16) float dsum[kStages][kBlockM];
    alignas(8) uint64_t kv_full;
    uint64_t q_full[kStages];
    uint64_t q_empty[kStages];
    uint64_t unit_fetched;  // the first math thread fetched a unit (bwd/scheduler.cuh kKVFirst)
    int64_t unit_item;  // global item of the current unit (>= total_items: no more work)
    int32_t unit_kv;    // index of the unit's KV tile within its item
    int32_t unit_num_steps;
    unsigned long long trace[kWsTraceSlots];
  };
  static constexpr int kSmemAlign = 1024;
  // Per-unit visit/ticket tables (8 bytes per Q tile) follow the storage. Two dS^T buffers only if
  // they leave at least kTableReserve bytes for the tables (Nq >= 1024), else one (and one extra
  // math barrier per step).
  static constexpr int kTableReserve = 8 * 1024;
  static constexpr int kMaxSmem = 232448;  // sm90 opt-in limit per block
  static constexpr int kdSStages =
      int(sizeof(Storage<2>)) + kSmemAlign + kTableReserve <= kMaxSmem ? 2 : 1;
  using SharedStorage = Storage<kdSStages>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + kSmemAlign;
  static int64_t smem_bytes(int64_t num_q_tiles) {
    return kSmemBytes + 2 * num_q_tiles * int64_t(sizeof(int32_t));
  }

  static constexpr uint32_t kKVBytes = 2u * kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kQStageBytes =
      2u * kBlockM * kHeadDim * sizeof(Element) + 2u * kBlockM * sizeof(float);

  template <class SmemLayout>
  static auto make_tma(const Element* ptr, int32_t seq, int32_t heads, int32_t batch,
                       SmemLayout smem_layout) {
    return make_bshd_tma<Element, kHeadDim>(ptr, seq, heads, batch, smem_layout);
  }
  using TmaQ = decltype(make_tma(nullptr, 1, 1, 1, SmemLayoutQ{}));
  using TmaKV = decltype(make_tma(nullptr, 1, 1, 1, SmemLayoutKV{}));
  // The dK/dV TMA stores (tma_dkv_epilogue): a (Bn, d) tile of K's / V's shared-memory layout, the
  // box of TmaKV, from smem.k / smem.v to dK / dV ([batch, seq_kv, heads, d], viewed as
  // (seq_kv, d, heads, batch): rows past seq_kv of a batch row are not written).
  static auto make_tma_store_kv(Element* ptr, int32_t seq, int32_t heads, int32_t batch) {
    return make_bshd_tma_store<Element, kHeadDim>(ptr, seq, heads, batch, SmemLayoutKV{});
  }
  using TmaStoreKV = decltype(make_tma_store_kv(nullptr, 1, 1, 1));
};

// Whether a call's dK/dV epilogue goes through K's and V's shared memory and TMA stores: no GQA
// (each KV head's gradient is one unit's tile, written once) and 16-bit gradients (the tile's
// element type). Host (bwd/launch.cu builds the store descriptors) and device (DkDvEpilogue)
// agree on it through this one test.
__host__ __device__ __forceinline__ bool tma_dkv_epilogue(const AttentionParams& p) {
  return p.num_heads == p.num_kv_heads && p.grad_dtype != DType::kFloat32;
}

template <class Traits>
struct WsParams {
  AttentionParams p;
  ScheduleProblem sp;
  int64_t total_items;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaQ tma_do;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaStoreKV tma_dk;  // tma_dkv_epilogue(p) only, else left empty
  typename Traits::TmaStoreKV tma_dv;
  unsigned long long* trace;  // [grid, kWsTraceSlots] or nullptr (no tracing)
  // Deterministic and unmasked (dq_first_store_applies): the step that holds a Q tile's ticket 0
  // stores its partial (bulk_store_f32, as zero_plus(x)) instead of adding it, so dq_accum needs
  // no zeroing; the later tickets add as before. Same values, same bits.
  bool dq_first_store;
};

// Whether the first contribution to each dQ tile is stored rather than added (WsParams::
// dq_first_store): a deterministic schedule (ticket 0 is the first add in a fixed order) and the
// unmasked instantiation (every step of the band is computed, so every Q tile's ticket 0 is; the
// masked one leaves out hidden steps and keeps the zeroed accumulator). Q tiles the band gives
// no KV tile are never written: the postprocess reads them as zero (bwd/postprocess.cuh).
template <class Traits>
constexpr bool dq_first_store_applies(const ScheduleProblem& sp) {
  return !Traits::kMask && sp.schedule != Schedule::kAtomic;
}

}  // namespace jax_dash::sm90::bwd
