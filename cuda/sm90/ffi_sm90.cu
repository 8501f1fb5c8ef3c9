// XLA FFI handlers for platform "CUDA": validate buffers, fill AttentionParams, launch the sm90
// kernels on XLA's stream. No allocation (the backward's workspace arrives as results) and no
// stream synchronization.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/ffi_common.h"
#include "cuda/params.h"
#include "cuda/sm90/handlers.h"
#include "cuda/sm90/launch.h"
#include "xla/ffi/api/ffi.h"

// The backward kernels live in bwd/launch.cu, written in parallel; until that file exists the
// backward handler reports that it is not built instead of breaking the link.
#if __has_include("cuda/sm90/bwd/launch.cu")
#define JAX_DASH_HAVE_SM90_BWD 1
#else
#define JAX_DASH_HAVE_SM90_BWD 0
#endif

namespace ffi = xla::ffi;

namespace jax_dash::sm90 {
namespace {

constexpr int kMaxCachedDevices = 64;
enum DeviceState : int { kUnknown = 0, kHopper = 1, kOther = 2 };
// Per-device answer of the compute-capability check; handlers run on many threads at once.
std::atomic<int> g_device_state[kMaxCachedDevices];
std::atomic<int> g_device_major[kMaxCachedDevices];
std::atomic<int> g_device_minor[kMaxCachedDevices];

ffi::Error cuda_error(const char* what, cudaError_t err) {
  return ffi::Error::Internal(std::string("jax_dash: ") + what + ": " + cudaGetErrorName(err) +
                              " (" + cudaGetErrorString(err) + ")");
}

// The kernels use wgmma and TMA, which exist only on compute capability 9.0 (sm_90a).
ffi::Error check_hopper_device() {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    return cuda_error("cudaGetDevice failed", err);
  }
  int state = device < kMaxCachedDevices ? g_device_state[device].load() : kUnknown;
  int major = 0, minor = 0;
  if (state == kUnknown) {
    cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) {
      err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    }
    if (err != cudaSuccess) return cuda_error("cudaDeviceGetAttribute failed", err);
    state = (major == 9 && minor == 0) ? kHopper : kOther;
    if (device < kMaxCachedDevices) {
      g_device_major[device].store(major);
      g_device_minor[device].store(minor);
      g_device_state[device].store(state);
    }
  } else {
    major = g_device_major[device].load();
    minor = g_device_minor[device].load();
  }
  if (state != kHopper) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "jax_dash: the CUDA kernels need a Hopper GPU (compute capability 9.0, "
                      "e.g. H100/H200/H800); device " + std::to_string(device) +
                          " has compute capability " + std::to_string(major) + "." +
                          std::to_string(minor) + ". Run on a Hopper GPU or on the CPU.");
  }
  return ffi::Error::Success();
}

ffi::Error check_gpu_problem(const AttentionParams& p) {
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) {
    return ffi::Error::InvalidArgument(
        "jax_dash: on GPU query/key/value must be bfloat16 or float16 (float32 runs on the CPU "
        "only); cast the inputs");
  }
  // Smaller head dims reach here zero-padded to 64, 128 or 256 (jax_dash/_ffi.py
  // hopper_head_dim).
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) {
    return ffi::Error::InvalidArgument(
        "jax_dash: the Hopper kernels support head_dim up to 256 (64, 128 and 256; smaller ones "
        "zero-padded to them), got " + std::to_string(p.head_dim) +
        "; head_dim " + std::to_string(p.head_dim) + " runs on CPU today");
  }
  if (p.seq_q > INT32_MAX || p.seq_kv > INT32_MAX || p.batch > INT32_MAX) {
    return ffi::Error::InvalidArgument("jax_dash: batch and sequence lengths must be < 2^31");
  }
  return ffi::Error::Success();
}

// The dropout operands of jax_dash_fwd_dropout on the GPU: key (uint32 [2]) and offsets (int32 [4])
// are device buffers, so only their shapes are checked here (the CPU handler also checks the
// offsets' values; jax_dash/dropout.py builds them >= 0); the kernels read them.
struct GpuDropoutOperands {
  const ffi::Buffer<ffi::U32>* key;
  const ffi::Buffer<ffi::S32>* offsets;
  int64_t threshold;
  float keep_scale;
};

