// parallel_for over independent tasks on a process-wide pool of worker threads. Each task writes
// its own outputs, so the result does not depend on how tasks are spread over threads (or on how
// many threads there are).
//
// Thread count: JAX_DASH_CPU_THREADS when set (an integer in [1, kMaxCpuThreads]; anything else is
// an error naming the variable), else the CPUs this process may use: on Linux its CPU affinity
// mask, capped by a cgroup v2 CPU quota (cpu.max) where there is one; elsewhere (macOS, which has
// neither) std::thread::hardware_concurrency(). The calling thread always works too, so a count of
// n uses n - 1 pool workers.
//
// The pool lives with the process: workers are created on first need (never per call) and wait
// for work between calls. A worker that cannot be created (a process, thread or address-space
// limit) is not an error: the pool stays smaller and, at worst, the calling thread does all tasks
// alone. Several calls may run at once (XLA runs handlers of different devices concurrently):
// each posts its own job, and its caller works on it until every task is taken, so a call never
// waits for an idle worker.
#pragma once

// JAX_DASH_PORTABLE_THREAD_COUNT forces the non-Linux path on Linux too, so that it can be
// compiled and tested where there is no macOS (g++ -fsyntax-only -DJAX_DASH_PORTABLE_THREAD_COUNT).
#if defined(__linux__) && !defined(JAX_DASH_PORTABLE_THREAD_COUNT)
#define JAX_DASH_LINUX_THREAD_COUNT 1
#endif

#include <pthread.h>  // pthread_atfork: POSIX (Linux and macOS)
#ifdef JAX_DASH_LINUX_THREAD_COUNT
#include <sched.h>  // sched_getaffinity, cpu_set_t: Linux only
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace jax_dash::cpu {

// Upper bound of JAX_DASH_CPU_THREADS: far above the cores of any one machine the kernels run on,
// far below the point where thread stacks alone exhaust memory.
constexpr int kMaxCpuThreads = 1024;

namespace detail {

#ifdef JAX_DASH_LINUX_THREAD_COUNT
// CPUs allowed by a cgroup v2 quota ("<quota> <period>" in cpu.max; "max" = none): 0 if none.
inline int cgroup_cpu_limit() {
  std::string group;  // "0::/some/path" in /proc/self/cgroup names this process's cgroup v2
  {
    std::ifstream cgroup("/proc/self/cgroup");
    std::string line;
    while (std::getline(cgroup, line))
      if (line.rfind("0::", 0) == 0) group = line.substr(3);
  }
  for (const std::string& dir : {"/sys/fs/cgroup" + group, std::string("/sys/fs/cgroup")}) {
    std::ifstream cpu_max(dir + "/cpu.max");
    std::string quota;
    long long period = 0;
    if (!(cpu_max >> quota >> period)) continue;
    if (quota == "max" || period <= 0) return 0;
    const long long q = std::atoll(quota.c_str());
    if (q <= 0) return 0;
    return static_cast<int>(std::max<long long>(1, (q + period - 1) / period));
  }
  return 0;
}

// The CPUs this process may run on: the affinity mask, capped by the cgroup quota.
inline int default_thread_count() {
  int count = 0;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) count = CPU_COUNT(&mask);
  if (count <= 0) count = static_cast<int>(std::thread::hardware_concurrency());
  if (count <= 0) count = 1;
  if (const int quota = cgroup_cpu_limit(); quota > 0) count = std::min(count, quota);
  return std::min(count, kMaxCpuThreads);
}
#else
// No affinity mask or cgroups to read (macOS): the CPUs the system reports.
inline int default_thread_count() {
  int count = static_cast<int>(std::thread::hardware_concurrency());
  if (count <= 0) count = 1;
  return std::min(count, kMaxCpuThreads);
}
#endif

}  // namespace detail

