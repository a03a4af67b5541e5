/* fd_rope_apply and fd_rope_apply_style (S3.1: split-half and interleaved
 * pairs, full and partial rotary_dim, f32/f16/bf16) against an independent
 * double computation of the formula, a hand-worked example of each style,
 * fd_rope_apply == fd_rope_apply_style(split-half) bit for bit, and every
 * error path of both. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fd_test.h"

namespace {

struct Rope {
  int32_t dtype;
  uint32_t tokens, heads, dim, rotary;
  float base;
  std::vector<int32_t> positions;
  std::vector<uint8_t> x;
  int32_t style;
};

Rope make_rope(uint64_t seed, int32_t dtype, uint32_t tokens, uint32_t heads, uint32_t dim,
               uint32_t rotary, float base, int32_t max_pos, int32_t style = FD_ROPE_SPLIT_HALF) {
  fd_test_rng rng = {seed};
  Rope r{dtype, tokens, heads, dim, rotary, base, {}, {}, style};
  for (uint32_t t = 0; t < tokens; ++t)
    r.positions.push_back(t == 0 ? max_pos : (int32_t)fd_test_range(&rng, 0, max_pos));
  const size_t n = (size_t)tokens * heads * dim;
  r.x.resize(n * fd_test_dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) fd_test_store(r.x.data(), i, dtype, 2.f * fd_test_normal(&rng));
  return r;
}

fd_status apply(Rope &r) {
  return fd_rope_apply_style(r.dtype, r.x.data(), r.tokens, r.heads, r.dim, r.positions.data(),
                             r.rotary, r.base, r.style);
}

/* Rotates `in` by the S3.1 formula in double and checks `out` element by element.
 * Pair i is (i, i + R/2) split-half and (2i, 2i + 1) interleaved.
 * The library computes the angle in FP32, so its error grows with the angle:
 * the bound allows a few FP32 ulps of the angle plus the output rounding. */
void check_rotation(const Rope &in, const Rope &out) {
  const double ulp = in.dtype == FD_DTYPE_F32   ? 0x1p-24
                     : in.dtype == FD_DTYPE_F16 ? 0x1p-11
                                                : 0x1p-8;
  const uint32_t half = in.rotary / 2;
  for (uint32_t t = 0; t < in.tokens; ++t)
    for (uint32_t h = 0; h < in.heads; ++h) {
      const size_t row = ((size_t)t * in.heads + h) * in.dim;
      for (uint32_t i = 0; i < half; ++i) {
        const double inv_freq = std::pow((double)in.base, -2.0 * i / in.rotary);
        const double angle = in.positions[t] * inv_freq;
        const size_t d1 = in.style == FD_ROPE_INTERLEAVED ? 2 * (size_t)i : i;
        const size_t d2 = in.style == FD_ROPE_INTERLEAVED ? d1 + 1 : half + (size_t)i;
        const double x1 = fd_test_load(in.x.data(), row + d1, in.dtype);
        const double x2 = fd_test_load(in.x.data(), row + d2, in.dtype);
        const double want1 = x1 * std::cos(angle) - x2 * std::sin(angle);
        const double want2 = x2 * std::cos(angle) + x1 * std::sin(angle);
        const double got1 = fd_test_load(out.x.data(), row + d1, in.dtype);
        const double got2 = fd_test_load(out.x.data(), row + d2, in.dtype);
        const double mag = std::fabs(x1) + std::fabs(x2);
        const double angle_err = mag * (8.0 * 0x1p-24 * (std::fabs(angle) + 1.0));
        const double tol1 = 2 * ulp * std::fabs(want1) + angle_err + 1e-30;
        const double tol2 = 2 * ulp * std::fabs(want2) + angle_err + 1e-30;
        if (!(std::fabs(got1 - want1) <= tol1) || !(std::fabs(got2 - want2) <= tol2)) {
          print_error(
              "style %d dtype %d token %u head %u i %u pos %d: got (%g, %g), want (%g, %g)\n",
              in.style, in.dtype, t, h, i, in.positions[t], got1, got2, want1, want2);
          fail();
        }
      }
      /* Dims past rotary_dim are bit-for-bit unchanged. */
      const size_t es = fd_test_dtype_size(in.dtype);
      assert_memory_equal(&out.x[(row + in.rotary) * es], &in.x[(row + in.rotary) * es],
                          (in.dim - in.rotary) * es);
    }
}