ffi::Error describe_gpu_dropout(const GpuDropoutOperands* d, AttentionParams* p) {
  if (d == nullptr) return ffi::Error::Success();
  if (!has_dims(d->key->dimensions(), {2}))
    return ffi::Error::InvalidArgument("jax_dash: the dropout key has shape " +
                                       dims_string(d->key->dimensions()) + ", expected [2]");
  if (!has_dims(d->offsets->dimensions(), {4}))
    return ffi::Error::InvalidArgument("jax_dash: dropout_offsets has shape " +
                                       dims_string(d->offsets->dimensions()) +
                                       ", expected [4] (batch, head, q, kv)");
  if (d->threshold < 0 || d->threshold > 65535 || !(d->keep_scale >= 1.0f) ||
      !std::isfinite(d->keep_scale))
    return ffi::Error::InvalidArgument("jax_dash: dropout_threshold=" +
                                       std::to_string(d->threshold) + " (0..65535) and " +
                                       "dropout_scale=" + std::to_string(d->keep_scale) +
                                       " (finite, >= 1) out of range");
  p->has_dropout = true;
  p->dropout_threshold = static_cast<uint16_t>(d->threshold);
  p->dropout_scale = d->keep_scale;
  p->dropout_key_ptr = d->key->typed_data();
  p->dropout_offsets = d->offsets->typed_data();
  return ffi::Error::Success();
}

ffi::Error Fwd(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
               ffi::Buffer<ffi::S32> q_seq_lengths, ffi::Buffer<ffi::S32> kv_seq_lengths,
               ffi::Buffer<ffi::S32> q_segment_ids, ffi::Buffer<ffi::S32> kv_segment_ids,
               ffi::Buffer<ffi::F32> scale, bool is_causal, int64_t window_left,
               int64_t window_right, float logits_soft_cap, bool has_seq_lengths,
               bool has_segment_ids, const GpuDropoutOperands* dropout,
               ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::F32>> lse,
               ffi::Buffer<ffi::S32>* workspace) {
  if (ffi::Error e = check_hopper_device(); e.failure()) return e;
  AttentionParams p;
  if (ffi::Error e = describe_problem(q, k, v, scale, is_causal, &p); e.failure()) return e;
  const MaskOperands mask{&q_seq_lengths, &kv_seq_lengths, &q_segment_ids, &kv_segment_ids,
                          window_left,    window_right,    logits_soft_cap, has_seq_lengths,
                          has_segment_ids};
  if (ffi::Error e = describe_mask(mask, &p); e.failure()) return e;
  if (ffi::Error e = describe_gpu_dropout(dropout, &p); e.failure()) return e;
  if (ffi::Error e = check_gpu_problem(p); e.failure()) return e;
  if (std::string e = kernel_selection_error(); !e.empty()) return ffi::Error::InvalidArgument(e);
  if (out->element_type() != q.element_type() ||
      static_cast<int64_t>(out->element_count()) !=
          p.batch * p.seq_q * p.num_heads * p.head_dim) {
    return ffi::Error::InvalidArgument("jax_dash: out must have the query's shape " +
                                       dims_string(q.dimensions()) + " and dtype, got " +
                                       dims_string(out->dimensions()));
  }
  if (static_cast<int64_t>(lse->element_count()) != p.batch * p.num_heads * p.seq_q) {
    return ffi::Error::InvalidArgument("jax_dash: lse must be [batch, num_heads, seq_q] float32, "
                                       "got " + dims_string(lse->dimensions()));
  }
  p.out = out->untyped_data();
  p.lse = lse->typed_data();
  // The persistent kernel's tile counter (run_fwd zeroes it); the dropout target has none (its
  // kernels are one tile a CTA).
  if (workspace != nullptr) {
    if (workspace->element_count() < 1) {
      return ffi::Error::InvalidArgument("jax_dash: the forward's workspace must hold one int32, "
                                         "got " + dims_string(workspace->dimensions()));
    }
    p.workspace_i32 = workspace->typed_data();
  }
  if (cudaError_t err = run_fwd(p, stream); err != cudaSuccess) {
    return cuda_error("forward kernel launch failed", err);
  }
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return cuda_error("forward kernel launch failed", err);
  }
  return ffi::Error::Success();
}

