// CPU segment_sum (the meaning and the order of the adds: cuda/segment_sum.h).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/cpu/dtype.h"
#include "cuda/cpu/thread_pool.h"
#include "cuda/segment_sum.h"

namespace jax_dash::cpu {

namespace {
// Segments per task: enough work per task to pay for handing it out, small enough to spread a
// vocabulary-sized output over every thread.
constexpr int64_t kSegmentsPerTask = 256;
}  // namespace

void segment_sum(const SegmentSumParams& p) {
  const int32_t* ids_begin = p.sorted_ids;
  const int32_t* ids_end = p.sorted_ids + p.num_rows;
  for (int64_t s = 0; s <= p.num_segments; ++s)
    p.offsets[s] = static_cast<int32_t>(
        std::lower_bound(ids_begin, ids_end, static_cast<int32_t>(s)) - ids_begin);

  const int64_t num_tasks = (p.num_segments + kSegmentsPerTask - 1) / kSegmentsPerTask;
  parallel_for(num_tasks, [&](int64_t task) {
    std::vector<float> sum(static_cast<size_t>(p.row_size));
    const int64_t first = task * kSegmentsPerTask;
    const int64_t last = std::min(first + kSegmentsPerTask, p.num_segments);
    for (int64_t s = first; s < last; ++s) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t r = p.offsets[s]; r < p.offsets[s + 1]; ++r) {
        const int64_t row = p.order != nullptr ? p.order[r] : r;
        const int64_t base = row * p.row_size;
        for (int64_t c = 0; c < p.row_size; ++c) sum[c] += load_element(p.data, base + c, p.dtype);
      }
      const int64_t out_base = s * p.row_size;
      for (int64_t c = 0; c < p.row_size; ++c) store_element(p.out, out_base + c, p.dtype, sum[c]);
    }
  });
}

}  // namespace jax_dash::cpu
