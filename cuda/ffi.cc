// XLA FFI handlers for platform "cpu" (and, when the sm90 kernels are not built, "CUDA" stubs that
// say so), plus the nanobind module that hands them to Python.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "cuda/cpu/attention_cpu.h"
#include "cuda/ffi_common.h"
#include "cuda/params.h"
#include "cuda/dropout_py.h"
#include "cuda/schedule_py.h"
#include "cuda/segment_sum.h"
#include "cuda/sm90/handlers.h"
#include "nanobind/nanobind.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace jax_dash {

// The CPU has no residency limit; it uses the wave width of an H100/H200 SXM (132 SMs, one backward
// CTA per SM) so that wave-dependent tickets (shift) give the bits such a GPU would.
constexpr int32_t kCpuWave = 132;

// Runs a CPU kernel, turning its exceptions into FFI errors that name it: invalid_argument comes
// from JAX_DASH_CPU_THREADS (the user's setting), anything else is internal.
template <typename Kernel>
ffi::Error run_cpu_kernel(const char* what, Kernel&& kernel) {
  try {
    kernel();
  } catch (const std::invalid_argument& e) {
    return ffi::Error::InvalidArgument(std::string("jax_dash CPU ") + what + ": " + e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("jax_dash CPU ") + what + ": " + e.what());
  }
  return ffi::Error::Success();
}

// The dropout operands and attributes of the *_dropout targets (cuda/dropout.h): the two key
// words (uint32 [2]) and the global coordinates of the call's first element (int32 [4]: batch,
// head, q, kv; AttentionParams::dropout_offsets), both host memory on the CPU, the 16-bit
// threshold and 1 / (1 - rate).
struct DropoutOperands {
  const ffi::Buffer<ffi::U32>* key;
  const ffi::Buffer<ffi::S32>* offsets;
  int64_t threshold;
  float keep_scale;
};

// The offsets are data (traced values reach here unchecked): each must be >= 0, and the call's
// coordinates from it must stay below 2^32 (the mask's coordinates are uint32).
ffi::Error check_dropout_offsets(const int32_t* offsets, const AttentionParams& p) {
  static constexpr const char* kNames[4] = {"batch", "head", "q", "kv"};
  const int64_t extents[4] = {p.batch, p.num_heads, p.seq_q, p.seq_kv};
  constexpr int64_t kCoordinates = int64_t{1} << 32;
  for (int axis = 0; axis < 4; ++axis)
    if (offsets[axis] < 0 || offsets[axis] + extents[axis] > kCoordinates)
      return ffi::Error::InvalidArgument(
          std::string("jax_dash: dropout_offsets has ") + kNames[axis] + " offset " +
          std::to_string(offsets[axis]) + " for " + std::to_string(extents[axis]) +
          " positions; offsets must be >= 0 (the global coordinates of the call's first "
          "element), and offset + positions <= 2^32");
  return ffi::Error::Success();
}

// Host-memory operands only (the CPU handlers): the offsets are read here, to check them.
ffi::Error describe_dropout(const DropoutOperands* d, AttentionParams* p) {
  if (d == nullptr) return ffi::Error::Success();
  if (!has_dims(d->key->dimensions(), {2}))
    return ffi::Error::InvalidArgument("jax_dash: the dropout key has shape " +
                                       dims_string(d->key->dimensions()) + ", expected [2]");
  if (!has_dims(d->offsets->dimensions(), {4}))
    return ffi::Error::InvalidArgument("jax_dash: dropout_offsets has shape " +
                                       dims_string(d->offsets->dimensions()) +
                                       ", expected [4] (batch, head, q, kv)");
  if (ffi::Error e = check_dropout_offsets(d->offsets->typed_data(), *p); e.failure()) return e;
  if (d->threshold < 0 || d->threshold > 65535 || !(d->keep_scale >= 1.0f) ||
      !std::isfinite(d->keep_scale))
    return ffi::Error::InvalidArgument("jax_dash: dropout_threshold=" +
                                       std::to_string(d->threshold) + " (0..65535) and " +
                                       "dropout_scale=" + std::to_string(d->keep_scale) +
                                       " (finite, >= 1) out of range");
  p->has_dropout = true;
  p->dropout_key0 = d->key->typed_data()[0];
  p->dropout_key1 = d->key->typed_data()[1];
  p->dropout_threshold = static_cast<uint16_t>(d->threshold);
  p->dropout_scale = d->keep_scale;
  p->dropout_offsets = d->offsets->typed_data();
  return ffi::Error::Success();
}

