// Attention dropout in the math warpgroups of the sm90 backward (issue 33): the keep mask of
// cuda/dropout.h, regenerated from the key and the global coordinates (the forward's mask, bit for
// bit), as one bit per element of a thread's S^T fragment. The mainloop draws a step's bits right
// after it issues the S^T and dP^T wgmmas, so the Philox rounds run while the tensor cores work
// (the seed paper's overlap of the RNG with a GEMM, inside one kernel), and applies them after:
// dV's operand P -> P * Z and dP -> dP * Z before dS = P (dP - D), Z = keep / (1 - rate) (D is the
// preprocess's rowsum(dO * O) of the dropped output O, as without dropout).
//
// A thread's S^T accumulator holds, per 16-column block k of a warpgroup's 64 KV rows x Bm query
// columns, KV rows {R, R + 8} x query columns {Q, Q + 1, Q + 8, Q + 9} (R = 16 w + lane / 4 for
// warp w, Q = 16 k + 2 (lane % 4)): the transpose of the forward's fragment. With the call's
// offsets on the 16-element Philox blocks, those eight elements lie in two Philox calls of
// cuda/dropout.h, query rows Q and Q + 1 (the forward's i), each call's four words serving rows R
// and R + 8 and columns + 0 and + 8 (word t + 2 r for column + 8 t, row R + 8 r) through the
// 16-bit half of R's parity. Lanes l and
// l ^ 4 (rows R and R ^ 1) need the same two calls and the other halves: each computes one call
// and hands the partner its halves with two shuffles, so a thread pays one Philox call per eight
// elements, the forward's cost. Other offsets (a ring or shard_map block not on a 16-element
// boundary) draw each element with its own call, in a loop that is not unrolled: correct, and
// about 8x the RNG work.
#pragma once

#include <cuda_runtime.h>

#include <cute/tensor.hpp>

#include <cstdint>

#include "cuda/dropout.h"
#include "cuda/params.h"

namespace jax_dash::sm90::bwd {

// The keep bits of one step: bit e of word e / 32 for element e of the S^T fragment.
template <int kElements>
struct KeepBits {
  static_assert(kElements % 32 == 0, "whole words of bits");
  uint32_t w[kElements / 32];
  __device__ __forceinline__ bool operator()(int e) const { return (w[e / 32] >> (e % 32)) & 1u; }
};

struct BwdDropout {
  static constexpr uint32_t kPhiloxBlock = 16;

  uint32_t key0, key1, threshold;
  float keep_scale;
  uint32_t b, h;       // global batch row and head of the unit (counter words 3 and 2)
  uint32_t q_offset;   // global query row of the call's local row 0
  uint32_t kv0;        // global KV row of the unit's local row 0
  bool aligned;        // q and kv offsets on the Philox blocks: one call per 8 elements

  // The unit's dropout state: batch row b and head h of the call, KV tile rows from kv_begin.
  __device__ __forceinline__ static BwdDropout load(const AttentionParams& p, int64_t batch,
                                                    int head, int64_t kv_begin) {
    BwdDropout r;
    r.key0 = p.dropout_key_ptr[0];
    r.key1 = p.dropout_key_ptr[1];
    r.threshold = p.dropout_threshold;
    r.keep_scale = p.dropout_scale;
    const int32_t* o = p.dropout_offsets;
    r.b = static_cast<uint32_t>(batch) + static_cast<uint32_t>(o[0]);
    r.h = static_cast<uint32_t>(head) + static_cast<uint32_t>(o[1]);
    r.q_offset = static_cast<uint32_t>(o[2]);
    r.kv0 = static_cast<uint32_t>(kv_begin) + static_cast<uint32_t>(o[3]);
    r.aligned = static_cast<uint32_t>(o[2]) % kPhiloxBlock == 0 &&
                static_cast<uint32_t>(o[3]) % kPhiloxBlock == 0;
    return r;
  }

