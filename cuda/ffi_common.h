// Shape/dtype checks and AttentionParams filling shared by the CPU and CUDA FFI handlers.
// The Python layer validates first with friendlier messages; these checks are the last line.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "cuda/params.h"
#include "xla/ffi/api/ffi.h"

namespace jax_dash {

namespace ffi = xla::ffi;

inline std::string dims_string(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

inline std::string dims_string(std::initializer_list<int64_t> dims) {
  std::string s = "(";
  for (const int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + ")";
}

// The NumPy/JAX name of an XLA element type, as users spell it.
inline std::string dtype_string(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::C64: return "complex64";
    case ffi::DataType::C128: return "complex128";
    default: return "XLA element type " + std::to_string(static_cast<int>(type));
  }
}

inline ffi::DataType to_ffi_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ffi::DataType::F32;
    case DType::kFloat16: return ffi::DataType::F16;
    case DType::kBFloat16: return ffi::DataType::BF16;
  }
  return ffi::DataType::INVALID;
}

inline ffi::Error to_dtype(ffi::DataType type, DType* out) {
  switch (type) {
    case ffi::DataType::F32: *out = DType::kFloat32; return ffi::Error::Success();
    case ffi::DataType::F16: *out = DType::kFloat16; return ffi::Error::Success();
    case ffi::DataType::BF16: *out = DType::kBFloat16; return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("jax_dash: query has dtype " + dtype_string(type) +
                                         "; allowed: float32, float16, bfloat16");
  }
}

// Whether a buffer's dimensions are exactly `dims`.
inline bool has_dims(ffi::AnyBuffer::Dimensions actual, std::initializer_list<int64_t> dims) {
  if (actual.size() != dims.size()) return false;
  size_t i = 0;
  for (const int64_t d : dims)
    if (actual[i++] != d) return false;
  return true;
}

// `name` must have exactly `dims` and element type `dtype`, those of `owner` ("the query's").
inline ffi::Error check_dims(const char* name, const ffi::AnyBuffer& buffer,
                             std::initializer_list<int64_t> dims, const char* owner) {
  if (!has_dims(buffer.dimensions(), dims))
    return ffi::Error::InvalidArgument("jax_dash: " + std::string(name) + " has shape " +
                                       dims_string(buffer.dimensions()) + ", expected " + owner +
                                       " shape " + dims_string(dims));
  return ffi::Error::Success();
}

inline ffi::Error check_buffer(const char* name, const ffi::AnyBuffer& buffer,
                               std::initializer_list<int64_t> dims, ffi::DataType dtype,
                               const char* owner) {
  if (ffi::Error e = check_dims(name, buffer, dims, owner); e.failure()) return e;
  if (buffer.element_type() != dtype)
    return ffi::Error::InvalidArgument("jax_dash: " + std::string(name) + " has dtype " +
                                       dtype_string(buffer.element_type()) + ", expected " +
                                       owner + " dtype " + dtype_string(dtype));
  return ffi::Error::Success();
}

