/* The FP8 quantisation rule of the CUDA append kernels (src/core/
 * fp8_quantise.hpp), checked on the CPU with the host E4M3 encoder in place
 * of the device's conversion instruction: fp8_quantise2 must give the codes
 * of the rounded quotient RN(v / scale) for every value, whether it takes the
 * multiply (the usual case) or falls back to dividing (quotients near an FP8
 * rounding boundary, scales whose reciprocal is not a normal float). The
 * CUDA suites (gpu_append, gpu_fp8) compare the kernels' bytes with the CPU
 * backend's, which divides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.hpp"
#include "core/fp8_quantise.hpp"
#include "fd_test.h"

namespace {

/* Counts its calls: two when the multiply decided, three after a fallback. */
struct HostCvt2 {
  int *calls;
  uint32_t operator()(float a, float b) const {
    ++*calls;
    return fd::f32_to_fp8_e4m3(a) | (static_cast<uint32_t>(fd::f32_to_fp8_e4m3(b)) << 8);
  }
};

uint32_t by_division(float v0, float v1, float scale) {
  return fd::f32_to_fp8_e4m3(v0 / scale) |
         (static_cast<uint32_t>(fd::f32_to_fp8_e4m3(v1 / scale)) << 8);
}

/* Checks one pair; returns whether the fallback (a third conversion) ran. */
bool check_pair(float v0, float v1, float scale) {
  int calls = 0;
  const uint32_t got =
      fd::fp8_quantise2(v0, v1, scale, fd::fp8_quantise_bracket(scale), HostCvt2{&calls});
  const uint32_t want = by_division(v0, v1, scale);
  if (got != want)
    fail_msg("v = (%a, %a), scale %a: codes 0x%04x, dividing gives 0x%04x", static_cast<double>(v0),
             static_cast<double>(v1), static_cast<double>(scale), got, want);
  return calls > 2;
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

const float kScales[] = {1.f, 0.5f, 0.0625f, 3.f, 0.1f, 0.0173f, 7.31f, 1e-3f, 250.f, 1.7e-5f};

/* Random values over the whole range the conversion distinguishes (FP8
 * subnormals, normals, past the saturation point), both signs, at several
 * scales: almost every one decided by the multiply. */
void test_random_values(void **state) {
  (void)state;
  fd_test_rng rng = {2027};
  int n = 0, fallbacks = 0;
  for (float scale : kScales)
    for (int i = 0; i < 40000; ++i) {
      const float e0 = -14.f + 24.f * fd_test_uniform(&rng);
      const float e1 = -14.f + 24.f * fd_test_uniform(&rng);
      const float v0 =
          std::ldexp(fd_test_uniform(&rng) + 0.5f, static_cast<int>(e0)) * (i % 2 ? -scale : scale);
      const float v1 = std::ldexp(fd_test_uniform(&rng) + 0.5f, static_cast<int>(e1)) * scale;
      fallbacks += check_pair(v0, v1, scale);
      ++n;
    }
  /* The fallback is for quotients within a few ulps of a boundary. */
  assert_true(fallbacks * 1000 < n);
  print_message("unit_fp8_quantise: %d random pairs, %d fell back to dividing\n", n, fallbacks);
}

/* Values whose quotient lies within 12 FP32 ulps of an FP8 rounding boundary
 * (the midpoint between two neighbouring codes, including the subnormal ones
 * and 464, the first value past 448): the cases the bracket must send to the
 * division, and their neighbours that it need not. */
void test_near_boundaries(void **state) {
  (void)state;
  int n = 0, fallbacks = 0;
  for (float scale : kScales)
    for (uint32_t code = 0; code < 0x7e; ++code) {
      const double lo = fd::fp8_e4m3_to_f32(static_cast<uint8_t>(code));
      const double hi = code == 0x7e - 1 ? 464.0 * 2 - 448.0 : fd::fp8_e4m3_to_f32(code + 1);
      const float mid = static_cast<float>((lo + hi) / 2);  // exact: a short binary fraction
      uint32_t u;
      std::memcpy(&u, &mid, sizeof u);
      for (int k = -12; k <= 12; ++k) {
        const float q = bits_to_float(u + static_cast<uint32_t>(k));
        /* v with v / scale within an ulp or two of q. */
        const float v = q * scale;
        fallbacks += check_pair(v, -v, scale);
        ++n;
      }
    }
  /* Some of these must have taken the division (at scale 1, k = 0 is an
   * exact midpoint) and most must not. */
  assert_true(fallbacks > 0);
  assert_true(fallbacks < n);
  print_message("unit_fp8_quantise: %d near-boundary pairs, %d fell back to dividing\n", n,
                fallbacks);
}

/* NaN, infinities, zeros, the largest floats; scales whose reciprocal is not
 * a normal float (subnormal or huge scales) always divide. */
void test_special_values(void **state) {
  (void)state;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float values[] = {0.f,  -0.f, inf,   -inf,  nan,   -nan, big,
                          -big, tiny, -tiny, 448.f, 464.f, 480.f};
  for (float scale : {1.f, 0.01f, 3e-39f, 2e-39f, 1e-45f, 2e38f, big})
    for (float a : values)
      for (float b : values) check_pair(a, b, scale);
  assert_true(fd::fp8_quantise_bracket(1e-45f).down == 0.f); /* 1 / scale overflows */
  assert_true(fd::fp8_quantise_bracket(2e-39f).down == 0.f); /* 1 / scale > FLT_MAX */
  assert_true(fd::fp8_quantise_bracket(3e-39f).down >
              0.f); /* a subnormal scale, normal 1 / scale */
  assert_true(fd::fp8_quantise_bracket(2e38f).down == 0.f); /* 1 / scale subnormal */
  /* 1 / scale normal, but its upper factor past FLT_MAX or its lower one
   * below FLT_MIN: no bracket either. */
  assert_true(fd::fp8_quantise_bracket(1.f / std::numeric_limits<float>::max()).down == 0.f);
  assert_true(fd::fp8_quantise_bracket(0x1p126f).down == 0.f);
  /* Scale 0.25: 4 (1 -+ 2^-21), exactly. */
  const fd::Fp8Bracket quarter = fd::fp8_quantise_bracket(0.25f);
  assert_true(quarter.down == 4.f - 0x1p-19f && quarter.up == 4.f + 0x1p-19f);
  /* A fallback scale gives the quotient's codes too. */
  int calls = 0;
  assert_int_equal(fd::fp8_quantise2(1e-40f, 2e-40f, 1e-45f, fd::Fp8Bracket{}, HostCvt2{&calls}),
                   by_division(1e-40f, 2e-40f, 1e-45f));
  assert_int_equal(calls, 1);
}

/* The multiply step alone: `sure` is and-ed (a false flag stays false, so
 * one flag collects a run), false without a bracket, and when it stays true
 * the codes are the quotient's. */
void test_multiply_step(void **state) {
  (void)state;
  int calls = 0;
  bool sure = true;
  const fd::Fp8Bracket one = fd::fp8_quantise_bracket(1.f);
  const uint32_t c = fd::fp8_quantise2_multiply(3.f, -0.5f, one, HostCvt2{&calls}, sure);
  assert_true(sure);
  assert_int_equal(c, by_division(3.f, -0.5f, 1.f));
  sure = false;
  (void)fd::fp8_quantise2_multiply(3.f, -0.5f, one, HostCvt2{&calls}, sure);
  assert_false(sure);
  sure = true;
  (void)fd::fp8_quantise2_multiply(3.f, -0.5f, fd::Fp8Bracket{}, HostCvt2{&calls}, sure);
  assert_false(sure);
  /* An exact midpoint between two codes (1.0625 lies between 1 and 1.125):
   * the bracket cannot decide it. */
  sure = true;
  (void)fd::fp8_quantise2_multiply(1.0625f, 1.f, one, HostCvt2{&calls}, sure);
  assert_false(sure);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_values),
      cmocka_unit_test(test_near_boundaries),
      cmocka_unit_test(test_special_values),
      cmocka_unit_test(test_multiply_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
