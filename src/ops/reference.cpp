#include "ops/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/arg_checks.hpp"
#include "core/versioned.hpp"

namespace fd {
namespace {

void require_positive(uint32_t value, const char *name) {
  if (value == 0) fail(FD_ERR_INVALID_ARGUMENT, "%s must be > 0", name);
}

// Throws unless a*b*c*d elements (of at most 4 bytes) can be addressed.
void require_addressable(uint64_t a, uint64_t b, uint64_t c, uint64_t d, const char *what) {
  uint64_t n = 0;
  if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n) ||
      __builtin_mul_overflow(n, d, &n) || n > static_cast<uint64_t>(PTRDIFF_MAX) / 4)
    fail(FD_ERR_INVALID_ARGUMENT, "%s is too large to address", what);
}

}  // namespace

float check_dense_attention_args(const DenseAttentionArgs &a) {
  if (!dtype_valid(a.dtype))
    fail(FD_ERR_INVALID_ARGUMENT,
         "dtype %d is not a compute type (f32 = 0, f16 = 1, bf16 = 2; FP8 is K/V storage only)",
         static_cast<int>(a.dtype));
  require_positive(a.batch, "batch");
  require_positive(a.num_q_heads, "num_q_heads");
  require_positive(a.num_kv_heads, "num_kv_heads");
  require_positive(a.head_dim, "head_dim");
  require_positive(a.max_seq_len, "max_seq_len");
  if (a.num_q_heads % a.num_kv_heads != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "num_q_heads (%u) must be a multiple of num_kv_heads (%u)",
         a.num_q_heads, a.num_kv_heads);
  require_addressable(a.batch, a.num_q_heads, a.head_dim, 1,
                      "q/out ([batch, num_q_heads, head_dim])");
  require_addressable(a.batch, a.num_kv_heads, a.max_seq_len, a.head_dim,
                      "k/v ([batch, num_kv_heads, max_seq_len, head_dim])");
  require_non_null(a.q, "q");
  require_non_null(a.k, "k");
  require_non_null(a.v, "v");
  require_non_null(a.seq_lens, "seq_lens");
  require_non_null(a.out, "out");
  const size_t e = dtype_size(a.dtype);
  require_aligned(a.q, e, "q");
  require_aligned(a.k, e, "k");
  require_aligned(a.v, e, "v");
  require_aligned(a.out, e, "out");
  require_aligned(a.seq_lens, sizeof(int32_t), "seq_lens");
  if (!std::isfinite(a.sm_scale) || a.sm_scale < 0.f)
    fail(FD_ERR_INVALID_ARGUMENT, "sm_scale must be finite and >= 0, got %g",
         static_cast<double>(a.sm_scale));
  for (uint32_t r = 0; r < a.batch; ++r) {
    const int32_t len = a.seq_lens[r];
    if (len < 0 || static_cast<uint32_t>(len) > a.max_seq_len)
      fail(FD_ERR_INVALID_ARGUMENT, "seq_lens[%u] = %d is out of range [0, max_seq_len=%u]", r,
           static_cast<int>(len), a.max_seq_len);
  }
  if (a.q_indptr != nullptr) {
    require_aligned(a.q_indptr, sizeof(int32_t), "q_indptr");
    if (a.q_indptr[0] != 0)
      fail(FD_ERR_INVALID_ARGUMENT, "q_indptr[0] must be 0, got %d", a.q_indptr[0]);
    for (uint32_t r = 0; r < a.batch; ++r) {
      const int64_t n = int64_t{a.q_indptr[r + 1]} - a.q_indptr[r];
      if (n < 1 || n > a.seq_lens[r])
        fail(FD_ERR_INVALID_ARGUMENT,
             "q_indptr[%u] = %d: row %u has %lld query tokens, it needs 1 .. seq_lens[%u] = %d",
             r + 1, a.q_indptr[r + 1], r, static_cast<long long>(n), r, a.seq_lens[r]);
    }
    require_addressable(static_cast<uint32_t>(a.q_indptr[a.batch]), a.num_q_heads, a.head_dim, 1,
                        "q/out ([q_indptr[batch], num_q_heads, head_dim])");
  }
  if (!std::isfinite(a.logit_softcap) || a.logit_softcap < 0.f)
    fail(FD_ERR_INVALID_ARGUMENT, "logit_softcap must be finite and >= 0 (0: none), got %g",
         static_cast<double>(a.logit_softcap));
  if (a.sliding_window < 0)
    fail(FD_ERR_INVALID_ARGUMENT, "sliding_window must be >= 0 (0: none), got %d",
         a.sliding_window);
  if (a.sinks != nullptr) {
    require_aligned(a.sinks, sizeof(float), "sinks");
    for (uint32_t h = 0; h < a.num_q_heads; ++h)
      if (std::isnan(a.sinks[h])) fail(FD_ERR_INVALID_ARGUMENT, "sinks[%u] is NaN", h);
  }
  return a.sm_scale > 0.f ? a.sm_scale : 1.0f / std::sqrt(static_cast<float>(a.head_dim));
}