// Fills the problem description of p from q [B, Sq, H, D], k/v [B, Sk, Hkv, D] and the 0-d
// float32 scale (its pointer only: on the GPU it is device memory, read by the kernels).
inline ffi::Error describe_problem(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                   const ffi::AnyBuffer& v, const ffi::Buffer<ffi::F32>& scale,
                                   bool is_causal, AttentionParams* p) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4)
    return ffi::Error::InvalidArgument(
        "jax_dash: query, key and value must be 4-D [batch, seq, heads, head_dim], got shapes " +
        dims_string(qd) + ", " + dims_string(kd) + ", " + dims_string(vd));
  AttentionParams& P = *p;
  P = AttentionParams{};
  if (ffi::Error e = to_dtype(q.element_type(), &P.dtype); e.failure()) return e;
  P.grad_dtype = P.dtype;
  if (k.element_type() != q.element_type() || v.element_type() != q.element_type())
    return ffi::Error::InvalidArgument(
        "jax_dash: query, key and value must have the same dtype, got " +
        dtype_string(q.element_type()) + ", " + dtype_string(k.element_type()) + ", " +
        dtype_string(v.element_type()));
  for (int i = 0; i < 4; ++i)
    if (kd[i] != vd[i])
      return ffi::Error::InvalidArgument("jax_dash: key " + dims_string(kd) + " and value " +
                                         dims_string(vd) + " must have the same shape");
  if (qd[0] != kd[0] || qd[3] != kd[3])
    return ffi::Error::InvalidArgument("jax_dash: query " + dims_string(qd) + " and key " +
                                       dims_string(kd) +
                                       " must have the same batch (axis 0) and head_dim (axis 3)");
  if (kd[2] <= 0 || qd[2] % kd[2] != 0)
    return ffi::Error::InvalidArgument(
        "jax_dash: num_heads (" + std::to_string(qd[2]) +
        ") must be a positive multiple of num_kv_heads (" + std::to_string(kd[2]) +
        "), got query " + dims_string(qd) + ", key " + dims_string(kd));
  if (qd[1] <= 0 || kd[1] <= 0)
    return ffi::Error::InvalidArgument("jax_dash: sequence lengths must be at least 1, got seq_q=" +
                                       std::to_string(qd[1]) + " and seq_kv=" +
                                       std::to_string(kd[1]));
  if (qd[3] <= 0 || qd[3] > 256 || qd[3] % 8 != 0)
    return ffi::Error::InvalidArgument("jax_dash: head_dim must be a multiple of 8 up to 256, "
                                       "got " + std::to_string(qd[3]));
  // Head counts are int32 in AttentionParams and batch * num_heads indexes heads of work
  // (ScheduleProblem::num_heads).
  if (qd[2] > INT32_MAX || qd[0] * qd[2] > INT32_MAX)
    return ffi::Error::InvalidArgument(
        "jax_dash: batch * num_heads must be below 2^31, got batch=" + std::to_string(qd[0]) +
        " and num_heads=" + std::to_string(qd[2]) + "; split the call along the batch or heads");
  if (scale.dimensions().size() != 0)
    return ffi::Error::InvalidArgument("jax_dash: scale must be a 0-d float32 array, got shape " +
                                       dims_string(scale.dimensions()));
  P.batch = qd[0];
  P.seq_q = qd[1];
  P.seq_kv = kd[1];
  P.num_heads = static_cast<int32_t>(qd[2]);
  P.num_kv_heads = static_cast<int32_t>(kd[2]);
  P.head_dim = static_cast<int32_t>(qd[3]);
  P.scale_ptr = scale.typed_data();
  P.is_causal = is_causal;
  P.tiles = tile_config(P.head_dim);
  P.q = q.untyped_data();
  P.k = k.untyped_data();
  P.v = v.untyped_data();
  return ffi::Error::Success();
}

// The mask operands and attributes beyond is_causal (cuda/mask.h). The lengths and segment-id
// operands are always passed (the FFI has no optional operands); has_seq_lengths and
// has_segment_ids say whether they mean anything. window_left / window_right: -1 = no limit on
// that side. logits_soft_cap: 0 = none.
struct MaskOperands {
  const ffi::Buffer<ffi::S32>* q_seq_lengths;   // [batch]
  const ffi::Buffer<ffi::S32>* kv_seq_lengths;  // [batch]
  const ffi::Buffer<ffi::S32>* q_segment_ids;   // [batch, seq_q]
  const ffi::Buffer<ffi::S32>* kv_segment_ids;  // [batch, seq_kv]
  int64_t window_left;
  int64_t window_right;
  float logits_soft_cap;
  bool has_seq_lengths;
  bool has_segment_ids;
};

