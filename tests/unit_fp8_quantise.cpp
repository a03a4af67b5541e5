/* The FP8 quantisation rule of the CUDA append kernels (src/core/
 * fp8_quantise.hpp), checked on the CPU for both formats, E4M3 and E5M2, with
 * the host encoder of the format in place of the device's conversion
 * instruction: fp8_quantise2 must give the codes of the rounded quotient
 * RN(v / scale) for every value, whether the bracket decides (the usual case)
 * or the exact resolution near an FP8 rounding boundary does, at ordinary
 * scales and at scales planned with a power of two. The CUDA suites
 * (gpu_append, gpu_fp8) compare the kernels' bytes with the CPU backend's,
 * which divides. */
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

/* A format under test: the quantiser's format argument, the host encoder
 * and decoder (the reference), the largest finite code, and the exponents
 * of the values that span its codes (subnormals to past the saturation
 * point) for the random test. */
struct E4m3 {
  using Fmt = fd::Fp8E4m3;
  static constexpr const char *kName = "E4M3";
  static constexpr uint32_t kMaxCode = 0x7e;
  static constexpr float kMinExp = -14.f, kMaxExp = 10.f;
  static uint8_t encode(float x) { return fd::f32_to_fp8_e4m3(x); }
  static float decode(uint32_t c) { return fd::fp8_e4m3_to_f32(static_cast<uint8_t>(c)); }
};
struct E5m2 {
  using Fmt = fd::Fp8E5m2;
  static constexpr const char *kName = "E5M2";
  static constexpr uint32_t kMaxCode = 0x7b;
  static constexpr float kMinExp = -21.f, kMaxExp = 18.f;
  static uint8_t encode(float x) { return fd::f32_to_fp8_e5m2(x); }
  static float decode(uint32_t c) { return fd::fp8_e5m2_to_f32(static_cast<uint8_t>(c)); }
};

template <class F>
struct HostCvt2 {
  uint32_t operator()(float a, float b) const {
    return F::encode(a) | (static_cast<uint32_t>(F::encode(b)) << 8);
  }
};

template <class F>
uint32_t by_division(float v0, float v1, float scale) {
  return F::encode(v0 / scale) | (static_cast<uint32_t>(F::encode(v1 / scale)) << 8);
}

/* Checks one pair; returns whether the bracket left it open (the resolution
 * step ran for at least one of the two). */
template <class F>
bool check_pair(float v0, float v1, float scale) {
  using Fmt = typename F::Fmt;
  const fd::Fp8Quant q = fd::fp8_quant_plan(scale);
  const uint32_t got = fd::fp8_quantise2<Fmt>(v0, v1, q, HostCvt2<F>{});
  const uint32_t want = by_division<F>(v0, v1, scale);
  if (got != want)
    fail_msg("%s: v = (%a, %a), scale %a: codes 0x%04x, dividing gives 0x%04x", F::kName,
             static_cast<double>(v0), static_cast<double>(v1), static_cast<double>(scale), got,
             want);
  /* The bracket of the unscaled values, as the kernels run it first: when it
   * closes, its codes are the quotients' too. */
  uint32_t open = 0;
  const uint32_t fast = fd::fp8_bracket2(v0, v1, q, HostCvt2<F>{}, open);
  if (open == 0 && fast != want)
    fail_msg("%s: v = (%a, %a), scale %a: closed bracket gives 0x%04x, dividing 0x%04x", F::kName,
             static_cast<double>(v0), static_cast<double>(v1), static_cast<double>(scale), fast,
             want);
  /* Four at a time, with the pair in either half of the word. */
  const float quad[4] = {v0, v1, v1, v0};
  const uint32_t word = fd::fp8_quantise4<Fmt>(quad, q, HostCvt2<F>{});
  const uint32_t swapped = ((want & 0xffu) << 8) | (want >> 8);
  if (word != (want | (swapped << 16)))
    fail_msg("%s: v = (%a, %a), scale %a: four at a time 0x%08x, dividing 0x%04x", F::kName,
             static_cast<double>(v0), static_cast<double>(v1), static_cast<double>(scale), word,
             want);
  const float a0 = v0 * q.pre, a1 = v1 * q.pre;
  return HostCvt2<F>{}(a0 * q.down, a1 * q.down) != HostCvt2<F>{}(a0 * q.up, a1 * q.up);
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
template <class F>
void random_values(fd_test_rng *rng) {
  int n = 0, open = 0;
  const float span = F::kMaxExp - F::kMinExp;
  for (float scale : kScales)
    for (int i = 0; i < 40000; ++i) {
      const float e0 = F::kMinExp + span * fd_test_uniform(rng);
      const float e1 = F::kMinExp + span * fd_test_uniform(rng);
      const float v0 =
          std::ldexp(fd_test_uniform(rng) + 0.5f, static_cast<int>(e0)) * (i % 2 ? -scale : scale);
      const float v1 = std::ldexp(fd_test_uniform(rng) + 0.5f, static_cast<int>(e1)) * scale;
      const bool resolved = check_pair<F>(v0, v1, scale);
      if (scale < 1e-30f || scale > 1e30f) continue;  // (values of a few bits: many ties)
      open += resolved;
      ++n;
    }
  /* The resolution is for quotients within a few ulps of a boundary. */
  assert_true(open * 1000 < n);
  print_message("unit_fp8_quantise: %s: %d random pairs matched, %d resolved near a boundary\n",
                F::kName, n, open);
}

void test_random_values(void **state) {
  (void)state;
  fd_test_rng rng = {2027};
  random_values<E4m3>(&rng);
  random_values<E5m2>(&rng);
}

/* Every bf16 value (the kernels' inputs before rotation) at every scale. */
template <class F>
void every_bf16() {
  int n = 0;
  for (float scale : kScales)
    for (uint32_t b = 0; b < 0x10000u; b += 2) {
      const float v0 = bits_to_float(b << 16), v1 = bits_to_float((b + 1) << 16);
      check_pair<F>(v0, v1, scale);
      n += 2;
    }
  print_message("unit_fp8_quantise: %s: every bf16 value at %zu scales (%d values) matched\n",
                F::kName, sizeof kScales / sizeof kScales[0], n);
}

void test_every_bf16(void **state) {
  (void)state;
  every_bf16<E4m3>();
  every_bf16<E5m2>();
}

/* Values whose quotient lies within 12 FP32 ulps of an FP8 rounding boundary
 * (the midpoint between two neighbouring codes, including the subnormal ones),
 * and values v = q * scale rounded either way: the cases the bracket leaves
 * open (exact midpoints among them), and neighbours it need not. */
template <class F>
void near_boundaries() {
  int n = 0, open = 0;
  for (float scale : kScales)
    for (uint32_t code = 0; code < F::kMaxCode; ++code) {
      const double lo = F::decode(code);
      const double hi = F::decode(code + 1);
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
          open += check_pair<F>(w, -w, scale);
          ++n;
        }
      }
    }
  /* Some of these must have been left open by the bracket (at scale 1,
   * k = 0 is an exact midpoint) and most must not. */
  assert_true(open > 0);
  assert_true(open < n);
  print_message("unit_fp8_quantise: %s: %d near-boundary pairs matched, %d resolved\n", F::kName, n,
                open);
}

