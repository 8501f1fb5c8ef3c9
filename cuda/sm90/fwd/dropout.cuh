// Attention dropout in the math warpgroups of the sm90 forward (issue 33): the keep mask of
// cuda/dropout.h applied to the probabilities P of a tile after they were added into the row sums
// (the normalization counts every probability, as the CPU kernels do) and before P is converted
// for the P V wgmma: dropped elements become 0, kept ones P * keep_scale.
//
// A thread's accumulator fragment of a 64 x BLK_N tile holds, per 16-column block q, rows
// {i, i + 8} x columns {c, c + 1, c + 8, c + 9} (c = 16 q + 2 (lane % 4), i = 16 w + lane / 4 for
// warp w of the warpgroup): exactly the eight elements of one Philox call of cuda/dropout.h when
// the call's global q and kv offsets are multiples of 16 (the query tiles start at multiples of 64,
// the KV tiles at multiples of BLK_N). Then one Philox call gives eight keep bits, BLK_N / 16 calls
// per tile step. Other offsets (a ring or shard_map block not on a 16-element boundary) draw each
// element with its own call, in a loop that is not unrolled: correct, and about 8x the RNG work.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include <cstdint>

#include "cuda/dropout.h"
#include "cuda/sm90/fwd/traits.cuh"

namespace jax_dash::sm90::fwd {

// The dropout operands of a forward call (AttentionParams: dropout_key_ptr, dropout_offsets,
// dropout_threshold, dropout_scale). key and offsets are device arrays (FFI operands, so a new key
// or a new block offset is new data, not a new executable); each math thread reads them once.
struct FwdDropoutParams {
  const uint32_t* key;      // [2]
  const int32_t* offsets;   // [4] (batch, head, q, kv) of the call's element (0, 0, 0, 0)
  uint32_t threshold;       // keep a 16-bit draw >= threshold
  float keep_scale;         // 1 / (1 - rate)
};

// The kernel parameters of a dropout instantiation: the others' and the dropout operands (the
// roles that do not apply dropout take them as FwdKernelParams).
template <class Traits>
struct FwdDropoutKernelParams : FwdKernelParams<Traits> {
  FwdDropoutParams dropout;
};

// The mask's element (b, h, i, j) is kept iff dropout_keep(key, threshold, b + offset_b, ...).
struct FwdDropout {
  // Rows {i, i + 8} and columns {c, c + 1, c + 8, c + 9} of one Philox call: the multiple of 16 the
  // q and kv offsets must be for a thread's fragment to line up with the calls.
  static constexpr uint32_t kPhiloxBlock = 16;

  uint32_t key0, key1, threshold;
  float keep_scale;
  uint32_t offset_b, offset_h, offset_q, offset_kv;
  bool aligned;  // offset_q and offset_kv multiples of kPhiloxBlock: one call per 8 elements

  __device__ __forceinline__ static FwdDropout load(const FwdDropoutParams& d) {
    FwdDropout r;
    r.key0 = d.key[0];
    r.key1 = d.key[1];
    r.threshold = d.threshold;
    r.keep_scale = d.keep_scale;
    r.offset_b = static_cast<uint32_t>(d.offsets[0]);
    r.offset_h = static_cast<uint32_t>(d.offsets[1]);
    r.offset_q = static_cast<uint32_t>(d.offsets[2]);
    r.offset_kv = static_cast<uint32_t>(d.offsets[3]);
    r.aligned = r.offset_q % kPhiloxBlock == 0 && r.offset_kv % kPhiloxBlock == 0;
    return r;
  }

  // tSrS (MMA,1,1): the tile's probabilities (fp32, after the row sums); tScS (MMA,1,1): their
  // (row, col) in the tile, whose first row is row_begin and first column col_begin of the call
  // (local coordinates; the offsets make them global). Value mode of MMA (2, 2, BLK_N/8): a column,
  // 8 rows, 8 columns, so flat index e = v + 2 r + 4 chunk.
  template <class TensorS, class TensorC>
  __device__ __forceinline__ void apply(TensorS& tSrS, const TensorC& tScS, int batch, int head,
                                        int64_t row_begin, int64_t col_begin) const {
    using namespace cute;
    constexpr int kElements = decltype(size(tSrS))::value;
    static_assert(kElements % 8 == 0 && kElements <= 64,
                  "one Philox call per 8 elements; the fallback's keep bits fit in 64 bits");
    const uint32_t b = static_cast<uint32_t>(batch) + offset_b;
    const uint32_t h = static_cast<uint32_t>(head) + offset_h;
    const uint32_t row0 = static_cast<uint32_t>(row_begin) + offset_q;
    const uint32_t col0 = static_cast<uint32_t>(col_begin) + offset_kv;
    if (aligned) {
      // 16-column block q: elements 8 q + v + 2 r + 4 t (t: columns + 8), word r + 2 t of the call
      // whose counter is that of the block's element (r, t, v) = (0, 0, 0) (cuda/dropout.h).
      CUTE_UNROLL
      for (int q = 0; q < kElements / 8; ++q) {
        const uint32_t i = row0 + static_cast<uint32_t>(get<0>(tScS(8 * q)));
        const uint32_t j = col0 + static_cast<uint32_t>(get<1>(tScS(8 * q)));
        uint32_t counter[4], words[4];
        dropout_counter(b, h, i, j, counter);
        philox4x32_10(counter, key0, key1, words);
        CUTE_UNROLL
        for (int w = 0; w < 8; ++w) {  // w = v + 2 r + 4 t
          const int v = w % 2, r = (w / 2) % 2, t = w / 4;
          const uint32_t word = words[r + 2 * t];
          const uint32_t draw = v ? (word >> 16) : (word & 0xFFFFu);
          float& prob = tSrS(8 * q + w);
          prob = draw >= threshold ? prob * keep_scale : 0.f;
        }
      }
    } else {
      uint64_t keep_bits = 0;
#pragma unroll 1
      for (int e = 0; e < kElements; ++e) {
        const uint32_t i = row0 + static_cast<uint32_t>(get<0>(tScS(e)));
        const uint32_t j = col0 + static_cast<uint32_t>(get<1>(tScS(e)));
        keep_bits |= uint64_t(dropout_keep(key0, key1, threshold, b, h, i, j)) << e;
      }
      CUTE_UNROLL
      for (int e = 0; e < kElements; ++e) {
        float& prob = tSrS(e);
        prob = (keep_bits >> e) & 1u ? prob * keep_scale : 0.f;
      }
    }
  }
};

// The mainloop's dropout state: FwdDropout with kDropout, nothing without (so that the kernels
// without dropout compile to the code they had).
struct NoFwdDropout {};
template <bool kDropout, class Params>
__device__ __forceinline__ auto load_fwd_dropout(const Params& p) {
  if constexpr (kDropout) {
    return FwdDropout::load(p.dropout);
  } else {
    return NoFwdDropout{};
  }
}

}  // namespace jax_dash::sm90::fwd
