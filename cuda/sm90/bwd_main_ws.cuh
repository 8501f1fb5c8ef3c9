// Warp-specialized backward main kernel for sm90, the default backward ("ws-rs"; stages S1-S3 of
// the kernel plan; maintainers/perf-notes.md).
//
// Same work items, visit orders, tickets and tile products as bwd_main.cuh (whose traits it reuses
// for the MMA types and shared-memory layouts), with the work split by role:
//
//   warpgroup 0 ("service", registers lowered to kServiceRegisters)
//     warp 0  PRODUCER: TMA of K_n, V_n once per unit (kv_full); per step TMA of Q_m, dO_m and bulk
//             copies of lse_log2_m, dsum_m into a 2-stage ring (q_full / q_empty mbarriers).
//     warp 1  dQ WRITER: per step, in visit order: waits for tile m's ticket, takes the step's dQ
//             partial from shared memory (dQFull), reduce-adds it into dq_accum with one bulk
//             asynchronous reduction (ticket 0 with dq_first_store: stores it with a bulk copy,
//             dq_accum being unzeroed), frees the buffer once it has been read (dQEmpty), waits for
//             the reduction to complete in global memory, then releases the ticket. With two dQ
//             buffers (kdQStages: head_dim 64) step s uses buffer s % 2 and its own barrier pair.
//             With kdQInStage (head_dim 256) the partial lies in the step's own Q/dO stage and
//             the writer, once it has read it, frees the stage for the producer (q_empty).
//     warps 2-3  exit.
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
// at a time, exactly as in bwd_main.cuh, so the deadlock argument of cuda/schedule.h applies
// unchanged. Inside a CTA every wait points to an earlier step of the same unit.
//
// dq_accum is kept in "fragment order": the (Bm, d) tile of Q tile m is stored as the dQ
// accumulator registers of the 256 math threads, 16-byte chunk k of thread t at float4 index
// k * 256 + t. The bulk reduction then adds one contiguous block per step and the smem stores are
// conflict-free; bwd_postprocess_dq_fragment_kernel maps it back to rows and columns.
//
// dV += P^T dO and dK += dS^T Q take their A operand from registers (stage S3: the 16-bit P^T and
// dS^T in the S^T/dP^T accumulator layout, which is the layout of a register A fragment), so P^T
// never goes through shared memory; dS^T still does, for dQ. Issue order dV (before the math
// barrier), dQ, dK. (The variant with every product from shared memory, "ws", was 4-21% slower and
// is deleted: maintainers/perf-notes.md.)
//
// Bits: every dq_accum element still receives one fp32 add per contribution in ticket order, but
// P is computed as ex2.approx.ftz(fma(S, scale*log2e, -lse*log2e)) (one rounding fewer than
// bwd_main.cuh), so the gradients are a different bits version from bwd_main.cuh's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/bwd_main.cuh"
#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/softmax.cuh"  // exp2_ftz
#include "cuda/sm90/tma.cuh"

namespace jax_dash::sm90::bwd {

using namespace cute;

// Named barriers (0 is __syncthreads).
enum WsBarrier : int {
  kUnitBarrier = 1,     // producer warp + writer warp + math: a unit is published / finished
  kPdSBarrier = 2,      // math: dS^T of this step is in shared memory
  kdQFullBarrier = 3,   // math arrive, writer sync: the step's dQ partial is in shared memory
  kdQEmptyBarrier = 4,  // writer arrive, math sync: the dQ buffer may be overwritten
  kMathBarrier = 5,     // math only: unit fetch, single-buffered dS^T, GQA epilogue
  kdQFullBarrier1 = 6,  // the same pair for the second dQ buffer (kdQStages == 2)
  kdQEmptyBarrier1 = 7,
};
// The full/empty barrier pair of dQ buffer j.
__device__ __forceinline__ int dq_full_barrier(int j) {
  return j ? kdQFullBarrier1 : kdQFullBarrier;
}
__device__ __forceinline__ int dq_empty_barrier(int j) {
  return j ? kdQEmptyBarrier1 : kdQEmptyBarrier;
}

// Opt-in per-role wait trace (tests/sm90_check.cu bench): clock64 cycles one representative thread
// of each role spends waiting, summed per CTA. The slots of CTA c are trace[c * kWsTraceSlots + i].
enum WsTraceSlot : int {
  kTraceMathWaitKV = 0,      // math: K/V of a unit landed
  kTraceMathWaitQ = 1,       // math: Q/dO/lse/dsum stage landed (producer late)
  kTraceMathWaitPdS = 2,     // math: the other warpgroup's dS^T (and, hd64, its dS^T buffer)
  kTraceMathWaitdQEmpty = 3, // math: the writer has not yet read the previous dQ (writer late)
  kTraceWriterWaitTicket = 4,  // writer: ticket of tile m (the schedule's waits)
  kTraceWriterWaitdQFull = 5,  // writer: math has not produced this step's dQ yet
  kTraceWriterWaitReduce = 6,  // writer: bulk reduction issued and read from shared memory
  kTraceProducerWaitEmpty = 7, // producer: a stage is still in use by math
  kTraceMathUnitStart = 8,   // math: fetch, visit tables, publication and K/V wait of a unit
  kTraceMathEpilogue = 9,    // math: dK/dV epilogue and the unit's closing barrier
  kTraceWriterComplete = 10,   // writer: the reduction complete in global memory
  kTraceWriterRelease = 11,    // writer: proxy fence and ticket release (deterministic only)
  // The parts of kTraceMathUnitStart (with kTraceMathWaitKV, the rest of it):
  kTraceMathFetch = 12,      // math: the fetch (an atomicAdd for a new item) and its barrier
  kTraceMathTables = 13,     // math: the unit's visit order and tickets into shared memory
  kTraceMathPublish = 14,    // math: the stores' read-wait and the publication barrier
  kTraceMathUnits = 15,      // math: units done
  kTraceMathSteps = 16,      // math: steps done
  kTraceMathCycles = 17,     // math: cycles from the first fetch to the end
  kWsTraceSlots = 18,
};

// Times one wait of one role into a shared-memory counter when tracing is on (a uniform branch
// otherwise).
struct WsTracer {
  unsigned long long* counters;  // shared memory, or nullptr when tracing is off
  __device__ __forceinline__ long long start() const { return counters ? clock64() : 0; }
  __device__ __forceinline__ void stop(int slot, long long t0) const {
    if (counters) atomicAdd(&counters[slot], static_cast<unsigned long long>(clock64() - t0));
  }
  __device__ __forceinline__ void add(int slot, unsigned long long v) const {
    if (counters) atomicAdd(&counters[slot], v);
  }
};

// kMask: the instantiation that carries the mask policy beyond causal and seq_kv (window, lengths,
// segment ids, soft cap); calls without them run kMask = false, compiled as before.
template <class Element_, int kHeadDim_, bool kMask_>
struct WsTraits {
  using Base = BwdTraits<Element_, kHeadDim_>;
  static constexpr bool kWarpSpecialized = true;
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
  static constexpr int kUnitThreads = 64 + kMathThreads;  // producer + writer warps + math
  static constexpr int kdQThreads = 32 + kMathThreads;    // writer warp + math
  static constexpr int kServiceRegisters = 24;
  static constexpr int kMathRegisters = 240;
  static_assert(kServiceRegisters * 128 + kMathRegisters * kMathThreads <= 65536,
                "register file of one SM");
  static constexpr bool kdQInStage = kSplitD;
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
  static_assert(!kdQInStage || 2 * kBlockM * kHeadDim * sizeof(Element) == kdQBytes,
                "kdQInStage: one stage's Q and dO hold exactly one dQ partial");

