// Traits of the sm90 forward: tile shapes, MMA types, the shared-memory layout every role shares
// (SharedStorage), the TMA descriptors, and the kernel's parameter block (FwdKernelParams).
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/fast_math.h>

#include <algorithm>
#include <cstdint>

#include "cuda/mask.h"
#include "cuda/sm90/tma.cuh"
#include "cuda/tiles.h"

namespace jax_dash::sm90::fwd {

using namespace cute;

constexpr int kWarpgroupRows = 64;  // rows of one wgmma accumulator
constexpr int kThreadsPerWarpgroup = 128;
constexpr int kStages = 2;          // K/V shared-memory ring depth
constexpr int kTileSlots = 2;       // the persistent scheduler's hand-over ring (scheduler.cuh)

// kNarrowRows: at most 128 query rows (two math warpgroups) whatever the tile table says; the
// masked kernels take it. At head_dim 64 with three warpgroups' 160 registers the segment-id
// kernel spilled (168 local loads in place of 26) and the sliding-window point's forward ran at
// 232 TFLOP/s against 263 with two warpgroups (H100, 2026-11-24, call 4). A row's arithmetic does
// not depend on the query tile, so the bits are the same.
template <class Element, int kHeadDim, bool kNarrowRows = false, bool kPersistent = false>
struct FwdKernelTraits {
  using ElementType = Element;
  static constexpr TileConfig kTiles = tile_config(kHeadDim);
  static constexpr int kBlockM =
      kNarrowRows ? std::min(kTiles.fwd_block_m, 128) : kTiles.fwd_block_m;
  static constexpr int kBlockN = kTiles.fwd_block_n;
  static constexpr int kWarpgroups = kBlockM / kWarpgroupRows;  // math warpgroups
  static constexpr int kMathThreads = kWarpgroups * kThreadsPerWarpgroup;
  static constexpr int kMathWarps = kMathThreads / 32;
  static constexpr int kThreads = kMathThreads + kThreadsPerWarpgroup;  // + the producer
  static constexpr int kProducerRegisters = 24;
  // Two math warpgroups (128 query rows) take 240 registers each, three (192 rows, head_dim 64)
  // 160: 24 * 128 + 160 * 384 = 64512 of the SM's 65536.
  static constexpr int kMathRegisters = kWarpgroups == 2 ? 240 : 160;
  static_assert(kWarpgroups == 2 || kWarpgroups == 3,
                "the turn-taking is written for two or three math warpgroups");
  static_assert(kProducerRegisters * kThreadsPerWarpgroup + kMathRegisters * kMathThreads <= 65536,
                "register file of one SM");
  static_assert(kMathWarps * 32 == kMathThreads);
  static_assert(kBlockM % kWarpgroupRows == 0, "fwd_block_m must be a multiple of 64");
  static_assert(kBlockN % 16 == 0, "fwd_block_n must be a multiple of 16 (wgmma K of P V)");
  static_assert(kHeadDim % 64 == 0, "head_dim must fill whole 128-byte swizzle rows");

  using BlockM = Int<kBlockM>;
  using BlockN = Int<kBlockN>;
  using HeadDim = Int<kHeadDim>;

