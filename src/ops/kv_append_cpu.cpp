// CPU backend of fd_kv_append / fd_rope_kv_append: RoPE through the same
// rope_rotate as fd_rope_apply, then a strided scatter into the caches.
#include <cstring>
#include <vector>

#include "ops/kv_append.hpp"
#include "ops/rope.hpp"

namespace fd {
namespace {

// src: [num_tokens, num_kv_heads, head_dim]; token i goes to (block_ids[i],
// offsets[i]) of `cache` through the problem's view.
void scatter(const AppendProblem &p, void *cache, const void *src) {
  const PagedKv &kv = p.kv;
  const size_t e = kv.element_bytes, D = kv.head_dim, H = kv.num_kv_heads;
  auto *base = static_cast<unsigned char *>(cache);
  const auto *from = static_cast<const unsigned char *>(src);
  for (size_t i = 0; i < p.num_tokens; ++i)
    for (size_t h = 0; h < H; ++h) {
      const unsigned char *row = from + (i * H + h) * D * e;
      const int64_t at = kv.offset(p.block_ids[i], int64_t(h), p.offsets[i], 0);
      if (kv.stride_dim == 1) {
        std::memcpy(base + size_t(at) * e, row, D * e);
      } else {
        for (size_t d = 0; d < D; ++d)
          std::memcpy(base + size_t(at + int64_t(d) * kv.stride_dim) * e, row + d * e, e);
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
  const PagedKv &kv = p.kv;
  std::vector<unsigned char> k_rot(size_t{p.num_tokens} * kv.num_kv_heads * kv.head_dim *
                                   kv.element_bytes);
  std::vector<float> tables(rope_scratch_floats(p.rotary_dim));
  rope_rotate(kv.dtype, p.k, k_rot.data(), p.num_tokens, kv.num_kv_heads, kv.head_dim, p.positions,
              p.rotary_dim, p.rope_base, tables.data());
  scatter(p, p.k_cache, k_rot.data());
  scatter(p, p.v_cache, p.v);
  rope_rotate(kv.dtype, p.q, p.q_out, p.num_tokens, p.num_q_heads, kv.head_dim, p.positions,
              p.rotary_dim, p.rope_base, tables.data());
}

}  // namespace fd
