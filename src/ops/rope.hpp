// Rotary position embedding on the CPU (docs/semantics.md S3.1): split-half
// or interleaved pairs (fd_rope_style), full or partial rotary_dim.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fd {

// Throws FD_ERR_INVALID_ARGUMENT unless rotary_dim is even and in
// (0, head_dim] and base is finite and > 0.
void check_rope_args(uint32_t head_dim, uint32_t rotary_dim, float base);

// Throws FD_ERR_INVALID_ARGUMENT naming `name` ("params->rope_style")
// unless `style` is an fd_rope_style value.
void check_rope_style(int32_t style, const char *name);

// Rotates `src` ([num_tokens, num_heads, head_dim] of `dtype`) into `dst`
// (same shape; may equal src), token i at positions[i] (each >= 0, not
// re-checked), pairs placed as `style` (an fd_rope_style) says. FP32 math,
// rounded once to dtype. Arguments must be valid.
void rope_rotate(int32_t dtype, const void *src, void *dst, size_t num_tokens, uint32_t num_heads,
                 uint32_t head_dim, const int32_t *positions, uint32_t rotary_dim, float base,
                 int32_t style);

// Floats of scratch the overload below needs: 3 * rotary_dim / 2.
inline size_t rope_scratch_floats(uint32_t rotary_dim) {
  return size_t{3} * (rotary_dim / 2);
}

// As above with caller-provided scratch (rope_scratch_floats(rotary_dim)
// floats), so it allocates nothing and cannot fail: for callers that rotate
// after they have started writing their outputs.
void rope_rotate(int32_t dtype, const void *src, void *dst, size_t num_tokens, uint32_t num_heads,
                 uint32_t head_dim, const int32_t *positions, uint32_t rotary_dim, float base,
                 int32_t style, float *scratch);

}  // namespace fd
