// CPU backend of fd_kv_append / fd_rope_kv_append: RoPE through the same
// rope_rotate as fd_rope_apply, then a strided scatter into the caches, which
// quantises into an FP8 cache (S1.1).
#include <vector>

#include "core/dtype.hpp"
#include "ops/kv_append.hpp"
#include "ops/rope.hpp"

namespace fd {
namespace {

// src: [num_tokens, num_kv_heads, head_dim] of src_dtype; token i goes to
// (block_ids[i], offsets[i]) of `cache` through the problem's view, each
// value divided by `scale` (1 unless the cache is FP8).
void scatter(const AppendProblem &p, void *cache, const void *src, int32_t src_dtype, float scale) {
  const PagedKv &kv = p.kv;
  const size_t e = kv.element_bytes, se = dtype_size(src_dtype), D = kv.head_dim,
               H = kv.num_kv_heads;
  auto *base = static_cast<unsigned char *>(cache);
  const auto *from = static_cast<const unsigned char *>(src);
  for (size_t i = 0; i < p.num_tokens; ++i)
    for (size_t h = 0; h < H; ++h) {
      const int64_t at = kv.offset(p.block_ids[i], int64_t(h), p.offsets[i], 0);
      convert_elements(from + (i * H + h) * D * se, src_dtype, base + size_t(at) * e, kv.dtype, D,
                       kv.stride_dim, scale);
    }
}

}  // namespace

void kv_append_cpu(const AppendProblem &p) {
  const PagedKv &kv = p.kv;
  const bool quantise = dtype_is_fp8(kv.dtype);
  const float k_scale = quantise ? p.k_scale : 1.f, v_scale = quantise ? p.v_scale : 1.f;
  if (p.rotary_dim == 0) {
    scatter(p, p.k_cache, p.k, p.src_dtype, k_scale);
    scatter(p, p.v_cache, p.v, p.src_dtype, v_scale);
    return;
  }
  // K is rotated into scratch; Q last, so an in-place q_out is safe. All
  // scratch is allocated before the first write, so running out of memory
  // fails the call with the caches and q_out untouched. Into an FP8 cache
  // the rotated K stays FP32 and is rounded once, to FP8 (S1.1).
  const size_t k_elems = size_t{p.num_tokens} * kv.num_kv_heads * kv.head_dim;
  const int32_t rot_dtype = quantise ? FD_DTYPE_F32 : p.src_dtype;
  std::vector<unsigned char> k_rot(k_elems * dtype_size(rot_dtype));
  std::vector<float> tables(rope_scratch_floats(p.rotary_dim));
  const void *k = p.k;
  if (quantise) {
    convert_elements(p.k, p.src_dtype, k_rot.data(), FD_DTYPE_F32, k_elems, 1, 1.f);
    k = k_rot.data();
  }
  rope_rotate(rot_dtype, k, k_rot.data(), p.num_tokens, kv.num_kv_heads, kv.head_dim, p.positions,
              p.rotary_dim, p.rope_base, p.rope_style, tables.data());
  scatter(p, p.k_cache, k_rot.data(), rot_dtype, k_scale);
  scatter(p, p.v_cache, p.v, p.src_dtype, v_scale);
  rope_rotate(p.src_dtype, p.q, p.q_out, p.num_tokens, p.num_q_heads, kv.head_dim, p.positions,
              p.rotary_dim, p.rope_base, p.rope_style, tables.data());
}

}  // namespace fd
