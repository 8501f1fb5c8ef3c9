// Python bindings of cuda/dropout.h, so that the tests check jax_dash.dropout_keep_mask (the same
// definition in jnp) against the function the kernels call, bit for bit.
#include "cuda/dropout_py.h"

#include <cstdint>
#include <string>

#include "cuda/dropout.h"
#include "nanobind/ndarray.h"

namespace nb = nanobind;

namespace jax_dash {

void bind_dropout(nb::module_& m) {
  m.def(
      "philox4x32_10",
      [](uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t key0, uint32_t key1) {
        const uint32_t counter[4] = {c0, c1, c2, c3};
        uint32_t out[4];
        philox4x32_10(counter, key0, key1, out);
        return nb::make_tuple(out[0], out[1], out[2], out[3]);
      },
      nb::arg("c0"), nb::arg("c1"), nb::arg("c2"), nb::arg("c3"), nb::arg("key0"),
      nb::arg("key1"), "Philox4x32-10 of one counter: four uint32 words");
  m.def(
      "dropout_keep_mask",
      [](uint32_t key0, uint32_t key1, uint32_t threshold, int64_t batch, int64_t heads,
         int64_t seq_q, int64_t seq_kv, int64_t batch_offset, int64_t head_offset,
         int64_t q_offset, int64_t kv_offset) {
        const int64_t sizes[4] = {batch, heads, seq_q, seq_kv};
        const int64_t offsets[4] = {batch_offset, head_offset, q_offset, kv_offset};
        for (int d = 0; d < 4; ++d) {
          if (sizes[d] < 0 || offsets[d] < 0 || sizes[d] + offsets[d] > (int64_t{1} << 32))
            throw nb::value_error(("dimension " + std::to_string(d) + ": size " +
                                   std::to_string(sizes[d]) + " at offset " +
                                   std::to_string(offsets[d]) +
                                   " must be >= 0 and end within 2^32").c_str());
        }
        const int64_t total = batch * heads * seq_q * seq_kv;
        auto* mask = new uint8_t[total > 0 ? total : 1];
        nb::capsule owner(mask, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
        int64_t at = 0;
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < seq_q; ++i)
              for (int64_t j = 0; j < seq_kv; ++j)
                mask[at++] = dropout_keep(
                    key0, key1, threshold, static_cast<uint32_t>(b + batch_offset),
                    static_cast<uint32_t>(h + head_offset), static_cast<uint32_t>(i + q_offset),
                    static_cast<uint32_t>(j + kv_offset));
        return nb::ndarray<nb::numpy, uint8_t>(
            mask, {static_cast<size_t>(batch), static_cast<size_t>(heads),
                   static_cast<size_t>(seq_q), static_cast<size_t>(seq_kv)},
            owner);
      },
      nb::arg("key0"), nb::arg("key1"), nb::arg("threshold"), nb::arg("batch"), nb::arg("heads"),
      nb::arg("seq_q"), nb::arg("seq_kv"), nb::arg("batch_offset"), nb::arg("head_offset"),
      nb::arg("q_offset"), nb::arg("kv_offset"),
      "the keep mask (uint8 0/1, [batch, heads, seq_q, seq_kv]) of cuda/dropout.h");
}

}  // namespace jax_dash