void test_near_boundaries(void **state) {
  (void)state;
  near_boundaries<E4m3>();
  near_boundaries<E5m2>();
}

/* The resolution alone, at scale 1 where the quotient is v itself: exact
 * midpoints round to the even code, an FP32 ulp either side to the nearer
 * code; 2^-10 (between 0 and the smallest subnormal) and its lower neighbour,
 * whose ulp is half. */
void test_resolution(void **state) {
  (void)state;
  using Fmt = fd::Fp8E4m3;
  using Cvt = HostCvt2<E4m3>;
  const fd::Fp8Quant one = fd::fp8_quant_plan(1.f);
  const float up = 1.f + 0x1p-23f, down = 1.f - 0x1p-24f;
  /* 1.0625: between 1 (0x38) and 1.125 (0x39); ties to 0x38. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(1.0625f, -1.0625f, one, Cvt{}), 0xb838);
  assert_int_equal(fd::fp8_quantise2<Fmt>(1.0625f * up, 1.0625f * down, one, Cvt{}), 0x3839);
  /* 1.1875: between 1.125 (0x39) and 1.25 (0x3a); ties to 0x3a. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(1.1875f, 1.1875f * down, one, Cvt{}), 0x393a);
  /* 2^-10: ties to 0; just above: the smallest subnormal, 0x01. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(0x1p-10f, 0x1p-10f * up, one, Cvt{}), 0x0100);
  assert_int_equal(fd::fp8_quantise2<Fmt>(-0x1p-10f, 0x1p-10f * down, one, Cvt{}), 0x0080);
  /* 432: between 416 (0x7d) and 448 (0x7e); ties to 0x7e. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(432.f, 432.f * down, one, Cvt{}), 0x7d7e);
  /* Quotients an FP32 ulp or two from the midpoint 1.0625 at scales that
   * are not powers of two. */
  for (float scale : {3.f, 5.f, 7.f, 0.3f, 1.1f})
    for (int j = -3; j <= 3; ++j) {
      const float v = (1.0625f + static_cast<float>(j) * 0x1p-24f) * scale;
      check_pair<E4m3>(v, -v, scale);
    }
  /* The magnitude decoder agrees with the host table. */
  for (uint32_t c = 0; c <= 0x7e; ++c)
    assert_true(fd::fp8_e4m3_magnitude(c) == fd::fp8_e4m3_to_f32(static_cast<uint8_t>(c)));
}

/* The same for E5M2 (2 mantissa bits, subnormals of 2^-16, largest finite
 * 57344): ties to the even code inside a binade, across a binade boundary,
 * between the largest two codes and at 2^-17 (between 0 and the smallest
 * subnormal, the only midpoint that is a power of two), and an FP32 ulp
 * either side of each. */