ffi::Error FwdImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::Buffer<ffi::S32> q_seq_lengths, ffi::Buffer<ffi::S32> kv_seq_lengths,
                   ffi::Buffer<ffi::S32> q_segment_ids, ffi::Buffer<ffi::S32> kv_segment_ids,
                   ffi::Buffer<ffi::F32> scale, bool is_causal, int64_t window_left,
                   int64_t window_right, float logits_soft_cap, bool has_seq_lengths,
                   bool has_segment_ids, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::Buffer<ffi::F32>> lse,
                   ffi::Result<ffi::Buffer<ffi::S32>> workspace) {
  return Fwd(stream, q, k, v, q_seq_lengths, kv_seq_lengths, q_segment_ids, kv_segment_ids, scale,
             is_causal, window_left, window_right, logits_soft_cap, has_seq_lengths,
             has_segment_ids, nullptr, out, lse, &*workspace);
}

ffi::Error FwdDropoutImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                          ffi::AnyBuffer v, ffi::Buffer<ffi::S32> q_seq_lengths,
                          ffi::Buffer<ffi::S32> kv_seq_lengths,
                          ffi::Buffer<ffi::S32> q_segment_ids,
                          ffi::Buffer<ffi::S32> kv_segment_ids, ffi::Buffer<ffi::F32> scale,
                          ffi::Buffer<ffi::U32> key, ffi::Buffer<ffi::S32> offsets,
                          bool is_causal, int64_t window_left, int64_t window_right,
                          float logits_soft_cap, bool has_seq_lengths, bool has_segment_ids,
                          int64_t dropout_threshold, float dropout_scale,
                          ffi::Result<ffi::AnyBuffer> out,
                          ffi::Result<ffi::Buffer<ffi::F32>> lse) {
  const GpuDropoutOperands dropout{&key, &offsets, dropout_threshold, dropout_scale};
  return Fwd(stream, q, k, v, q_seq_lengths, kv_seq_lengths, q_segment_ids, kv_segment_ids, scale,
             is_causal, window_left, window_right, logits_soft_cap, has_seq_lengths,
             has_segment_ids, &dropout, out, lse, nullptr);
}

