/* The host FP8 conversions of src/core/dtype.hpp (docs/semantics.md S1.1),
 * which the CPU backend, the cache and the other FP8 suites use: all 256
 * codes of E4M3 and E5M2 decode to the OCP values and encode back;
 * encoding equals an independent nearest-value search (ties to the even
 * code, saturation to the largest finite value, NaN to 0x7f) on every f16
 * and bf16 value, every midpoint between two codes and its neighbours, and
 * random FP32 values; subnormals, signed zeros and the convert_elements
 * helper. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "dtype.hpp"
#include "fd_test.h"

namespace {

struct Format {
  int32_t dtype;
  int mant, bias;
  bool has_inf;
  uint8_t max_code;
  double max_value;
};

const Format kE4m3 = {FD_DTYPE_FP8_E4M3, 3, 7, false, 0x7e, 448.0};
const Format kE5m2 = {FD_DTYPE_FP8_E5M2, 2, 15, true, 0x7b, 57344.0};

/* The value of a code from the OCP definition, in double (NaN for NaN). */
double ocp_value(const Format &f, uint8_t c) {
  const int exp_bits = 7 - f.mant;
  const int e = (c & 0x7f) >> f.mant, m = c & ((1 << f.mant) - 1);
  const int emax = (1 << exp_bits) - 1;
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  if (f.has_inf && e == emax) return m == 0 ? sign * INFINITY : NAN;
  if (!f.has_inf && e == emax && m == (1 << f.mant) - 1) return NAN;
  if (e == 0) return sign * std::ldexp(m, 1 - f.bias - f.mant);
  return sign * std::ldexp((1 << f.mant) + m, e - f.bias - f.mant);
}

uint8_t encode(const Format &f, float x) {
  return f.dtype == FD_DTYPE_FP8_E4M3 ? fd::f32_to_fp8_e4m3(x) : fd::f32_to_fp8_e5m2(x);
}
float decode(const Format &f, uint8_t c) {
  return f.dtype == FD_DTYPE_FP8_E4M3 ? fd::fp8_e4m3_to_f32(c) : fd::fp8_e5m2_to_f32(c);
}

/* The expected code: the nearest finite value (ties: the even code), the
 * largest finite value of the sign beyond it, 0x7f for NaN. */
