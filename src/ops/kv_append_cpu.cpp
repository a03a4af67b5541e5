// CPU backend of fd_kv_append / fd_rope_kv_append: RoPE through the same
// rope_rotate as fd_rope_apply, then a strided scatter into the caches.
#include <cstring>
#include <vector>

#include "core/dtype.hpp"
#include "ops/kv_append.hpp"
#include "ops/rope.hpp"

namespace fd {
namespace {

// src: [num_tokens, num_kv_heads, head_dim]; token i goes to (block_ids[i],
// offsets[i]) of `cache` with the problem's strides.
void scatter(const AppendProblem &p, void *cache, const void *src) {
  const size_t e = dtype_size(p.dtype), D = p.head_dim;
  const int64_t *s = p.strides;
  auto *base = static_cast<unsigned char *>(cache);
  const auto *from = static_cast<const unsigned char *>(src);
  for (size_t i = 0; i < p.num_tokens; ++i)
    for (size_t h = 0; h < p.num_kv_heads; ++h) {
      const unsigned char *row = from + (i * p.num_kv_heads + h) * D * e;
      const int64_t at =
          int64_t{p.block_ids[i]} * s[0] + int64_t(h) * s[1] + int64_t{p.offsets[i]} * s[2];
      if (s[3] == 1) {
        std::memcpy(base + size_t(at) * e, row, D * e);
      } else {
        for (size_t d = 0; d < D; ++d)
          std::memcpy(base + size_t(at + int64_t(d) * s[3]) * e, row + d * e, e);
      }
    }
}

}  // namespace

void kv_append_cpu(const AppendProblem &p) {
  if (p.rotary_dim == 0) {
    scatter(p, p.k_cache, p.k);
    scatter(p, p.v_cache, p.v);
    return;
  }
  // K is rotated into scratch; Q last, so an in-place q_out is safe. All
  // scratch is allocated before the first write, so running out of memory
  // fails the call with the caches and q_out untouched.
  std::vector<unsigned char> k_rot(size_t{p.num_tokens} * p.num_kv_heads * p.head_dim *
                                   dtype_size(p.dtype));
  std::vector<float> tables(rope_scratch_floats(p.rotary_dim));
  rope_rotate(p.dtype, p.k, k_rot.data(), p.num_tokens, p.num_kv_heads, p.head_dim, p.positions,
              p.rotary_dim, p.rope_base, tables.data());
  scatter(p, p.k_cache, k_rot.data());
  scatter(p, p.v_cache, p.v);
  rope_rotate(p.dtype, p.q, p.q_out, p.num_tokens, p.num_q_heads, p.head_dim, p.positions,
              p.rotary_dim, p.rope_base, tables.data());
}

}  // namespace fd