  template <int kdSStages>
  struct Storage {
    // The dK/dV epilogue writes dK and dV into k and v (store_dk_dv_tma), or (GQA, float32
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
// element type). Host (bwd_launch.cu builds the store descriptors) and device (ws_math) agree on it
// through this one test.
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
// no KV tile are never written: the postprocess reads them as zero (bwd_postprocess.cuh).
template <class Traits>
constexpr bool dq_first_store_applies(const ScheduleProblem& sp) {
  return !Traits::kMask && sp.schedule != Schedule::kAtomic;
}

// Every value of a dQ partial as zero_plus(x): what it must be when it is stored as a Q tile's
// first contribution (WsParams::dq_first_store) instead of added into a zero.
template <class Frag>
__device__ __forceinline__ void zero_plus_all(Frag& f) {
  CUTE_UNROLL
  for (int i = 0; i < size(f); ++i) f(i) = zero_plus(f(i));
}

// Issues a wgmma chain C (+)= A B with A in registers; the caller waits with warpgroup_wait and
// must not change A's registers before then.
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_rs(TiledMma& mma, TA& tA, TB const& tB, TC& tC) {
  warpgroup_fence_operand(tA);
  warpgroup_fence_operand(tC);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tA); ++k) {
    cute::gemm(mma, tA(_, _, k), tB(_, _, k), tC);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tC);
  warpgroup_fence_operand(tA);
}

// A unit as every role sees it: its head and KV tile (from the global item and the KV tile's index
// within the item), and its number of steps.
struct WsUnit {
  int head_linear;
  int n;  // KV tile
  int num_steps;
};

__device__ __forceinline__ WsUnit read_unit(const ScheduleProblem& sp, int64_t item, int kv,
                                           int num_steps) {
  const int per_head = items_per_head(sp);
  return WsUnit{static_cast<int>(item / per_head),
                item_kv_tile(sp, static_cast<int>(item % per_head), kv), num_steps};
}

// The producer's and the writer's unit hand-off: waits at the unit barrier for the unit the math
// warpgroups published; false when there is no work left.
template <class Traits, class Storage>
__device__ __forceinline__ bool published_unit(const WsParams<Traits>& P, const Storage& smem,
                                               WsUnit* u) {
  named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);
  const int64_t item = smem.unit_item;
  if (item >= P.total_items) return false;
  *u = read_unit(P.sp, item, smem.unit_kv, smem.unit_num_steps);
  return true;
}

// ---- producer warp ------------------------------------------------------------------------------
template <class Traits, class Storage>
__device__ __forceinline__ void ws_producer(const WsParams<Traits>& P, Storage& smem,
                                            const int32_t* visit_m) {
  using Element = typename Traits::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  const AttentionParams& p = P.p;
  const bool leader = cute::elect_one_sync();
  const int32_t seq_q = static_cast<int32_t>(p.seq_q);
  const int32_t seq_kv = static_cast<int32_t>(p.seq_kv);
  const int32_t batch = static_cast<int32_t>(p.batch);
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t rows_q = static_cast<int64_t>(P.sp.num_q_tiles) * kBlockM;
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                     p.num_kv_heads, p.head_dim);
  const float* lse_log2_g = p.workspace_f32 + ws.lse_log2;
  const float* dsum_g = p.workspace_f32 + ws.dsum;
  const WsTracer tracer{P.trace != nullptr && leader ? smem.trace : nullptr};

  Tensor mQ = P.tma_q.get_tma_tensor(make_shape(seq_q, HeadDim{}, p.num_heads, batch));
  Tensor mdO = P.tma_do.get_tma_tensor(make_shape(seq_q, HeadDim{}, p.num_heads, batch));
  Tensor mK = P.tma_k.get_tma_tensor(make_shape(seq_kv, HeadDim{}, p.num_kv_heads, batch));
  Tensor mV = P.tma_v.get_tma_tensor(make_shape(seq_kv, HeadDim{}, p.num_kv_heads, batch));
  auto tma_q = P.tma_q.get_slice(_0{});
  auto tma_do = P.tma_do.get_slice(_0{});
  auto tma_k = P.tma_k.get_slice(_0{});
  auto tma_v = P.tma_v.get_slice(_0{});
  Tensor tKsK = tma_k.partition_D(make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKV{}));
  Tensor tVsV = tma_v.partition_D(make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutKV{}));

  int q_iter = 0;  // steps issued so far (all units): stage = q_iter % 2, phase = (q_iter / 2) & 1
  WsUnit u;
  while (published_unit(P, smem, &u)) {
    const int num_steps = u.num_steps;
    const int b = u.head_linear / p.num_heads;
    const int h = u.head_linear % p.num_heads;
    const int kvh = h / group;
    if (num_steps > 0 && leader) {
      Tensor gK = local_tile(mK(_, _, kvh, b), Shape<BlockN, HeadDim>{}, make_coord(u.n, _0{}));
      Tensor gV = local_tile(mV(_, _, kvh, b), Shape<BlockN, HeadDim>{}, make_coord(u.n, _0{}));
      Barrier::arrive_and_expect_tx(&smem.kv_full, Traits::kKVBytes);
      copy(P.tma_k.with(smem.kv_full), tma_k.partition_S(gK), tKsK);
      copy(P.tma_v.with(smem.kv_full), tma_v.partition_S(gV), tVsV);
    }
    Tensor gQ = local_tile(mQ(_, _, h, b), Shape<BlockM, HeadDim>{}, make_coord(_, _0{}));   // (Bm,d,Nq)
    Tensor gdO = local_tile(mdO(_, _, h, b), Shape<BlockM, HeadDim>{}, make_coord(_, _0{}));  // (Bm,d,Nq)
    Tensor tQgQ = tma_q.partition_S(gQ);     // (TMA,TMA_M,TMA_D,Nq)
    Tensor tdOgdO = tma_do.partition_S(gdO);
    const int64_t head_rows = static_cast<int64_t>(u.head_linear) * rows_q;
    for (int s = 0; s < num_steps; ++s, ++q_iter) {
      const int stage = q_iter % Traits::kStages;
      const int phase = (q_iter / Traits::kStages) & 1;
      // The first use of each stage passes at once (waiting for the phase before the first).
      const long long t0 = tracer.start();
      cutlass::arch::ClusterBarrier::wait(&smem.q_empty[stage], phase ^ 1);
      tracer.stop(kTraceProducerWaitEmpty, t0);
      if (leader) {
        const int m = visit_m[s];
        Tensor sQ = make_tensor(make_smem_ptr(smem.q[stage]), typename Traits::SmemLayoutQ{});
        Tensor sdO = make_tensor(make_smem_ptr(smem.dout[stage]), typename Traits::SmemLayoutQ{});
        Barrier::arrive_and_expect_tx(&smem.q_full[stage], Traits::kQStageBytes);
        copy(P.tma_q.with(smem.q_full[stage]), tQgQ(_, _, _, m), tma_q.partition_D(sQ));
        copy(P.tma_do.with(smem.q_full[stage]), tdOgdO(_, _, _, m), tma_do.partition_D(sdO));
        const int64_t row0 = head_rows + static_cast<int64_t>(m) * kBlockM;
        bulk_copy_g2s(smem.lse_log2[stage], lse_log2_g + row0, kBlockM * sizeof(float),
                      &smem.q_full[stage]);
        bulk_copy_g2s(smem.dsum[stage], dsum_g + row0, kBlockM * sizeof(float),
                      &smem.q_full[stage]);
      }
      __syncwarp();
    }
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);
  }
}

