/* Shared helpers for the cmocka suites (C99 and C++). Include after
 * <stdarg.h>, <stddef.h>, <setjmp.h>, <stdint.h> and <cmocka.h>. */
#ifndef FD_TEST_H
#define FD_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "flashdec.h"

/* Asserts that `expr` returns FD_OK; on failure prints the status and
 * fd_last_error_message() before failing the test. */
#define FD_ASSERT_OK(expr)                                                   \
  do {                                                                       \
    fd_status fd_assert_s_ = (expr);                                         \
    if (fd_assert_s_ != FD_OK) {                                             \
      print_error("%s:%d: %s returned %s (%s)\n", __FILE__, __LINE__, #expr, \
                  fd_status_string(fd_assert_s_), fd_last_error_message());  \
      fail();                                                                \
    }                                                                        \
  } while (0)

/* Asserts that `expr` returns `status` and that fd_last_error_message()
 * contains `substring` (pass "" to only require a non-empty message). */
#define FD_ASSERT_FAILS(expr, status, substring)                                           \
  do {                                                                                     \
    fd_status fd_assert_s_ = (expr);                                                       \
    const char *fd_assert_m_ = fd_last_error_message();                                    \
    if (fd_assert_s_ != (status) || fd_assert_m_[0] == '\0' ||                             \
        strstr(fd_assert_m_, (substring)) == NULL) {                                       \
      print_error("%s:%d: %s returned %s with message \"%s\"; expected %s with \"%s\"\n",  \
                  __FILE__, __LINE__, #expr, fd_status_string(fd_assert_s_), fd_assert_m_, \
                  fd_status_string(status), (substring));                                  \
      fail();                                                                              \
    }                                                                                      \
  } while (0)

/* Deterministic RNG (splitmix64) so failures reproduce from the seed. */
typedef struct fd_test_rng {
  uint64_t state;
} fd_test_rng;

static inline uint64_t fd_test_next(fd_test_rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform integer in [lo, hi] (inclusive). */
static inline int64_t fd_test_range(fd_test_rng *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(fd_test_next(r) % (uint64_t)(hi - lo + 1));
}

/* Uniform float in [0, 1). */
static inline float fd_test_uniform(fd_test_rng *r) {
  return (float)(fd_test_next(r) >> 40) * (1.0f / 16777216.0f);
}

/* Standard normal (Box-Muller). */
static inline float fd_test_normal(fd_test_rng *r) {
  float u1 = fd_test_uniform(r), u2 = fd_test_uniform(r);
  if (u1 < 1e-7f) u1 = 1e-7f;
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

/* FP32 <-> bf16 / f16 bit conversions, round to nearest even. */
static inline uint32_t fd_test_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float fd_test_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline float fd_test_bf16_to_f32(uint16_t h) {
  return fd_test_bits_f32((uint32_t)h << 16);
}
static inline uint16_t fd_test_f32_to_bf16(float f) {
  uint32_t u = fd_test_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float fd_test_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return (sign ? -1.0f : 1.0f) * ldexpf((float)m, -24);
  if (e == 31) return fd_test_bits_f32(sign | 0x7f800000u | (m << 13));
  return fd_test_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}
static inline uint16_t fd_test_f32_to_f16(float f) {
  uint32_t u = fd_test_f32_bits(f), a = u & 0x7fffffffu;
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    float r = fd_test_bits_f32(a) + 0.5f;
    return (uint16_t)(sign | (uint16_t)(fd_test_f32_bits(r) - 0x3f000000u));
  }
  return (uint16_t)(sign | (uint16_t)((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13));
}

/* Element i of a buffer of `dtype`, as float, and the inverse. */
static inline float fd_test_load(const void *base, size_t i, int32_t dtype) {
  if (dtype == FD_DTYPE_F32) return ((const float *)base)[i];
  if (dtype == FD_DTYPE_F16) return fd_test_f16_to_f32(((const uint16_t *)base)[i]);
  return fd_test_bf16_to_f32(((const uint16_t *)base)[i]);
}
static inline void fd_test_store(void *base, size_t i, int32_t dtype, float x) {
  if (dtype == FD_DTYPE_F32)
    ((float *)base)[i] = x;
  else if (dtype == FD_DTYPE_F16)
    ((uint16_t *)base)[i] = fd_test_f32_to_f16(x);
  else
    ((uint16_t *)base)[i] = fd_test_f32_to_bf16(x);
}
static inline size_t fd_test_dtype_size(int32_t dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return 4;
    case FD_DTYPE_F16:
    case FD_DTYPE_BF16: return 2;
    default: return 0;
  }
}
/* Sets q, K/V and out of a decode call to one element type (the served
 * combinations of 0.2). */
static inline void fd_test_decode_dtype(fd_decode_params *p, int32_t dtype) {
  p->q_dtype = dtype;
  p->kv_dtype = dtype;
  p->out_dtype = dtype;
}

#endif /* FD_TEST_H */