static ffi::Error FwdCpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                         ffi::Buffer<ffi::S32> q_seq_lengths, ffi::Buffer<ffi::S32> kv_seq_lengths,
                         ffi::Buffer<ffi::S32> q_segment_ids,
                         ffi::Buffer<ffi::S32> kv_segment_ids, ffi::Buffer<ffi::F32> scale,
                         bool is_causal, int64_t window_left, int64_t window_right,
                         float logits_soft_cap, bool has_seq_lengths, bool has_segment_ids,
                         const DropoutOperands* dropout, ffi::Result<ffi::AnyBuffer> out,
                         ffi::Result<ffi::Buffer<ffi::F32>> lse) {
  AttentionParams p;
  if (ffi::Error e = describe_problem(q, k, v, scale, is_causal, &p); e.failure()) return e;
  const MaskOperands mask{&q_seq_lengths, &kv_seq_lengths, &q_segment_ids, &kv_segment_ids,
                          window_left,    window_right,    logits_soft_cap, has_seq_lengths,
                          has_segment_ids};
  if (ffi::Error e = describe_mask(mask, &p); e.failure()) return e;
  if (ffi::Error e = describe_dropout(dropout, &p); e.failure()) return e;
  if (ffi::Error e = check_buffer("out", *out, {p.batch, p.seq_q, p.num_heads, p.head_dim},
                                  q.element_type(), "the query's");
      e.failure())
    return e;
  if (!has_dims(lse->dimensions(), {p.batch, p.num_heads, p.seq_q}))
    return ffi::Error::InvalidArgument("jax_dash: lse has shape " +
                                       dims_string(lse->dimensions()) +
                                       ", expected [batch, num_heads, seq_q] = " +
                                       dims_string({p.batch, int64_t{p.num_heads}, p.seq_q}));
  p.out = out->untyped_data();
  p.lse = lse->typed_data();
  return run_cpu_kernel("forward", [&] { cpu::forward(p); });
}

static ffi::Error FwdCpuImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                             ffi::Buffer<ffi::S32> q_seq_lengths,
                             ffi::Buffer<ffi::S32> kv_seq_lengths,
                             ffi::Buffer<ffi::S32> q_segment_ids,
                             ffi::Buffer<ffi::S32> kv_segment_ids, ffi::Buffer<ffi::F32> scale,
                             bool is_causal, int64_t window_left, int64_t window_right,
                             float logits_soft_cap, bool has_seq_lengths, bool has_segment_ids,
                             ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::Buffer<ffi::F32>> lse,
                             ffi::Result<ffi::Buffer<ffi::S32>> /*workspace*/) {
  return FwdCpu(q, k, v, q_seq_lengths, kv_seq_lengths, q_segment_ids, kv_segment_ids, scale,
                is_causal, window_left, window_right, logits_soft_cap, has_seq_lengths,
                has_segment_ids, nullptr, out, lse);
}

static ffi::Error FwdDropoutCpuImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                    ffi::Buffer<ffi::S32> q_seq_lengths,
                                    ffi::Buffer<ffi::S32> kv_seq_lengths,
                                    ffi::Buffer<ffi::S32> q_segment_ids,
                                    ffi::Buffer<ffi::S32> kv_segment_ids,
                                    ffi::Buffer<ffi::F32> scale, ffi::Buffer<ffi::U32> key,
                                    ffi::Buffer<ffi::S32> offsets, bool is_causal,
                                    int64_t window_left, int64_t window_right,
                                    float logits_soft_cap, bool has_seq_lengths,
                                    bool has_segment_ids, int64_t dropout_threshold,
                                    float dropout_scale, ffi::Result<ffi::AnyBuffer> out,
                                    ffi::Result<ffi::Buffer<ffi::F32>> lse) {
  const DropoutOperands dropout{&key, &offsets, dropout_threshold, dropout_scale};
  return FwdCpu(q, k, v, q_seq_lengths, kv_seq_lengths, q_segment_ids, kv_segment_ids, scale,
                is_causal, window_left, window_right, logits_soft_cap, has_seq_lengths,
                has_segment_ids, &dropout, out, lse);
}

