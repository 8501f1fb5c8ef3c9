// Standalone check of the Hopper kernels without JAX: calls sm90::run_fwd / run_bwd directly, so
// that compute-sanitizer (memcheck, racecheck, synccheck, initcheck) and Nsight Compute can run on
// them (both fail to start under a JAX process on the device machine).
//
//   jax_dash_sm90_check            small cases: forward and backward against an fp64 host
//                                  reference, poisoned outputs, bitwise repeatability
//   jax_dash_sm90_check bench B S H Hkv D causal schedule iters [window_left]
//                                  backward (and forward) of one bf16 problem, `iters` times, for a
//                                  profiler; prints the mean time of each and the backward's
//                                  per-role wait trace of one run (window_left: a sliding window
//                                  of that many earlier keys, the masked kernels)
//   jax_dash_sm90_check variants   the same bits from the forward kernels that promise them: ws,
//                                  ws-persistent and ws-persistent-narrow (the same cases,
//                                  compared bitwise)
//   jax_dash_sm90_check masks      the masked kernel instantiations (window, lengths, segment
//                                  ids, soft cap; issue 13) against the fp64 reference
//   JAX_DASH_SM90_FWD=ws|ws-persistent|ws-persistent-narrow  the forward kernel (default: by
//                                  length; launch.h)
//
// Exit status: 0 all checks pass, 1 a check failed, 2 a CUDA error or bad arguments.
// Built by CMake with the kernels (target jax_dash_sm90_check); scripts/sanitize.sh runs it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda/dropout.h"
#include "cuda/params.h"
#include "cuda/schedule.h"
#include "cuda/sm90/async_ops.cuh"
#include "cuda/sm90/launch.h"

namespace {

using jax_dash::AttentionParams;
using jax_dash::DType;
using jax_dash::Schedule;

#define CHECK_CUDA(expr)                                                                     \
  do {                                                                                       \
    cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__, \
                   __LINE__, cudaGetErrorString(err_));                                      \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

struct Case {
  int64_t batch, seq_q, seq_kv;
  int heads, kv_heads, head_dim;
  bool causal;
  Schedule schedule;
  DType dtype;
  // The mask beyond causal (the `masks` mode; cuda/mask.h): a window (-1: no limit on that side),
  // per-row lengths (query_length / key_length below), segment ids (position / segment_length),
  // a soft cap on the logits.
  int64_t window_left = -1, window_right = -1;
  bool lengths = false;
  int64_t segment_length = 0;
  double soft_cap = 0.0;
  bool has_mask() const {
    return window_left >= 0 || window_right >= 0 || lengths || segment_length > 0 || soft_cap > 0;
  }
};

// The driver's lengths: batch row b's query and key lengths (shorter for later rows, at least 1).
int64_t query_length(const Case& c, int64_t b) {
  return c.lengths ? std::max<int64_t>(1, c.seq_q - 1 - 37 * b) : c.seq_q;
}
int64_t key_length(const Case& c, int64_t b) {
  return c.lengths ? std::max<int64_t>(1, c.seq_kv - 5 - 29 * b) : c.seq_kv;
}
int32_t segment_id(const Case& c, int64_t position) {
  return c.segment_length > 0 ? static_cast<int32_t>(position / c.segment_length) : 0;
}

// The fp64 reference's mask: query i of row b sees key j (cuda/mask.h's policy, written out).
bool host_visible(const Case& c, int64_t b, int64_t i, int64_t j) {
  if (i >= query_length(c, b) || j >= key_length(c, b)) return false;
  if (c.causal && j > i) return false;
  if (c.window_left >= 0 && j < i - c.window_left) return false;
  if (c.window_right >= 0 && j > i + c.window_right) return false;
  return segment_id(c, i) == segment_id(c, j);
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kAscending: return "ascending";
    case Schedule::kDescending: return "descending";
    case Schedule::kShift: return "shift";
    case Schedule::kSymmetricShift: return "symmetric_shift";
    case Schedule::kAtomic: return "atomic";
    case Schedule::kMirror: return "mirror";
  }
  return "?";
}

bool parse_schedule(const char* s, Schedule* out) {
  for (int i = 0; i <= static_cast<int>(Schedule::kLastSchedule); ++i) {
    if (std::strcmp(s, schedule_name(static_cast<Schedule>(i))) == 0) {
      *out = static_cast<Schedule>(i);
      return true;
    }
  }
  return false;
}

// 16-bit storage <-> double on the host.
uint16_t to_bits(double x, DType t) {
  if (t == DType::kBFloat16) {
    const __nv_bfloat16_raw r = __float2bfloat16(static_cast<float>(x));
    return r.x;
  }
  const __half_raw r = __float2half(static_cast<float>(x));
  return r.x;
}

double from_bits(uint16_t bits, DType t) {
  if (t == DType::kBFloat16) {
    __nv_bfloat16_raw r;
    r.x = bits;
    return static_cast<double>(__bfloat162float(__nv_bfloat16(r)));
  }
  __half_raw r;
  r.x = bits;
  return static_cast<double>(__half2float(__half(r)));
}

// Deterministic pseudo-normal values (sum of uniforms), never all zero.
struct Rng {
  uint64_t state;
  double uniform() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) * (1.0 / 9007199254740992.0);
  }
  double normal() {
    double s = 0;
    for (int i = 0; i < 4; ++i) s += uniform();
    return (s - 2.0) * std::sqrt(3.0);
  }
};

std::vector<uint16_t> random_tensor(size_t n, DType t, uint64_t seed) {
  Rng rng{seed * 0x9E3779B97F4A7C15ULL + 1};
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = to_bits(rng.normal(), t);
  return v;
}