// Checks the mask operands against p's shapes and fills p's mask fields.
inline ffi::Error describe_mask(const MaskOperands& m, AttentionParams* p) {
  for (const auto& [name, buffer] :
       {std::pair<const char*, const ffi::Buffer<ffi::S32>*>{"query_seq_lengths",
                                                            m.q_seq_lengths},
        {"key_value_seq_lengths", m.kv_seq_lengths}})
    if (!has_dims(buffer->dimensions(), {p->batch}))
      return ffi::Error::InvalidArgument("jax_dash: " + std::string(name) + " has shape " +
                                         dims_string(buffer->dimensions()) +
                                         ", expected [batch] = " + dims_string({p->batch}));
  if (!has_dims(m.q_segment_ids->dimensions(), {p->batch, p->seq_q}))
    return ffi::Error::InvalidArgument("jax_dash: query_segment_ids has shape " +
                                       dims_string(m.q_segment_ids->dimensions()) +
                                       ", expected [batch, seq_q] = " +
                                       dims_string({p->batch, p->seq_q}));
  if (!has_dims(m.kv_segment_ids->dimensions(), {p->batch, p->seq_kv}))
    return ffi::Error::InvalidArgument("jax_dash: key_value_segment_ids has shape " +
                                       dims_string(m.kv_segment_ids->dimensions()) +
                                       ", expected [batch, seq_kv] = " +
                                       dims_string({p->batch, p->seq_kv}));
  if (m.window_left < -1 || m.window_right < -1 || m.window_left >= kUnboundedBand ||
      m.window_right >= kUnboundedBand)
    return ffi::Error::InvalidArgument(
        "jax_dash: window_left=" + std::to_string(m.window_left) + ", window_right=" +
        std::to_string(m.window_right) + ": each must be >= 0, or -1 for no limit");
  if (!(std::isfinite(m.logits_soft_cap) && m.logits_soft_cap >= 0.0f))
    return ffi::Error::InvalidArgument("jax_dash: logits_soft_cap=" +
                                       std::to_string(m.logits_soft_cap) +
                                       " must be finite and > 0 (0 = no cap)");
  p->has_window = m.window_left >= 0 || m.window_right >= 0;
  p->window_left = m.window_left >= 0 ? m.window_left : kUnboundedBand;
  p->window_right = m.window_right >= 0 ? m.window_right : kUnboundedBand;
  p->logits_soft_cap = m.logits_soft_cap;
  p->q_seq_lengths = m.has_seq_lengths ? m.q_seq_lengths->typed_data() : nullptr;
  p->kv_seq_lengths = m.has_seq_lengths ? m.kv_seq_lengths->typed_data() : nullptr;
  p->q_segment_ids = m.has_segment_ids ? m.q_segment_ids->typed_data() : nullptr;
  p->kv_segment_ids = m.has_segment_ids ? m.kv_segment_ids->typed_data() : nullptr;
  return ffi::Error::Success();
}

inline ffi::Error check_schedule(int32_t schedule, Schedule* out) {
  if (schedule < static_cast<int32_t>(Schedule::kAscending) ||
      schedule > static_cast<int32_t>(Schedule::kLastSchedule))
    return ffi::Error::InvalidArgument(
        "jax_dash: unknown schedule id " + std::to_string(schedule) + "; allowed: " +
        std::to_string(static_cast<int32_t>(Schedule::kAscending)) + " (ascending) to " +
        std::to_string(static_cast<int32_t>(Schedule::kLastSchedule)) + " (mirror)");
  *out = static_cast<Schedule>(schedule);
  return ffi::Error::Success();
}

// Checks the backward's extra buffers against p's shapes and dtype and fills their pointers:
// out, dout and dq have the query's shape and dtype, dk and dv the key's (describe_problem has
// checked that the key's dtype is the query's). With f32_grads, dq, dk and dv are float32 instead
// (the ring's carried accumulators) and p->grad_dtype says so.
inline ffi::Error describe_backward(const ffi::AnyBuffer& out, const ffi::Buffer<ffi::F32>& lse,
                                    const ffi::AnyBuffer& dout, ffi::AnyBuffer* dq,
                                    ffi::AnyBuffer* dk, ffi::AnyBuffer* dv,
                                    ffi::Buffer<ffi::F32>* workspace_f32,
                                    ffi::Buffer<ffi::S32>* workspace_i32, AttentionParams* p,
                                    bool f32_grads = false) {
  const std::initializer_list<int64_t> q_dims = {p->batch, p->seq_q, p->num_heads, p->head_dim};
  const std::initializer_list<int64_t> kv_dims = {p->batch, p->seq_kv, p->num_kv_heads,
                                                  p->head_dim};
  const ffi::DataType dtype = to_ffi_type(p->dtype);
  p->grad_dtype = f32_grads ? DType::kFloat32 : p->dtype;
  const ffi::DataType grad_dtype = to_ffi_type(p->grad_dtype);
  const char* grad_owner = f32_grads ? "float32 (f32_grads) and the query's" : "the query's";
  const char* kv_grad_owner = f32_grads ? "float32 (f32_grads) and the key's" : "the key's";
  for (const auto& [name, buffer] : {std::pair<const char*, const ffi::AnyBuffer*>{"out", &out},
                                     {"dout", &dout}})
    if (ffi::Error e = check_buffer(name, *buffer, q_dims, dtype, "the query's"); e.failure())
      return e;
  if (ffi::Error e = check_buffer("dq", *dq, q_dims, grad_dtype, grad_owner); e.failure())
    return e;
  for (const auto& [name, buffer] :
       {std::pair<const char*, const ffi::AnyBuffer*>{"dk", dk}, {"dv", dv}})
    if (ffi::Error e = check_buffer(name, *buffer, kv_dims, grad_dtype, kv_grad_owner);
        e.failure())
      return e;
  if (!has_dims(lse.dimensions(), {p->batch, p->num_heads, p->seq_q}))
    return ffi::Error::InvalidArgument(
        "jax_dash: lse has shape " + dims_string(lse.dimensions()) +
        ", expected [batch, num_heads, seq_q] = " +
        dims_string({p->batch, int64_t{p->num_heads}, p->seq_q}));
  const BwdWorkspaceLayout w = bwd_workspace_layout(p->batch, p->seq_q, p->seq_kv, p->num_heads,
                                                    p->num_kv_heads, p->head_dim);
  if (static_cast<int64_t>(workspace_f32->element_count()) != w.f32_size ||
      static_cast<int64_t>(workspace_i32->element_count()) != w.i32_size)
    return ffi::Error::InvalidArgument(
        "jax_dash: backward workspace has " + std::to_string(workspace_f32->element_count()) +
        " float32 / " + std::to_string(workspace_i32->element_count()) +
        " int32 elements, expected " + std::to_string(w.f32_size) + " / " +
        std::to_string(w.i32_size) + " (jax_dash._jax_dash.bwd_workspace_size)");
  p->out = out.untyped_data();
  p->lse = lse.typed_data();
  p->dout = dout.untyped_data();
  p->dq = dq->untyped_data();
  p->dk = dk->untyped_data();
  p->dv = dv->untyped_data();
  p->workspace_f32 = workspace_f32->typed_data();
  p->workspace_i32 = workspace_i32->typed_data();
  return ffi::Error::Success();
}