static ffi::Error BwdCpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                         ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout,
                         ffi::Buffer<ffi::S32> q_seq_lengths,
                         ffi::Buffer<ffi::S32> kv_seq_lengths,
                         ffi::Buffer<ffi::S32> q_segment_ids,
                         ffi::Buffer<ffi::S32> kv_segment_ids, ffi::Buffer<ffi::F32> scale,
                         ffi::AnyBuffer dq_sum, ffi::AnyBuffer dk_sum, ffi::AnyBuffer dv_sum,
                         bool is_causal, int64_t window_left, int64_t window_right,
                         float logits_soft_cap, bool has_seq_lengths, bool has_segment_ids,
                         int32_t schedule, bool f32_grads, bool accumulate,
                         const DropoutOperands* dropout, ffi::Result<ffi::AnyBuffer> dq,
                         ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                         ffi::Result<ffi::Buffer<ffi::F32>> workspace_f32,
                         ffi::Result<ffi::Buffer<ffi::S32>> workspace_i32) {
  AttentionParams p;
  if (ffi::Error e = describe_problem(q, k, v, scale, is_causal, &p); e.failure()) return e;
  const MaskOperands mask{&q_seq_lengths, &kv_seq_lengths, &q_segment_ids, &kv_segment_ids,
                          window_left,    window_right,    logits_soft_cap, has_seq_lengths,
                          has_segment_ids};
  if (ffi::Error e = describe_mask(mask, &p); e.failure()) return e;
  if (ffi::Error e = describe_dropout(dropout, &p); e.failure()) return e;
  if (ffi::Error e = check_schedule(schedule, &p.schedule); e.failure()) return e;
  if (ffi::Error e = describe_backward(out, lse, dout, &*dq, &*dk, &*dv, &*workspace_f32,
                                       &*workspace_i32, &p, f32_grads);
      e.failure())
    return e;
  SumCopy copies[3];
  int num_copies = 0;
  if (ffi::Error e = describe_accumulate(accumulate, f32_grads, dq_sum, dk_sum, dv_sum, &p,
                                         copies, &num_copies);
      e.failure())
    return e;
  for (int i = 0; i < num_copies; ++i) std::memcpy(copies[i].dst, copies[i].src, copies[i].bytes);
  p.wave = kCpuWave;
  return run_cpu_kernel("backward", [&] { cpu::backward(p); });
}

static ffi::Error BwdCpuImpl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                             ffi::AnyBuffer out, ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout,
                             ffi::Buffer<ffi::S32> q_seq_lengths,
                             ffi::Buffer<ffi::S32> kv_seq_lengths,
                             ffi::Buffer<ffi::S32> q_segment_ids,
                             ffi::Buffer<ffi::S32> kv_segment_ids, ffi::Buffer<ffi::F32> scale,
                             ffi::AnyBuffer dq_sum, ffi::AnyBuffer dk_sum, ffi::AnyBuffer dv_sum,
                             bool is_causal, int64_t window_left, int64_t window_right,
                             float logits_soft_cap, bool has_seq_lengths, bool has_segment_ids,
                             int32_t schedule, bool f32_grads, bool accumulate,
                             ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                             ffi::Result<ffi::AnyBuffer> dv,
                             ffi::Result<ffi::Buffer<ffi::F32>> workspace_f32,
                             ffi::Result<ffi::Buffer<ffi::S32>> workspace_i32) {
  return BwdCpu(q, k, v, out, lse, dout, q_seq_lengths, kv_seq_lengths, q_segment_ids,
                kv_segment_ids, scale, dq_sum, dk_sum, dv_sum, is_causal, window_left,
                window_right, logits_soft_cap, has_seq_lengths, has_segment_ids, schedule,
                f32_grads, accumulate, nullptr, dq, dk, dv, workspace_f32, workspace_i32);
}

static ffi::Error BwdDropoutCpuImpl(
    ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
    ffi::Buffer<ffi::F32> lse, ffi::AnyBuffer dout, ffi::Buffer<ffi::S32> q_seq_lengths,
    ffi::Buffer<ffi::S32> kv_seq_lengths, ffi::Buffer<ffi::S32> q_segment_ids,
    ffi::Buffer<ffi::S32> kv_segment_ids, ffi::Buffer<ffi::F32> scale, ffi::AnyBuffer dq_sum,
    ffi::AnyBuffer dk_sum, ffi::AnyBuffer dv_sum, ffi::Buffer<ffi::U32> key,
    ffi::Buffer<ffi::S32> offsets, bool is_causal,
    int64_t window_left, int64_t window_right, float logits_soft_cap, bool has_seq_lengths,
    bool has_segment_ids, int32_t schedule, bool f32_grads, bool accumulate,
    int64_t dropout_threshold, float dropout_scale, ffi::Result<ffi::AnyBuffer> dq,
    ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
    ffi::Result<ffi::Buffer<ffi::F32>> workspace_f32,
    ffi::Result<ffi::Buffer<ffi::S32>> workspace_i32) {
  const DropoutOperands dropout{&key, &offsets, dropout_threshold, dropout_scale};
  return BwdCpu(q, k, v, out, lse, dout, q_seq_lengths, kv_seq_lengths, q_segment_ids,
                kv_segment_ids, scale, dq_sum, dk_sum, dv_sum, is_causal, window_left,
                window_right, logits_soft_cap, has_seq_lengths, has_segment_ids, schedule,
                f32_grads, accumulate, &dropout, dq, dk, dv, workspace_f32, workspace_i32);
}

