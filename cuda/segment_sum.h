// segment_sum: out[s, :] = sum of data[i, :] over the rows i with segment id s, in float32, the
// rows added one after another in ascending i. Shared by the CPU and CUDA handlers.
//
// The handlers receive the ids already ordered (jax_dash/embedding.py sorts (id, row) pairs with
// a stable sort, or takes them as given when the caller says they are sorted): `sorted_ids[r]` is
// the id of the r-th row in that order and `order[r]` its row in `data` (no `order`: row r itself).
// Ids outside [0, num_segments) have been mapped to -1 or num_segments, so they sort to the two
// ends and belong to no segment. Segment s owns the positions [offsets[s], offsets[s + 1]) of the
// order, where offsets[s] is the first position whose id is >= s; both kernels add those rows in
// position order, which is ascending row order: the bits depend only on the inputs, and the CPU
// and the GPU give the same bits (one float32 add per row, no fused multiply-add, the same
// round-to-nearest-even conversion to the data's dtype).
#pragma once

#include <cstdint>
#include <string>

#include "cuda/ffi_common.h"
#include "cuda/params.h"
#include "xla/ffi/api/ffi.h"

namespace jax_dash {

struct SegmentSumParams {
  const void* data = nullptr;          // [num_rows, row_size], dtype
  const int32_t* sorted_ids = nullptr;  // [num_rows]
  const int32_t* order = nullptr;       // [num_rows], or nullptr: the identity
  void* out = nullptr;                  // [num_segments, row_size], dtype
  int32_t* offsets = nullptr;           // [num_segments + 1] (workspace)
  int64_t num_rows = 0;
  int64_t row_size = 0;
  int64_t num_segments = 0;
  DType dtype = DType::kFloat32;
};

// Checks the buffers of a segment_sum call (the Python layer checks first, with the user's
// argument names) and fills p.
inline ffi::Error describe_segment_sum(const ffi::AnyBuffer& data,
                                       const ffi::Buffer<ffi::S32>& sorted_ids,
                                       const ffi::Buffer<ffi::S32>& order, bool has_order,
                                       const ffi::AnyBuffer& out,
                                       const ffi::Buffer<ffi::S32>& offsets,
                                       SegmentSumParams* p) {
  const auto dd = data.dimensions(), od = out.dimensions();
  if (dd.size() != 2 || od.size() != 2)
    return ffi::Error::InvalidArgument(
        "jax_dash segment_sum: data and out must be 2-D [rows, row_size], got " +
        dims_string(dd) + " and " + dims_string(od));
  if (ffi::Error e = to_dtype(data.element_type(), &p->dtype); e.failure())
    return ffi::Error::InvalidArgument("jax_dash segment_sum: data has dtype " +
                                       dtype_string(data.element_type()) +
                                       "; allowed: float32, float16, bfloat16");
  if (out.element_type() != data.element_type() || od[1] != dd[1])
    return ffi::Error::InvalidArgument("jax_dash segment_sum: out " + dims_string(od) + " " +
                                       dtype_string(out.element_type()) +
                                       " must have data's dtype and row size, data is " +
                                       dims_string(dd) + " " + dtype_string(data.element_type()));
  p->num_rows = dd[0];
  p->row_size = dd[1];
  p->num_segments = od[0];
  if (p->num_segments >= INT32_MAX || p->num_rows >= INT32_MAX)
    return ffi::Error::InvalidArgument(
        "jax_dash segment_sum: num_segments and the number of rows must be < 2^31 - 1, got " +
        std::to_string(p->num_segments) + " and " + std::to_string(p->num_rows));
  if (sorted_ids.element_count() != static_cast<size_t>(p->num_rows))
    return ffi::Error::InvalidArgument("jax_dash segment_sum: sorted_ids has " +
                                       std::to_string(sorted_ids.element_count()) +
                                       " elements, data has " + std::to_string(p->num_rows) +
                                       " rows");
  if (has_order && order.element_count() != static_cast<size_t>(p->num_rows))
    return ffi::Error::InvalidArgument("jax_dash segment_sum: order has " +
                                       std::to_string(order.element_count()) +
                                       " elements, data has " + std::to_string(p->num_rows) +
                                       " rows");
  if (offsets.element_count() != static_cast<size_t>(p->num_segments + 1))
    return ffi::Error::InvalidArgument("jax_dash segment_sum: offsets must have num_segments + 1 "
                                       "elements");
  p->data = data.untyped_data();
  p->sorted_ids = sorted_ids.typed_data();
  p->order = has_order ? order.typed_data() : nullptr;
  p->out = out.untyped_data();
  p->offsets = offsets.typed_data();
  return ffi::Error::Success();
}

namespace cpu {
void segment_sum(const SegmentSumParams& p);
}  // namespace cpu

}  // namespace jax_dash