// Row-major [B, S, H, D] index.
inline size_t idx(const Case& c, int64_t b, int64_t s, int64_t seq, int h, int heads, int d) {
  return ((static_cast<size_t>(b) * seq + s) * heads + h) * c.head_dim + d;
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// fp64 attention forward and backward (host_visible's mask, the soft cap) on the 16-bit inputs.
// A query row that sees no key gets out 0, lse -inf and no gradient.
Reference reference(const Case& c, const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
                    const std::vector<uint16_t>& v, const std::vector<uint16_t>& dout,
                    double scale) {
  Reference r;
  const int D = c.head_dim;
  const size_t nq = static_cast<size_t>(c.batch * c.seq_q) * c.heads * D;
  const size_t nk = static_cast<size_t>(c.batch * c.seq_kv) * c.kv_heads * D;
  r.out.assign(nq, 0.0);
  r.dq.assign(nq, 0.0);
  r.dk.assign(nk, 0.0);
  r.dv.assign(nk, 0.0);
  r.lse.assign(static_cast<size_t>(c.batch) * c.heads * c.seq_q, 0.0);
  const int group = c.heads / c.kv_heads;
  std::vector<double> p(c.seq_kv), dp(c.seq_kv), tanh_of(c.seq_kv, 0.0);
  std::vector<char> vis(c.seq_kv);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.heads; ++h) {
      const int kh = h / group;
      for (int64_t i = 0; i < c.seq_q; ++i) {
        const int64_t keys = c.seq_kv;  // hidden keys get p = 0 (vis[j] false)
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          vis[j] = host_visible(c, b, i, j);
          if (!vis[j]) continue;
          double s = 0;
          for (int d = 0; d < D; ++d)
            s += from_bits(q[idx(c, b, i, c.seq_q, h, c.heads, d)], c.dtype) *
                 from_bits(k[idx(c, b, j, c.seq_kv, kh, c.kv_heads, d)], c.dtype);
          tanh_of[j] = 0.0;
          if (c.soft_cap > 0) {
            tanh_of[j] = std::tanh(s * scale / c.soft_cap);
            p[j] = c.soft_cap * tanh_of[j];
          } else {
            p[j] = s * scale;
          }
          mx = std::max(mx, p[j]);
        }
        const size_t lse_index = (static_cast<size_t>(b) * c.heads + h) * c.seq_q + i;
        if (mx == -std::numeric_limits<double>::infinity()) {  // no key visible
          r.lse[lse_index] = mx;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < keys; ++j) sum += vis[j] ? std::exp(p[j] - mx) : 0.0;
        const double lse = mx + std::log(sum);
        r.lse[lse_index] = lse;
        for (int64_t j = 0; j < keys; ++j) p[j] = vis[j] ? std::exp(p[j] - lse) : 0.0;
        double dsum = 0;
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < keys; ++j)
            o += p[j] * from_bits(v[idx(c, b, j, c.seq_kv, kh, c.kv_heads, d)], c.dtype);
          r.out[idx(c, b, i, c.seq_q, h, c.heads, d)] = o;
          dsum += o * from_bits(dout[idx(c, b, i, c.seq_q, h, c.heads, d)], c.dtype);
        }
        for (int64_t j = 0; j < keys; ++j) {
          double x = 0;
          for (int d = 0; d < D; ++d)
            x += from_bits(dout[idx(c, b, i, c.seq_q, h, c.heads, d)], c.dtype) *
                 from_bits(v[idx(c, b, j, c.seq_kv, kh, c.kv_heads, d)], c.dtype);
          dp[j] = p[j] * (x - dsum) * (1.0 - tanh_of[j] * tanh_of[j]);  // dS (soft cap: tanh')
        }
        for (int64_t j = 0; j < keys; ++j) {
          for (int d = 0; d < D; ++d) {
            const size_t qi = idx(c, b, i, c.seq_q, h, c.heads, d);
            const size_t kj = idx(c, b, j, c.seq_kv, kh, c.kv_heads, d);
            r.dq[qi] += scale * dp[j] * from_bits(k[kj], c.dtype);
            r.dk[kj] += scale * dp[j] * from_bits(q[qi], c.dtype);
            r.dv[kj] += p[j] * from_bits(dout[qi], c.dtype);
          }
        }
      }
    }
  }
  return r;
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(count, 1) * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const std::vector<T>& h) {
    CHECK_CUDA(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() { CHECK_CUDA(cudaMemset(ptr, 0xFF, std::max<size_t>(n, 1) * sizeof(T))); }
};

// max |ours - ref| <= tol * max |ref| + tol_abs, and every value finite. Prints one line.
bool compare(const char* tag, const char* what, const std::vector<double>& ours,
             const std::vector<double>& ref, double tol) {
  double max_ref = 0, max_err = 0;
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    if (!std::isfinite(ours[i])) {
      ++bad;
      continue;
    }
    max_err = std::max(max_err, std::fabs(ours[i] - ref[i]));
  }
  const bool ok = bad == 0 && max_err <= tol * max_ref + 1e-5;
  std::printf("  %-5s %-4s max|err| %.3e  max|ref| %.3e  non-finite %zu  %s\n", tag, what, max_err,
              max_ref, bad, ok ? "ok" : "FAIL");
  return ok;
}

// lse: like compare, but a row whose reference lse is -inf (it sees no key) must be -inf too.
bool compare_lse(const std::vector<double>& ours, const std::vector<double>& ref) {
  std::vector<double> ours_finite, ref_finite;
  size_t empty_rows = 0, wrong_empty = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] == -std::numeric_limits<double>::infinity()) {
      ++empty_rows;
      wrong_empty += ours[i] == ref[i] ? 0 : 1;
    } else {
      ours_finite.push_back(ours[i]);
      ref_finite.push_back(ref[i]);
    }
  }
  const bool ok = compare("fwd", "lse", ours_finite, ref_finite, 1e-5);
  if (empty_rows > 0) {
    std::printf("  fwd   lse of %zu rows that see no key: %zu not -inf  %s\n", empty_rows,
                wrong_empty, wrong_empty == 0 ? "ok" : "FAIL");
  }
  return ok && wrong_empty == 0;
}

std::vector<double> widen(const std::vector<uint16_t>& x, DType t) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = from_bits(x[i], t);
  return y;
}

// The backward's gradients (dq, dk, dv, from DeviceProblem::backward) against the reference's.
bool compare_grads(const std::vector<std::vector<uint16_t>>& got, const Reference& ref, DType t,
                   double tol) {
  bool ok = compare("bwd", "dq", widen(got[0], t), ref.dq, tol);
  ok &= compare("bwd", "dk", widen(got[1], t), ref.dk, tol);
  ok &= compare("bwd", "dv", widen(got[2], t), ref.dv, tol);
  return ok;
}

size_t q_elems(const Case& c) {
  return static_cast<size_t>(c.batch * c.seq_q) * c.heads * c.head_dim;
}
size_t kv_elems(const Case& c) {
  return static_cast<size_t>(c.batch * c.seq_kv) * c.kv_heads * c.head_dim;
}

// Every device buffer of one problem, and the AttentionParams pointing at them (wave from the
// occupancy query, as the FFI handler sets it).
struct DeviceProblem {
  DeviceBuffer<int32_t> q_lengths, kv_lengths, q_segments, kv_segments;  // Case's mask
  DeviceBuffer<uint16_t> q, k, v, out, dout, dq, dk, dv;
  DeviceBuffer<float> lse;
  DeviceBuffer<float> scale_buffer;  // 0-d: the kernels read the softmax scale from device memory
  jax_dash::BwdWorkspaceLayout ws;
  DeviceBuffer<float> wf;
  DeviceBuffer<int32_t> wi;
  AttentionParams p{};