// The thread count for the next parallel_for (see the header comment). Throws
// std::invalid_argument naming JAX_DASH_CPU_THREADS when it is set to anything but an integer in
// [1, kMaxCpuThreads].
inline int cpu_thread_count() {
  const char* env = std::getenv("JAX_DASH_CPU_THREADS");
  if (env == nullptr || *env == '\0') {
    static const int default_count = detail::default_thread_count();
    return default_count;
  }
  errno = 0;
  char* end = nullptr;
  const long requested = std::strtol(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || requested < 1 || requested > kMaxCpuThreads)
    throw std::invalid_argument(
        "JAX_DASH_CPU_THREADS='" + std::string(env) + "' is not allowed: it must be an integer "
        "from 1 to " + std::to_string(kMaxCpuThreads) + " (or unset, for the CPUs this process "
        "may use)");
  return static_cast<int>(requested);
}

class ThreadPool {
 public:
  // The process's pool. Never destroyed (joining workers during static destruction could hang,
  // destroying joinable threads would terminate); after fork() the child gets a fresh, empty one.
  static ThreadPool& instance() {
    static const bool initialized = [] {
      current() = new ThreadPool();
      pthread_atfork(nullptr, nullptr, [] { current() = new ThreadPool(); });
      return true;
    }();
    (void)initialized;
    return *current();
  }

  // Runs task(0..num_tasks-1) on the calling thread and up to helpers pool workers; rethrows the
  // first exception a task threw (the remaining tasks are then skipped).
  void run(int64_t num_tasks, int helpers, const std::function<void(int64_t)>& task) {
    Job job(&task, num_tasks);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job.helpers_wanted = std::min(helpers, grow_locked(helpers));
      if (job.helpers_wanted > 0) {
        jobs_.push_back(&job);
        work_ready_.notify_all();
      }
    }
    work_on(job);
    std::unique_lock<std::mutex> lock(mutex_);
    // Every task is taken: no worker may join from now on; wait for those that did.
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), &job), jobs_.end());
    job.done.wait(lock, [&] { return job.active_workers == 0; });
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  struct Job {
    Job(const std::function<void(int64_t)>* task_, int64_t num_tasks_)
        : task(task_), num_tasks(num_tasks_) {}
    const std::function<void(int64_t)>* task;
    int64_t num_tasks;
    std::atomic<int64_t> next{0};
    int helpers_wanted = 0;   // workers that may still join (guarded by mutex_)
    int active_workers = 0;   // workers inside work_on (guarded by mutex_)
    std::exception_ptr error;  // first failure (guarded by mutex_)
    std::condition_variable done;
  };

  static ThreadPool*& current() {
    static ThreadPool* pool = nullptr;
    return pool;
  }

  ThreadPool() = default;

  // Creates workers up to `wanted`; returns how many exist. A creation that fails caps the pool.
  int grow_locked(int wanted) {
    while (num_workers_ < std::min(wanted, capacity_)) {
      try {
        std::thread([this] { worker_loop(); }).detach();
        ++num_workers_;
      } catch (const std::exception&) {  // std::system_error (EAGAIN) or std::bad_alloc
        capacity_ = num_workers_;
      }
    }
    return num_workers_;
  }

  void work_on(Job& job) {
    for (int64_t i = job.next.fetch_add(1); i < job.num_tasks; i = job.next.fetch_add(1)) {
      try {
        (*job.task)(i);
      } catch (...) {
        job.next.store(job.num_tasks);  // stop handing out tasks
        std::lock_guard<std::mutex> lock(mutex_);
        if (!job.error) job.error = std::current_exception();
        return;
      }
    }
  }

  void worker_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_ready_.wait(lock, [&] { return !jobs_.empty(); });
      Job* job = jobs_.front();
      if (--job->helpers_wanted == 0) jobs_.pop_front();
      ++job->active_workers;
      lock.unlock();
      work_on(*job);
      lock.lock();
      // The caller frees the job once no worker is active; notify while holding the lock so that
      // it cannot do so before notify_all returns.
      if (--job->active_workers == 0) job->done.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<Job*> jobs_;  // jobs that still accept workers
  int num_workers_ = 0;  // detached; they live as long as the process
  int capacity_ = kMaxCpuThreads;
};

inline void parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& task) {
  const int64_t threads = std::min<int64_t>(cpu_thread_count(), num_tasks);
  if (threads <= 1) {
    for (int64_t i = 0; i < num_tasks; ++i) task(i);
    return;
  }
  ThreadPool::instance().run(num_tasks, static_cast<int>(threads - 1), task);
}

}  // namespace jax_dash::cpu