// ---- dQ writer warp -----------------------------------------------------------------------------
template <class Traits, class Storage>
__device__ __forceinline__ void ws_dq_writer(const WsParams<Traits>& P, Storage& smem,
                                             const int32_t* visit_m,
                                             const int32_t* visit_ticket) {
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
  const WsTracer tracer{P.trace != nullptr && leader ? smem.trace : nullptr};
  int q_iter = 0;  // kdQInStage: steps so far (all units), as the producer counts them

  WsUnit u;
  while (published_unit(P, smem, &u)) {
    const int num_steps = u.num_steps;
    // The buffers are free for the unit's first steps (the previous unit's reductions were waited
    // for).
    if constexpr (!Traits::kdQInStage) {
      for (int j = 0; j < Traits::kdQStages && j < num_steps; ++j)
        named_barrier_arrive(dq_empty_barrier(j), Traits::kdQThreads);
    }
    for (int s = 0; s < num_steps; ++s, ++q_iter) {
      // kdQInStage: the stage's barrier; otherwise the buffer's.
      const int buf = Traits::kdQInStage ? q_iter % Traits::kStages
                                         : (Traits::kdQStages == 1 ? 0 : s % Traits::kdQStages);
      const int m = visit_m[s];
      int32_t* sem = dq_sem + static_cast<int64_t>(u.head_linear) * P.sp.num_q_tiles + m;
      // Wait for the ticket first: the spin overlaps the math warpgroups' work on this step.
      if (deterministic && leader) {
        const long long t0 = tracer.start();
        spin_until_equal(sem, visit_ticket[s]);
        tracer.stop(kTraceWriterWaitTicket, t0);
        fence_async_global();  // the bulk reduction below is ordered after the acquire
      }
      __syncwarp();
      const long long t_full = tracer.start();
      named_barrier_sync(dq_full_barrier(buf), Traits::kdQThreads);
      tracer.stop(kTraceWriterWaitdQFull, t_full);
      const long long t_reduce = tracer.start();
      if (leader) {
        float* tile = dq_accum + (static_cast<int64_t>(u.head_linear) * rows_q +
                                  static_cast<int64_t>(m) * kBlockM) * kHeadDim;
        // The first contribution (ticket 0, dq_first_store) is stored: dq_accum was not zeroed.
        const bool store = P.dq_first_store && visit_ticket[s] == 0;
        auto put = [&](float* dst, const float* src, uint32_t bytes) JAX_DASH_INLINE {
          if (store) {
            bulk_store_f32(dst, src, bytes);
          } else {
            bulk_reduce_add_f32(dst, src, bytes);
          }
        };
        if constexpr (Traits::kdQInStage) {
          // The partial's first half lies in the stage's Q buffer, the second in its dO buffer.
          constexpr uint32_t kHalf = Traits::kdQBytes / 2;
          put(tile, reinterpret_cast<const float*>(smem.q[buf]), kHalf);
          put(tile + Traits::kdQFloats / 2, reinterpret_cast<const float*>(smem.dout[buf]),
              kHalf);
        } else {
          put(tile, smem.dq[buf], Traits::kdQBytes);
        }
        bulk_commit_group();
        bulk_wait_group_read_all();
        // kdQInStage: the stage is read; the producer may load a later step's Q/dO into it.
        if constexpr (Traits::kdQInStage) cutlass::arch::ClusterBarrier::arrive(&smem.q_empty[buf]);
      }
      __syncwarp();
      tracer.stop(kTraceWriterWaitReduce, t_reduce);
      if (!Traits::kdQInStage && s + Traits::kdQStages < num_steps) {
        named_barrier_arrive(dq_empty_barrier(buf), Traits::kdQThreads);
      }
      if (leader) {
        // Release only once the adds are complete in global memory (not merely read from shared
        // memory): the next ticket holder's adds must land after ours.
        const long long t_complete = tracer.start();
        bulk_wait_group_all();
        tracer.stop(kTraceWriterComplete, t_complete);
        if (deterministic) {
          const long long t_release = tracer.start();
          fence_async_global();
          red_release_gpu_add(sem, 1);
          tracer.stop(kTraceWriterRelease, t_release);
        }
      }
      __syncwarp();
    }
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);
  }
  if (leader) bulk_wait_group_all();
}