static ffi::Error SegmentSumCpuImpl(ffi::AnyBuffer data, ffi::Buffer<ffi::S32> sorted_ids,
                                    ffi::Buffer<ffi::S32> order, bool has_order,
                                    ffi::Result<ffi::AnyBuffer> out,
                                    ffi::Result<ffi::Buffer<ffi::S32>> offsets) {
  SegmentSumParams p;
  if (ffi::Error e = describe_segment_sum(data, sorted_ids, order, has_order, *out, *offsets, &p);
      e.failure())
    return e;
  return run_cpu_kernel("segment_sum", [&] { cpu::segment_sum(p); });
}

}  // namespace jax_dash

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashFwdCpu, jax_dash::FwdCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()          // query
                                  .Arg<ffi::AnyBuffer>()          // key
                                  .Arg<ffi::AnyBuffer>()          // value
                                  .Arg<ffi::Buffer<ffi::S32>>()   // query_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()   // key_value_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()   // query_segment_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()   // key_value_segment_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()   // scale (0-d)
                                  .Attr<bool>("is_causal")        // top-left causal mask
                                  .Attr<int64_t>("window_left")   // -1: no window limit
                                  .Attr<int64_t>("window_right")  // -1: no window limit
                                  .Attr<float>("logits_soft_cap")  // 0: no cap
                                  .Attr<bool>("has_seq_lengths")  // lengths operands used
                                  .Attr<bool>("has_segment_ids")  // segment operands used
                                  .Ret<ffi::AnyBuffer>()          // out
                                  .Ret<ffi::Buffer<ffi::F32>>()   // lse
                                  .Ret<ffi::Buffer<ffi::S32>>()   // workspace [1]: the GPU's
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashBwdCpu, jax_dash::BwdCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()          // query
                                  .Arg<ffi::AnyBuffer>()          // key
                                  .Arg<ffi::AnyBuffer>()          // value
                                  .Arg<ffi::AnyBuffer>()          // out
                                  .Arg<ffi::Buffer<ffi::F32>>()   // lse
                                  .Arg<ffi::AnyBuffer>()          // dout
                                  .Arg<ffi::Buffer<ffi::S32>>()   // query_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()   // key_value_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()   // query_segment_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()   // key_value_segment_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()   // scale (0-d)
                                  .Arg<ffi::AnyBuffer>()          // dq_sum (accumulate)
                                  .Arg<ffi::AnyBuffer>()          // dk_sum (accumulate)
                                  .Arg<ffi::AnyBuffer>()          // dv_sum (accumulate)
                                  .Attr<bool>("is_causal")        // top-left causal mask
                                  .Attr<int64_t>("window_left")   // -1: no window limit
                                  .Attr<int64_t>("window_right")  // -1: no window limit
                                  .Attr<float>("logits_soft_cap")  // 0: no cap
                                  .Attr<bool>("has_seq_lengths")  // lengths operands used
                                  .Attr<bool>("has_segment_ids")  // segment operands used
                                  .Attr<int32_t>("schedule")      // jax_dash::Schedule
                                  .Attr<bool>("f32_grads")        // dq, dk, dv in float32
                                  .Attr<bool>("accumulate")       // dq, dk, dv += (the sums)
                                  .Ret<ffi::AnyBuffer>()          // dq
                                  .Ret<ffi::AnyBuffer>()          // dk
                                  .Ret<ffi::AnyBuffer>()          // dv
                                  .Ret<ffi::Buffer<ffi::F32>>()   // workspace_f32
                                  .Ret<ffi::Buffer<ffi::S32>>()   // workspace_i32
);

