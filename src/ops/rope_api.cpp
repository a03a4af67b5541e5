// fd_rope_apply / fd_rope_apply_style: the public, in-place form of the CPU
// RoPE (S3.1).
#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/arg_checks.hpp"
#include "ops/rope.hpp"

namespace {

fd_status apply(int32_t dtype, void *x, uint32_t num_tokens, uint32_t num_heads, uint32_t head_dim,
                const int32_t *positions, uint32_t rotary_dim, float rope_base,
                int32_t rope_style) {
  return fd::guard([&] {
    if (!fd::dtype_valid(dtype))
      fd::fail(
          FD_ERR_INVALID_ARGUMENT,
          "dtype %d is not a compute type (f32 = 0, f16 = 1, bf16 = 2; FP8 is K/V storage only)",
          static_cast<int>(dtype));
    fd::require_non_null(x, "x");
    fd::require_non_null(positions, "positions");
    if (num_tokens == 0) fd::fail(FD_ERR_INVALID_ARGUMENT, "num_tokens must be > 0");
    if (num_heads == 0) fd::fail(FD_ERR_INVALID_ARGUMENT, "num_heads must be > 0");
    if (head_dim == 0) fd::fail(FD_ERR_INVALID_ARGUMENT, "head_dim must be > 0");
    fd::check_rope_args(head_dim, rotary_dim, rope_base);
    fd::check_rope_style(rope_style, "rope_style");
    const char *what = "x ([num_tokens, num_heads, head_dim])";
    (void)fd::checked_extent_mul(fd::checked_extent_mul(num_tokens, num_heads, what), head_dim,
                                 what);
    fd::require_aligned(x, fd::dtype_size(dtype), "x");
    fd::require_aligned(positions, sizeof(int32_t), "positions");
    // Every position is checked before the first element is rotated, so a
    // failure leaves x untouched.
    for (uint32_t t = 0; t < num_tokens; ++t)
      if (positions[t] < 0)
        fd::fail(FD_ERR_INVALID_ARGUMENT, "positions[%u] = %d must be >= 0", t,
                 static_cast<int>(positions[t]));
    fd::rope_rotate(dtype, x, x, num_tokens, num_heads, head_dim, positions, rotary_dim, rope_base,
                    rope_style);
    return FD_OK;
  });
}

}  // namespace

extern "C" FD_API fd_status fd_rope_apply(int32_t dtype, void *x, uint32_t num_tokens,
                                          uint32_t num_heads, uint32_t head_dim,
                                          const int32_t *positions, uint32_t rotary_dim,
                                          float rope_base) {
  return apply(dtype, x, num_tokens, num_heads, head_dim, positions, rotary_dim, rope_base,
               FD_ROPE_SPLIT_HALF);
}

extern "C" FD_API fd_status fd_rope_apply_style(int32_t dtype, void *x, uint32_t num_tokens,
                                                uint32_t num_heads, uint32_t head_dim,
                                                const int32_t *positions, uint32_t rotary_dim,
                                                float rope_base, int32_t rope_style) {
  return apply(dtype, x, num_tokens, num_heads, head_dim, positions, rotary_dim, rope_base,
               rope_style);
}