// A sum that arrived in a buffer other than its output's (a call without input_output_aliases):
// the handler copies it into the output before the kernels run, so that they always add into
// the output in place.
struct SumCopy {
  const void* src;
  void* dst;
  size_t bytes;
};

// The accumulate operands dq_sum, dk_sum, dv_sum: with accumulate, the float32 sums the call adds
// its gradients to (the ring's running sums), each with its gradient's shape, normally aliased to
// dq, dk, dv (jax.ffi.ffi_call input_output_aliases); accumulate needs f32_grads. Without
// accumulate they are ignored (callers pass empty arrays). Call after describe_backward (it reads
// p->dq, p->dk, p->dv). copies[0..*num_copies) gets the sums that are not in their outputs.
inline ffi::Error describe_accumulate(bool accumulate, bool f32_grads,
                                      const ffi::AnyBuffer& dq_sum, const ffi::AnyBuffer& dk_sum,
                                      const ffi::AnyBuffer& dv_sum, AttentionParams* p,
                                      SumCopy copies[3], int* num_copies) {
  *num_copies = 0;
  p->accumulate = false;
  if (!accumulate) return ffi::Error::Success();
  if (!f32_grads)
    return ffi::Error::InvalidArgument(
        "jax_dash: accumulate needs f32_grads (it adds float32 gradients to float32 sums)");
  const std::initializer_list<int64_t> q_dims = {p->batch, p->seq_q, p->num_heads, p->head_dim};
  const std::initializer_list<int64_t> kv_dims = {p->batch, p->seq_kv, p->num_kv_heads,
                                                  p->head_dim};
  // Each sum has its gradient's shape (the query's, the key's, the value's) and dtype float32.
  auto check_sum = [](const char* name, const ffi::AnyBuffer& sum,
                      std::initializer_list<int64_t> dims, const char* owner) -> ffi::Error {
    if (ffi::Error e = check_dims(name, sum, dims, owner); e.failure()) return e;
    if (sum.element_type() != ffi::DataType::F32)
      return ffi::Error::InvalidArgument(
          "jax_dash: " + std::string(name) + " has dtype " + dtype_string(sum.element_type()) +
          ", expected float32 (accumulate adds float32 gradients into it)");
    return ffi::Error::Success();
  };
  if (ffi::Error e = check_sum("dq_sum", dq_sum, q_dims, "the query's"); e.failure()) return e;
  if (ffi::Error e = check_sum("dk_sum", dk_sum, kv_dims, "the key's"); e.failure()) return e;
  if (ffi::Error e = check_sum("dv_sum", dv_sum, kv_dims, "the value's"); e.failure()) return e;
  for (const auto& [sum, out] : {std::pair<const ffi::AnyBuffer*, void*>{&dq_sum, p->dq},
                                 {&dk_sum, p->dk}, {&dv_sum, p->dv}})
    if (sum->untyped_data() != out && sum->element_count() > 0)
      copies[(*num_copies)++] = SumCopy{sum->untyped_data(), out, sum->size_bytes()};
  p->accumulate = true;
  return ffi::Error::Success();
}

}  // namespace jax_dash