// The same with dropout (CPU only): the dropout key and offsets after the other operands, two
// attributes more.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashFwdDropoutCpu, jax_dash::FwdDropoutCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()          // query
                                  .Arg<ffi::AnyBuffer>()          // key
                                  .Arg<ffi::AnyBuffer>()          // value
                                  .Arg<ffi::Buffer<ffi::S32>>()   // query_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()   // key_value_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()   // query_segment_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()   // key_value_segment_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()   // scale (0-d)
                                  .Arg<ffi::Buffer<ffi::U32>>()   // dropout key [2]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // dropout_offsets [4]
                                  .Attr<bool>("is_causal")
                                  .Attr<int64_t>("window_left")
                                  .Attr<int64_t>("window_right")
                                  .Attr<float>("logits_soft_cap")
                                  .Attr<bool>("has_seq_lengths")
                                  .Attr<bool>("has_segment_ids")
                                  .Attr<int64_t>("dropout_threshold")  // keep a draw >= this
                                  .Attr<float>("dropout_scale")   // 1 / (1 - rate)
                                  .Ret<ffi::AnyBuffer>()          // out
                                  .Ret<ffi::Buffer<ffi::F32>>()   // lse
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashBwdDropoutCpu, jax_dash::BwdDropoutCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()          // query
                                  .Arg<ffi::AnyBuffer>()          // key
                                  .Arg<ffi::AnyBuffer>()          // value
                                  .Arg<ffi::AnyBuffer>()          // out
                                  .Arg<ffi::Buffer<ffi::F32>>()   // lse
                                  .Arg<ffi::AnyBuffer>()          // dout
                                  .Arg<ffi::Buffer<ffi::S32>>()   // query_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()   // key_value_seq_lengths
                                  .Arg<ffi::Buffer<ffi::S32>>()   // query_segment_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()   // key_value_segment_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()   // scale (0-d)
                                  .Arg<ffi::AnyBuffer>()          // dq_sum (accumulate)
                                  .Arg<ffi::AnyBuffer>()          // dk_sum (accumulate)
                                  .Arg<ffi::AnyBuffer>()          // dv_sum (accumulate)
                                  .Arg<ffi::Buffer<ffi::U32>>()   // dropout key [2]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // dropout_offsets [4]
                                  .Attr<bool>("is_causal")
                                  .Attr<int64_t>("window_left")
                                  .Attr<int64_t>("window_right")
                                  .Attr<float>("logits_soft_cap")
                                  .Attr<bool>("has_seq_lengths")
                                  .Attr<bool>("has_segment_ids")
                                  .Attr<int32_t>("schedule")
                                  .Attr<bool>("f32_grads")
                                  .Attr<bool>("accumulate")
                                  .Attr<int64_t>("dropout_threshold")
                                  .Attr<float>("dropout_scale")
                                  .Ret<ffi::AnyBuffer>()          // dq
                                  .Ret<ffi::AnyBuffer>()          // dk
                                  .Ret<ffi::AnyBuffer>()          // dv
                                  .Ret<ffi::Buffer<ffi::F32>>()   // workspace_f32
                                  .Ret<ffi::Buffer<ffi::S32>>()   // workspace_i32
);

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashSegmentSumCpu, jax_dash::SegmentSumCpuImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()          // data [rows, row_size]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // sorted_ids [rows]
                                  .Arg<ffi::Buffer<ffi::S32>>()   // order [rows] (or empty)
                                  .Attr<bool>("has_order")        // order used
                                  .Ret<ffi::AnyBuffer>()          // out [num_segments, row_size]
                                  .Ret<ffi::Buffer<ffi::S32>>()   // offsets [num_segments + 1]
);

#ifndef JAX_DASH_WITH_CUDA
// Built without nvcc: a GPU call fails with a message that says why, not "no handler".
static ffi::Error CudaNotBuiltImpl(ffi::RemainingArgs, ffi::RemainingRets, ffi::Dictionary) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    "jax_dash was built without its CUDA kernels (nvcc was not found at build "
                    "time, or JAX_DASH_CUDA=OFF); reinstall with the CUDA toolkit on PATH, or run "
                    "on the CPU");
}
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashFwdCuda, CudaNotBuiltImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()               // any operands
                                  .RemainingRets()               // any results
                                  .Attrs<ffi::Dictionary>()      // any attributes
);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashFwdDropoutCuda, CudaNotBuiltImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()               // any operands
                                  .RemainingRets()               // any results
                                  .Attrs<ffi::Dictionary>()      // any attributes
);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashBwdCuda, CudaNotBuiltImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()               // any operands
                                  .RemainingRets()               // any results
                                  .Attrs<ffi::Dictionary>()      // any attributes
);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashBwdDropoutCuda, CudaNotBuiltImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()               // any operands
                                  .RemainingRets()               // any results
                                  .Attrs<ffi::Dictionary>()      // any attributes
);
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxDashSegmentSumCuda, CudaNotBuiltImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()               // any operands
                                  .RemainingRets()               // any results
                                  .Attrs<ffi::Dictionary>()      // any attributes
);
#endif