ffi::Error Bwd(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
               ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout,
               ffi::Buffer<ffi::S32> q_seq_lengths, ffi::Buffer<ffi::S32> kv_seq_lengths,
               ffi::Buffer<ffi::S32> q_segment_ids, ffi::Buffer<ffi::S32> kv_segment_ids,
               ffi::Buffer<ffi::F32> scale, ffi::AnyBuffer dq_sum, ffi::AnyBuffer dk_sum,
               ffi::AnyBuffer dv_sum, bool is_causal, int64_t window_left, int64_t window_right,
               float logits_soft_cap, bool has_seq_lengths, bool has_segment_ids,
               int32_t schedule, bool f32_grads, bool accumulate,
               const GpuDropoutOperands* dropout, ffi::Result<ffi::AnyBuffer> dq,
               ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
               ffi::Result<ffi::Buffer<ffi::F32>> workspace_f32,
               ffi::Result<ffi::Buffer<ffi::S32>> workspace_i32) {
  if (ffi::Error e = check_hopper_device(); e.failure()) return e;
  AttentionParams p;
  if (ffi::Error e = describe_problem(q, k, v, scale, is_causal, &p); e.failure()) return e;
  const MaskOperands mask{&q_seq_lengths, &kv_seq_lengths, &q_segment_ids, &kv_segment_ids,
                          window_left,    window_right,    logits_soft_cap, has_seq_lengths,
                          has_segment_ids};
  if (ffi::Error e = describe_mask(mask, &p); e.failure()) return e;
  if (ffi::Error e = describe_gpu_dropout(dropout, &p); e.failure()) return e;
  if (ffi::Error e = check_gpu_problem(p); e.failure()) return e;
  if (std::string e = kernel_selection_error(); !e.empty()) return ffi::Error::InvalidArgument(e);
  if (ffi::Error e = check_schedule(schedule, &p.schedule); e.failure()) return e;
  if (ffi::Error e = describe_backward(out, lse, dout, &*dq, &*dk, &*dv, &*workspace_f32,
                                       &*workspace_i32, &p, f32_grads);
      e.failure()) {
    return e;
  }
  SumCopy copies[3];
  int num_copies = 0;
  if (ffi::Error e = describe_accumulate(accumulate, f32_grads, dq_sum, dk_sum, dv_sum, &p,
                                         copies, &num_copies);
      e.failure()) {
    return e;
  }
#if JAX_DASH_HAVE_SM90_BWD
  // Checked before anything is enqueued: a launch that cannot fit would fail only after the
  // workspace zeroing and the preprocess were already on the stream.
  BwdOccupancy occupancy;
  if (cudaError_t err = bwd_occupancy(p, &occupancy); err != cudaSuccess) {
    return cuda_error("backward occupancy query failed", err);
  }
  if (p.seq_q > occupancy.max_seq_q) {
    // The main kernel keeps each KV tile's visit order and tickets (one entry per Q tile) in
    // shared memory, so very long queries outgrow it (about 450k tokens at head_dim 128).
    return ffi::Error::InvalidArgument(
        "jax_dash: the GPU backward supports seq_q up to " +
        std::to_string(occupancy.max_seq_q) + " at head_dim=" + std::to_string(p.head_dim) +
        " on this GPU (its per-query-tile schedule tables live in shared memory), got seq_q=" +
        std::to_string(p.seq_q) + "; shard the sequence over devices with "
        "jax_dash.ring_attention (each device's block must be at most that long), or, without "
        "a causal mask, run query chunks of at most that length over the same keys");
  }
  if (occupancy.wave < 1) {
    return ffi::Error::Internal(
        "jax_dash: the occupancy query found no backward CTA resident on this GPU for seq_q=" +
        std::to_string(p.seq_q) + " at head_dim=" + std::to_string(p.head_dim));
  }
  p.wave = occupancy.wave;
  // Sums that XLA did not place in their outputs (a call without input_output_aliases): the
  // kernels add into the outputs in place.
  for (int i = 0; i < num_copies; ++i) {
    if (cudaError_t err = cudaMemcpyAsync(copies[i].dst, copies[i].src, copies[i].bytes,
                                          cudaMemcpyDeviceToDevice, stream);
        err != cudaSuccess) {
      return cuda_error("copying an accumulate sum into its gradient failed", err);
    }
  }
  if (cudaError_t err = run_bwd(p, stream); err != cudaSuccess) {
    return cuda_error("backward kernel launch failed", err);
  }
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    return cuda_error("backward kernel launch failed", err);
  }
  return ffi::Error::Success();
#else
  (void)stream;
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    "jax_dash: the Hopper backward is not built in this version "
                    "(cuda/sm90/bwd/launch.cu was missing at build time)");
#endif
}

ffi::Error BwdImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout,
                   ffi::Buffer<ffi::S32> q_seq_lengths, ffi::Buffer<ffi::S32> kv_seq_lengths,
                   ffi::Buffer<ffi::S32> q_segment_ids, ffi::Buffer<ffi::S32> kv_segment_ids,
                   ffi::Buffer<ffi::F32> scale, ffi::AnyBuffer dq_sum, ffi::AnyBuffer dk_sum,
                   ffi::AnyBuffer dv_sum, bool is_causal, int64_t window_left,
                   int64_t window_right, float logits_soft_cap, bool has_seq_lengths,
                   bool has_segment_ids, int32_t schedule, bool f32_grads, bool accumulate,
                   ffi::Result<ffi::AnyBuffer> dq,
                   ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                   ffi::Result<ffi::Buffer<ffi::F32>> workspace_f32,
                   ffi::Result<ffi::Buffer<ffi::S32>> workspace_i32) {
  return Bwd(stream, q, k, v, out, lse, dout, q_seq_lengths, kv_seq_lengths, q_segment_ids,
             kv_segment_ids, scale, dq_sum, dk_sum, dv_sum, is_causal, window_left, window_right,
             logits_soft_cap, has_seq_lengths, has_segment_ids, schedule, f32_grads, accumulate,
             nullptr, dq, dk, dv, workspace_f32, workspace_i32);
}