// Rows with lengths or segment ids (kMask): the unit's visit order and tickets with the band's steps
// that no query can see left out (past a length, or id ranges that do not meet: cuda/mask.h's tile
// test on bwd_tile_segments_kernel's ranges). A kept step's ticket is its rank among tile m's
// visible contributors in the band's ticket order (schedules.without_hidden_pairs), so the adds that
// remain keep the band's order and the bits are those of computing every step (a left-out pair adds
// only zeros). Called by all math threads (one named barrier); returns the number of kept steps,
// also stored to *unit_num_steps for the other roles. Out of line: it runs once per unit, and its
// loops must not weigh on the step loop's registers.
template <int kBlockM, int kBlockN, int kMathThreads>
__device__ __forceinline__ int visible_unit_tables(const AttentionParams& p, const ScheduleProblem& sp,
                                                WsUnit u, int tid, bool deterministic,
                                                const SegmentRange* tile_segments,
                                                int32_t* visit_m, int32_t* visit_ticket,
                                                int32_t* unit_num_steps) {
  const int band_steps = q_visit_count(sp, u.head_linear, u.n);
  const int64_t row_b = u.head_linear / p.num_heads;
  const MaskPolicy mp = mask_policy(p, row_b);
  const SegmentRange* row_segments = tile_segments + row_b * (sp.num_q_tiles + sp.num_kv_tiles);
  auto pair_visible = [&](int m, int n) JAX_DASH_INLINE {
    SegmentRange qr{1, 0}, kr{1, 0};  // unused without segment ids
    if (mp.row.q_segment_ids != nullptr) {
      qr = row_segments[m];
      kr = row_segments[sp.num_q_tiles + n];
    }
    return mp.tile(static_cast<int64_t>(m) * kBlockM, kBlockM, static_cast<int64_t>(n) * kBlockN,
                   kBlockN, qr, kr) != TileVisibility::kInvisible;
  };
  if (tid < 32) {  // the first math warp compacts the visit order, 32 steps at a time
    int kept = 0;
    for (int base = 0; base < band_steps; base += 32) {
      const int s = base + tid;
      int visit = 0;
      bool keep = false;
      if (s < band_steps) {
        visit = q_visit_tile(sp, u.head_linear, u.n, s);
        keep = pair_visible(visit, u.n);
      }
      const unsigned keep_mask = __ballot_sync(0xffffffffu, keep);
      if (keep) visit_m[kept + __popc(keep_mask & ((1u << tid) - 1u))] = visit;
      kept += __popc(keep_mask);
    }
    if (tid == 0) *unit_num_steps = kept;
  }
  named_barrier_sync(kMathBarrier, kMathThreads);
  const int num_steps = *unit_num_steps;
  const Schedule eff = effective_schedule(sp);
  const bool by_kv_tile = eff == Schedule::kAscending || eff == Schedule::kDescending;
  for (int s = tid; s < num_steps && deterministic; s += kMathThreads) {
    const int m = visit_m[s];
    const int first = first_kv_tile(sp, m);
    int rank = 0;
    if (by_kv_tile) {  // band ticket n - first: count the visible tiles before n
      for (int n2 = first; n2 < u.n; ++n2) rank += pair_visible(m, n2) ? 1 : 0;
    } else {
      const int ticket = dq_ticket(sp, u.head_linear, m, u.n);
      const int end = first + num_kv_tiles_seen(sp, m);
      for (int n2 = first; n2 < end; ++n2) {
        if (n2 != u.n && pair_visible(m, n2) && dq_ticket(sp, u.head_linear, m, n2) < ticket)
          ++rank;
      }
    }
    visit_ticket[s] = rank;
  }
  return num_steps;
}

// The dK/dV epilogue of a unit without GQA and with 16-bit gradients (tma_dkv_epilogue, the common
// case): dK * scale and dV, rounded to Element, go into K's and V's shared-memory tiles in the
// layout their TMA loads use (SmemLayoutKV), and one thread stores both tiles with TMA (rows past
// seq_kv are clipped by the copy engine). Elements 2i, 2i+1 of the accumulator are adjacent columns
// of one row (wgmma's C layout), so of one 16-byte chunk of the swizzled row: one st.shared.b32 per
// pair (cute's copy into a swizzled tile compiles to generic stores with 64-bit address math). One
// rounding of dk * scale and of dv to Element, as in every epilogue: the same bits.
// K and V are free once the first barrier has passed: this warpgroup's wgmmas of the unit are
// complete (the step loop's last wait) and the barrier waits for the other's (its dQ wgmma reads
// every K row). The producer writes K and V again only with the next unit's loads, issued after the
// next unit's publication barrier, and the leader (tid 0) waits for the stores' shared-memory reads
// before it arrives there (ws_math). Returns with the leader's stores committed, not waited for.
template <class Traits, class Storage, class ThrMma, class Acc>
__device__ __forceinline__ void store_dk_dv_tma(const WsParams<Traits>& P, Storage& smem,
                                                const ThrMma& thr_dkv, int tid, float scale,
                                                int b, int h, int n, const Acc& dk, const Acc& dv) {
  using Element = typename Traits::Element;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKV{});  // (Bn, d)
  Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutKV{});
  Tensor tdKsK = thr_dkv.partition_C(sK);  // this thread's accumulator elements (tdKVc's coords)
  Tensor tdVsV = thr_dkv.partition_C(sV);
  static_assert(decltype(size(tdKsK))::value == decltype(size(dk))::value);
  // The other warpgroup's last wgmmas may still read K (dQ = dS K reads every K row).
  named_barrier_sync(kMathBarrier, Traits::kMathThreads);
  CUTE_UNROLL
  for (int i = 0; i < size(dk); i += 2) {
    st_shared_u32(&tdKsK(i), pack_pair(static_cast<Element>(dk(i) * scale),
                                       static_cast<Element>(dk(i + 1) * scale)));
    st_shared_u32(&tdVsV(i),
                  pack_pair(static_cast<Element>(dv(i)), static_cast<Element>(dv(i + 1))));
  }
  fence_async_shared();  // generic smem writes -> the TMA stores' reads
  named_barrier_sync(kMathBarrier, Traits::kMathThreads);
  if (tid == 0) {
    const AttentionParams& p = P.p;
    const auto shape = make_shape(static_cast<int32_t>(p.seq_kv), HeadDim{}, p.num_kv_heads,
                                  static_cast<int32_t>(p.batch));
    Tensor mdK = P.tma_dk.get_tma_tensor(shape);
    Tensor mdV = P.tma_dv.get_tma_tensor(shape);
    Tensor gdK = local_tile(mdK(_, _, h, b), Shape<BlockN, HeadDim>{}, make_coord(n, _0{}));
    Tensor gdV = local_tile(mdV(_, _, h, b), Shape<BlockN, HeadDim>{}, make_coord(n, _0{}));
    auto tma_dk = P.tma_dk.get_slice(_0{});
    auto tma_dv = P.tma_dv.get_slice(_0{});
    copy(P.tma_dk, tma_dk.partition_S(sK), tma_dk.partition_D(gdK));
    copy(P.tma_dv, tma_dv.partition_S(sV), tma_dv.partition_D(gdV));
    bulk_commit_group();
  }
}