  DeviceProblem(const Case& c, double scale)
      : q_lengths(c.batch), kv_lengths(c.batch), q_segments(c.batch * c.seq_q),
        kv_segments(c.batch * c.seq_kv), q(q_elems(c)), k(kv_elems(c)), v(kv_elems(c)), out(q_elems(c)), dout(q_elems(c)),
        dq(q_elems(c)), dk(kv_elems(c)), dv(kv_elems(c)),
        lse(static_cast<size_t>(c.batch) * c.heads * c.seq_q), scale_buffer(1),
        ws(jax_dash::bwd_workspace_layout(c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads,
                                          c.head_dim)),
        wf(ws.f32_size), wi(ws.i32_size) {
    p.batch = c.batch;
    p.seq_q = c.seq_q;
    p.seq_kv = c.seq_kv;
    p.num_heads = c.heads;
    p.num_kv_heads = c.kv_heads;
    p.head_dim = c.head_dim;
    p.dtype = c.dtype;
    p.grad_dtype = c.dtype;  // zero would mean float32 gradients
    scale_buffer.upload({static_cast<float>(scale)});
    p.scale_ptr = scale_buffer.ptr;
    p.is_causal = c.causal;
    p.schedule = c.schedule;
    p.tiles = jax_dash::tile_config(c.head_dim);
    p.q = q.ptr;
    p.k = k.ptr;
    p.v = v.ptr;
    p.out = out.ptr;
    p.lse = lse.ptr;
    p.dout = dout.ptr;
    p.dq = dq.ptr;
    p.dk = dk.ptr;
    p.dv = dv.ptr;
    p.workspace_f32 = wf.ptr;
    p.workspace_i32 = wi.ptr;  // also the persistent forward's tile counter (its element 0)
    // The mask beyond causal, as the FFI handler's describe_mask fills it.
    p.has_window = c.window_left >= 0 || c.window_right >= 0;
    p.window_left = c.window_left >= 0 ? c.window_left : jax_dash::kUnboundedBand;
    p.window_right = c.window_right >= 0 ? c.window_right : jax_dash::kUnboundedBand;
    p.logits_soft_cap = static_cast<float>(c.soft_cap);
    if (c.lengths) {
      std::vector<int32_t> ql(c.batch), kl(c.batch);
      for (int64_t b = 0; b < c.batch; ++b) {
        ql[b] = static_cast<int32_t>(query_length(c, b));
        kl[b] = static_cast<int32_t>(key_length(c, b));
      }
      q_lengths.upload(ql);
      kv_lengths.upload(kl);
      p.q_seq_lengths = q_lengths.ptr;
      p.kv_seq_lengths = kv_lengths.ptr;
    }
    if (c.segment_length > 0) {
      std::vector<int32_t> qs(c.batch * c.seq_q), ks(c.batch * c.seq_kv);
      for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t i = 0; i < c.seq_q; ++i) qs[b * c.seq_q + i] = segment_id(c, i);
        for (int64_t j = 0; j < c.seq_kv; ++j) ks[b * c.seq_kv + j] = segment_id(c, j);
      }
      q_segments.upload(qs);
      kv_segments.upload(ks);
      p.q_segment_ids = q_segments.ptr;
      p.kv_segment_ids = kv_segments.ptr;
    }
    jax_dash::sm90::BwdOccupancy occupancy;
    CHECK_CUDA(jax_dash::sm90::bwd_occupancy(p, &occupancy));
    p.wave = occupancy.wave;
  }

  // One backward over poisoned gradients and workspaces (so nothing is read that the call did
  // not write): dq, dk, dv.
  std::vector<std::vector<uint16_t>> backward() {
    dq.poison();
    dk.poison();
    dv.poison();
    wf.poison();
    wi.poison();
    CHECK_CUDA(jax_dash::sm90::run_bwd(p, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    return {dq.download(), dk.download(), dv.download()};
  }
};

// The steps the masked backward computes: the band's (KV tile, Q tile) steps whose tile pair some
// query can see by cuda/mask.h's tile test (past a length, or segment-id ranges that do not meet),
// over the rows and keys that have a length, summed over the heads. A step the data hides must not
// be computed (bwd/kernel.cuh leaves it out of the visit order).
std::vector<double> trace_sums(const AttentionParams& p);
int64_t expected_bwd_steps(const Case& c, const AttentionParams& p) {
  using jax_dash::SegmentRange;
  const jax_dash::ScheduleProblem sp =
      jax_dash::schedule_problem(p, jax_dash::tile_config(c.head_dim), p.wave);
  int64_t steps = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    std::vector<int32_t> qs(c.seq_q), ks(c.seq_kv);
    for (int64_t i = 0; i < c.seq_q; ++i) qs[i] = segment_id(c, i);
    for (int64_t j = 0; j < c.seq_kv; ++j) ks[j] = segment_id(c, j);
    const int64_t qlen = query_length(c, b), klen = key_length(c, b);
    jax_dash::MaskPolicy mp{jax_dash::mask_band(p),
                            jax_dash::MaskRow{qlen, klen, c.segment_length > 0 ? qs.data() : nullptr,
                                              c.segment_length > 0 ? ks.data() : nullptr}};
    auto range = [](const std::vector<int32_t>& ids, int64_t begin, int64_t end) {
      return end > begin ? jax_dash::segment_range(ids.data(), begin, end)
                         : SegmentRange{INT32_MAX, INT32_MIN};
    };
    int64_t row_steps = 0;
    for (int n = 0; n < sp.num_kv_tiles; ++n) {
      const int64_t c0 = int64_t(n) * sp.block_n;
      const SegmentRange kr = range(ks, c0, std::min({c0 + sp.block_n, c.seq_kv, klen}));
      for (int s = 0; s < jax_dash::q_visit_count(sp, 0, n); ++s) {
        const int m = jax_dash::q_visit_tile(sp, 0, n, s);
        const int64_t r0 = int64_t(m) * sp.block_m;
        const SegmentRange qr = range(qs, r0, std::min({r0 + sp.block_m, c.seq_q, qlen}));
        row_steps += mp.tile(r0, sp.block_m, c0, sp.block_n, qr, kr) !=
                     jax_dash::TileVisibility::kInvisible;
      }
    }
    steps += row_steps * c.heads;
  }
  return steps;
}

// The backward preprocess's dsum and lse_log2 (in the workspace after run_bwd) against the host's
// replay of the one-row-a-warp arithmetic, bit for bit: lane l's FMA chain from 0 over the columns
// l, l + 32, ..., then the xor butterfly (16, 8, 4, 2, 1; every lane ends with the same bits); rows
// past seq_q (to the padded Q tile) 0 and +inf, lse -inf -> +inf, else lse * log2(e) in float.
bool check_preprocess(const Case& c, const DeviceProblem& d, const std::vector<uint16_t>& out,
                      const std::vector<uint16_t>& dout, const std::vector<float>& lse) {
  const int64_t block_m = jax_dash::tile_config(c.head_dim).bwd_block_m;
  const int64_t rows_q = jax_dash::ceil_div(c.seq_q, block_m) * block_m;
  const size_t n = static_cast<size_t>(c.batch) * c.heads * rows_q;
  std::vector<float> dsum(n), lse_log2(n);
  CHECK_CUDA(cudaMemcpy(dsum.data(), d.wf.ptr + d.ws.dsum, n * sizeof(float),
                        cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(lse_log2.data(), d.wf.ptr + d.ws.lse_log2, n * sizeof(float),
                        cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.heads; ++h) {
      for (int64_t r = 0; r < rows_q; ++r) {
        float want_sum = 0.f, want_l2 = INFINITY;
        if (r < c.seq_q) {
          float lane[32];
          for (int l = 0; l < 32; ++l) {
            float acc = 0.f;
            for (int col = l; col < c.head_dim; col += 32) {
              const size_t i = idx(c, b, r, c.seq_q, h, c.heads, col);
              acc = std::fmaf(static_cast<float>(from_bits(out[i], c.dtype)),
                              static_cast<float>(from_bits(dout[i], c.dtype)), acc);
            }
            lane[l] = acc;
          }
          for (int off = 16; off > 0; off /= 2) {
            float next[32];
            for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ off];
            std::memcpy(lane, next, sizeof(lane));
          }
          want_sum = lane[0];
          const float l = lse[(static_cast<size_t>(b) * c.heads + h) * c.seq_q + r];
          if (l != -INFINITY) want_l2 = l * 1.4426950408889634f;
        }
        const size_t row = (static_cast<size_t>(b) * c.heads + h) * rows_q + r;
        bad += std::memcmp(&dsum[row], &want_sum, sizeof(float)) != 0 ||
               std::memcmp(&lse_log2[row], &want_l2, sizeof(float)) != 0;
      }
    }
  }
  std::printf("  bwd   preprocess dsum, lse_log2 bitwise as one row a warp: %s\n",
              bad ? "FAIL" : "ok");
  return bad == 0;
}