ffi::Error BwdDropoutImpl(
    cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
    ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout, ffi::Buffer<ffi::S32> q_seq_lengths,
    ffi::Buffer<ffi::S32> kv_seq_lengths, ffi::Buffer<ffi::S32> q_segment_ids,
    ffi::Buffer<ffi::S32> kv_segment_ids, ffi::Buffer<ffi::F32> scale, ffi::AnyBuffer dq_sum,
    ffi::AnyBuffer dk_sum, ffi::AnyBuffer dv_sum, ffi::Buffer<ffi::U32> key,
    ffi::Buffer<ffi::S32> offsets, bool is_causal, int64_t window_left, int64_t window_right,
    float logits_soft_cap, bool has_seq_lengths, bool has_segment_ids, int32_t schedule,
    bool f32_grads, bool accumulate, int64_t dropout_threshold, float dropout_scale,
    ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
    ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::Buffer<ffi::F32>> workspace_f32,
    ffi::Result<ffi::Buffer<ffi::S32>> workspace_i32) {
  const GpuDropoutOperands dropout{&key, &offsets, dropout_threshold, dropout_scale};
  return Bwd(stream, q, k, v, out, lse, dout, q_seq_lengths, kv_seq_lengths, q_segment_ids,
             kv_segment_ids, scale, dq_sum, dk_sum, dv_sum, is_causal, window_left, window_right,
             logits_soft_cap, has_seq_lengths, has_segment_ids, schedule, f32_grads, accumulate,
             &dropout, dq, dk, dv, workspace_f32, workspace_i32);
}

}  // namespace
}  // namespace jax_dash::sm90

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashFwdCuda, jax_dash::sm90::FwdImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // q
                                  .Arg<ffi::AnyBuffer>()                     // k
                                  .Arg<ffi::AnyBuffer>()                     // v
                                  .Arg<ffi::Buffer<ffi::S32>>()              // q_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()              // kv_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()              // q_segment_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()              // kv_segment_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()              // scale (0-d)
                                  .Attr<bool>("is_causal")                   // is_causal
                                  .Attr<int64_t>("window_left")              // -1: unbounded
                                  .Attr<int64_t>("window_right")             // -1: unbounded
                                  .Attr<float>("logits_soft_cap")            // 0: none
                                  .Attr<bool>("has_seq_lengths")             // lengths used
                                  .Attr<bool>("has_segment_ids")             // segments used
                                  .Ret<ffi::AnyBuffer>()                     // out
                                  .Ret<ffi::Buffer<ffi::F32>>()              // lse
                                  .Ret<ffi::Buffer<ffi::S32>>()              // workspace [1]
);

