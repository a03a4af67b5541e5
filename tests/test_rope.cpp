/* fd_rope_apply (S3.1, split-half RoPE) against an independent double
 * computation of the formula, and its error paths. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cmath>
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
};

Rope make_rope(uint64_t seed, int32_t dtype, uint32_t tokens, uint32_t heads, uint32_t dim,
               uint32_t rotary, float base, int32_t max_pos) {
  fd_test_rng rng = {seed};
  Rope r{dtype, tokens, heads, dim, rotary, base, {}, {}};
  for (uint32_t t = 0; t < tokens; ++t)
    r.positions.push_back(t == 0 ? max_pos : (int32_t)fd_test_range(&rng, 0, max_pos));
  const size_t n = (size_t)tokens * heads * dim;
  r.x.resize(n * fd_test_dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) fd_test_store(r.x.data(), i, dtype, 2.f * fd_test_normal(&rng));
  return r;
}

fd_status apply(Rope &r) {
  return fd_rope_apply(r.dtype, r.x.data(), r.tokens, r.heads, r.dim, r.positions.data(), r.rotary,
                       r.base);
}

/* Rotates `in` by the S3.1 formula in double and checks `out` element by element.
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
        const double x1 = fd_test_load(in.x.data(), row + i, in.dtype);
        const double x2 = fd_test_load(in.x.data(), row + half + i, in.dtype);
        const double want1 = x1 * std::cos(angle) - x2 * std::sin(angle);
        const double want2 = x2 * std::cos(angle) + x1 * std::sin(angle);
        const double got1 = fd_test_load(out.x.data(), row + i, in.dtype);
        const double got2 = fd_test_load(out.x.data(), row + half + i, in.dtype);
        const double mag = std::fabs(x1) + std::fabs(x2);
        const double angle_err = mag * (8.0 * 0x1p-24 * (std::fabs(angle) + 1.0));
        const double tol1 = 2 * ulp * std::fabs(want1) + angle_err + 1e-30;
        const double tol2 = 2 * ulp * std::fabs(want2) + angle_err + 1e-30;
        if (!(std::fabs(got1 - want1) <= tol1) || !(std::fabs(got2 - want2) <= tol2)) {
          print_error("dtype %d token %u head %u i %u pos %d: got (%g, %g), want (%g, %g)\n",
                      in.dtype, t, h, i, in.positions[t], got1, got2, want1, want2);
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
  for (const auto &s : shapes)
    for (int32_t dtype : dtypes) {
      const Rope in =
          make_rope(seed++, dtype, s.tokens, s.heads, s.dim, s.rotary, s.base, s.max_pos);
      Rope out = in;
      FD_ASSERT_OK(apply(out));
      check_rotation(in, out);
      /* The rotation really moved something (the test could otherwise pass vacuously). */
      assert_true(memcmp(in.x.data(), out.x.data(), in.x.size()) != 0);
    }
}

void test_position_zero_is_identity(void **state) {
  (void)state;
  const int32_t dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  for (int32_t dtype : dtypes) {
    const Rope in = make_rope(3, dtype, 4, 2, 64, 48, 10000.f, 0);
    Rope out = in;
    FD_ASSERT_OK(apply(out));
    assert_memory_equal(in.x.data(), out.x.data(), in.x.size());
  }
}

/* Every error path: status, message, and x left untouched. */
void test_errors(void **state) {
  (void)state;
  const Rope base = make_rope(9, FD_DTYPE_BF16, 3, 2, 16, 8, 10000.f, 50);
#define EXPECT_ROPE_FAILS(mutate, substring)                                                    \
  do {                                                                                          \
    Rope r = base;                                                                              \
    void *x = r.x.data();                                                                       \
    const int32_t *pos = r.positions.data();                                                    \
    mutate;                                                                                     \
    FD_ASSERT_FAILS(fd_rope_apply(r.dtype, x, r.tokens, r.heads, r.dim, pos, r.rotary, r.base), \
                    FD_ERR_INVALID_ARGUMENT, substring);                                        \
    assert_memory_equal(r.x.data(), base.x.data(), base.x.size());                              \
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
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_double),
      cmocka_unit_test(test_position_zero_is_identity),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
