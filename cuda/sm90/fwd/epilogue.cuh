// Epilogues of the sm90 forward: O (16-bit) and lse of one query tile, from a math warpgroup's
// accumulator registers. Rows past seq_q are never written. The traits choose the policy by type
// (FwdEpilogue): through shared memory and one TMA store per warpgroup, or direct stores.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>

#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/fwd/tile.cuh"
#include "cuda/sm90/fwd/traits.cuh"
#include "cuda/sm90/named_barrier.cuh"
#include "cuda/sm90/softmax.cuh"

namespace jax_dash::sm90::fwd {

// The lse of each of this thread's rows: one thread of the four that share a row writes it.
template <int kRows, class Params, class Coords>
__device__ __forceinline__ void store_lse(const Params& p, const FwdTile& tile,
                                          const Coords& out_coords, const float (&lse)[kRows],
                                          unsigned math_tid) {
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = tile.row_begin + get<0>(out_coords(r, 0));
    if (row < p.seq_q && math_tid % 4 == 0) {
      p.lse[(int64_t(tile.batch) * p.num_heads + tile.head) * p.seq_q + row] = lse[r];
    }
  }
}

// kTmaStoreO: O through this warpgroup's 64-row slice of shared memory and one TMA store, issued
// by the warpgroup's first thread (rows past seq_q are clipped by the copy engine).
template <class Traits>
struct FwdEpilogueTmaStore {
  using Element = typename Traits::ElementType;
  using Params = FwdKernelParams<Traits>;
  using HeadDim = typename Traits::HeadDim;

  template <int kRows, class Accum, class Coords>
  __device__ __forceinline__ static void store(const Params& p,
                                               typename Traits::SharedStorage& smem,
                                               const FwdTile& tile, Accum& tOrO,
                                               const Coords& out_coords,
                                               const float (&lse)[kRows], unsigned math_tid,
                                               int math_wg) {
    const bool store_leader = math_tid % kThreadsPerWarpgroup == 0;
    // The slice is free once this warpgroup's previous TMA store has read it (persistent: the
    // previous tile's; a no-op otherwise), which its leader waits for before the barrier.
    if (store_leader) bulk_wait_group_read_all();
    named_barrier_sync(kEpilogueBarrier + math_wg, kThreadsPerWarpgroup);
    Tensor sO = make_tensor(make_smem_ptr(smem.o.data()), typename Traits::SmemLayoutO{});
    // O in 16 bits, then stmatrix: four 8 x 8 matrices of 16-bit values a warp instruction (8 of a
    // thread's pairs), the swizzled addresses computed by CuTe as 32-bit shared-memory offsets.
    // The 32-bit stores it replaces (one a pair, 32 a thread) each built their swizzled address:
    // ~250 integer instructions a warp and tile (H100 ncu, hd128 causal 8 x 2k: the forward's
    // per-tile code 1,538 instructions a warp against FA3's 943; twenty-fifth session).
    Tensor tOrO16 = make_tensor<Element>(tOrO.layout());
    CUTE_UNROLL
    for (int i = 0; i < size(tOrO); ++i) tOrO16(i) = static_cast<Element>(tOrO(i));
    auto smem_copy_o =
        make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Traits::TiledMmaPV{});
    auto thr_copy_o = smem_copy_o.get_thread_slice(math_tid);
    cute::copy(smem_copy_o, thr_copy_o.retile_S(tOrO16), thr_copy_o.partition_D(sO));
    fence_async_shared();  // generic smem writes -> the TMA store's reads
    named_barrier_sync(kEpilogueBarrier + math_wg, kThreadsPerWarpgroup);
    if (store_leader) {
      Tensor mO = p.tma_o.get_tma_tensor(make_shape(p.seq_q, HeadDim{}, p.num_heads, p.batch));
      Tensor gO = local_tile(mO(_, _, tile.head, tile.batch), Shape<Int<kWarpgroupRows>, HeadDim>{},
                             make_coord(int(tile.row_begin / kWarpgroupRows) + math_wg, _0{}));
      Tensor sOwg = make_tensor(make_smem_ptr(smem.o.data() + math_wg * cosize_v<
                                    typename Traits::SmemLayoutOWg>),
                                typename Traits::SmemLayoutOWg{});
      auto tma_o = p.tma_o.get_slice(_0{});
      copy(p.tma_o, tma_o.partition_S(sOwg), tma_o.partition_D(gO));
      bulk_commit_group();
    }
    store_lse(p, tile, out_coords, lse, math_tid);
  }

  // The last TMA store must have read its slice before the CTA's shared memory goes.
  __device__ __forceinline__ static void finish(unsigned math_tid) {
    if (math_tid % kThreadsPerWarpgroup == 0) bulk_wait_group_all();
  }
};

// Adjacent column pairs of O as one 32-bit global store each (head_dim 256 and the kernels with
// narrow rows: traits.cuh kTmaStoreO).
template <class Traits>
struct FwdEpilogueDirectStore {
  using Element = typename Traits::ElementType;
  using Params = FwdKernelParams<Traits>;
  static constexpr int kHeadDim = Traits::HeadDim::value;

  template <int kRows, class Accum, class Coords>
  __device__ __forceinline__ static void store(const Params& p,
                                               typename Traits::SharedStorage& smem,
                                               const FwdTile& tile, Accum& tOrO,
                                               const Coords& out_coords,
                                               const float (&lse)[kRows], unsigned math_tid,
                                               int math_wg) {
    Tensor out_acc = as_rows_cols(tOrO);  // (ROWS, COLS)
    Element* out = static_cast<Element*>(p.out);
    const int64_t out_row_stride = int64_t(p.num_heads) * kHeadDim;
    Element* out_head =
        out + (int64_t(tile.batch) * p.seq_q) * out_row_stride + int64_t(tile.head) * kHeadDim;
    static_assert(decltype(size<1>(out_acc))::value % 2 == 0);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = tile.row_begin + get<0>(out_coords(r, 0));
      if (row >= p.seq_q) continue;
      Element* out_row = out_head + row * out_row_stride;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out_acc); c += 2) {
        const int col = get<1>(out_coords(r, c));
        __align__(4) Element pair[2] = {static_cast<Element>(out_acc(r, c)),
                                        static_cast<Element>(out_acc(r, c + 1))};
        *reinterpret_cast<uint32_t*>(out_row + col) = *reinterpret_cast<const uint32_t*>(pair);
      }
      if (math_tid % 4 == 0) {
        p.lse[(int64_t(tile.batch) * p.num_heads + tile.head) * p.seq_q + row] = lse[r];
      }
    }
  }

  __device__ __forceinline__ static void finish(unsigned math_tid) {}
};

template <class Traits>
using FwdEpilogue = std::conditional_t<Traits::kTmaStoreO, FwdEpilogueTmaStore<Traits>,
                                       FwdEpilogueDirectStore<Traits>>;

}  // namespace jax_dash::sm90::fwd
