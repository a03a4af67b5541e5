/* Helpers of the FP8 suites (tests/test_fp8_*.cpp; C++ only): the host
 * conversions of src/core/dtype.hpp through a dtype, and errors of rows.
 * Include after <stdarg.h>, <stddef.h>, <setjmp.h>, <stdint.h>, <cmocka.h>
 * and "fd_test.h". */
#ifndef FD_TEST_FP8_SUPPORT_H
#define FD_TEST_FP8_SUPPORT_H

#include <cmath>
#include <vector>

#include "dtype.hpp"
#include "flashdec.h"

/* The stored code of x / scale (S1.1). */
static inline uint8_t f8_quantise(int32_t dtype, float x, float scale) {
  return dtype == FD_DTYPE_FP8_E4M3 ? fd::f32_to_fp8_e4m3(x / scale)
                                    : fd::f32_to_fp8_e5m2(x / scale);
}

/* The stored value of a code (no scale). */
static inline float f8_value(int32_t dtype, uint8_t c) {
  return dtype == FD_DTYPE_FP8_E4M3 ? fd::fp8_e4m3_to_f32(c) : fd::fp8_e5m2_to_f32(c);
}

/* The largest finite value of an FP8 type. */
static inline float f8_max(int32_t dtype) {
  return dtype == FD_DTYPE_FP8_E4M3 ? 448.f : 57344.f;
}

/* Element i of a buffer of any dtype as float, and the inverse. */
static inline float f8_load(const void *base, size_t i, int32_t dtype) {
  return fd::load_as_f32(base, i, dtype);
}
static inline void f8_store(void *base, size_t i, int32_t dtype, float x) {
  fd::store_from_f32(base, i, dtype, x);
}

/* Worst over rows of max |a - b| / max |b| (rows of `dim` values); the mean
 * over rows into *mean when given. */
static inline double f8_worst_row_error(const std::vector<float> &a, const std::vector<float> &b,
                                        size_t dim, double *mean = NULL) {
  double worst = 0, sum = 0;
  size_t rows = 0;
  for (size_t r = 0; r * dim < b.size(); ++r, ++rows) {
    double diff = 0, mag = 0;
    for (size_t d = 0; d < dim; ++d) {
      diff = std::fmax(diff, std::fabs((double)a[r * dim + d] - b[r * dim + d]));
      mag = std::fmax(mag, std::fabs((double)b[r * dim + d]));
    }
    if (std::isnan(diff)) return INFINITY;
    const double e = diff / std::fmax(mag, 1e-6);
    worst = std::fmax(worst, e);
    sum += e;
  }
  if (mean != NULL) *mean = rows > 0 ? sum / (double)rows : 0;
  return worst;
}

#endif