namespace {

template <typename T>
nb::capsule encapsulate(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "an FFI handler takes XLA_FFI_CallFrame* and returns XLA_FFI_Error*");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jax_dash, m) {
  m.doc() = "jax_dash native kernels: XLA FFI handlers and the schedule definitions";
  m.def("registrations", []() {
    nb::dict fwd, bwd, targets;
    fwd["cpu"] = encapsulate(JaxDashFwdCpu);
    fwd["CUDA"] = encapsulate(JaxDashFwdCuda);
    bwd["cpu"] = encapsulate(JaxDashBwdCpu);
    bwd["CUDA"] = encapsulate(JaxDashBwdCuda);
    targets["jax_dash_fwd"] = fwd;
    targets["jax_dash_bwd"] = bwd;
    nb::dict fwd_dropout, bwd_dropout;
    fwd_dropout["cpu"] = encapsulate(JaxDashFwdDropoutCpu);
    bwd_dropout["cpu"] = encapsulate(JaxDashBwdDropoutCpu);
    fwd_dropout["CUDA"] = encapsulate(JaxDashFwdDropoutCuda);
    bwd_dropout["CUDA"] = encapsulate(JaxDashBwdDropoutCuda);
    targets["jax_dash_fwd_dropout"] = fwd_dropout;
    targets["jax_dash_bwd_dropout"] = bwd_dropout;
    nb::dict segment_sum;
    segment_sum["cpu"] = encapsulate(JaxDashSegmentSumCpu);
    segment_sum["CUDA"] = encapsulate(JaxDashSegmentSumCuda);
    targets["jax_dash_segment_sum"] = segment_sum;
    return targets;
  });
  m.def("built_with_cuda", []() {
#ifdef JAX_DASH_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.attr("CPU_WAVE") = jax_dash::kCpuWave;
  m.def(
      "tile_config",
      [](int head_dim) {
        const jax_dash::TileConfig t = jax_dash::tile_config(head_dim);
        return nb::make_tuple(t.fwd_block_m, t.fwd_block_n, t.bwd_block_m, t.bwd_block_n);
      },
      nb::arg("head_dim"), "(fwd_block_m, fwd_block_n, bwd_block_m, bwd_block_n) for head_dim");
  m.def(
      "bwd_workspace_size",
      [](int64_t batch, int64_t seq_q, int64_t seq_kv, int64_t num_heads, int64_t num_kv_heads,
         int64_t head_dim) {
        const jax_dash::BwdWorkspaceLayout w = jax_dash::bwd_workspace_layout(
            batch, seq_q, seq_kv, num_heads, num_kv_heads, head_dim);
        return nb::make_tuple(w.f32_size, w.i32_size);
      },
      nb::arg("batch"), nb::arg("seq_q"), nb::arg("seq_kv"), nb::arg("num_heads"),
      nb::arg("num_kv_heads"), nb::arg("head_dim"),
      "(float32 elements, int32 elements) of the backward workspace");
  m.def(
      "bwd_has_unit_tables",
      [](int64_t batch, int64_t seq_q, int64_t seq_kv, int64_t num_heads, int64_t num_kv_heads,
         int64_t head_dim) {
        return jax_dash::bwd_workspace_layout(batch, seq_q, seq_kv, num_heads, num_kv_heads,
                                              head_dim)
            .unit_tables;
      },
      nb::arg("batch"), nb::arg("seq_q"), nb::arg("seq_kv"), nb::arg("num_heads"),
      nb::arg("num_kv_heads"), nb::arg("head_dim"),
      "whether the backward workspace holds the unit tables (else the Hopper backward runs its "
      "masked instantiation, which builds them in the kernel)");
  jax_dash::bind_schedules(m);
  jax_dash::bind_dropout(m);
}
