// Small sm90 building blocks for warp-specialized kernels: named barriers with explicit thread
// counts, register reallocation between warpgroups, bulk (non-tensor) copies and reductions, and
// the global-memory ticket operations. Shared by the warp-specialized backward (bwd/kernel.cuh)
// and, later, the forward rebuild. Each is one PTX instruction or a short fixed sequence; the
// comments say which ordering guarantee the caller relies on.
#pragma once

#include <cstdint>

#include <cute/arch/cluster_sm90.hpp>  // elect_one_sync
#include <cute/arch/util.hpp>          // cast_smem_ptr_to_uint
#include <cutlass/arch/barrier.h>

// On a kernel's lambdas: inline them, always. A lambda the compiler leaves out of line (it did so
// for the masked forward's per-tile body, called once but large) takes the kernel's register
// tensors (the S and O accumulators) by reference: they move to local memory and every access
// becomes a generic load or store (the masked forward ran at ~13 TFLOP/s).
#define JAX_DASH_INLINE __attribute__((always_inline))

namespace jax_dash::sm90 {

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32). Every
// thread of a participating warp executes it. sync waits; arrive counts without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// bar.sync is barrier.sync.aligned: every thread of one barrier generation that waits must execute
// the same barrier instruction (arrivals from elsewhere with bar.arrive are allowed). A barrier
// whose waiting threads come from different places in the code (the roles of a warp-specialized
// kernel, each with its own copy of the call) must use the unaligned form instead; the aligned
// form is undefined behaviour there (compute-sanitizer synccheck: "divergent thread(s) in block").
__device__ __forceinline__ void named_barrier_sync_unaligned(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// One arrival of the calling warp on the mbarrier `bar` (every lane executes it; one elected lane
// arrives, after the warp's lanes have converged): the consumer release of a warp that is done
// with a shared-memory buffer, on a barrier that counts warps.
__device__ __forceinline__ void warp_arrive(uint64_t* bar) {
  __syncwarp();
  if (cute::elect_one_sync()) cutlass::arch::ClusterBarrier::arrive(bar);
}

// Register reallocation (all four warps of a warpgroup execute the same one). Needs a register cap
// at kernel entry (__launch_bounds__(threads, 1)).
template <int kRegs>
__device__ __forceinline__ void warpgroup_registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void warpgroup_registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Generic-proxy writes to shared memory -> later async-proxy reads (wgmma, bulk copies). Each
// writing thread executes it before the barrier that publishes the data.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Orders this thread's generic global accesses (a ticket acquire, a release) against its
// async-proxy global accesses (bulk reductions).
__device__ __forceinline__ void fence_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory,
// completing on `mbar` (which must expect the bytes).
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes,
                                              uint64_t* mbar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(cute::cast_smem_ptr_to_uint(smem)),
      "l"(gmem), "r"(bytes), "r"(cute::cast_smem_ptr_to_uint(mbar))
      : "memory");
}

// gmem[i] += smem[i] for `bytes / 4` floats, one fp32 add per element at L2 (round to nearest),
// as one bulk asynchronous reduction; commit closes the group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem,
                                                    uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem),
      "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes)
      : "memory");
}
// gmem[i] = smem[i] for `bytes / 4` floats (a plain bulk store, same alignment rules), in the
// same bulk group bookkeeping as bulk_reduce_add_f32: the first contribution to a dQ tile
// (WsParams::dq_first_store).
__device__ __forceinline__ void bulk_store_f32(float* gmem, const float* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem),
               "r"(cute::cast_smem_ptr_to_uint(smem)), "r"(bytes)
               : "memory");
}
// x + (+0.0f), round to nearest, subnormals kept (add.rn.f32): what the bulk fp32 reduction
// (cp.reduce.async.bulk .add.f32) leaves in an accumulator that held +0: -0 becomes +0, every other
// value stays itself, subnormals included (measured on an H100, 2026-11-26: the reduction does not
// flush them; tests/sm90_check.cu first_store_probe checks it on every run). So a first
// contribution stored as zero_plus(x) equals the old "memset to 0, then add".
__device__ __forceinline__ float zero_plus(float x) {
  float r;
  asm("add.rn.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// The shared-memory sources of every committed bulk group have been read (the buffer is free);
// the global writes may still be in flight.
__device__ __forceinline__ void bulk_wait_group_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
// The shared-memory sources of all but the kPending most recently committed bulk groups have been
// read.
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
// Every committed bulk group is complete, its global writes included.
__device__ __forceinline__ void bulk_wait_group_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Tickets: acquire-spin until *ptr == ticket; release-increment.
__device__ __forceinline__ int32_t ld_acquire_gpu(const int32_t* ptr) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void spin_until_equal(const int32_t* ptr, int32_t ticket) {
  while (ld_acquire_gpu(ptr) != ticket) __nanosleep(32);
}
__device__ __forceinline__ void red_release_gpu_add(int32_t* ptr, int32_t v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}

// Two 16-bit elements as one 32-bit word, the first at the lower address (little endian).
template <class Element>
__device__ __forceinline__ uint32_t pack_pair(Element lo, Element hi) {
  return static_cast<uint32_t>(lo.raw()) | (static_cast<uint32_t>(hi.raw()) << 16);
}

// The swizzled smem pointer is built through integer arithmetic, which hides its address space from
// the compiler: store with st.shared explicitly rather than a generic st.
__device__ __forceinline__ void st_shared_u32(const void* smem, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(cute::cast_smem_ptr_to_uint(smem)), "r"(v)
               : "memory");
}

}  // namespace jax_dash::sm90
