// Attention dropout's keep mask: whether element (b, h, i, j) of the attention probabilities is
// kept is a pure function of the dropout key and the element's global coordinates (batch row,
// head, query position, key position), so the forward and the backward regenerate the same mask,
// and no tile shape, thread layout, schedule, sharding over batch or heads, or ring offset changes
// it. The CPU kernels, the Hopper kernels and jax_dash.dropout_keep_mask (jax_dash/dropout.py,
// the same arithmetic in jnp) all call this definition.
//
// One Philox4x32-10 call (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11)
// gives 128 bits = eight 16-bit draws, and covers the eight elements one thread of a Hopper wgmma
// accumulator holds: rows {i, i + 8} x columns {c, c + 1, c + 8, c + 9} of a 16 x 16 block,
// c = 2 * ((j % 8) / 2). Counter (c0, c1, c2, c3) = (4 * (j / 16) + (j % 8) / 2,
// 8 * (i / 16) + i % 8, h, b); the element takes word (i % 16) / 8 + 2 * ((j % 16) / 8), its low
// 16 bits for an even j, its high 16 bits for an odd j. Kept iff that draw >= threshold, where
// threshold = min(65535, floor(rate * 65536 + 0.5)): the rate is quantized to 1/65536.
#pragma once

#include <cstdint>

#include "cuda/compat.h"

namespace jax_dash {

JAX_DASH_HD inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// Philox4x32 with 10 rounds; the key is bumped before rounds 2..10 (Random123's order; its known
// answers are checked in tests/test_dropout.py).
JAX_DASH_HD inline void philox4x32_10(const uint32_t counter[4], uint32_t key0, uint32_t key1,
                                      uint32_t out[4]) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kW0;
      key1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c0, &hi0, &lo0);
    philox_mulhilo(kM1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ key0, n2 = hi0 ^ c3 ^ key1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// The Philox counter of element (b, h, i, j) (see the header comment).
JAX_DASH_HD inline void dropout_counter(uint32_t b, uint32_t h, uint32_t i, uint32_t j,
                                        uint32_t counter[4]) {
  counter[0] = 4u * (j / 16u) + (j % 8u) / 2u;
  counter[1] = 8u * (i / 16u) + i % 8u;
  counter[2] = h;
  counter[3] = b;
}

// The 16-bit draw of element (i, j) out of its Philox call's four words: word
// (i % 16) / 8 + 2 ((j % 16) / 8), chosen by selects (a GPU thread indexing the words by a
// run-time number would put them in local memory).
JAX_DASH_HD inline uint32_t dropout_draw(const uint32_t words[4], uint32_t i, uint32_t j) {
  const bool high_rows = (i % 16u) >= 8u, high_cols = (j % 16u) >= 8u;
  const uint32_t word = high_cols ? (high_rows ? words[3] : words[2])
                                  : (high_rows ? words[1] : words[0]);
  return (j % 2u) ? (word >> 16) : (word & 0xFFFFu);
}

// Whether element (b, h, i, j) (global coordinates) is kept.
JAX_DASH_HD inline bool dropout_keep(uint32_t key0, uint32_t key1, uint32_t threshold, uint32_t b,
                                     uint32_t h, uint32_t i, uint32_t j) {
  uint32_t counter[4], words[4];
  dropout_counter(b, h, i, j, counter);
  philox4x32_10(counter, key0, key1, words);
  return dropout_draw(words, i, j) >= threshold;
}

}  // namespace jax_dash