  // 128-byte swizzled K-major tiles: Q (BLK_M, D), K and V (BLK_N, D, STAGES), all D-contiguous.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<BlockM, HeadDim>{}));
  using SmemLayoutKVStage = decltype(tile_to_shape(SmemAtom{}, Shape<BlockN, HeadDim>{}));
  using SmemLayoutKV =
      decltype(tile_to_shape(SmemAtom{}, Shape<BlockN, HeadDim, Int<kStages>>{}));
  // V viewed as (D, BLK_N, STAGES): the MN-major B operand of O += P V, same bytes as SmemLayoutKV.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{},
      make_ordered_layout(Shape<HeadDim, BlockN, Int<kStages>>{}, Step<_2, _1, _3>{})));

  // S (BLK_M, BLK_N) = Q K^T, warpgroups stacked along M.
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<Int<kWarpgroupRows>, BlockN, HeadDim>>(),
      Layout<Shape<Int<kWarpgroups>, _1, _1>>{}));
  // O (BLK_M, D) += P (BLK_M, BLK_N) V (BLK_N, D), P from registers.
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float,
                           Shape<Int<kWarpgroupRows>, HeadDim, BlockN>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<kWarpgroups>, _1, _1>>{}));

  // kTmaStoreO (unmasked, head_dim <= 128): the epilogue writes O to shared memory, one 64-row
  // slice per math warpgroup, and one thread of the warpgroup stores the slice with TMA (rows past
  // seq_q are clipped by the copy engine). Head dim 256 has no room for it. The kernels with
  // narrow rows (the masked ones; the persistent one for causal head_dim 64 up to 1k) keep the
  // direct stores: with TMA the narrow persistent kernel was 1.5-1.9% slower, and the 192-row one
  // 0.5-1.0% faster (H100, twenty-fifth session, call 5; before O went to shared memory by
  // stmatrix, the 192-row kernel was 1-2.4% slower with it, ninth session call 1).
  static constexpr bool kTmaStoreO = kHeadDim <= 128 && !kNarrowRows;
  using SmemLayoutOWg = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kWarpgroupRows>, HeadDim>{}));
  // (BLK_M, D) over the warpgroups' slices, slice w holding rows [64 w, 64 w + 64).
  using SmemLayoutO = decltype(tile_to_shape(SmemLayoutOWg{}, Shape<BlockM, HeadDim>{}));
  static constexpr int kOElements = kTmaStoreO ? int(cosize_v<SmemLayoutO>) : 8;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, kOElements> o;  // kTmaStoreO only
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutKV>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutKV>> v;
    alignas(8) uint64_t bar_q;
    uint64_t bar_k[kStages];
    uint64_t bar_v[kStages];
    uint64_t k_empty[kStages];  // every math warp has read the K stage
    uint64_t v_empty[kStages];  // every math warp has read the V stage
    uint64_t q_empty;           // persistent only: every math warp is done with this tile's Q
    // Persistent only: the scheduler's hand-over of the next tile (fwd/scheduler.cuh).
    uint64_t slot_full[kTileSlots];   // the producer wrote tile_slot[i]
    uint64_t slot_empty[kTileSlots];  // every math warp has read it
    int32_t tile_slot[kTileSlots];
  };
  // +1024: the dynamic shared-memory base is aligned by hand to the swizzle period.
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVStageBytes = kBlockN * kHeadDim * sizeof(Element);

  template <class SmemLayout>
  static auto make_tma(const Element* ptr, int32_t seq, int32_t heads, int32_t batch,
                       SmemLayout smem_layout) {
    return make_bshd_tma<Element, kHeadDim>(ptr, seq, heads, batch, smem_layout);
  }
  using TmaQ = decltype(make_tma(nullptr, 1, 1, 1, SmemLayoutQ{}));
  using TmaKV = decltype(make_tma(nullptr, 1, 1, 1, SmemLayoutKVStage{}));
  static auto make_tma_store(Element* ptr, int32_t seq, int32_t heads, int32_t batch) {
    return make_bshd_tma_store<Element, kHeadDim>(ptr, seq, heads, batch, SmemLayoutOWg{});
  }
  using TmaO = decltype(make_tma_store(nullptr, 1, 1, 1));
};

template <class Traits>
struct FwdKernelParams {
  typename Traits::TmaQ tma_q;
  typename Traits::TmaO tma_o;  // kTmaStoreO: O by 64-row slices
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  int32_t seq_q;
  int32_t seq_kv;
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t batch;
  int32_t num_m_blocks;
  // Tile order (fwd/scheduler.cuh, FwdTileOrder): the (batch, head) pairs are taken in groups of
  // group_heads, about one wave of tiles per group (launch_fwd), so the CTAs that run together
  // share their heads' K and V in L2; the heads from tail_first_head on (the last kTailGroups
  // groups, slots from tail_first_slot on) form one last block.
  int32_t group_heads;
  int32_t tail_first_head;
  int32_t tail_first_slot;
  // The tile order's divisors, as multiply-and-shift pairs made on the host: the tiles of a group,
  // the heads of a group and of the tail, the heads of a batch row. The tile order works in 32
  // bits (the launch refuses a grid of 2^31 tiles or more).
  cutlass::FastDivmod group_tiles_div;
  cutlass::FastDivmod group_size_div;
  cutlass::FastDivmod tail_size_div;
  cutlass::FastDivmod heads_div;
  const float* scale;  // device pointer to the 0-d float32 softmax scale (AttentionParams)
  // kPersistent: the tiles handed out after each CTA's first, zeroed by the launch (one int32 of
  // the caller's; FwdPersistentTileScheduler).
  int32_t* tile_counter;
  bool is_causal;
  void* out;
  float* lse;
  // The mask beyond causal and seq_kv (cuda/mask.h; issue 13, first run on an H100 2026-11-23):
  // has_mask says that a window, lengths or segment ids are present. band holds
  // extents, causal and window; the pointers are device arrays (nullptr when absent).
  bool has_mask;
  MaskBand band;
  const int32_t* q_lengths;    // [batch]
  const int32_t* kv_lengths;   // [batch]
  const int32_t* q_segments;   // [batch, seq_q]
  const int32_t* kv_segments;  // [batch, seq_kv]
  float soft_cap;              // > 0: logits = cap * tanh(scale * q.k / cap)
};

}  // namespace jax_dash::sm90::fwd
