// parallel_for over independent tasks. Each task writes its own outputs, so the result does not
// depend on how tasks are spread over threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <functional>
#include <thread>
#include <vector>

namespace jax_dash::cpu {

inline int cpu_thread_count() {
  if (const char* env = std::getenv("JAX_DASH_CPU_THREADS")) {
    const int requested = std::atoi(env);
    if (requested > 0) return requested;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

inline void parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& task) {
  const int64_t threads = std::min<int64_t>(cpu_thread_count(), num_tasks);
  if (threads <= 1) {
    for (int64_t i = 0; i < num_tasks; ++i) task(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto worker = [&]() {
    try {
      for (int64_t i = next.fetch_add(1); i < num_tasks; i = next.fetch_add(1)) task(i);
    } catch (...) {
      // Stop handing out tasks and report the first failure on the calling thread.
      next.store(num_tasks);
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int64_t t = 0; t + 1 < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& thread : pool) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace jax_dash::cpu
