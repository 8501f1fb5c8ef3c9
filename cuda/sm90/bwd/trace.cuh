// The backward's opt-in per-role wait trace (tests/sm90_check.cu bench).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace jax_dash::sm90::bwd {

// Opt-in per-role wait trace (tests/sm90_check.cu bench): clock64 cycles one representative thread
// of each role spends waiting, summed per CTA (the writer slots over both dQ writer warps). The
// slots of CTA c are trace[c * kWsTraceSlots + i].
enum WsTraceSlot : int {
  kTraceMathWaitKV = 0,      // math: K/V of a unit landed
  kTraceMathWaitQ = 1,       // math: Q/dO/lse/dsum stage landed (producer late)
  kTraceMathWaitPdS = 2,     // math: the other warpgroup's dS^T (and, hd64, its dS^T buffer)
  kTraceMathWaitdQEmpty = 3, // math: the writer has not yet read the previous dQ (writer late)
  kTraceWriterWaitTicket = 4,  // writer: ticket of tile m (the schedule's waits)
  kTraceWriterWaitdQFull = 5,  // writer: math has not produced this step's dQ yet
  kTraceWriterWaitReduce = 6,  // writer: bulk reduction issued and read from shared memory
  kTraceProducerWaitEmpty = 7, // producer: a stage is still in use by math
  kTraceMathUnitStart = 8,   // math: fetch, visit tables, publication and K/V wait of a unit
  kTraceMathEpilogue = 9,    // math: dK/dV epilogue and the unit's closing barrier
  kTraceWriterComplete = 10,   // writer: the reduction complete in global memory
  kTraceWriterRelease = 11,    // writer: proxy fence and ticket release (deterministic only)
  // The parts of kTraceMathUnitStart (with kTraceMathWaitKV, the rest of it):
  kTraceMathFetch = 12,      // math: the fetch (an atomicAdd for a new item), its barrier and
                             // the first thread's wait for the dK/dV stores' read
  kTraceMathTables = 13,     // math: the unit's visit order and tickets into shared memory
  kTraceMathPublish = 14,    // math: the publication barrier
  kTraceMathUnits = 15,      // math: units done
  kTraceMathSteps = 16,      // math: steps done
  kTraceMathCycles = 17,     // math: cycles from the first fetch to the end
  kWsTraceSlots = 18,
};

// Times one wait of one role into a shared-memory counter when tracing is on (a uniform branch
// otherwise). kCompiled false (WsTraits::kTraced): no trace code at all, counters ignored.
template <bool kCompiled>
struct WsTracer {
  unsigned long long* counters;  // shared memory, or nullptr when tracing is off
  __device__ __forceinline__ long long start() const {
    if constexpr (kCompiled) return counters ? clock64() : 0;
    return 0;
  }
  __device__ __forceinline__ void stop(int slot, long long t0) const {
    if constexpr (kCompiled) {
      if (counters) atomicAdd(&counters[slot], static_cast<unsigned long long>(clock64() - t0));
    }
  }
  __device__ __forceinline__ void add(int slot, unsigned long long v) const {
    if constexpr (kCompiled) {
      if (counters) atomicAdd(&counters[slot], v);
    }
  }
};

}  // namespace jax_dash::sm90::bwd