// The dK/dV epilogue with GQA or float32 gradients, staged through shared memory in float32:
// each of dK and dV in turn goes from the fragments to shared memory (16-byte chunks XOR-swizzled
// by row, so the fragments' 8-byte stores are conflict-free without padding: 64 KB a tensor at
// head_dim 128, which K, V, Q and dO hold), then moves in 16-byte coalesced chunks. With GQA the
// query heads of a group add into the float32 accumulators in dkv_ticket order (the chain of
// store_dk_dv, same adds: sum = accumulator + partial, so the same bits), the last one writes
// sum * scale (dK) and sum (dV) in the gradient dtype; without GQA (float32 gradients) the partial
// goes out directly. store_dk_dv did all of it one 4-byte element at a time. With accumulate
// (float32) what would be written is added to the output's value instead (accumulate_f32).
template <class Element, int kHeadDim, int kBlockN, int kMathThreads, class Acc, class Coords>
__device__ __forceinline__ void store_dk_dv_staged_f32(const AttentionParams& p,
                                                       const ScheduleProblem& sp, int tid,
                                                       float scale, int64_t b, int h, int n,
                                                       int64_t kv0, const Acc& dk, const Acc& dv,
                                                       const Coords& coords, float* stage) {
  using namespace cute;
  constexpr int kChunks = kHeadDim / 4;  // 16-byte chunks of a float32 row
  static_assert(kChunks >= 8 && kChunks % 8 == 0, "the swizzle permutes chunks in groups of 8");
  // Float index of (row, column): chunk c / 4 of row r at chunk (c / 4) ^ (2 * (r % 4)). A
  // half-warp's 8-byte fragment stores cover rows r..r+3, chunks {2k, 2k+1} each: 8 distinct
  // chunks, 128 bytes, every bank once; a quarter-warp's 16-byte reads of 8 consecutive chunks
  // of one row stay a permutation of them.
  auto staged = [&](int r, int c) JAX_DASH_INLINE {
    return r * kHeadDim + (((c / 4) ^ (2 * (r % 4))) * 4) + c % 4;
  };
  const int group = p.num_heads / p.num_kv_heads;
  const int kvh = h / group;
  const bool f32 = p.grad_dtype == DType::kFloat32;
  const int64_t kv_row_stride = static_cast<int64_t>(p.num_kv_heads) * kHeadDim;
  const int64_t out_base =
      (b * p.seq_kv + kv0) * kv_row_stride + static_cast<int64_t>(kvh) * kHeadDim;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockN), p.seq_kv - kv0));
  const BwdWorkspaceLayout ws = bwd_workspace_layout(p.batch, p.seq_q, p.seq_kv, p.num_heads,
                                                     p.num_kv_heads, p.head_dim);
  const int64_t kv_head_linear = b * p.num_kv_heads + kvh;
  const int64_t rows_kv = static_cast<int64_t>(sp.num_kv_tiles) * sp.block_n;
  const int ticket = group > 1 ? dkv_ticket(sp, h % group, n) : 0;
  const bool last = ticket == group - 1;
  int32_t* sem = p.workspace_i32 + ws.dkv_semaphore + kv_head_linear * sp.num_kv_tiles + n;
  // The other warpgroup's last wgmmas may still read K, Q and dO; with GQA, wait for the turn.
  if (group > 1 && tid == 0) spin_until_equal(sem, ticket);
  named_barrier_sync(kMathBarrier, kMathThreads);
  // One tensor: fragments -> shared memory -> (accumulator, output) in 16-byte chunks.
  auto move = [&](const Acc& part, float out_scale, int64_t accum_offset, void* out)
                  JAX_DASH_INLINE {
    float* accum = p.workspace_f32 + accum_offset + (kv_head_linear * rows_kv + kv0) * kHeadDim;
    // Elements 2i, 2i+1 of the accumulator are adjacent columns of one row (wgmma's C layout).
    CUTE_UNROLL
    for (int i = 0; i < size(part); i += 2) {
      const int r = get<0>(coords(i));
      const int c = get<1>(coords(i));
      *reinterpret_cast<float2*>(stage + staged(r, c)) = make_float2(part(i), part(i + 1));
    }
    named_barrier_sync(kMathBarrier, kMathThreads);
    for (int x = tid; x < kBlockN * kChunks; x += kMathThreads) {
      const int r = x / kChunks;
      const int c = (x % kChunks) * 4;
      float4 v = *reinterpret_cast<const float4*>(stage + staged(r, c));
      if (group > 1) {
        const float4 a = __ldcg(reinterpret_cast<const float4*>(accum + r * kHeadDim + c));
        v = make_float4(a.x + v.x, a.y + v.y, a.z + v.z, a.w + v.w);
        if (!last) {
          __stcg(reinterpret_cast<float4*>(accum + r * kHeadDim + c), v);
          continue;
        }
      }
      if (r >= rows) continue;
      const int64_t o = out_base + r * kv_row_stride + c;
      const float4 w =
          make_float4(v.x * out_scale, v.y * out_scale, v.z * out_scale, v.w * out_scale);
      if (f32) {
        float4* dst = reinterpret_cast<float4*>(static_cast<float*>(out) + o);
        if (p.accumulate) {  // the ring's running sum: dst = dst + w
          const float4 sum = *dst;
          *dst = make_float4(accumulate_f32(sum.x, w.x), accumulate_f32(sum.y, w.y),
                             accumulate_f32(sum.z, w.z), accumulate_f32(sum.w, w.w));
        } else {
          *dst = w;
        }
      } else {
        const uint2 packed =
            make_uint2(pack_pair(static_cast<Element>(w.x), static_cast<Element>(w.y)),
                       pack_pair(static_cast<Element>(w.z), static_cast<Element>(w.w)));
        *reinterpret_cast<uint2*>(static_cast<Element*>(out) + o) = packed;
      }
    }
  };
  move(dk, scale, ws.dk_accum, p.dk);
  named_barrier_sync(kMathBarrier, kMathThreads);  // every chunk of dK read before dV's stores
  move(dv, 1.f, ws.dv_accum, p.dv);
  if (group > 1 && !last) {
    __threadfence();
    named_barrier_sync(kMathBarrier, kMathThreads);
    if (tid == 0) red_release_gpu_add(sem, 1);
  }
}