void test_matches_double(void **state) {
  (void)state;
  const struct {
    uint32_t tokens, heads, dim, rotary;
    float base;
    int32_t max_pos;
  } shapes[] = {{5, 4, 128, 128, 10000.f, 4096},
                {3, 2, 64, 32, 10000.f, 100},
                {4, 3, 40, 40, 500000.f, 131072},
                {2, 1, 6, 2, 10.f, 7},
                {7, 8, 80, 64, 1.5f, 1000},
                /* Around the size where the tables move from the stack to the heap. */
                {2, 2, 256, 256, 10000.f, 4096},
                {2, 2, 272, 258, 10000.f, 4096},
                {3, 1, 512, 512, 10000.f, 65536}};
  const int32_t dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  uint64_t seed = 11;
  /* Both styles over every shape: full (rotary == dim) and partial rotary. */
  for (int32_t style : {FD_ROPE_SPLIT_HALF, FD_ROPE_INTERLEAVED})
    for (const auto &s : shapes)
      for (int32_t dtype : dtypes) {
        const Rope in =
            make_rope(seed++, dtype, s.tokens, s.heads, s.dim, s.rotary, s.base, s.max_pos, style);
        Rope out = in;
        FD_ASSERT_OK(apply(out));
        check_rotation(in, out);
        /* The rotation really moved something (the test could otherwise pass vacuously). */
        assert_true(memcmp(in.x.data(), out.x.data(), in.x.size()) != 0);
      }
}

/* One head by hand: x = (1, 0, 1, 0, 5, 7), R = 4, position 1, base 100,
 * so inv_freq = (1, 0.1). Interleaved pairs (x0, x1) = (1, 0) at angle 1 and
 * (x2, x3) = (1, 0) at 0.1: (cos 1, sin 1, cos 0.1, sin 0.1). Split-half pairs
 * (x0, x2) = (1, 1) at angle 1 and (x1, x3) = (0, 0) at 0.1: (cos 1 - sin 1,
 * 0, cos 1 + sin 1, 0). Dims 4 and 5 stay as they are in both. */
void test_worked_example(void **state) {
  (void)state;
  const float c1 = std::cos(1.0f), s1 = std::sin(1.0f), c01 = std::cos(0.1f), s01 = std::sin(0.1f);
  const struct {
    int32_t style;
    float want[6];
  } cases[] = {{FD_ROPE_INTERLEAVED, {c1, s1, c01, s01, 5.f, 7.f}},
               {FD_ROPE_SPLIT_HALF, {c1 - s1, 0.f, c1 + s1, 0.f, 5.f, 7.f}}};
  for (const auto &c : cases) {
    float x[6] = {1.f, 0.f, 1.f, 0.f, 5.f, 7.f};
    const int32_t pos = 1;
    FD_ASSERT_OK(fd_rope_apply_style(FD_DTYPE_F32, x, 1, 1, 6, &pos, 4, 100.f, c.style));
    for (int d = 0; d < 6; ++d)
      if (!(std::fabs(x[d] - c.want[d]) <= 1e-6f)) {
        print_error("style %d dim %d: got %.9g, want %.9g\n", c.style, d, (double)x[d],
                    (double)c.want[d]);
        fail();
      }
  }
}

/* fd_rope_apply is fd_rope_apply_style with FD_ROPE_SPLIT_HALF, bit for bit;
 * the interleaved style gives other bits. */
void test_split_half_is_rope_apply(void **state) {
  (void)state;
  const int32_t dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  const uint32_t shapes[][4] = {{5, 4, 128, 128}, {3, 2, 64, 24}, {2, 3, 272, 258}};
  uint64_t seed = 100;
  for (const auto &s : shapes)
    for (int32_t dtype : dtypes) {
      const Rope in = make_rope(seed++, dtype, s[0], s[1], s[2], s[3], 10000.f, 9000);
      Rope plain = in, split = in, inter = in;
      FD_ASSERT_OK(fd_rope_apply(dtype, plain.x.data(), in.tokens, in.heads, in.dim,
                                 in.positions.data(), in.rotary, in.base));
      FD_ASSERT_OK(fd_rope_apply_style(dtype, split.x.data(), in.tokens, in.heads, in.dim,
                                       in.positions.data(), in.rotary, in.base,
                                       FD_ROPE_SPLIT_HALF));
      FD_ASSERT_OK(fd_rope_apply_style(dtype, inter.x.data(), in.tokens, in.heads, in.dim,
                                       in.positions.data(), in.rotary, in.base,
                                       FD_ROPE_INTERLEAVED));
      assert_memory_equal(plain.x.data(), split.x.data(), in.x.size());
      assert_true(memcmp(plain.x.data(), inter.x.data(), in.x.size()) != 0);
    }
}

void test_position_zero_is_identity(void **state) {
  (void)state;
  const int32_t dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  for (int32_t style : {FD_ROPE_SPLIT_HALF, FD_ROPE_INTERLEAVED})
    for (int32_t dtype : dtypes) {
      const Rope in = make_rope(3, dtype, 4, 2, 64, 48, 10000.f, 0, style);
      Rope out = in;
      FD_ASSERT_OK(apply(out));
      assert_memory_equal(in.x.data(), out.x.data(), in.x.size());
    }
}