void reference_attention_dense(const DenseAttentionArgs &a, float sm_scale) {
  const size_t dim = a.head_dim;
  const uint32_t group = a.num_q_heads / a.num_kv_heads;
  std::vector<float> scores(a.max_seq_len);
  std::vector<float> acc(dim);
  for (size_t r = 0; r < a.batch; ++r) {
    const int64_t len = a.seq_lens[r];
    // Query tokens of the row: the last n positions (S2.2); without q_indptr
    // one token, at position len - 1.
    const int64_t first = a.q_indptr != nullptr ? a.q_indptr[r] : static_cast<int64_t>(r);
    const int64_t n = a.q_indptr != nullptr ? a.q_indptr[r + 1] - first : 1;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t position = len - n + j;
      // Visible keys: 0 .. position, or its last sliding_window (S2.3).
      const int64_t lo =
          a.sliding_window > 0 ? std::max<int64_t>(0, position - a.sliding_window + 1) : 0;
      const int64_t hi = position + 1;  // 0 for an empty row
      for (size_t h = 0; h < a.num_q_heads; ++h) {
        const size_t q_row = ((first + j) * a.num_q_heads + h) * dim;
        const size_t kv_head = h / group;
        const size_t kv_base = (r * a.num_kv_heads + kv_head) * a.max_seq_len * dim;
        // Two passes, FP32 throughout: scores and their maximum (the sink
        // included), then weights.
        const float sink = a.sinks != nullptr ? a.sinks[h] : -INFINITY;
        float max_score = sink;
        for (int64_t t = lo; t < hi; ++t) {
          float dot = 0.f;
          for (size_t d = 0; d < dim; ++d)
            dot += load_as_f32(a.q, q_row + d, a.dtype) *
                   load_as_f32(a.k, kv_base + t * dim + d, a.dtype);
          float s = dot * sm_scale;
          if (a.logit_softcap > 0.f) s = a.logit_softcap * std::tanh(s / a.logit_softcap);
          scores[t] = s;
          if (s > max_score) max_score = s;
        }
        // The sink takes probability mass and brings no value.
        float denom = sink == -INFINITY ? 0.f : std::exp(sink - max_score);
        for (size_t d = 0; d < dim; ++d) acc[d] = 0.f;
        for (int64_t t = lo; t < hi; ++t) {
          const float p = std::exp(scores[t] - max_score);
          denom += p;
          for (size_t d = 0; d < dim; ++d)
            acc[d] += p * load_as_f32(a.v, kv_base + t * dim + d, a.dtype);
        }
        // An empty row has no weights: its output is zero by definition (S2).
        const float inv = hi > lo ? 1.0f / denom : 0.f;
        for (size_t d = 0; d < dim; ++d) store_from_f32(a.out, q_row + d, a.dtype, acc[d] * inv);
      }
    }
  }
}

}  // namespace fd

extern "C" FD_API fd_status fd_reference_attention_dense(
    int32_t dtype, uint32_t batch, uint32_t num_q_heads, uint32_t num_kv_heads, uint32_t head_dim,
    uint32_t max_seq_len, const void *q, const void *k, const void *v, const int32_t *seq_lens,
    float sm_scale, void *out) {
  return fd::guard([&] {
    fd::DenseAttentionArgs args;
    args.dtype = dtype;
    args.batch = batch;
    args.num_q_heads = num_q_heads;
    args.num_kv_heads = num_kv_heads;
    args.head_dim = head_dim;
    args.max_seq_len = max_seq_len;
    args.q = q;
    args.k = k;
    args.v = v;
    args.seq_lens = seq_lens;
    args.sm_scale = sm_scale;
    args.out = out;
    const float scale = fd::check_dense_attention_args(args);
    fd::reference_attention_dense(args, scale);
    return FD_OK;
  });
}

namespace {

fd_reference_params default_reference_params() {
  fd_reference_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.dtype = FD_DTYPE_F32;
  return p;
}

}  // namespace

extern "C" FD_API void fd_reference_params_init(fd_reference_params *params) {
  if (params != nullptr) *params = default_reference_params();
}

extern "C" FD_API fd_status fd_reference_attention(const fd_reference_params *params) {
  return fd::guard([&] {
    constexpr size_t kMinSize = offsetof(fd_reference_params, out) + sizeof(void *);
    const fd_reference_params p =
        fd::read_versioned<kMinSize>(params, default_reference_params(), "params");
    fd::DenseAttentionArgs args;
    args.dtype = p.dtype;
    args.batch = p.batch;
    args.num_q_heads = p.num_q_heads;
    args.num_kv_heads = p.num_kv_heads;
    args.head_dim = p.head_dim;
    args.max_seq_len = p.max_seq_len;
    args.q = p.q;
    args.k = p.k;
    args.v = p.v;
    args.seq_lens = p.seq_lens;
    args.sm_scale = p.sm_scale;
    args.out = p.out;
    args.q_indptr = p.q_indptr;
    args.logit_softcap = p.logit_softcap;
    args.sliding_window = p.sliding_window;
    args.sinks = p.sinks;
    const float scale = fd::check_dense_attention_args(args);
    fd::reference_attention_dense(args, scale);
    return FD_OK;
  });
}