  // The keep bits of a thread's S^T fragment of the step whose query tile starts at local row q0.
  // tScS (MMA,1,1): (kv row, q column) of each element in the tile; value mode (2, 2, Bm / 8): a
  // column, 8 rows, 8 columns, so element e = v + 2 r + 4 chunk. Warp-uniform control flow (the
  // shuffles need every lane).
  template <int kElements, class Coords>
  __device__ __forceinline__ KeepBits<kElements> keep_bits(const Coords& tScS, int64_t q0) const {
    using namespace cute;
    KeepBits<kElements> bits;
    CUTE_UNROLL
    for (int i = 0; i < kElements / 32; ++i) bits.w[i] = 0;
    const uint32_t q_base = static_cast<uint32_t>(q0) + q_offset;
    if (aligned) {
      // Element 0's KV row R (the thread's row; the other is R + 8) and its parity: the 16-bit
      // half of every word this thread uses, and which of the two calls it computes.
      const uint32_t row = kv0 + static_cast<uint32_t>(get<0>(tScS(0)));
      const uint32_t parity = row & 1u;
      // byte_perm selectors: the low halves of (a, b) or their high halves, as one word.
      const uint32_t mine_sel = parity ? 0x7632u : 0x5410u;
      const uint32_t theirs_sel = parity ? 0x5410u : 0x7632u;
      const uint32_t high_threshold = threshold << 16;
      CUTE_UNROLL
      for (int k = 0; k < kElements / 8; ++k) {
        // Query column Q of the block (its v = 0 element) and the call of column Q + parity.
        const uint32_t col = q_base + static_cast<uint32_t>(get<1>(tScS(8 * k)));
        uint32_t counter[4], words[4];
        dropout_counter(b, h, col + parity, row, counter);
        philox4x32_10(counter, key0, key1, words);
        // words[t + 2 r] serves row R + 8 r, column + 8 t. This thread's halves of its own call,
        // and the partner's halves of it (the partner's parity is the other).
        const uint32_t mine_r0 = __byte_perm(words[0], words[1], mine_sel);
        const uint32_t mine_r1 = __byte_perm(words[2], words[3], mine_sel);
        const uint32_t send_r0 = __byte_perm(words[0], words[1], theirs_sel);
        const uint32_t send_r1 = __byte_perm(words[2], words[3], theirs_sel);
        const uint32_t got_r0 = __shfl_xor_sync(0xffffffffu, send_r0, 4);
        const uint32_t got_r1 = __shfl_xor_sync(0xffffffffu, send_r1, 4);
        // Call v (column Q + v): this thread's own where v == parity, else the partner's.
        uint32_t draws[2][2];  // [v][r]: the draws of columns +0 (low half) and +8 (high half)
        draws[0][0] = parity ? got_r0 : mine_r0;
        draws[0][1] = parity ? got_r1 : mine_r1;
        draws[1][0] = parity ? mine_r0 : got_r0;
        draws[1][1] = parity ? mine_r1 : got_r1;
        CUTE_UNROLL
        for (int x = 0; x < 8; ++x) {  // x = v + 2 r + 4 t
          const int v = x % 2, r = (x / 2) % 2, t = x / 4;
          const uint32_t pair = draws[v][r];
          const bool keep = t ? pair >= high_threshold : (pair & 0xFFFFu) >= threshold;
          const int e = 8 * k + x;
          bits.w[e / 32] |= static_cast<uint32_t>(keep) << (e % 32);
        }
      }
    } else {
      static_assert(kElements <= 64, "the fallback's keep bits fit in 64 bits");
      uint64_t keep_bits = 0;  // a register pair: bits.w indexed at run time would be local memory
#pragma unroll 1
      for (int e = 0; e < kElements; ++e) {
        const uint32_t j = kv0 + static_cast<uint32_t>(get<0>(tScS(e)));
        const uint32_t i = q_base + static_cast<uint32_t>(get<1>(tScS(e)));
        keep_bits |= static_cast<uint64_t>(dropout_keep(key0, key1, threshold, b, h, i, j)) << e;
      }
      CUTE_UNROLL
      for (int i = 0; i < kElements / 32; ++i) {
        bits.w[i] = static_cast<uint32_t>(keep_bits >> (32 * i));
      }
    }
    return bits;
  }
};

// The mainloop's dropout state: BwdDropout with kDropout, nothing without (so that the kernels
// without dropout compile to the code they had).
struct NoBwdDropout {};
template <bool kDropout>
__device__ __forceinline__ auto load_bwd_dropout(const AttentionParams& p, int64_t batch,
                                                 int head, int64_t kv_begin) {
  if constexpr (kDropout) {
    return BwdDropout::load(p, batch, head, kv_begin);
  } else {
    return NoBwdDropout{};
  }
}

}  // namespace jax_dash::sm90::bwd