uint8_t reference_encode(const Format &f, float x) {
  if (std::isnan(x)) return 0x7f;
  const double a = std::fabs(static_cast<double>(x));
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (a >= f.max_value) return static_cast<uint8_t>(sign | f.max_code);
  uint8_t best = 0;
  double best_err = INFINITY;
  for (int c = 0; c <= f.max_code; ++c) {
    const double err = std::fabs(ocp_value(f, static_cast<uint8_t>(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

void expect_encodes(const Format &f, float x) {
  const uint8_t got = encode(f, x), want = reference_encode(f, x);
  if (got != want) {
    print_error("%s: %.9g (bits 0x%08x) encodes to 0x%02x, expected 0x%02x\n",
                f.dtype == FD_DTYPE_FP8_E4M3 ? "e4m3" : "e5m2", static_cast<double>(x),
                fd_test_f32_bits(x), got, want);
    fail();
  }
}

void test_every_code(void **state) {
  (void)state;
  for (const Format *f : {&kE4m3, &kE5m2}) {
    int nans = 0, infs = 0;
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = static_cast<uint8_t>(c);
      /* (Buffers of 4 bytes: load_as_f32 / store_from_f32 switch over every
       * element size.) */
      const uint8_t code_buf[4] = {code, 0, 0, 0};
      const double want = ocp_value(*f, code);
      const float got = decode(*f, code);
      /* The table, load_as_f32 and the OCP definition agree. */
      assert_true(fd::load_as_f32(code_buf, 0, f->dtype) == got || std::isnan(got));
      if (std::isnan(want)) {
        assert_true(std::isnan(got));
        ++nans;
        assert_int_equal(encode(*f, got), 0x7f); /* NaN stays NaN */
        continue;
      }
      assert_true(static_cast<double>(got) == want);
      assert_int_equal(std::signbit(got), (c & 0x80) != 0);
      if (std::isinf(want)) {
        ++infs;
        /* Infinity saturates: the largest finite value of its sign. */
        assert_int_equal(encode(*f, got), (c & 0x80) | f->max_code);
        continue;
      }
      assert_int_equal(encode(*f, got), c); /* round trip, -0 included */
      uint8_t stored[4] = {0, 0, 0, 0};
      fd::store_from_f32(stored, 0, f->dtype, got);
      assert_int_equal(stored[0], c);
    }
    assert_int_equal(nans, f->has_inf ? 6 : 2);
    assert_int_equal(infs, f->has_inf ? 2 : 0);
    assert_true(static_cast<double>(decode(*f, f->max_code)) == f->max_value);
  }
}

void test_every_f16_and_bf16(void **state) {
  (void)state;
  for (const Format *f : {&kE4m3, &kE5m2})
    for (uint32_t h = 0; h < 65536; ++h) {
      expect_encodes(*f, fd_test_f16_to_f32(static_cast<uint16_t>(h)));
      expect_encodes(*f, fd_test_bf16_to_f32(static_cast<uint16_t>(h)));
    }
}

/* Ties go to the even code; one FP32 ulp either side of a tie goes to the
 * nearer code. */
void test_midpoints(void **state) {
  (void)state;
  for (const Format *f : {&kE4m3, &kE5m2})
    for (int c = 0; c < f->max_code; ++c) {
      const double lo = ocp_value(*f, static_cast<uint8_t>(c)),
                   hi = ocp_value(*f, static_cast<uint8_t>(c + 1));
      const float mid = static_cast<float>((lo + hi) / 2); /* exact in FP32 */
      assert_true(static_cast<double>(mid) == (lo + hi) / 2);
      const uint8_t even = static_cast<uint8_t>((c & 1) == 0 ? c : c + 1);
      assert_int_equal(encode(*f, mid), even);
      assert_int_equal(encode(*f, -mid), 0x80 | even);
      assert_int_equal(encode(*f, std::nextafter(mid, 0.f)), c);
      assert_int_equal(encode(*f, std::nextafter(mid, INFINITY)), c + 1);
      expect_encodes(*f, mid);
    }
}

void test_saturation_nan_and_subnormals(void **state) {
  (void)state;
  /* E4M3: 448 is the largest finite value; 464 is the tie between 448 and
   * the (absent) 480, which goes to the even 448; anything beyond saturates. */
  assert_int_equal(fd::f32_to_fp8_e4m3(448.f), 0x7e);
  assert_int_equal(fd::f32_to_fp8_e4m3(464.f), 0x7e);
  assert_int_equal(fd::f32_to_fp8_e4m3(465.f), 0x7e);
  assert_int_equal(fd::f32_to_fp8_e4m3(1e30f), 0x7e);
  assert_int_equal(fd::f32_to_fp8_e4m3(INFINITY), 0x7e);
  assert_int_equal(fd::f32_to_fp8_e4m3(-INFINITY), 0xfe);
  assert_int_equal(fd::f32_to_fp8_e4m3(FLT_MAX), 0x7e);
  assert_int_equal(fd::f32_to_fp8_e4m3(NAN), 0x7f);
  assert_int_equal(fd::f32_to_fp8_e4m3(-NAN), 0x7f);
  /* E5M2: 57344 largest finite; infinity is never produced. */
  assert_int_equal(fd::f32_to_fp8_e5m2(57344.f), 0x7b);
  assert_int_equal(fd::f32_to_fp8_e5m2(61440.f), 0x7b);
  assert_int_equal(fd::f32_to_fp8_e5m2(1e30f), 0x7b);
  assert_int_equal(fd::f32_to_fp8_e5m2(INFINITY), 0x7b);
  assert_int_equal(fd::f32_to_fp8_e5m2(-INFINITY), 0xfb);
  assert_int_equal(fd::f32_to_fp8_e5m2(NAN), 0x7f);
  /* Subnormals: E4M3 units of 2^-9, E5M2 units of 2^-16. */
  assert_int_equal(fd::f32_to_fp8_e4m3(std::ldexp(1.f, -9)), 0x01);
  assert_int_equal(fd::f32_to_fp8_e4m3(std::ldexp(1.f, -10)), 0x00);     /* tie to 0 */
  assert_int_equal(fd::f32_to_fp8_e4m3(std::ldexp(1.0001f, -10)), 0x01); /* above the tie */
  assert_int_equal(fd::f32_to_fp8_e4m3(std::ldexp(3.f, -10)), 0x02);     /* 1.5 units: 2 */
  assert_int_equal(fd::f32_to_fp8_e4m3(std::ldexp(7.5f, -9)), 0x08);     /* min normal */
  assert_int_equal(fd::f32_to_fp8_e4m3(-std::ldexp(5.f, -9)), 0x85);
  assert_int_equal(fd::f32_to_fp8_e5m2(std::ldexp(1.f, -16)), 0x01);
  assert_int_equal(fd::f32_to_fp8_e5m2(std::ldexp(1.f, -17)), 0x00);
  assert_int_equal(fd::f32_to_fp8_e5m2(std::ldexp(3.f, -17)), 0x02);
  assert_int_equal(fd::f32_to_fp8_e5m2(std::ldexp(3.5f, -16)), 0x04); /* min normal */
  /* FP32 subnormals and zeros. */
  assert_int_equal(fd::f32_to_fp8_e4m3(1e-40f), 0x00);
  assert_int_equal(fd::f32_to_fp8_e4m3(-1e-40f), 0x80);
  assert_int_equal(fd::f32_to_fp8_e4m3(-0.f), 0x80);
  assert_int_equal(fd::f32_to_fp8_e5m2(0.f), 0x00);
}

void test_random_f32(void **state) {
  (void)state;
  fd_test_rng rng = {20261201};
  for (int i = 0; i < 200000; ++i) {
    /* Exponents spread over and beyond both formats' ranges. */
    const float x =
        std::ldexp(fd_test_uniform(&rng) + 0.5f, static_cast<int>(fd_test_range(&rng, -30, 20))) *
        ((fd_test_next(&rng) & 1) != 0 ? -1.f : 1.f);
    expect_encodes(kE4m3, x);
    expect_encodes(kE5m2, x);
    /* Arbitrary bit patterns (NaNs, infinities, FP32 subnormals included). */
    const float y = fd_test_bits_f32(static_cast<uint32_t>(fd_test_next(&rng)));
    expect_encodes(kE4m3, y);
    expect_encodes(kE5m2, y);
  }
}

/* convert_elements: the scale divides before rounding (saturate(x / s)),
 * strides place the outputs, equal types at scale 1 copy bytes. */
void test_convert_elements(void **state) {
  (void)state;
  const float src[6] = {1.f, -3.f, 500.f, NAN, INFINITY, 0.3f};
  uint8_t dst[12];
  memset(dst, 0xaa, sizeof dst);
  fd::convert_elements(src, FD_DTYPE_F32, dst, FD_DTYPE_FP8_E4M3, 6, 2, 0.5f);
  for (int i = 0; i < 6; ++i) {
    assert_int_equal(dst[2 * i], fd::f32_to_fp8_e4m3(src[i] / 0.5f));
    assert_int_equal(dst[2 * i + 1], 0xaa);
  }
  assert_int_equal(dst[0], 0x40); /* 2 */
  assert_int_equal(dst[4], 0x7e); /* 1000: saturated */
  assert_int_equal(dst[6], 0x7f); /* NaN */
  assert_int_equal(dst[8], 0x7e); /* inf */
  uint16_t h[3] = {0x7e01, 0x3c00, 0x8001}, out[3] = {0, 0, 0};
  fd::convert_elements(h, FD_DTYPE_F16, out, FD_DTYPE_F16, 3, 1, 1.f);
  assert_memory_equal(h, out, sizeof h); /* bytes, NaN payload included */
  const uint16_t bf[2] = {fd_test_f32_to_bf16(3.f), fd_test_f32_to_bf16(-0.0625f)};
  uint8_t e5[2];
  fd::convert_elements(bf, FD_DTYPE_BF16, e5, FD_DTYPE_FP8_E5M2, 2, 1, 2.f);
  assert_true(fd::fp8_e5m2_to_f32(e5[0]) == 1.5f);
  assert_true(fd::fp8_e5m2_to_f32(e5[1]) == -0.03125f);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_code), cmocka_unit_test(test_every_f16_and_bf16),
      cmocka_unit_test(test_midpoints),  cmocka_unit_test(test_saturation_nan_and_subnormals),
      cmocka_unit_test(test_random_f32), cmocka_unit_test(test_convert_elements),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
