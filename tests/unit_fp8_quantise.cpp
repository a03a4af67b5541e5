/* The FP8 quantisation rule of the CUDA append kernels (src/core/
 * fp8_quantise.hpp), checked on the CPU with the host E4M3 encoder in place
 * of the device's conversion instruction: fp8_quantise2 must give the codes
 * of the rounded quotient RN(v / scale) for every value, whether the bracket
 * decides (the usual case) or the exact resolution near an FP8 rounding
 * boundary does, at ordinary scales and at scales planned with a power of
 * two. The CUDA suites (gpu_append, gpu_fp8) compare the kernels' bytes with
 * the CPU backend's, which divides. */
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

struct HostCvt2 {
  uint32_t operator()(float a, float b) const {
    return fd::f32_to_fp8_e4m3(a) | (static_cast<uint32_t>(fd::f32_to_fp8_e4m3(b)) << 8);
  }
};

uint32_t by_division(float v0, float v1, float scale) {
  return fd::f32_to_fp8_e4m3(v0 / scale) |
         (static_cast<uint32_t>(fd::f32_to_fp8_e4m3(v1 / scale)) << 8);
}

/* Checks one pair; returns whether the bracket left it open (the resolution
 * step ran for at least one of the two). */
bool check_pair(float v0, float v1, float scale) {
  const fd::Fp8Quant q = fd::fp8_quant_plan(scale);
  const uint32_t got = fd::fp8_quantise2(v0, v1, q, HostCvt2{});
  const uint32_t want = by_division(v0, v1, scale);
  if (got != want)
    fail_msg("v = (%a, %a), scale %a: codes 0x%04x, dividing gives 0x%04x", static_cast<double>(v0),
             static_cast<double>(v1), static_cast<double>(scale), got, want);
  /* The bracket of the unscaled values, as the kernels run it first: when it
   * closes, its codes are the quotients' too. */
  uint32_t open = 0;
  const uint32_t fast = fd::fp8_bracket2(v0, v1, q, HostCvt2{}, open);
  if (open == 0 && fast != want)
    fail_msg("v = (%a, %a), scale %a: closed bracket gives 0x%04x, dividing 0x%04x",
             static_cast<double>(v0), static_cast<double>(v1), static_cast<double>(scale), fast,
             want);
  /* Four at a time, with the pair in either half of the word. */
  const float quad[4] = {v0, v1, v1, v0};
  const uint32_t word = fd::fp8_quantise4(quad, q, HostCvt2{});
  const uint32_t swapped = ((want & 0xffu) << 8) | (want >> 8);
  if (word != (want | (swapped << 16)))
    fail_msg("v = (%a, %a), scale %a: four at a time 0x%08x, dividing 0x%04x",
             static_cast<double>(v0), static_cast<double>(v1), static_cast<double>(scale), word,
             want);
  const float a0 = v0 * q.pre, a1 = v1 * q.pre;
  return HostCvt2{}(a0 * q.down, a1 * q.down) != HostCvt2{}(a0 * q.up, a1 * q.up);
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/* Ordinary scales, and scales past [2^-100, 2^100] (planned with a power of
 * two): subnormal, tiny, huge, the largest float. */
const float kScales[] = {1.f,    0.5f,   0.0625f, 3.f,     0.1f,   0.0173f,
                         7.31f,  1e-3f,  250.f,   1.7e-5f, 0.011f, 0.009f,
                         1e-35f, 3e-39f, 1e-45f,  7e33f,   2e38f,  3.4028234e38f};

/* Random values over the whole range the conversion distinguishes (FP8
 * subnormals, normals, past the saturation point), both signs, at several
 * scales: almost every one decided by the bracket. */
void test_random_values(void **state) {
  (void)state;
  fd_test_rng rng = {2027};
  int n = 0, open = 0;
  for (float scale : kScales)
    for (int i = 0; i < 40000; ++i) {
      const float e0 = -14.f + 24.f * fd_test_uniform(&rng);
      const float e1 = -14.f + 24.f * fd_test_uniform(&rng);
      const float v0 =
          std::ldexp(fd_test_uniform(&rng) + 0.5f, static_cast<int>(e0)) * (i % 2 ? -scale : scale);
      const float v1 = std::ldexp(fd_test_uniform(&rng) + 0.5f, static_cast<int>(e1)) * scale;
      const bool resolved = check_pair(v0, v1, scale);
      if (scale < 1e-30f || scale > 1e30f) continue;  // (values of a few bits: many ties)
      open += resolved;
      ++n;
    }
  /* The resolution is for quotients within a few ulps of a boundary. */
  assert_true(open * 1000 < n);
  print_message("unit_fp8_quantise: %d random pairs, %d resolved near a boundary\n", n, open);
}

/* Every bf16 value (the kernels' inputs before rotation) at every scale. */
void test_every_bf16(void **state) {
  (void)state;
  for (float scale : kScales)
    for (uint32_t b = 0; b < 0x10000u; b += 2) {
      const float v0 = bits_to_float(b << 16), v1 = bits_to_float((b + 1) << 16);
      check_pair(v0, v1, scale);
    }
}

/* Values whose quotient lies within 12 FP32 ulps of an FP8 rounding boundary
 * (the midpoint between two neighbouring codes, including the subnormal ones),
 * and values v = q * scale rounded either way: the cases the bracket leaves
 * open (exact midpoints among them), and neighbours it need not. */
void test_near_boundaries(void **state) {
  (void)state;
  int n = 0, open = 0;
  for (float scale : kScales)
    for (uint32_t code = 0; code < 0x7e; ++code) {
      const double lo = fd::fp8_e4m3_to_f32(static_cast<uint8_t>(code));
      const double hi = fd::fp8_e4m3_to_f32(static_cast<uint8_t>(code + 1));
      const float mid = static_cast<float>((lo + hi) / 2);  // exact: a short binary fraction
      uint32_t u;
      std::memcpy(&u, &mid, sizeof u);
      for (int k = -12; k <= 12; ++k) {
        const float q = bits_to_float(u + static_cast<uint32_t>(k));
        /* v with v / scale within an ulp or two of q, and its neighbours. */
        const float v = q * scale;
        uint32_t vb;
        std::memcpy(&vb, &v, sizeof vb);
        for (int j = -2; j <= 2; ++j) {
          const float w = bits_to_float(vb + static_cast<uint32_t>(j));
          open += check_pair(w, -w, scale);
          ++n;
        }
      }
    }
  /* Some of these must have been left open by the bracket (at scale 1,
   * k = 0 is an exact midpoint) and most must not. */
  assert_true(open > 0);
  assert_true(open < n);
  print_message("unit_fp8_quantise: %d near-boundary pairs, %d resolved\n", n, open);
}

/* The resolution alone, at scale 1 where the quotient is v itself: exact
 * midpoints round to the even code, an FP32 ulp either side to the nearer
 * code; 2^-10 (between 0 and the smallest subnormal) and its lower neighbour,
 * whose ulp is half. */
void test_resolution(void **state) {
  (void)state;
  const fd::Fp8Quant one = fd::fp8_quant_plan(1.f);
  const float up = 1.f + 0x1p-23f, down = 1.f - 0x1p-24f;
  /* 1.0625: between 1 (0x38) and 1.125 (0x39); ties to 0x38. */
  assert_int_equal(fd::fp8_quantise2(1.0625f, -1.0625f, one, HostCvt2{}), 0xb838);
  assert_int_equal(fd::fp8_quantise2(1.0625f * up, 1.0625f * down, one, HostCvt2{}), 0x3839);
  /* 1.1875: between 1.125 (0x39) and 1.25 (0x3a); ties to 0x3a. */
  assert_int_equal(fd::fp8_quantise2(1.1875f, 1.1875f * down, one, HostCvt2{}), 0x393a);
  /* 2^-10: ties to 0; just above: the smallest subnormal, 0x01. */
  assert_int_equal(fd::fp8_quantise2(0x1p-10f, 0x1p-10f * up, one, HostCvt2{}), 0x0100);
  assert_int_equal(fd::fp8_quantise2(-0x1p-10f, 0x1p-10f * down, one, HostCvt2{}), 0x0080);
  /* 432: between 416 (0x7d) and 448 (0x7e); ties to 0x7e. */
  assert_int_equal(fd::fp8_quantise2(432.f, 432.f * down, one, HostCvt2{}), 0x7d7e);
  /* Quotients an FP32 ulp or two from the midpoint 1.0625 at scales that
   * are not powers of two. */
  for (float scale : {3.f, 5.f, 7.f, 0.3f, 1.1f})
    for (int j = -3; j <= 3; ++j) {
      const float v = (1.0625f + static_cast<float>(j) * 0x1p-24f) * scale;
      check_pair(v, -v, scale);
    }
  /* The magnitude decoder agrees with the host table. */
  for (uint32_t c = 0; c <= 0x7e; ++c)
    assert_true(fd::fp8_e4m3_magnitude(c) == fd::fp8_e4m3_to_f32(static_cast<uint8_t>(c)));
}

/* NaN, infinities, zeros, the largest floats, at ordinary and planned scales;
 * the plans themselves. */
void test_special_values(void **state) {
  (void)state;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float values[] = {0.f,  -0.f,  inf,   -inf,  nan,   -nan,   big,   -big,
                          tiny, -tiny, 448.f, 464.f, 480.f, 1e-30f, -1e30f};
  for (float scale : {1.f, 0.01f, 3e-39f, 2e-39f, 1e-45f, 2e38f, big})
    for (float a : values)
      for (float b : values) check_pair(a, b, scale);
  /* In range: no pre-scaling; scale 0.25: 4 (1 -+ 2^-21), exactly. */
  const fd::Fp8Quant quarter = fd::fp8_quant_plan(0.25f);
  assert_true(quarter.pre == 1.f && quarter.scale == 0.25f);
  assert_true(quarter.down == 4.f - 0x1p-19f && quarter.up == 4.f + 0x1p-19f);
  /* Past the range: a power of two brings the scale in, with a bracket. */
  const fd::Fp8Quant small = fd::fp8_quant_plan(1e-45f), large = fd::fp8_quant_plan(big);
  assert_true(small.pre == 0x1p64f && small.scale == 1e-45f * 0x1p64f && small.down > 0.f);
  assert_true(large.pre == 0x1p-64f && large.scale == big * 0x1p-64f && large.down > 0.f);
  /* The unscaled bracket: pre * down, pre * up where those are normal; open
   * for every nonzero value of a subnormal scale. */
  assert_true(quarter.down_v == quarter.down && quarter.up_v == quarter.up);
  assert_true(fd::fp8_quant_plan(1e-35f).down_v == fd::fp8_quant_plan(1e-35f).down * 0x1p64f);
  assert_true(small.down_v == 0.f && std::isinf(small.up_v));
  uint32_t open = 0;
  (void)fd::fp8_bracket2(1e-44f, 0.f, small, HostCvt2{}, open);
  assert_true(open != 0);
  /* Refused scales plan nothing. */
  assert_true(fd::fp8_quant_plan(0.f).down == 0.f);
  assert_true(fd::fp8_quant_plan(-1.f).down == 0.f);
  assert_true(fd::fp8_quant_plan(inf).down == 0.f);
  assert_true(fd::fp8_quant_plan(nan).down == 0.f);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_values),   cmocka_unit_test(test_every_bf16),
      cmocka_unit_test(test_near_boundaries), cmocka_unit_test(test_resolution),
      cmocka_unit_test(test_special_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
