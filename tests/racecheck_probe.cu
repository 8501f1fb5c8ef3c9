// Does compute-sanitizer racecheck follow the two synchronisation patterns of the warp-specialized
// backward (cuda/sm90/bwd/kernel.cuh)? Both patterns below are race-free by construction:
//   1. unit publication: one math thread writes a shared word, then the math warpgroups, a producer
//      warp and a writer warp meet at one named barrier (barrier.sync id, 320), each role from its
//      own place in the code; the service warps read the word after it; a second meeting closes
//      the unit before the next write;
//   2. stage reuse: a producer thread refills a shared buffer with cp.async.bulk (completing on a
//      "full" mbarrier) only after waiting on an "empty" mbarrier, on which each math warp arrives
//      once (one elected lane, after __syncwarp) when its threads have read the buffer.
//   3. the dQ hand-over (mode "handshake", with pattern 1 and without 2): per step the math threads
//      wait on barrier 4 (the writer's bar.arrive says the buffer is free: once at the start of a
//      unit, then after each step but the last), store their partial, bar.arrive on barrier 3; the
//      writer waits on barrier 3 and reads the partials; as in the backward, with a unit that has
//      no steps in between.
// Modes: "both" (default), "unit" (pattern 1 alone: units without refills), "handshake" (1 + 3),
// "race" (1 + 2 plus a planted race: a shared word written and read by different warps with no
// synchronisation).
//   nvcc -gencode=arch=compute_90a,code=sm_90a -lineinfo -o probe tests/racecheck_probe.cu
//   compute-sanitizer --tool racecheck ./probe [mode]   (0 hazards if racecheck follows the mode's
//                                                         patterns)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

constexpr int kUnits = 6, kStepsPerUnit = 5, kStages = 2, kBufFloats = 64;
constexpr int kThreads = 384, kMathThreads = 256, kUnitThreads = kMathThreads + 64;

struct Smem {
  alignas(16) float buf[kStages][kBufFloats];
  alignas(8) uint64_t full[kStages];
  alignas(8) uint64_t empty[kStages];
  int unit;
  int planted;
  float dq[kMathThreads];
};

__device__ uint32_t sa(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ void bar_sync(int id, int n) { asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ void bar_sync_aligned(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ void mbar_init(uint64_t* b, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n) : "memory");
}
__device__ void mbar_wait(uint64_t* b, int parity) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra W;\n}\n" ::"r"(sa(b)), "r"(parity) : "memory");
}
__device__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory");
}
__device__ void mbar_expect(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes)
               : "memory");
}
__device__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(b)) : "memory");
}

// Steps of unit u in the handshake mode: some units have none (as causal tiles can).
__device__ int handshake_steps(int u) { return u % 3 == 1 ? 0 : 2 + u % 4; }

__global__ void __launch_bounds__(kThreads, 1) probe(const float* src, float* out, int plant,
                                                     int steps, int handshake) {
  __shared__ Smem s;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) { mbar_init(&s.full[i], 1); mbar_init(&s.empty[i], kMathThreads / 32); }
    s.planted = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  float acc = 0.f;
  int it = 0;
  if (warp == 0) {  // producer
    for (int u = 0; u < kUnits; ++u) {
      bar_sync(1, kUnitThreads);  // site B: unit published
      const int unit = s.unit;
      acc += unit;
      for (int k = 0; k < steps; ++k, ++it) {
        const int st = it % kStages, ph = (it / kStages) & 1;
        mbar_wait(&s.empty[st], ph ^ 1);
        if (lane == 0) {
          mbar_expect(&s.full[st], kBufFloats * 4);
          bulk_g2s(s.buf[st], src + (unit * kStepsPerUnit + k) * kBufFloats, kBufFloats * 4, &s.full[st]);
        }
        __syncwarp();
      }
      bar_sync(1, kUnitThreads);  // site E: unit closed
    }
    if (plant && lane == 0) s.planted = 1;  // planted race: no synchronisation with the reader
  } else if (warp == 1) {  // writer: reads the unit (and, handshake, the partials)
    constexpr int kdQThreads = kMathThreads + 32;
    for (int u = 0; u < kUnits; ++u) {
      bar_sync(1, kUnitThreads);  // site C
      acc += s.unit;
      const int n = handshake ? handshake_steps(s.unit) : 0;
      if (n > 0) bar_arrive(4, kdQThreads);  // the buffer is free for the unit's first step
      for (int k = 0; k < n; ++k) {
        if (lane == 0) acc += 1.f;  // (the backward's ticket spin: leader only)
        __syncwarp();
        bar_sync_aligned(3, kdQThreads);  // the step's partials are in shared memory
        for (int t = lane; t < kMathThreads; t += 32) acc += s.dq[t];
        __syncwarp();
        if (k + 1 < n) bar_arrive(4, kdQThreads);
      }
      bar_sync(1, kUnitThreads);  // site F
    }
  } else if (warp >= 4) {  // math
    const int tid = threadIdx.x - 128;
    for (int u = 0; u < kUnits; ++u) {
      if (tid == 0) s.unit = u;
      bar_sync(1, kUnitThreads);  // site A
      for (int k = 0; k < steps; ++k, ++it) {
        const int st = it % kStages, ph = (it / kStages) & 1;
        mbar_wait(&s.full[st], ph);
        acc += s.buf[st][tid % kBufFloats];
        __syncwarp();
        if (lane == 0) mbar_arrive(&s.empty[st]);
      }
      const int n = handshake ? handshake_steps(u) : 0;
      for (int k = 0; k < n; ++k) {
        bar_sync_aligned(4, kMathThreads + 32);  // the writer has read the previous partials
        s.dq[tid] = acc + k;
        bar_arrive(3, kMathThreads + 32);
      }
      bar_sync(1, kUnitThreads);  // site D
    }
    if (plant && tid == 0) acc += s.planted;
  }
  out[threadIdx.x] = acc;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "both";
  const bool plant = std::strcmp(mode, "race") == 0;
  const bool handshake = std::strcmp(mode, "handshake") == 0;
  const bool stage = std::strcmp(mode, "unit") != 0 && !handshake;  // refills (pattern 2)
  const int n = kUnits * kStepsPerUnit * kBufFloats;
  float *src = nullptr, *out = nullptr;
  if (cudaMalloc(&src, n * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&out, kThreads * sizeof(float)) != cudaSuccess) return 2;
  cudaMemset(src, 0, n * sizeof(float));
  const int steps = stage ? kStepsPerUnit : 0;
  probe<<<1, kThreads>>>(src, out, plant, steps, handshake);
  const cudaError_t err = cudaDeviceSynchronize();
  std::printf("probe (%s): %s\n", mode, cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 2;
}
