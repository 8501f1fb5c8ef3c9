// Python bindings of cuda/schedule.h: whole-head tables in one call (numpy arrays), so that
// jax_dash/schedules.py builds its DAG from the exact functions the kernels call.
#include "cuda/schedule_py.h"

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "cuda/schedule.h"
#include "nanobind/ndarray.h"

namespace nb = nanobind;

namespace jax_dash {
namespace {

using Int32Array = nb::ndarray<nb::numpy, int32_t>;

// Hands a vector to numpy; the capsule frees it when the array dies.
Int32Array to_numpy(std::vector<int32_t>&& values, std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<int32_t>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  return Int32Array(owned->data(), shape, owner);
}

ScheduleProblem checked_problem(int32_t schedule, int64_t seq_q, int64_t seq_kv, int32_t block_m,
                                int32_t block_n, bool is_causal, int32_t num_heads, int32_t wave,
                                int64_t window_left, int64_t window_right) {
  if (schedule < 0 || schedule > static_cast<int32_t>(Schedule::kLastSchedule))
    throw nb::value_error(("schedule=" + std::to_string(schedule) + " is not a Schedule enum " +
                           "value (0.." + std::to_string(static_cast<int32_t>(
                               Schedule::kLastSchedule)) + ")").c_str());
  if (seq_q < 1 || seq_kv < 1)
    throw nb::value_error(("seq_q=" + std::to_string(seq_q) + ", seq_kv=" +
                           std::to_string(seq_kv) + ": both must be >= 1").c_str());
  if (block_m < 1 || block_n < 1)
    throw nb::value_error(("block_m=" + std::to_string(block_m) + ", block_n=" +
                           std::to_string(block_n) + ": both must be >= 1").c_str());
  if (num_heads < 1)
    throw nb::value_error(("num_heads=" + std::to_string(num_heads) + " must be >= 1").c_str());
  if (wave < 1)
    throw nb::value_error(("wave=" + std::to_string(wave) + " must be >= 1").c_str());
  if (window_left < -1 || window_right < -1 || window_left >= kUnboundedBand ||
      window_right >= kUnboundedBand)
    throw nb::value_error(("window_left=" + std::to_string(window_left) + ", window_right=" +
                           std::to_string(window_right) +
                           ": each must be >= 0 (and < 2**40), or -1 for no limit")
                              .c_str());
  ScheduleProblem p = problem_from_lengths(seq_q, seq_kv, block_m, block_n, is_causal, num_heads,
                                           wave, static_cast<Schedule>(schedule));
  p.has_window = window_left >= 0 || window_right >= 0;
  p.window_left = window_left >= 0 ? window_left : kUnboundedBand;
  p.window_right = window_right >= 0 ? window_right : kUnboundedBand;
  return p;
}

// Everything schedule.h says about one head (head_linear = b * num_heads + h).
nb::dict head_tables(int32_t schedule, int64_t seq_q, int64_t seq_kv, int32_t block_m,
                     int32_t block_n, bool is_causal, int32_t num_heads, int32_t wave,
                     int32_t head, int64_t window_left, int64_t window_right) {
  const ScheduleProblem p = checked_problem(schedule, seq_q, seq_kv, block_m, block_n, is_causal,
                                            num_heads, wave, window_left, window_right);
  if (head < 0 || head >= num_heads)
    throw nb::value_error(("head=" + std::to_string(head) + " must be in [0, num_heads=" +
                           std::to_string(num_heads) + ")").c_str());
  const size_t nq = static_cast<size_t>(p.num_q_tiles);
  const size_t nkv = static_cast<size_t>(p.num_kv_tiles);
  const int per_head = items_per_head(p);

  std::vector<int32_t> item_kv(static_cast<size_t>(per_head) * 2, -1);  // (item, j)
  std::vector<int32_t> wave_first(per_head), wave_end(per_head);
  for (int item = 0; item < per_head; ++item) {
    for (int j = 0; j < item_num_kv_tiles(p, item); ++j)
      item_kv[static_cast<size_t>(item) * 2 + j] = item_kv_tile(p, item, j);
    const WaveSlice s = wave_slice(p, head, item);
    wave_first[item] = s.first;
    wave_end[item] = s.end;
  }
  std::vector<int32_t> visit(nkv * nq, -1), visit_count(nkv);  // (n, step)
  for (size_t n = 0; n < nkv; ++n) {
    const int count = q_visit_count(p, head, static_cast<int>(n));
    visit_count[n] = count;
    for (int step = 0; step < count; ++step)
      visit[n * nq + step] = q_visit_tile(p, head, static_cast<int>(n), step);
  }
  std::vector<int32_t> ticket(nq * nkv, -1), ticket_count(nq);  // (m, n); -1 = masked
  std::vector<int32_t> kv_first(nq), q_first(nkv), q_end(nkv);
  for (size_t n = 0; n < nkv; ++n) {
    q_first[n] = first_q_tile(p, static_cast<int>(n));
    q_end[n] = end_q_tile(p, static_cast<int>(n));
  }
  for (size_t m = 0; m < nq; ++m) {
    kv_first[m] = first_kv_tile(p, static_cast<int>(m));
    ticket_count[m] = dq_ticket_count(p, static_cast<int>(m));
    for (size_t n = 0; n < nkv; ++n)
      if (tile_active(p, static_cast<int>(m), static_cast<int>(n)))
        ticket[m * nkv + n] = dq_ticket(p, head, static_cast<int>(m), static_cast<int>(n));
  }

  nb::dict out;
  out["effective_schedule"] = static_cast<int32_t>(effective_schedule(p));
  out["num_q_tiles"] = p.num_q_tiles;
  out["num_kv_tiles"] = p.num_kv_tiles;
  out["items_per_head"] = per_head;
  out["item_kv_tiles"] = to_numpy(std::move(item_kv), {static_cast<size_t>(per_head), 2});
  out["wave_first"] = to_numpy(std::move(wave_first), {static_cast<size_t>(per_head)});
  out["wave_end"] = to_numpy(std::move(wave_end), {static_cast<size_t>(per_head)});
  out["visit"] = to_numpy(std::move(visit), {nkv, nq});
  out["visit_count"] = to_numpy(std::move(visit_count), {nkv});
  out["ticket"] = to_numpy(std::move(ticket), {nq, nkv});
  out["ticket_count"] = to_numpy(std::move(ticket_count), {nq});
  out["first_kv_tile"] = to_numpy(std::move(kv_first), {nq});
  out["first_q_tile"] = to_numpy(std::move(q_first), {nkv});
  out["end_q_tile"] = to_numpy(std::move(q_end), {nkv});
  return out;
}

// dkv_ticket for every (head_in_group, n): shape (group_size, Nkv).
Int32Array dkv_tickets(int32_t schedule, int64_t seq_q, int64_t seq_kv, int32_t block_m,
                       int32_t block_n, bool is_causal, int32_t num_heads, int32_t wave,
                       int32_t group_size, int64_t window_left, int64_t window_right) {
  const ScheduleProblem p = checked_problem(schedule, seq_q, seq_kv, block_m, block_n, is_causal,
                                            num_heads, wave, window_left, window_right);
  if (group_size < 1)
    throw nb::value_error(("group_size=" + std::to_string(group_size) + " must be >= 1").c_str());
  const size_t nkv = static_cast<size_t>(p.num_kv_tiles);
  std::vector<int32_t> tickets(static_cast<size_t>(group_size) * nkv);
  for (int g = 0; g < group_size; ++g)
    for (size_t n = 0; n < nkv; ++n)
      tickets[static_cast<size_t>(g) * nkv + n] = dkv_ticket(p, g, static_cast<int>(n));
  return to_numpy(std::move(tickets), {static_cast<size_t>(group_size), nkv});
}

// What a head's schedule is without its tables: (effective schedule id, items_per_head). O(1).
nb::tuple schedule_summary(int32_t schedule, int64_t seq_q, int64_t seq_kv, int32_t block_m,
                           int32_t block_n, bool is_causal, int32_t wave, int64_t window_left,
                           int64_t window_right) {
  const ScheduleProblem p = checked_problem(schedule, seq_q, seq_kv, block_m, block_n, is_causal,
                                            1, wave, window_left, window_right);
  return nb::make_tuple(static_cast<int32_t>(effective_schedule(p)), items_per_head(p));
}

}  // namespace

void bind_schedules(nb::module_& m) {
  m.def("schedule_head_tables", &head_tables, nb::arg("schedule"), nb::arg("seq_q"),
        nb::arg("seq_kv"), nb::arg("block_m"), nb::arg("block_n"), nb::arg("is_causal"),
        nb::arg("num_heads"), nb::arg("wave"), nb::arg("head"), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1,
        "schedule.h for one head: items, visit orders, dQ tickets and wave slices (numpy int32); "
        "window_left/right: the local window's sides (-1 = no limit).");
  m.def("schedule_dkv_tickets", &dkv_tickets, nb::arg("schedule"), nb::arg("seq_q"),
        nb::arg("seq_kv"), nb::arg("block_m"), nb::arg("block_n"), nb::arg("is_causal"),
        nb::arg("num_heads"), nb::arg("wave"), nb::arg("group_size"),
        nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        "dkv_ticket(head_in_group, n) as a (group_size, Nkv) int32 array.");
  m.def("schedule_summary", &schedule_summary, nb::arg("schedule"), nb::arg("seq_q"),
        nb::arg("seq_kv"), nb::arg("block_m"), nb::arg("block_n"), nb::arg("is_causal"),
        nb::arg("wave"), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        "(effective schedule id, items_per_head) of one head, without building its tables.");
}

}  // namespace jax_dash