// ---- math warpgroups ----------------------------------------------------------------------------
template <class Traits, class Storage>
__device__ __forceinline__ void ws_math(const WsParams<Traits>& P, Storage& smem,
                                        int32_t* visit_m, int32_t* visit_ticket) {
  using Element = typename Traits::Element;
  using BlockM = typename Traits::BlockM;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
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
  const float soft_cap = Traits::kMask ? p.logits_soft_cap : 0.f;
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

  // kSplitD: the two 64-column halves of this warpgroup's dQ (TiledMmadQHalf), B = K^T rows
  // [128 w + 64 h, +64) of the (d, Bn) view.
  typename Traits::TiledMmadQHalf mma_dq_half;
  auto thr_dq_half = mma_dq_half.get_thread_slice(tid % 128);
  const int dq_block0 = 2 * (tid / 128);
  Tensor tdQrKt0 = thr_dq_half.partition_fragment_B(
      local_tile(sKt, Shape<_64, BlockN>{}, make_coord(dq_block0, _0{})));
  Tensor tdQrKt1 = thr_dq_half.partition_fragment_B(
      local_tile(sKt, Shape<_64, BlockN>{}, make_coord(dq_block0 + 1, _0{})));
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);  // (MMA, MMA_M, MMA_K) descriptors
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);

  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});    // (MMA, MMA_M, MMA_N)
  Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<BlockN, BlockM>{});
  Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<BlockN, HeadDim>{});
  Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<BlockN, HeadDim>{});
  Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<BlockM, HeadDim>{});
  static_assert(decltype(size(tdQrdQ))::value == Traits::kdQFloatsPerThread);

  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<BlockN, BlockM>{}));
  Tensor tdKVc = thr_dkv.partition_C(make_identity_tensor(Shape<BlockN, HeadDim>{}));
  const WsTracer tracer{P.trace != nullptr && tid == 0 ? smem.trace : nullptr};
  const long long t_begin = tracer.start();

  int64_t item = -1;
  int kv = 0;
  int q_iter = 0;
  int kv_loads = 0;
  while (true) {
    const long long t_unit = tracer.start();
    // Fetch the next unit: the rest of this item, else the next untaken item (in-order fetch).
    if (tid == 0) {
      const bool same_item =
          item >= 0 && kv + 1 < item_num_kv_tiles(sp, static_cast<int>(item % items_per_head(sp)));
      const int64_t next = same_item ? item : static_cast<int64_t>(atomicAdd(item_counter, 1));
      smem.unit_item = next;
      smem.unit_kv = same_item ? kv + 1 : 0;
    }
    named_barrier_sync(kMathBarrier, kMathThreads);
    item = smem.unit_item;
    kv = smem.unit_kv;
    tracer.stop(kTraceMathFetch, t_unit);
    const long long t_tables = tracer.start();
    const bool done = item >= P.total_items;
    WsUnit u{};
    int num_steps = 0;
    if (!done) {
      u = read_unit(sp, item, kv, 0);
      // Visit order and tickets of this unit go to shared memory: the producer, the writer and
      // the math read them at every step.
      if (drop_hidden) {
        num_steps = visible_unit_tables<kBlockM, kBlockN, kMathThreads>(
            p, sp, u, tid, deterministic, tile_segments, visit_m, visit_ticket,
            &smem.unit_num_steps);
      } else if (Traits::kMask && !ws.unit_tables) {
        // No unit tables in the workspace (a long sequence over few heads): this unit's, from
        // cuda/schedule.h (only the masked instantiation runs without them: bwd_launch.cu).
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
    // The previous unit's dK/dV TMA stores (store_dk_dv_tma) read K's and V's tiles: they must be
    // read before this barrier releases the producer to load the next unit's K and V into them.
    if (tid == 0) bulk_wait_group_read_all();
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);  // publish unit and tables
    tracer.stop(kTraceMathPublish, t_publish);
    if (done) break;

    const int64_t b = u.head_linear / p.num_heads;
    const int h = u.head_linear % p.num_heads;
    const int64_t kv0 = static_cast<int64_t>(u.n) * kBlockN;
    // This batch row's whole mask (ext_mask only).
    PolicyMask policy{};
    if (ext_mask) policy.m = mask_policy(p, b);
    // Whether query q_row does not see key kv_row: the whole policy (ext_mask), else the
    // extents and causal.
    auto hidden = [&](int64_t kv_row, int64_t q_row) JAX_DASH_INLINE {
      return ext_mask ? !policy.visible(q_row, kv_row)
                      : kv_row >= p.seq_kv || (p.is_causal && kv_row > q_row);
    };
    clear(tdKrdK);
    clear(tdVrdV);
    if (num_steps > 0) {
      const long long t0 = tracer.start();
      cutlass::arch::ClusterTransactionBarrier::wait(&smem.kv_full, kv_loads & 1);
      tracer.stop(kTraceMathWaitKV, t0);
      ++kv_loads;
      tracer.add(kTraceMathSteps, num_steps);
    }
    tracer.stop(kTraceMathUnitStart, t_unit);
    tracer.add(kTraceMathUnits, 1);

    for (int step = 0; step < num_steps; ++step, ++q_iter) {
      const int stage = q_iter % Traits::kStages;
      const int ds_stage = Traits::kdSStages == 1 ? 0 : q_iter % Traits::kdSStages;
      const int m = visit_m[step];
      // This step's partial is stored, not added (WsParams::dq_first_store): as zero_plus(x).
      const bool dq_first = P.dq_first_store && visit_ticket[step] == 0;
      const long long t_q = tracer.start();
      cutlass::arch::ClusterTransactionBarrier::wait(&smem.q_full[stage],
                                                     (q_iter / Traits::kStages) & 1);
      tracer.stop(kTraceMathWaitQ, t_q);

      Tensor sQ = make_tensor(make_smem_ptr(smem.q[stage]), typename Traits::SmemLayoutQ{});
      Tensor sdO = make_tensor(make_smem_ptr(smem.dout[stage]), typename Traits::SmemLayoutQ{});
      Tensor sQt = make_tensor(make_smem_ptr(smem.q[stage]), typename Traits::SmemLayoutQt{});
      Tensor sdOt = make_tensor(make_smem_ptr(smem.dout[stage]), typename Traits::SmemLayoutQt{});
      Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
      Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
      gemm_ss<true>(mma_sdp, tSrK, tSrQ, tSrS);
      gemm_ss<true>(mma_sdp, tSrV, tSrdO, tSrdP);

      const float* s_lse = smem.lse_log2[stage];
      const float* s_dsum = smem.dsum[stage];
      const int64_t q0 = static_cast<int64_t>(m) * kBlockM;
      // Masks only where a tile crosses seq_kv or the causal diagonal (rows past seq_q have
      // lse_log2 = +inf, so their P is already 0).
      const bool need_mask =
          ext_mask ? policy.tile_needs_mask(q0, kBlockM, kv0, kBlockN)
                   : kv0 + kBlockN > p.seq_kv || (p.is_causal && kv0 + kBlockN - 1 > q0);
      if (soft_cap > 0.f) {
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
          tSrdP(i) = prob * (tSrdP(i) - s_dsum[c]) * (1.f - t * t);
        }
      } else {
        warpgroup_wait<1>();
        warpgroup_fence_operand(tSrS);
        // The mask test is per tile (need_mask), so the element loop has no branch in it: the
        // masked and the unmasked tile each get their own straight-line loop (the same
        // arithmetic).
        // (kSegments decided per tile: no branch in the element loop.)
        auto masked_probs = [&](auto segments) JAX_DASH_INLINE {
          constexpr bool kSegments = decltype(segments)::value;
          CUTE_UNROLL
          for (int i = 0; i < size(tSrS); ++i) {
            const float prob = exp2_ftz(fmaf(tSrS(i), scale_log2, -s_lse[get<1>(tScS(i))]));
            const bool visible = policy.template visible<kSegments>(q0 + get<1>(tScS(i)),
                                                                    kv0 + get<0>(tScS(i)));
            tSrS(i) = visible ? prob : 0.f;
          }
        };
        if (need_mask && ext_mask && policy.has_segments()) {
          masked_probs(std::true_type{});
        } else if (need_mask && ext_mask) {
          masked_probs(std::false_type{});
        } else if (need_mask) {
          CUTE_UNROLL
          for (int i = 0; i < size(tSrS); ++i) {
            const int64_t kv_row = kv0 + get<0>(tScS(i));  // kv row
            const int64_t q_row = q0 + get<1>(tScS(i));    // q row
            const float prob = exp2_ftz(fmaf(tSrS(i), scale_log2, -s_lse[get<1>(tScS(i))]));
            const bool hidden = kv_row >= p.seq_kv || (p.is_causal && kv_row > q_row);
            tSrS(i) = hidden ? 0.f : prob;
          }
        } else {
          CUTE_UNROLL
          for (int i = 0; i < size(tSrS); ++i) {
            tSrS(i) = exp2_ftz(fmaf(tSrS(i), scale_log2, -s_lse[get<1>(tScS(i))]));
          }
        }
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrdP);
        CUTE_UNROLL
        for (int i = 0; i < size(tSrdP); ++i) {
          tSrdP(i) = tSrS(i) * (tSrdP(i) - s_dsum[get<1>(tScS(i))]);
        }
      }
      Tensor sdSt = make_tensor(make_smem_ptr(smem.dst[ds_stage]), typename Traits::SmemLayoutPt{});
      Tensor sdS = make_tensor(make_smem_ptr(smem.dst[ds_stage]), typename Traits::SmemLayoutdS{});
      Tensor tPsdSt = thr_sdp.partition_C(sdSt);
      Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
      Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);
      Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);
      // P^T and dS^T in 16 bits, in the accumulator's register order.
      Tensor rP = make_tensor<Element>(tSrS.layout());
      Tensor rdS = make_tensor<Element>(tSrdP.layout());
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        rP(i) = static_cast<Element>(tSrS(i));
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
      // dV needs nothing from the other warpgroup: issue it before the barrier.
      gemm_rs<false>(mma_dkv, tdVrP, tdVrdOt, tdVrdV);
      // With one dS^T buffer, the other warpgroup's dQ wgmma of the previous step may still read
      // it: wait until both warpgroups are past that step.
      if constexpr (Traits::kdSStages == 1) {
        const long long t_ds = tracer.start();
        named_barrier_sync(kMathBarrier, kMathThreads);
        tracer.stop(kTraceMathWaitPdS, t_ds);
      }
      // Elements 2i, 2i+1 are adjacent q columns of one kv row: one 32-bit store per pair.
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); i += 2) {
        // kSplitD: both warpgroups hold the whole tile; each stores its half of the fragment.
        if (Traits::kSplitD && (i < size(tSrS) / 2) != first_warpgroup) continue;
        st_shared_u32(&tPsdSt(i), pack_pair(rdS(i), rdS(i + 1)));
      }
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
        if constexpr (Traits::kdQInStage) {
          warpgroup_wait<0>();  // dV, dQ, dK: this warpgroup is done with the stage's Q and dO
        } else {
          warpgroup_wait<1>();  // dV and dQ (wgmma groups complete in order); dK may still run
        }
      }
      warpgroup_fence_operand(tdQrdQ);
      if constexpr (Traits::kdQInStage) {
        // Hand dQ to the writer in the step's own stage, once the other warpgroup's wgmmas are
        // done with it too (fragment order as below: chunks k < half of each thread in Q's
        // buffer, the rest in dO's). The writer frees the stage (q_empty) after reading it.
        warpgroup_fence_operand(tdKrdK);
        warpgroup_fence_operand(tdVrdV);
        const long long t_stage = tracer.start();
        named_barrier_sync(kMathBarrier, kMathThreads);
        tracer.stop(kTraceMathWaitdQEmpty, t_stage);
        constexpr int kChunks = Traits::kdQFloatsPerThread / 4;
        float4* lo = reinterpret_cast<float4*>(smem.q[stage]);
        float4* hi = reinterpret_cast<float4*>(smem.dout[stage]);
        if constexpr (Traits::kSplitD) {
          // Half h's 32 values are chunks 8h..8h+7 of the fragment: half 0 to Q's buffer, half 1
          // to dO's.
          Tensor tdQrdS_h = thr_dq_half.partition_fragment_A(sdS);
          auto half = [&](const auto& tdQrKt_h, float4* dst) JAX_DASH_INLINE {
            Tensor acc = partition_fragment_C(mma_dq_half, Shape<BlockM, _64>{});
            static_assert(decltype(size(acc))::value * 2 == Traits::kdQFloatsPerThread);
            gemm_ss<true>(mma_dq_half, tdQrdS_h, tdQrKt_h, acc);
            warpgroup_wait<0>();
            warpgroup_fence_operand(acc);
            if (dq_first) zero_plus_all(acc);
            CUTE_UNROLL
            for (int k = 0; k < kChunks / 2; ++k) {
              dst[k * kMathThreads + tid] =
                  make_float4(acc(4 * k), acc(4 * k + 1), acc(4 * k + 2), acc(4 * k + 3));
            }
          };
          half(tdQrKt0, lo);
          half(tdQrKt1, hi);
        } else {
          if (dq_first) zero_plus_all(tdQrdQ);
          CUTE_UNROLL
          for (int k = 0; k < kChunks; ++k) {
            const float4 v = make_float4(tdQrdQ(4 * k), tdQrdQ(4 * k + 1), tdQrdQ(4 * k + 2),
                                         tdQrdQ(4 * k + 3));
            if (k < kChunks / 2) {
              lo[k * kMathThreads + tid] = v;
            } else {
              hi[(k - kChunks / 2) * kMathThreads + tid] = v;
            }
          }
        }
        fence_async_shared();  // generic smem stores -> the writer's bulk reductions
        // No q_empty arrival here: the writer frees the stage.
        named_barrier_arrive(dq_full_barrier(stage), Traits::kdQThreads);
      } else {
      // Hand dQ to the writer: wait until it has read the previous step's partial, store this one
      // in fragment order (16-byte chunk k of thread t at float4 k * 256 + t), publish.
      const int dq_buf = Traits::kdQStages == 1 ? 0 : step % Traits::kdQStages;
      const long long t_empty = tracer.start();
      named_barrier_sync(dq_empty_barrier(dq_buf), Traits::kdQThreads);
      tracer.stop(kTraceMathWaitdQEmpty, t_empty);
      float4* sdq = reinterpret_cast<float4*>(smem.dq[dq_buf]);
      if (dq_first) zero_plus_all(tdQrdQ);
      CUTE_UNROLL
      for (int k = 0; k < Traits::kdQFloatsPerThread / 4; ++k) {
        sdq[k * kMathThreads + tid] =
            make_float4(tdQrdQ(4 * k), tdQrdQ(4 * k + 1), tdQrdQ(4 * k + 2), tdQrdQ(4 * k + 3));
      }
      fence_async_shared();  // generic smem stores -> the writer's bulk reduction
      named_barrier_arrive(dq_full_barrier(dq_buf), Traits::kdQThreads);

      warpgroup_wait<0>();  // dV, dK: this step no longer reads Q/dO of this stage
      warpgroup_fence_operand(tdKrdK);
      warpgroup_fence_operand(tdVrdV);
      __syncwarp();
      if (cute::elect_one_sync()) {
        cutlass::arch::ClusterBarrier::arrive(&smem.q_empty[stage]);
      }
      }  // !kdQInStage
    }

    // Epilogue: dK = scale * sum dS^T Q, dV = sum P^T dO (bwd_main.cuh's, over the math threads).
    // Without GQA and with 16-bit gradients through K's and V's tiles and TMA stores, in every
    // instantiation (the masked one too: the epilogue sees no mask, rows past seq_kv are clipped).
    const long long t_epilogue = tracer.start();
    if (tma_dkv_epilogue(p)) {
      store_dk_dv_tma<Traits>(P, smem, thr_dkv, tid, scale, static_cast<int>(b), h, u.n, tdKrdK,
                              tdVrdV);
    } else if constexpr (!Traits::kMask) {
      // Staged in float32 from K on, over the shared memory no role reads until the unit barrier:
      // up to the dQ buffers, or (kdQInStage) up to Q (the writer may still read dQ from the Q/dO
      // stages).
      constexpr size_t kStageEnd =
          (Traits::kdQInStage ? offsetof(typename Traits::SharedStorage, q)
                              : offsetof(typename Traits::SharedStorage, dq)) -
          offsetof(typename Traits::SharedStorage, k);
      static_assert(kStageEnd >= kBlockN * kHeadDim * sizeof(float),
                    "the staging region holds one staged float32 tile");
      store_dk_dv_staged_f32<Element, kHeadDim, kBlockN, kMathThreads>(
          p, sp, tid, scale, b, h, u.n, kv0, tdKrdK, tdVrdV, tdKVc,
          reinterpret_cast<float*>(smem.k));
    } else {
      // The masked instantiation keeps the direct path here: with the staged float32 epilogue
      // its step loop's spills grew (ptxas, hd128: 48 -> 185 local loads).
      store_dk_dv<Element, kHeadDim>(p, sp, tid, scale, b, h, u.n, kv0, tdKrdK, tdVrdV, tdKVc,
                                     [] { named_barrier_sync(kMathBarrier, kMathThreads); });
    }
    named_barrier_sync_unaligned(kUnitBarrier, Traits::kUnitThreads);  // every role is done with the unit
    tracer.stop(kTraceMathEpilogue, t_epilogue);
  }
  // The last dK/dV TMA stores complete before the kernel ends (their reads were waited for above).
  if (tid == 0) bulk_wait_group_all();
  tracer.stop(kTraceMathCycles, t_begin);
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_main_ws_kernel(const __grid_constant__ WsParams<Traits> P) {
  using SharedStorage = typename Traits::SharedStorage;
  extern __shared__ char smem_raw[];
  // Align by offsetting smem_raw itself so that derived pointers stay in the shared window (see
  // bwd_main.cuh).
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
    if (warp == 0) ws_producer<Traits>(P, smem, visit_m);
    else if (warp == 1) ws_dq_writer<Traits>(P, smem, visit_m, visit_ticket);
  } else {
    warpgroup_registers_increase<Traits::kMathRegisters>();
    ws_math<Traits>(P, smem, visit_m, visit_ticket);
  }
  if (P.trace != nullptr) {
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

}  // namespace jax_dash::sm90::bwd
