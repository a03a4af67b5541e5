#include "ops/rope.hpp"

#include <cmath>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace fd {

void check_rope_args(uint32_t head_dim, uint32_t rotary_dim, float base) {
  if (rotary_dim == 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim)
    fail(FD_ERR_INVALID_ARGUMENT, "rotary_dim must be even and in (0, head_dim=%u], got %u",
         head_dim, rotary_dim);
  if (!std::isfinite(base) || base <= 0.f)
    fail(FD_ERR_INVALID_ARGUMENT, "rope_base must be finite and > 0, got %g",
         static_cast<double>(base));
}

void check_rope_style(int32_t style, const char *name) {
  if (style != FD_ROPE_SPLIT_HALF && style != FD_ROPE_INTERLEAVED)
    fail(FD_ERR_INVALID_ARGUMENT, "%s %d is not an fd_rope_style (split-half = 0, interleaved = 1)",
         name, static_cast<int>(style));
}

void rope_rotate(int32_t dtype, const void *src, void *dst, size_t num_tokens, uint32_t num_heads,
                 uint32_t head_dim, const int32_t *positions, uint32_t rotary_dim, float base,
                 int32_t style) {
  // The per-call tables (inv_freq, then cos and sin of the current token)
  // live on the stack for the usual rotary dims (<= 256) and in one heap
  // block otherwise: this runs once per layer per step, and three vectors
  // per call used to cost more than the rotation of a small batch.
  constexpr uint32_t kStackRotaryDim = 256;
  float stack_tables[3 * kStackRotaryDim / 2];
  std::vector<float> heap_tables;
  float *tables = stack_tables;
  if (rotary_dim > kStackRotaryDim) {
    heap_tables.resize(rope_scratch_floats(rotary_dim));
    tables = heap_tables.data();
  }
  rope_rotate(dtype, src, dst, num_tokens, num_heads, head_dim, positions, rotary_dim, base, style,
              tables);
}

void rope_rotate(int32_t dtype, const void *src, void *dst, size_t num_tokens, uint32_t num_heads,
                 uint32_t head_dim, const int32_t *positions, uint32_t rotary_dim, float base,
                 int32_t style, float *scratch) {
  const uint32_t half = rotary_dim / 2;
  // Pair i is (dim i*first_step, dim i*first_step + second): split-half
  // (i, i + R/2) or interleaved (2i, 2i + 1). The same operations on the
  // same values either way, so the styles differ only in where they read.
  const bool interleaved = style == FD_ROPE_INTERLEAVED;
  const uint32_t first_step = interleaved ? 2 : 1, second = interleaved ? 1 : half;
  float *const inv_freq = scratch;
  float *const cos_t = inv_freq + half;
  float *const sin_t = cos_t + half;
  for (uint32_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(base, -2.0f * static_cast<float>(i) / static_cast<float>(rotary_dim));
  for (size_t t = 0; t < num_tokens; ++t) {
    const float p = static_cast<float>(positions[t]);
    for (uint32_t i = 0; i < half; ++i) {
      const float angle = p * inv_freq[i];
      cos_t[i] = std::cos(angle);
      sin_t[i] = std::sin(angle);
    }
    for (uint32_t h = 0; h < num_heads; ++h) {
      const size_t row = (t * num_heads + h) * head_dim;
      for (uint32_t i = 0; i < half; ++i) {
        const size_t d1 = row + size_t{i} * first_step, d2 = d1 + second;
        const float x1 = load_as_f32(src, d1, dtype);
        const float x2 = load_as_f32(src, d2, dtype);
        store_from_f32(dst, d1, dtype, x1 * cos_t[i] - x2 * sin_t[i]);
        store_from_f32(dst, d2, dtype, x2 * cos_t[i] + x1 * sin_t[i]);
      }
      if (dst != src)
        for (uint32_t d = rotary_dim; d < head_dim; ++d)
          store_from_f32(dst, row + d, dtype, load_as_f32(src, row + d, dtype));
    }
  }
}

}  // namespace fd