// The forward with dropout (issue 33): the dropout key and offsets after the other operands, two
// attributes more (as the CPU's JaxDashFwdDropoutCpu).
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashFwdDropoutCuda, jax_dash::sm90::FwdDropoutImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // q
                                  .Arg<ffi::AnyBuffer>()                     // k
                                  .Arg<ffi::AnyBuffer>()                     // v
                                  .Arg<ffi::Buffer<ffi::S32>>()              // q_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()              // kv_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()              // q_segment_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()              // kv_segment_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()              // scale (0-d)
                                  .Arg<ffi::Buffer<ffi::U32>>()              // dropout key [2]
                                  .Arg<ffi::Buffer<ffi::S32>>()              // dropout_offsets [4]
                                  .Attr<bool>("is_causal")                   // is_causal
                                  .Attr<int64_t>("window_left")              // -1: unbounded
                                  .Attr<int64_t>("window_right")             // -1: unbounded
                                  .Attr<float>("logits_soft_cap")            // 0: none
                                  .Attr<bool>("has_seq_lengths")             // lengths used
                                  .Attr<bool>("has_segment_ids")             // segments used
                                  .Attr<int64_t>("dropout_threshold")        // keep a draw >= this
                                  .Attr<float>("dropout_scale")              // 1 / (1 - rate)
                                  .Ret<ffi::AnyBuffer>()                     // out
                                  .Ret<ffi::Buffer<ffi::F32>>()              // lse
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashBwdCuda, jax_dash::sm90::BwdImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // q
                                  .Arg<ffi::AnyBuffer>()                     // k
                                  .Arg<ffi::AnyBuffer>()                     // v
                                  .Arg<ffi::AnyBuffer>()                     // out
                                  .Arg<ffi::Buffer<ffi::F32>>()              // lse
                                  .Arg<ffi::AnyBuffer>()                     // dout
                                  .Arg<ffi::Buffer<ffi::S32>>()              // q_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()              // kv_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()              // q_segment_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()              // kv_segment_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()              // scale (0-d)
                                  .Arg<ffi::AnyBuffer>()                     // dq_sum
                                  .Arg<ffi::AnyBuffer>()                     // dk_sum
                                  .Arg<ffi::AnyBuffer>()                     // dv_sum
                                  .Attr<bool>("is_causal")                   // is_causal
                                  .Attr<int64_t>("window_left")              // -1: unbounded
                                  .Attr<int64_t>("window_right")             // -1: unbounded
                                  .Attr<float>("logits_soft_cap")            // 0: none
                                  .Attr<bool>("has_seq_lengths")             // lengths used
                                  .Attr<bool>("has_segment_ids")             // segments used
                                  .Attr<int32_t>("schedule")                 // schedule
                                  .Attr<bool>("f32_grads")                   // dq/dk/dv float32
                                  .Attr<bool>("accumulate")                  // dq/dk/dv += sums
                                  .Ret<ffi::AnyBuffer>()                     // dq
                                  .Ret<ffi::AnyBuffer>()                     // dk
                                  .Ret<ffi::AnyBuffer>()                     // dv
                                  .Ret<ffi::Buffer<ffi::F32>>()              // workspace_f32
                                  .Ret<ffi::Buffer<ffi::S32>>()              // workspace_i32
);

// The backward with dropout (issue 33): as the CPU's JaxDashBwdDropoutCpu.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashBwdDropoutCuda, jax_dash::sm90::BwdDropoutImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()  // stream
                                  .Arg<ffi::AnyBuffer>()                     // q
                                  .Arg<ffi::AnyBuffer>()                     // k
                                  .Arg<ffi::AnyBuffer>()                     // v
                                  .Arg<ffi::AnyBuffer>()                     // out
                                  .Arg<ffi::Buffer<ffi::F32>>()              // lse
                                  .Arg<ffi::AnyBuffer>()                     // dout
                                  .Arg<ffi::Buffer<ffi::S32>>()              // q_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()              // kv_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()              // q_segment_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()              // kv_segment_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()              // scale (0-d)
                                  .Arg<ffi::AnyBuffer>()                     // dq_sum
                                  .Arg<ffi::AnyBuffer>()                     // dk_sum
                                  .Arg<ffi::AnyBuffer>()                     // dv_sum
                                  .Arg<ffi::Buffer<ffi::U32>>()              // dropout key [2]
                                  .Arg<ffi::Buffer<ffi::S32>>()              // dropout_offsets [4]
                                  .Attr<bool>("is_causal")                   // is_causal
                                  .Attr<int64_t>("window_left")              // -1: unbounded
                                  .Attr<int64_t>("window_right")             // -1: unbounded
                                  .Attr<float>("logits_soft_cap")            // 0: none
                                  .Attr<bool>("has_seq_lengths")             // lengths used
                                  .Attr<bool>("has_segment_ids")             // segments used
                                  .Attr<int32_t>("schedule")                 // schedule
                                  .Attr<bool>("f32_grads")                   // dq/dk/dv float32
                                  .Attr<bool>("accumulate")                  // dq/dk/dv += sums
                                  .Attr<int64_t>("dropout_threshold")        // keep a draw >= this
                                  .Attr<float>("dropout_scale")              // 1 / (1 - rate)
                                  .Ret<ffi::AnyBuffer>()                     // dq
                                  .Ret<ffi::AnyBuffer>()                     // dk
                                  .Ret<ffi::AnyBuffer>()                     // dv
                                  .Ret<ffi::Buffer<ffi::F32>>()              // workspace_f32
                                  .Ret<ffi::Buffer<ffi::S32>>()              // workspace_i32
);