bool run_case(const Case& c) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  std::printf("case B=%lld Sq=%lld Skv=%lld H=%d Hkv=%d D=%d %s %s %s",
              static_cast<long long>(c.batch), static_cast<long long>(c.seq_q),
              static_cast<long long>(c.seq_kv), c.heads, c.kv_heads, c.head_dim,
              c.causal ? "causal" : "full", schedule_name(c.schedule),
              c.dtype == DType::kBFloat16 ? "bf16" : "fp16");
  if (c.has_mask()) {
    std::printf(" window (%lld, %lld) lengths %s segments of %lld soft cap %.1f",
                static_cast<long long>(c.window_left), static_cast<long long>(c.window_right),
                c.lengths ? "yes" : "no", static_cast<long long>(c.segment_length), c.soft_cap);
  }
  std::printf("\n");
  const size_t nq = q_elems(c), nk = kv_elems(c);
  const size_t nlse = static_cast<size_t>(c.batch) * c.heads * c.seq_q;
  const auto hq = random_tensor(nq, c.dtype, 1), hk = random_tensor(nk, c.dtype, 2),
             hv = random_tensor(nk, c.dtype, 3), hdo = random_tensor(nq, c.dtype, 4);
  const Reference ref = reference(c, hq, hk, hv, hdo, scale);
  const double tol = c.dtype == DType::kBFloat16 ? 2e-2 : 4e-3;

  DeviceProblem d(c, scale);
  d.q.upload(hq);
  d.k.upload(hk);
  d.v.upload(hv);
  d.dout.upload(hdo);
  bool ok = true;

  // Forward into poisoned (NaN) buffers.
  d.out.poison();
  d.lse.poison();
  CHECK_CUDA(jax_dash::sm90::run_fwd(d.p, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  {
    const auto o = widen(d.out.download(), c.dtype);
    const auto l = d.lse.download();
    ok &= compare("fwd", "out", o, ref.out, tol);
    std::vector<double> ld(l.begin(), l.end());
    ok &= compare_lse(ld, ref.lse);
  }

  // Backward from the reference's out (rounded to the dtype) and lse, so it is judged alone.
  std::vector<uint16_t> ho(nq);
  for (size_t i = 0; i < nq; ++i) ho[i] = to_bits(ref.out[i], c.dtype);
  std::vector<float> hl(nlse);
  for (size_t i = 0; i < nlse; ++i) hl[i] = static_cast<float>(ref.lse[i]);
  d.out.upload(ho);
  d.lse.upload(hl);
  std::vector<std::vector<uint16_t>> first;
  for (int rep = 0; rep < 2; ++rep) {
    const auto got = d.backward();
    if (rep == 0) {
      ok &= check_preprocess(c, d, ho, hdo, hl);
      ok &= compare_grads(got, ref, c.dtype, tol);
      first = got;
    } else if (c.schedule != Schedule::kAtomic) {
      const bool same = got == first;
      std::printf("  bwd   bitwise repeatable: %s\n", same ? "ok" : "FAIL");
      ok &= same;
    }
  }
  if (c.schedule != Schedule::kAtomic) {
    // float32 gradients (grad_dtype, ring attention's accumulators): the same sums, unrounded, so
    // the 16-bit gradients above must be exactly their rounding.
    DeviceBuffer<float> dq32(nq), dk32(nk), dv32(nk);
    AttentionParams p32 = d.p;
    p32.grad_dtype = DType::kFloat32;
    p32.dq = dq32.ptr;
    p32.dk = dk32.ptr;
    p32.dv = dv32.ptr;
    dq32.poison();
    dk32.poison();
    dv32.poison();
    CHECK_CUDA(jax_dash::sm90::run_bwd(p32, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<float> got32[3] = {dq32.download(), dk32.download(), dv32.download()};
    bool rounded = true;
    for (int t = 0; t < 3; ++t) {
      for (size_t i = 0; i < got32[t].size(); ++i) {
        rounded &= std::isfinite(got32[t][i]) && to_bits(got32[t][i], c.dtype) == first[t][i];
      }
    }
    std::printf("  bwd   float32 gradients round to the 16-bit ones: %s\n", rounded ? "ok" : "FAIL");
    ok &= rounded;
    // accumulate (the ring's running sums): the buffers hold float32 sums on entry and must get
    // exactly sum + gradient, one float32 add (the float32 epilogues and the dQ postprocess with
    // accumulate, so that the sanitizers see them too).
    std::vector<float> sums[3];
    DeviceBuffer<float>* bufs[3] = {&dq32, &dk32, &dv32};
    for (int t = 0; t < 3; ++t) {
      sums[t].resize(got32[t].size());
      for (size_t i = 0; i < sums[t].size(); ++i) {
        sums[t][i] = static_cast<float>(static_cast<int>((i * 7919 + t) % 2001) - 1000) * 1e-3f;
      }
      bufs[t]->upload(sums[t]);
    }
    p32.accumulate = true;
    CHECK_CUDA(jax_dash::sm90::run_bwd(p32, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    bool added = true;
    for (int t = 0; t < 3; ++t) {
      const std::vector<float> got = bufs[t]->download();
      for (size_t i = 0; i < got.size(); ++i) {
        const float want = sums[t][i] + got32[t][i];
        added &= std::memcmp(&got[i], &want, sizeof(float)) == 0;
      }
    }
    std::printf("  bwd   accumulate adds the float32 gradients to the sums: %s\n",
                added ? "ok" : "FAIL");
    ok &= added;
  }
  if (c.lengths || c.segment_length > 0) {
    // Rows with lengths or segment ids: only the steps some query can see are computed.
    const std::vector<double> sums = trace_sums(d.p);
    const int64_t computed = static_cast<int64_t>(sums[sums.size() - 2]);
    const int64_t expected = expected_bwd_steps(c, d.p);
    const bool same = computed == expected;
    std::printf("  bwd   steps computed %lld, visible tile pairs %lld: %s\n",
                static_cast<long long>(computed), static_cast<long long>(expected),
                same ? "ok" : "FAIL");
    ok &= same;
  }
  std::printf("  wave %d: %s\n", d.p.wave, ok ? "PASS" : "FAIL");
  return ok;
}

// ---- dropout (issue 33): the forward against an fp64 reference with the same keep mask ----------

// A call's dropout: rate, key and the global offsets (batch, head, q, kv) of its element 0.
struct DropoutCase {
  double rate;
  uint32_t key[2];
  int32_t offsets[4];
  uint32_t threshold() const {  // cuda/dropout.h: min(65535, floor(rate * 65536 + 0.5))
    return static_cast<uint32_t>(std::min(65535.0, std::floor(rate * 65536.0 + 0.5)));
  }
  float keep_scale() const { return static_cast<float>(1.0 / (1.0 - rate)); }
};

// fp64 forward and backward with dropout (no soft cap): the probabilities P of the undropped
// softmax (lse unchanged), each multiplied by Z = 0 or keep_scale as dropout_keep says at the
// element's global coordinates (the CPU kernels' formula, cuda/cpu/attention_cpu.cc
// dropout_factor): out = (P Z) V, dV = (P Z)^T dO, dS = P (Z dP - D) with dP = dO V^T and
// D = rowsum(dO * out), dQ = scale dS K, dK = scale dS^T Q. lse is not filled (the undropped
// reference's is the one to compare).
Reference reference_dropout(const Case& c, const DropoutCase& dc, const std::vector<uint16_t>& q,
                            const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                            const std::vector<uint16_t>& dout, double scale) {
  const int D = c.head_dim, group = c.heads / c.kv_heads;
  Reference r;
  r.out.assign(q_elems(c), 0.0);
  r.dq.assign(q_elems(c), 0.0);
  r.dk.assign(kv_elems(c), 0.0);
  r.dv.assign(kv_elems(c), 0.0);
  std::vector<double> p(c.seq_kv), z(c.seq_kv);
  const auto global = [](int64_t local, int32_t start) {
    return static_cast<uint32_t>(local) + static_cast<uint32_t>(start);
  };
  const auto at = [&](const std::vector<uint16_t>& x, size_t i) { return from_bits(x[i], c.dtype); };
  for (int64_t b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i) {
        const int kh = h / group;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < c.seq_kv; ++j) {
          p[j] = -std::numeric_limits<double>::infinity();
          if (!host_visible(c, b, i, j)) continue;
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += at(q, idx(c, b, i, c.seq_q, h, c.heads, d)) *
                   at(k, idx(c, b, j, c.seq_kv, kh, c.kv_heads, d));
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;
        double sum = 0;
        for (int64_t j = 0; j < c.seq_kv; ++j) sum += std::exp(p[j] - mx);
        for (int64_t j = 0; j < c.seq_kv; ++j) {
          p[j] = std::exp(p[j] - mx) / sum;
          const bool keep = jax_dash::dropout_keep(
              dc.key[0], dc.key[1], dc.threshold(), global(b, dc.offsets[0]),
              global(h, dc.offsets[1]), global(i, dc.offsets[2]), global(j, dc.offsets[3]));
          z[j] = keep ? static_cast<double>(dc.keep_scale()) : 0.0;
        }
        double dsum = 0;
        for (int d = 0; d < D; ++d) {
          const size_t qi = idx(c, b, i, c.seq_q, h, c.heads, d);
          double o = 0;
          for (int64_t j = 0; j < c.seq_kv; ++j)
            if (p[j] * z[j] != 0.0) o += p[j] * z[j] * at(v, idx(c, b, j, c.seq_kv, kh, c.kv_heads, d));
          r.out[qi] = o;
          dsum += o * at(dout, qi);
        }
        for (int64_t j = 0; j < c.seq_kv; ++j) {
          if (p[j] == 0.0) continue;
          double dp = 0;
          for (int d = 0; d < D; ++d)
            dp += at(dout, idx(c, b, i, c.seq_q, h, c.heads, d)) *
                  at(v, idx(c, b, j, c.seq_kv, kh, c.kv_heads, d));
          const double ds = p[j] * (z[j] * dp - dsum);
          for (int d = 0; d < D; ++d) {
            const size_t qi = idx(c, b, i, c.seq_q, h, c.heads, d);
            const size_t kj = idx(c, b, j, c.seq_kv, kh, c.kv_heads, d);
            r.dq[qi] += scale * ds * at(k, kj);
            r.dk[kj] += scale * ds * at(q, qi);
            r.dv[kj] += p[j] * z[j] * at(dout, qi);
          }
        }
      }
  return r;
}

// The forward with dropout: out against reference_dropout's, lse against the undropped
// reference's, and the same bits on a second run (the mask is a function of the key and the
// coordinates alone). Then the backward from the reference's out (rounded) and lse under every
// schedule: dq, dk, dv against the reference and the same bits on a second run (deterministic
// schedules; each has its own summation order, docs/determinism.md).
bool run_dropout_case(const Case& c, const DropoutCase& dc) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  std::printf("dropout case B=%lld Sq=%lld Skv=%lld H=%d Hkv=%d D=%d %s %s rate %.2f offsets "
              "(%d, %d, %d, %d)%s\n",
              static_cast<long long>(c.batch), static_cast<long long>(c.seq_q),
              static_cast<long long>(c.seq_kv), c.heads, c.kv_heads, c.head_dim,
              c.causal ? "causal" : "full", c.dtype == DType::kBFloat16 ? "bf16" : "fp16",
              dc.rate, dc.offsets[0], dc.offsets[1], dc.offsets[2], dc.offsets[3],
              c.has_mask() ? " masked" : "");
  const auto hq = random_tensor(q_elems(c), c.dtype, 1);
  const auto hk = random_tensor(kv_elems(c), c.dtype, 2);
  const auto hv = random_tensor(kv_elems(c), c.dtype, 3);
  const auto hdo = random_tensor(q_elems(c), c.dtype, 4);
  const Reference undropped = reference(c, hq, hk, hv, hdo, scale);
  const Reference ref = reference_dropout(c, dc, hq, hk, hv, hdo, scale);
  const std::vector<double>& ref_out = ref.out;
  const double tol = c.dtype == DType::kBFloat16 ? 2e-2 : 4e-3;
  DeviceProblem d(c, scale);
  d.q.upload(hq);
  d.k.upload(hk);
  d.v.upload(hv);
  DeviceBuffer<uint32_t> key(2);
  DeviceBuffer<int32_t> offsets(4);
  key.upload({dc.key[0], dc.key[1]});
  offsets.upload({dc.offsets[0], dc.offsets[1], dc.offsets[2], dc.offsets[3]});
  d.p.has_dropout = true;
  d.p.dropout_threshold = dc.threshold();
  d.p.dropout_scale = dc.keep_scale();
  d.p.dropout_key_ptr = key.ptr;
  d.p.dropout_offsets = offsets.ptr;
  jax_dash::sm90::BwdOccupancy occupancy;  // the dropout instantiation's
  CHECK_CUDA(jax_dash::sm90::bwd_occupancy(d.p, &occupancy));
  d.p.wave = occupancy.wave;
  bool ok = true;
  std::vector<uint16_t> first;
  for (int rep = 0; rep < 2; ++rep) {
    d.out.poison();
    d.lse.poison();
    CHECK_CUDA(jax_dash::sm90::run_fwd(d.p, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    const auto o = d.out.download();
    if (rep == 0) {
      ok &= compare("fwd", "out", widen(o, c.dtype), ref_out, tol);
      const auto l = d.lse.download();
      ok &= compare_lse(std::vector<double>(l.begin(), l.end()), undropped.lse);
      first = o;
    } else {
      std::printf("  fwd   bitwise repeatable: %s\n", o == first ? "ok" : "FAIL");
      ok &= o == first;
    }
  }
  const size_t nq = q_elems(c), nlse = static_cast<size_t>(c.batch) * c.heads * c.seq_q;
  std::vector<uint16_t> ho(nq);
  for (size_t i = 0; i < nq; ++i) ho[i] = to_bits(ref.out[i], c.dtype);
  std::vector<float> hl(nlse);
  for (size_t i = 0; i < nlse; ++i) hl[i] = static_cast<float>(undropped.lse[i]);
  d.out.upload(ho);
  d.lse.upload(hl);
  d.dout.upload(hdo);
  const Schedule schedules[] = {Schedule::kAscending, Schedule::kDescending, Schedule::kShift,
                                Schedule::kSymmetricShift, Schedule::kAtomic, Schedule::kMirror};
  for (Schedule schedule : schedules) {
    d.p.schedule = schedule;
    std::vector<std::vector<uint16_t>> first_grads;
    const int reps = schedule == Schedule::kAtomic ? 1 : 2;
    for (int rep = 0; rep < reps; ++rep) {
      const auto got = d.backward();
      if (rep == 0) {
        std::printf("  bwd %s\n", schedule_name(schedule));
        ok &= compare_grads(got, ref, c.dtype, tol);
        first_grads = got;
      } else {
        const bool same = got == first_grads;
        std::printf("  bwd   bitwise repeatable: %s\n", same ? "ok" : "FAIL");
        ok &= same;
      }
    }
  }
  std::printf("  %s\n", ok ? "PASS" : "FAIL");
  return ok;
}

// Both kernels (unmasked, masked), every head dim and dtype, causal and not, GQA, seq_q != seq_kv,
// offsets on the 16-element Philox blocks (one call per 8 elements) and off them (the per-element
// fallback), and a rate of 0.5 beside 0.1.
int dropout_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  constexpr Schedule any = Schedule::kDescending;  // the forward has no schedule
  struct Item {
    Case c;
    DropoutCase dc;
  };
  Case windowed{2, 300, 300, 4, 2, 128, true, any, bf16};
  windowed.window_left = 100;
  windowed.lengths = true;
  Case segmented{1, 400, 400, 2, 1, 64, false, any, fp16};
  segmented.segment_length = 90;
  const Item items[] = {
      {{1, 300, 300, 2, 2, 64, false, any, bf16}, {0.1, {0x12345678u, 0x9abcdef0u}, {0, 0, 0, 0}}},
      {{2, 256, 384, 4, 2, 128, true, any, fp16}, {0.1, {1u, 2u}, {3, 5, 512, 1024}}},
      {{1, 200, 200, 2, 1, 256, true, any, bf16}, {0.5, {7u, 11u}, {1, 2, 48, 16}}},
      {{2, 150, 330, 4, 2, 64, false, any, fp16}, {0.1, {0xdeadbeefu, 3u}, {0, 1, 7, 3}}},
      {{1, 333, 333, 2, 2, 128, true, any, bf16}, {0.2, {5u, 6u}, {2, 0, 13, 250}}},
      {windowed, {0.1, {8u, 9u}, {4, 2, 1024, 2048}}},
      {segmented, {0.1, {10u, 12u}, {0, 3, 5, 21}}},
  };
  int failed = 0;
  for (const Item& item : items) failed += run_dropout_case(item.c, item.dc) ? 0 : 1;
  const size_t n = sizeof(items) / sizeof(items[0]);
  std::printf("%s: %d of %zu dropout cases failed\n", failed ? "FAIL" : "PASS", failed, n);
  return failed ? 1 : 0;
}

// The outputs of one case's forward (out, lse) and backward (dq, dk, dv, from the forward's out and
// lse) with the environment variable `var` set to `value` ("" = unset) for the call.
struct Outputs {
  std::vector<uint16_t> out, dq, dk, dv;
  std::vector<float> lse;
};
Outputs run_with(const Case& c, const char* var, const char* value) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const char* saved = std::getenv(var);
  const std::string saved_value = saved ? saved : "";
  if (*value) setenv(var, value, 1);
  else unsetenv(var);
  DeviceProblem d(c, scale);
  d.q.upload(random_tensor(q_elems(c), c.dtype, 1));
  d.k.upload(random_tensor(kv_elems(c), c.dtype, 2));
  d.v.upload(random_tensor(kv_elems(c), c.dtype, 3));
  d.dout.upload(random_tensor(q_elems(c), c.dtype, 4));
  d.out.poison();
  d.lse.poison();
  CHECK_CUDA(jax_dash::sm90::run_fwd(d.p, nullptr));
  CHECK_CUDA(jax_dash::sm90::run_bwd(d.p, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  Outputs o{d.out.download(), d.dq.download(), d.dk.download(), d.dv.download(),
            d.lse.download()};
  if (saved) setenv(var, saved_value.c_str(), 1);
  else unsetenv(var);
  return o;
}

int variants(const Case* cases, size_t n) {
  int failed = 0;
  for (size_t i = 0; i < n; ++i) {
    const Case& c = cases[i];
    if (c.schedule == Schedule::kAtomic) continue;  // races: no bits to compare
    const Outputs f0 = run_with(c, "JAX_DASH_SM90_FWD", "ws"),
                  f1 = run_with(c, "JAX_DASH_SM90_FWD", "ws-persistent"),
                  f2 = run_with(c, "JAX_DASH_SM90_FWD", "ws-persistent-narrow");
    auto same_fwd = [&](const Outputs& a, const Outputs& b) {
      return a.out == b.out &&
             std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
    };
    const bool fwd_same = same_fwd(f0, f1) && same_fwd(f0, f2);
    std::printf("case %zu (Sq=%lld Skv=%lld D=%d %s %s): forward ws == ws-persistent == "
                "ws-persistent-narrow: %s\n",
                i, static_cast<long long>(c.seq_q), static_cast<long long>(c.seq_kv), c.head_dim,
                c.causal ? "causal" : "full", schedule_name(c.schedule),
                fwd_same ? "same bits" : "DIFFER");
    failed += fwd_same ? 0 : 1;
  }
  std::printf("%s: %d cases differ\n", failed ? "FAIL" : "PASS", failed);
  return failed ? 1 : 0;
}

// One more backward with the per-role wait trace on: where each role of the warp-specialized kernel
// waits, as a share of the math warpgroups' cycles, summed over CTAs (slots: WsTraceSlot). At
// head_dim 128 without a mask this runs the traced twin of the timed kernel (bwd/traits.cuh
// kTraced): the same schedule and waits, ~36 more instructions a step.
// The trace of one backward, each slot summed over the CTAs.
std::vector<double> trace_sums(const AttentionParams& p) {
  const int slots = jax_dash::sm90::bwd_trace_slots();
  const size_t n = static_cast<size_t>(p.wave) * slots;
  unsigned long long* trace = nullptr;
  CHECK_CUDA(cudaMalloc(&trace, n * sizeof(unsigned long long)));
  CHECK_CUDA(cudaMemset(trace, 0, n * sizeof(unsigned long long)));
  CHECK_CUDA(jax_dash::sm90::run_bwd(p, nullptr, trace));
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<unsigned long long> host(n);
  CHECK_CUDA(cudaMemcpy(host.data(), trace, n * sizeof(unsigned long long),
                        cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(trace));
  std::vector<double> sum(slots, 0.0);
  for (size_t i = 0; i < n; ++i) sum[i % slots] += static_cast<double>(host[i]);
  return sum;
}

void print_trace(const AttentionParams& p) {
  const int slots = jax_dash::sm90::bwd_trace_slots();
  const std::vector<double> sum = trace_sums(p);
  // Slot order: cuda/sm90/bwd/trace.cuh WsTraceSlot (the last three: units, steps, cycles).
  const char* names[] = {"math wait K/V",       "math wait Q/dO stage", "math wait PdS barrier",
                         "math wait dQ buffer", "writer wait ticket",   "writer wait dQ full",
                         "writer reduce (smem read)", "producer wait empty", "math unit start",
                         "math epilogue",       "writer wait complete", "writer fence+release",
                         " unit start: fetch",  " unit start: tables",  " unit start: publish"};
  constexpr int kNamed = sizeof(names) / sizeof(names[0]);
  static_assert(kNamed == 15, "one name per timed slot");
  if (slots != kNamed + 3) {
    std::fprintf(stderr, "trace: %d slots, this driver knows %d\n", slots, kNamed + 3);
    return;
  }
  const double cycles = sum[slots - 1] > 0 ? sum[slots - 1] : 1.0;
  const double steps = sum[slots - 2] > 0 ? sum[slots - 2] : 1.0;
  const double units = sum[slots - 3] > 0 ? sum[slots - 3] : 1.0;
  std::printf("trace (sum over the CTAs; %% of math cycles; cycles per step; per unit):\n");
  for (int i = 0; i < slots - 3; ++i) {
    std::printf("  %-24s %6.1f%%  %8.0f  %9.0f\n", names[i], 100.0 * sum[i] / cycles,
                sum[i] / steps, sum[i] / units);
  }
  std::printf("  %-24s %.0f units, %.0f steps, %.0f cycles per step, %.0f per unit\n", "math",
              units, steps, cycles / steps, cycles / units);
}

int bench(int argc, char** argv) {
  if (argc != 10 && argc != 11) {
    std::fprintf(stderr, "usage: %s bench B S H Hkv D causal(0/1) schedule iters [window_left]\n",
                 argv[0]);
    return 2;
  }
  Case c{};
  c.batch = std::atoll(argv[2]);
  c.seq_q = c.seq_kv = std::atoll(argv[3]);
  c.heads = std::atoi(argv[4]);
  c.kv_heads = std::atoi(argv[5]);
  c.head_dim = std::atoi(argv[6]);
  c.causal = std::atoi(argv[7]) != 0;
  c.dtype = DType::kBFloat16;
  const int iters = std::atoi(argv[9]);
  if (argc == 11) c.window_left = std::atoll(argv[10]);
  if (!parse_schedule(argv[8], &c.schedule) || c.batch < 1 || c.seq_q < 1 || c.heads < 1 ||
      c.kv_heads < 1 || c.heads % c.kv_heads != 0 || (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) ||
      iters < 1 || (argc == 11 && c.window_left < 0)) {
    std::fprintf(stderr, "bad arguments (schedule: ascending|descending|shift|symmetric_shift|"
                         "atomic; head_dim 64, 128 or 256; heads a multiple of kv heads; "
                         "window_left >= 0)\n");
    return 2;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  DeviceProblem d(c, scale);
  d.q.upload(random_tensor(q_elems(c), c.dtype, 1));
  d.k.upload(random_tensor(kv_elems(c), c.dtype, 2));
  d.v.upload(random_tensor(kv_elems(c), c.dtype, 3));
  d.dout.upload(random_tensor(q_elems(c), c.dtype, 4));
  const AttentionParams& p = d.p;
  cudaEvent_t e0, e1, e2;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  CHECK_CUDA(cudaEventCreate(&e2));
  CHECK_CUDA(jax_dash::sm90::run_fwd(p, nullptr));  // real out/lse for the backward, and warm-up
  CHECK_CUDA(jax_dash::sm90::run_bwd(p, nullptr));
  CHECK_CUDA(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) CHECK_CUDA(jax_dash::sm90::run_fwd(p, nullptr));
  CHECK_CUDA(cudaEventRecord(e1));
  for (int i = 0; i < iters; ++i) CHECK_CUDA(jax_dash::sm90::run_bwd(p, nullptr));
  CHECK_CUDA(cudaEventRecord(e2));
  CHECK_CUDA(cudaEventSynchronize(e2));
  float fwd_ms = 0, bwd_ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&fwd_ms, e0, e1));
  CHECK_CUDA(cudaEventElapsedTime(&bwd_ms, e1, e2));
  // Visible (query, key) pairs of one row and head: the benchmarks' convention (causal: half the
  // square; a window: the band's pairs counted exactly).
  double pairs = double(c.seq_q) * c.seq_kv * (c.causal ? 0.5 : 1.0);
  if (c.window_left >= 0) {
    pairs = 0;
    for (int64_t i = 0; i < c.seq_q; ++i) {
      const int64_t hi = c.causal ? std::min(i, c.seq_kv - 1) : c.seq_kv - 1;
      pairs += double(std::max<int64_t>(0, hi - std::max<int64_t>(0, i - c.window_left) + 1));
    }
  }
  const double flops = 4.0 * c.batch * c.heads * pairs * c.head_dim;
  // FNV-1a of the last backward's dQ, dK and dV bits: two builds' kernels (an A/B) compute the
  // same bits where a deterministic schedule gives the same hash (atomic: differs run to run).
  uint64_t bits_hash = 1469598103934665603ull;
  for (const DeviceBuffer<uint16_t>* g : {&d.dq, &d.dk, &d.dv}) {
    for (const uint16_t x : g->download()) bits_hash = (bits_hash ^ x) * 1099511628211ull;
  }
  std::printf("bench B=%lld S=%lld H=%d Hkv=%d D=%d %s%s %s wave=%d: fwd %.3f ms (%.0f TFLOP/s), "
              "bwd %.3f ms (%.0f TFLOP/s), bits %016llx\n",
              static_cast<long long>(c.batch), static_cast<long long>(c.seq_q), c.heads,
              c.kv_heads, c.head_dim, c.causal ? "causal" : "full",
              c.window_left >= 0 ? (" window " + std::to_string(c.window_left)).c_str() : "",
              schedule_name(c.schedule),
              p.wave, fwd_ms / iters, flops / (fwd_ms / iters) * 1e-9, bwd_ms / iters,
              2.5 * flops / (bwd_ms / iters) * 1e-9, static_cast<unsigned long long>(bits_hash));
  print_trace(p);
  return 0;
}

}  // namespace

// The premise of the backward's first-contribution store (WsParams::dq_first_store): for every
// value x, storing zero_plus(x) leaves the bits that a bulk fp32 reduction of x into +0 leaves
// (the kernels' old "memset, then add"), subnormals and signed zeros included.
__global__ void first_store_probe(const float* in, float* reduced, float* stored) {
  __shared__ alignas(128) float s_in[32];
  __shared__ alignas(128) float s_zp[32];
  const int t = threadIdx.x;
  s_in[t] = in[t];
  s_zp[t] = jax_dash::sm90::zero_plus(in[t]);
  jax_dash::sm90::fence_async_shared();
  __syncthreads();
  if (t == 0) {
    jax_dash::sm90::bulk_reduce_add_f32(reduced, s_in, sizeof(s_in));
    jax_dash::sm90::bulk_store_f32(stored, s_zp, sizeof(s_zp));
    jax_dash::sm90::bulk_commit_group();
    jax_dash::sm90::bulk_wait_group_all();
  }
}

bool check_first_store() {
  const float kMin = std::numeric_limits<float>::min();
  const float kDen = std::numeric_limits<float>::denorm_min();
  std::vector<float> in = {0.f,  -0.f,      kDen,      -kDen,        kMin - kDen, -(kMin - kDen),
                           kMin, -kMin,     1e-40f,    -1e-40f,      1.f,         -1.f,
                           3.5e-3f, -7.25e5f, std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  while (in.size() < 32) in.push_back(static_cast<float>(in.size()) * -0.37f);
  DeviceBuffer<float> d_in(32), reduced(32), stored(32);
  d_in.upload(in);
  reduced.upload(std::vector<float>(32, 0.f));
  stored.poison();
  first_store_probe<<<1, 32>>>(d_in.ptr, reduced.ptr, stored.ptr);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<float> r = reduced.download(), st = stored.download();
  bool same = true;
  for (int i = 0; i < 32; ++i) {
    if (std::memcmp(&r[i], &st[i], sizeof(float)) != 0) {
      uint32_t a, b, x;
      std::memcpy(&a, &r[i], 4);
      std::memcpy(&b, &st[i], 4);
      std::memcpy(&x, &in[i], 4);
      std::printf("  first-store probe: x=0x%08x reduced into +0 -> 0x%08x, stored -> 0x%08x\n",
                  x, a, b);
      same = false;
    }
  }
  std::printf("dQ first-contribution store has the bits of an add into zero: %s\n",
              same ? "ok" : "FAIL");
  return same;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "bench") == 0) return bench(argc, argv);
  const bool compare_variants = argc == 2 && std::strcmp(argv[1], "variants") == 0;
  const bool mask_cases = argc == 2 && std::strcmp(argv[1], "masks") == 0;
  const bool dropout_mode = argc == 2 && std::strcmp(argv[1], "dropout") == 0;
  if (argc > 1 && !compare_variants && !mask_cases && !dropout_mode) {
    std::fprintf(stderr, "usage: %s            (small checks)\n"
                         "       %s variants   (kernel variants' bits)\n"
                         "       %s masks      (window, lengths, segments, soft cap)\n"
                         "       %s dropout    (the forward with attention dropout)\n"
                         "       %s bench B S H Hkv D causal schedule iters\n",
                 argv[0], argv[0], argv[0], argv[0], argv[0]);
    return 2;
  }
  int major = 0, minor = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  if (major != 9 || minor != 0) {
    std::fprintf(stderr, "needs a Hopper GPU (compute capability 9.0), found %d.%d\n", major,
                 minor);
    return 2;
  }
  if (dropout_mode) return dropout_cases();
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  // Small enough for the sanitizers (which slow kernels by 10-100x), large enough for several
  // tiles, partial tiles, GQA, seq_q != seq_kv and every schedule's own path.
  const Case cases[] = {
      {1, 150, 150, 2, 1, 64, true, Schedule::kDescending, bf16},
      {1, 70, 200, 2, 2, 128, false, Schedule::kAscending, bf16},
      {1, 256, 256, 2, 2, 128, true, Schedule::kSymmetricShift, fp16},
      {1, 300, 300, 2, 2, 64, false, Schedule::kShift, bf16},
      {2, 100, 260, 4, 2, 64, false, Schedule::kAtomic, fp16},
      {1, 1, 1, 1, 1, 128, true, Schedule::kDescending, bf16},
      // Enough KV tiles (and, backward, Q tiles) that every 2-stage ring wraps several times.
      {1, 800, 800, 2, 1, 128, true, Schedule::kDescending, bf16},
      {1, 700, 900, 2, 2, 64, false, Schedule::kShift, fp16},
      // Head dim 256 (64-row tiles, the head dim split between the math warpgroups, dQ handed
      // over in the Q/dO stage): partial tiles, GQA, seq_q != seq_kv.
      {1, 200, 200, 2, 2, 256, true, Schedule::kDescending, bf16},
      {2, 150, 330, 4, 2, 256, false, Schedule::kSymmetricShift, fp16},
      {1, 300, 100, 2, 1, 256, true, Schedule::kAtomic, bf16},
      // mirror: the last KV tile first, dQ tickets in descending n.
      {1, 500, 500, 2, 1, 128, true, Schedule::kMirror, bf16},
      {2, 260, 700, 4, 2, 64, false, Schedule::kMirror, fp16},
  };
  if (compare_variants) {
    // Plus cases with more query tiles than an H100 has SMs, so that the persistent forward's CTAs
    // loop (512 tiles; 144 tiles: 12 CTAs take two, the rest one), with KV counts per tile odd and
    // even (causal).
    std::vector<Case> all(cases, cases + sizeof(cases) / sizeof(cases[0]));
    all.push_back({2, 2048, 2048, 16, 16, 128, true, Schedule::kDescending, bf16});
    all.push_back({3, 1000, 700, 6, 2, 64, false, Schedule::kShift, fp16});
    all.push_back({2, 1500, 1500, 5, 5, 64, true, Schedule::kSymmetricShift, bf16});
    // Causal with seq_q != seq_kv at head_dim 64: warpgroups whose rows see fewer KV tiles than
    // their tile's last rows skip those steps (and, past seq_q, every step), and which steps they
    // skip differs between 192-row (ws, ws-persistent) and 128-row tiles (ws-persistent-narrow);
    // all must give the same bits.
    all.push_back({1, 700, 300, 2, 1, 64, true, Schedule::kDescending, bf16});
    all.push_back({2, 333, 900, 4, 2, 64, true, Schedule::kShift, fp16});
    return variants(all.data(), all.size());
  }
  if (mask_cases) {
    // The masked kernel instantiations (issue 13): each part of the mask alone and together, both
    // head dims, partial tiles, GQA, and a schedule of each kind.
    auto masked = [](Case c, int64_t left, int64_t right, bool lengths, int64_t segment,
                     double cap) {
      c.window_left = left;
      c.window_right = right;
      c.lengths = lengths;
      c.segment_length = segment;
      c.soft_cap = cap;
      return c;
    };
    const Case mcases[] = {
        masked({1, 300, 300, 2, 1, 64, false, Schedule::kDescending, bf16}, 70, 9, false, 0, 0),
        masked({1, 256, 256, 2, 2, 128, true, Schedule::kSymmetricShift, bf16}, 64, -1, false, 0,
               0),
        masked({2, 200, 260, 4, 2, 64, false, Schedule::kShift, fp16}, -1, -1, true, 0, 0),
        masked({2, 333, 333, 2, 2, 128, true, Schedule::kDescending, bf16}, -1, -1, false, 50, 0),
        masked({1, 150, 150, 2, 2, 64, false, Schedule::kAtomic, bf16}, -1, -1, false, 0, 1.5),
        masked({2, 400, 400, 4, 2, 128, true, Schedule::kAscending, bf16}, 80, 3, true, 90, 2.0),
        masked({2, 513, 700, 2, 1, 64, false, Schedule::kDescending, fp16}, 100, 100, true, 64,
               0),
        // Data-hidden tile pairs under the rotating schedules' tickets (ranks among the visible
        // contributors in their ticket order).
        masked({1, 1024, 1024, 2, 2, 128, true, Schedule::kSymmetricShift, bf16}, -1, -1, false,
               150, 0),
        masked({2, 640, 640, 2, 1, 64, false, Schedule::kShift, fp16}, -1, -1, true, 130, 0),
        // Head dim 256: every part of the mask together, and segments under shift.
        masked({2, 300, 300, 2, 1, 256, true, Schedule::kAscending, bf16}, 70, 2, true, 80, 2.0),
        masked({1, 500, 500, 2, 2, 256, false, Schedule::kShift, fp16}, -1, -1, false, 120, 0),
        // mirror on a causal window (its case for auto), with lengths and segments dropping
        // pairs from its descending-n tickets; a two-sided window at head dim 256.
        masked({2, 700, 700, 2, 1, 64, true, Schedule::kMirror, bf16}, 200, -1, true, 150, 0),
        masked({1, 400, 500, 2, 2, 256, false, Schedule::kMirror, fp16}, 100, 30, false, 0, 0),
    };
    std::printf("masked kernels (forward ws, backward ws-rs)\n");
    int failed = 0;
    for (const Case& c : mcases) failed += run_case(c) ? 0 : 1;
    std::printf("%s: %d of %zu mask cases failed\n", failed ? "FAIL" : "PASS", failed,
                sizeof(mcases) / sizeof(mcases[0]));
    return failed ? 1 : 0;
  }
  if (std::string e = jax_dash::sm90::kernel_selection_error(); !e.empty()) {
    std::fprintf(stderr, "%s\n", e.c_str());
    return 2;
  }
  const char* fwd_variant = std::getenv("JAX_DASH_SM90_FWD");
  std::printf("forward kernel: %s\n",
              fwd_variant == nullptr || *fwd_variant == '\0' ? "by length" : fwd_variant);
  int failed = check_first_store() ? 0 : 1;
  for (const Case& c : cases) failed += run_case(c) ? 0 : 1;
  std::printf("%s: %d of %zu cases (and the first-store probe) failed\n",
              failed ? "FAIL" : "PASS", failed, sizeof(cases) / sizeof(cases[0]));
  return failed ? 1 : 0;
}