/* Every error path of both functions (fd_rope_apply_style in each style):
 * status, message, and x left untouched. */
void test_errors(void **state) {
  (void)state;
  const Rope base = make_rope(9, FD_DTYPE_BF16, 3, 2, 16, 8, 10000.f, 50);
#define EXPECT_ROPE_FAILS(mutate, substring)                                                     \
  do {                                                                                           \
    for (int32_t style_ = -1; style_ <= FD_ROPE_INTERLEAVED; ++style_) {                         \
      Rope r = base;                                                                             \
      void *x = r.x.data();                                                                      \
      const int32_t *pos = r.positions.data();                                                   \
      mutate;                                                                                    \
      if (style_ < 0) {                                                                          \
        FD_ASSERT_FAILS(                                                                         \
            fd_rope_apply(r.dtype, x, r.tokens, r.heads, r.dim, pos, r.rotary, r.base),          \
            FD_ERR_INVALID_ARGUMENT, substring);                                                 \
      } else {                                                                                   \
        FD_ASSERT_FAILS(fd_rope_apply_style(r.dtype, x, r.tokens, r.heads, r.dim, pos, r.rotary, \
                                            r.base, style_),                                     \
                        FD_ERR_INVALID_ARGUMENT, substring);                                     \
      }                                                                                          \
      assert_memory_equal(r.x.data(), base.x.data(), base.x.size());                             \
    }                                                                                            \
  } while (0)
  EXPECT_ROPE_FAILS(r.dtype = 5, "dtype 5");
  EXPECT_ROPE_FAILS(x = NULL, "x must not be NULL");
  EXPECT_ROPE_FAILS(pos = NULL, "positions must not be NULL");
  EXPECT_ROPE_FAILS(r.tokens = 0, "num_tokens must be > 0");
  EXPECT_ROPE_FAILS(r.heads = 0, "num_heads must be > 0");
  EXPECT_ROPE_FAILS((r.dim = 0, r.rotary = 0), "head_dim must be > 0");
  EXPECT_ROPE_FAILS(r.rotary = 0, "rotary_dim");
  EXPECT_ROPE_FAILS(r.rotary = 7, "rotary_dim");
  EXPECT_ROPE_FAILS(r.rotary = 18, "rotary_dim");
  EXPECT_ROPE_FAILS(r.base = 0.f, "rope_base");
  EXPECT_ROPE_FAILS(r.base = -2.f, "rope_base");
  EXPECT_ROPE_FAILS(r.base = NAN, "rope_base");
  EXPECT_ROPE_FAILS(r.base = INFINITY, "rope_base");
  /* A bad position in the last token: the earlier tokens must not have been rotated. */
  EXPECT_ROPE_FAILS(r.positions[2] = -1, "positions[2] = -1");
  EXPECT_ROPE_FAILS(r.positions[0] = INT32_MIN, "positions[0]");
  /* Sizes whose product overflows are refused before any position is read. */
  EXPECT_ROPE_FAILS((r.tokens = 0xffffffffu, r.heads = 0xffffffffu, r.dim = 0xffffffffu),
                    "x ([num_tokens, num_heads, head_dim]) is too large to address");
  EXPECT_ROPE_FAILS((r.tokens = 0x80000000u, r.heads = 0x80000000u), "too large to address");
  /* Misaligned arrays (bf16: 2 bytes; positions: 4 bytes). */
  EXPECT_ROPE_FAILS(x = (char *)x + 1, "x (");
  EXPECT_ROPE_FAILS(x = (char *)x + 1, "must be aligned to 2 bytes");
  EXPECT_ROPE_FAILS(pos = (const int32_t *)((const char *)pos + 2), "positions (");
  EXPECT_ROPE_FAILS(pos = (const int32_t *)((const char *)pos + 2), "must be aligned to 4 bytes");
#undef EXPECT_ROPE_FAILS
  /* An unknown style, with every other argument valid. */
  for (int32_t style : {2, -1, 0x7fffffff, INT32_MIN}) {
    Rope r = base;
    FD_ASSERT_FAILS(fd_rope_apply_style(r.dtype, r.x.data(), r.tokens, r.heads, r.dim,
                                        r.positions.data(), r.rotary, r.base, style),
                    FD_ERR_INVALID_ARGUMENT, "is not an fd_rope_style");
    char want[64];
    snprintf(want, sizeof want, "rope_style %d is not", (int)style);
    assert_non_null(strstr(fd_last_error_message(), want));
    assert_memory_equal(r.x.data(), base.x.data(), base.x.size());
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_double),
      cmocka_unit_test(test_worked_example),
      cmocka_unit_test(test_split_half_is_rope_apply),
      cmocka_unit_test(test_position_zero_is_identity),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