void test_resolution_e5m2(void **state) {
  (void)state;
  using Fmt = fd::Fp8E5m2;
  using Cvt = HostCvt2<E5m2>;
  const fd::Fp8Quant one = fd::fp8_quant_plan(1.f);
  const float up = 1.f + 0x1p-23f, down = 1.f - 0x1p-24f;
  /* 1.125: between 1 (0x3c) and 1.25 (0x3d); ties to 0x3c. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(1.125f, -1.125f, one, Cvt{}), 0xbc3c);
  assert_int_equal(fd::fp8_quantise2<Fmt>(1.125f * up, 1.125f * down, one, Cvt{}), 0x3c3d);
  /* 1.375: between 1.25 (0x3d) and 1.5 (0x3e); ties to 0x3e. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(1.375f, 1.375f * down, one, Cvt{}), 0x3d3e);
  /* 1.875: between 1.75 (0x3f) and 2 (0x40), across the binade; ties to 0x40. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(1.875f, 1.875f * down, one, Cvt{}), 0x3f40);
  /* 2^-17: ties to 0; just above: the smallest subnormal, 0x01. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(0x1p-17f, 0x1p-17f * up, one, Cvt{}), 0x0100);
  assert_int_equal(fd::fp8_quantise2<Fmt>(-0x1p-17f, 0x1p-17f * down, one, Cvt{}), 0x0080);
  /* 3 x 2^-17: between the subnormals 0x01 and 0x02; ties to 0x02. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(0x3p-17f, 0x3p-17f * down, one, Cvt{}), 0x0102);
  /* 7 x 2^-17: between the largest subnormal (0x03) and the smallest
   * normal, 2^-14 (0x04); ties to 0x04. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(0x7p-17f, -0x7p-17f * down, one, Cvt{}), 0x8304);
  /* 53248: between 49152 (0x7a) and 57344 (0x7b); ties to 0x7a. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(53248.f, 53248.f * up, one, Cvt{}), 0x7b7a);
  /* Past 57344 (61440 would round to infinity): the largest finite code. */
  assert_int_equal(fd::fp8_quantise2<Fmt>(61440.f, -61440.f * down, one, Cvt{}), 0xfb7b);
  for (float scale : {3.f, 5.f, 7.f, 0.3f, 1.1f, 1e-30f, 1e30f})
    for (int j = -3; j <= 3; ++j) {
      const float v = (1.125f + static_cast<float>(j) * 0x1p-24f) * scale;
      check_pair<E5m2>(v, -v, scale);
      const float w = (0x1p-17f + static_cast<float>(j) * 0x1p-41f) * scale;
      check_pair<E5m2>(w, -w, scale);
    }
  /* The magnitude decoder agrees with the host table. */
  for (uint32_t c = 0; c <= 0x7b; ++c)
    assert_true(fd::fp8_e5m2_magnitude(c) == fd::fp8_e5m2_to_f32(static_cast<uint8_t>(c)));
}

/* NaN, infinities, zeros, the largest floats, values around each format's
 * saturation point and its subnormals, at ordinary and planned scales; the
 * plans themselves. */
void test_special_values(void **state) {
  (void)state;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float values[] = {0.f,      -0.f,     inf,      -inf,       nan,       -nan,
                          big,      -big,     tiny,     -tiny,      448.f,     464.f,
                          480.f,    1e-30f,   -1e30f,   57344.f,    -61440.f,  61439.996f,
                          65536.f,  53248.f,  -1e5f,    0x1p-16f,   -0x1p-17f, 0x3p-17f,
                          0x7p-17f, 0x1p-14f, 0x1p-24f, -0x1.8p-16f};
  int n = 0;
  for (float scale : {1.f, 0.01f, 3e-39f, 2e-39f, 1e-45f, 2e38f, big, 0.5f, 4096.f})
    for (float a : values)
      for (float b : values) {
        check_pair<E4m3>(a, b, scale);
        check_pair<E5m2>(a, b, scale);
        ++n;
      }
  /* Infinities and values past the largest finite value saturate; NaN stays
   * NaN (the kernels then store 0x7f); zeros keep their sign. */
  const fd::Fp8Quant one = fd::fp8_quant_plan(1.f);
  assert_int_equal(fd::fp8_quantise2<fd::Fp8E5m2>(inf, -inf, one, HostCvt2<E5m2>{}), 0xfb7b);
  assert_int_equal(fd::fp8_quantise2<fd::Fp8E5m2>(1e5f, -0.f, one, HostCvt2<E5m2>{}), 0x807b);
  assert_int_equal(fd::fp8_quantise2<fd::Fp8E5m2>(nan, 0.f, one, HostCvt2<E5m2>{}), 0x007f);
  assert_int_equal(fd::fp8_quantise2<fd::Fp8E4m3>(inf, -inf, one, HostCvt2<E4m3>{}), 0xfe7e);
  print_message("unit_fp8_quantise: special values: %d pairs matched in each format\n", n);
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
  (void)fd::fp8_bracket2(1e-44f, 0.f, small, HostCvt2<E4m3>{}, open);
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
      cmocka_unit_test(test_resolution_e5m2), cmocka_unit_test(test_special_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
