// Shape/dtype checks and AttentionParams filling shared by the CPU and CUDA FFI handlers.
// The Python layer validates first with friendlier messages; these checks are the last line.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/params.h"
#include "xla/ffi/api/ffi.h"

namespace jax_dash {

namespace ffi = xla::ffi;

inline std::string dims_string(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

inline ffi::Error to_dtype(ffi::DataType type, DType* out) {
  switch (type) {
    case ffi::DataType::F32: *out = DType::kFloat32; return ffi::Error::Success();
    case ffi::DataType::F16: *out = DType::kFloat16; return ffi::Error::Success();
    case ffi::DataType::BF16: *out = DType::kBFloat16; return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(
          "jax_dash: query/key/value dtype must be float32, float16 or bfloat16");
  }
}

// Fills the problem description of p from q [B, Sq, H, D], k/v [B, Sk, Hkv, D].
inline ffi::Error describe_problem(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                   const ffi::AnyBuffer& v, float scale, bool is_causal,
                                   AttentionParams* p) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4)
    return ffi::Error::InvalidArgument("jax_dash: expected 4-D query/key/value, got " +
                                       dims_string(qd) + ", " + dims_string(kd) + ", " +
                                       dims_string(vd));
  if (k.element_type() != q.element_type() || v.element_type() != q.element_type())
    return ffi::Error::InvalidArgument("jax_dash: query, key and value must share one dtype");
  for (int i = 0; i < 4; ++i)
    if (kd[i] != vd[i])
      return ffi::Error::InvalidArgument("jax_dash: key " + dims_string(kd) +
                                         " and value " + dims_string(vd) + " differ in shape");
  if (qd[0] != kd[0] || qd[3] != kd[3])
    return ffi::Error::InvalidArgument("jax_dash: query " + dims_string(qd) + " and key " +
                                       dims_string(kd) + " differ in batch or head_dim");
  if (kd[2] <= 0 || qd[2] % kd[2] != 0)
    return ffi::Error::InvalidArgument("jax_dash: num_heads must be a multiple of num_kv_heads, "
                                       "got query " + dims_string(qd) + ", key " +
                                       dims_string(kd));
  if (qd[1] <= 0 || kd[1] <= 0)
    return ffi::Error::InvalidArgument("jax_dash: sequence lengths must be positive");
  if (qd[3] <= 0 || qd[3] > 256 || qd[3] % 8 != 0)
    return ffi::Error::InvalidArgument("jax_dash: head_dim must be a multiple of 8 up to 256, "
                                       "got " + std::to_string(qd[3]));
  AttentionParams& P = *p;
  P = AttentionParams{};
  if (ffi::Error e = to_dtype(q.element_type(), &P.dtype); e.failure()) return e;
  P.batch = qd[0];
  P.seq_q = qd[1];
  P.seq_kv = kd[1];
  P.num_heads = static_cast<int32_t>(qd[2]);
  P.num_kv_heads = static_cast<int32_t>(kd[2]);
  P.head_dim = static_cast<int32_t>(qd[3]);
  P.scale = scale;
  P.is_causal = is_causal;
  P.tiles = tile_config(P.head_dim);
  P.q = q.untyped_data();
  P.k = k.untyped_data();
  P.v = v.untyped_data();
  return ffi::Error::Success();
}

inline ffi::Error check_schedule(int32_t schedule, Schedule* out) {
  if (schedule < static_cast<int32_t>(Schedule::kAscending) ||
      schedule > static_cast<int32_t>(Schedule::kAtomic))
    return ffi::Error::InvalidArgument("jax_dash: unknown schedule id " +
                                       std::to_string(schedule));
  *out = static_cast<Schedule>(schedule);
  return ffi::Error::Success();
}

// Checks the backward's extra buffers against p's shapes and fills their pointers.
inline ffi::Error describe_backward(const ffi::AnyBuffer& out, const ffi::Buffer<ffi::F32>& lse,
                                    const ffi::AnyBuffer& dout, ffi::AnyBuffer* dq,
                                    ffi::AnyBuffer* dk, ffi::AnyBuffer* dv,
                                    ffi::Buffer<ffi::F32>* workspace_f32,
                                    ffi::Buffer<ffi::S32>* workspace_i32, AttentionParams* p) {
  const int64_t q_elems = p->batch * p->seq_q * p->num_heads * p->head_dim;
  const int64_t kv_elems = p->batch * p->seq_kv * p->num_kv_heads * p->head_dim;
  if (static_cast<int64_t>(out.element_count()) != q_elems ||
      static_cast<int64_t>(dout.element_count()) != q_elems ||
      static_cast<int64_t>(dq->element_count()) != q_elems)
    return ffi::Error::InvalidArgument("jax_dash: out/dout/dq must have the query's shape");
  if (static_cast<int64_t>(lse.element_count()) != p->batch * p->num_heads * p->seq_q)
    return ffi::Error::InvalidArgument("jax_dash: lse must be [batch, num_heads, seq_q]");
  if (static_cast<int64_t>(dk->element_count()) != kv_elems ||
      static_cast<int64_t>(dv->element_count()) != kv_elems)
    return ffi::Error::InvalidArgument("jax_dash: dk/dv must have the key's shape");
  const BwdWorkspaceLayout w = bwd_workspace_layout(p->batch, p->seq_q, p->seq_kv, p->num_heads,
                                                    p->num_kv_heads, p->head_dim);
  if (static_cast<int64_t>(workspace_f32->element_count()) != w.f32_size ||
      static_cast<int64_t>(workspace_i32->element_count()) != w.i32_size)
    return ffi::Error::InvalidArgument(
        "jax_dash: backward workspace has " + std::to_string(workspace_f32->element_count()) +
        " f32 / " + std::to_string(workspace_i32->element_count()) + " i32 elements, expected " +
        std::to_string(w.f32_size) + " / " + std::to_string(w.i32_size));
  if (out.element_type() != dout.element_type() || dq->element_type() != dout.element_type())
    return ffi::Error::InvalidArgument("jax_dash: out, dout and dq must have the query's dtype");
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

}  // namespace jax_dash
