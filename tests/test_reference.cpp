/* fd_reference_attention_dense (S2, implementation 1) against an independent
 * double-precision computation written here, plus its error paths. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fd_test.h"

namespace {

struct Dense {
  int32_t dtype;
  uint32_t batch, hq, hkv, dim, max_len;
  std::vector<uint8_t> q, k, v, out;
  std::vector<int32_t> lens;
};

std::vector<uint8_t> random_tensor(fd_test_rng *rng, size_t n, int32_t dtype, float scale) {
  std::vector<uint8_t> buf(n * fd_test_dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) fd_test_store(buf.data(), i, dtype, scale * fd_test_normal(rng));
  return buf;
}

Dense make_dense(uint64_t seed, int32_t dtype, uint32_t batch, uint32_t hq, uint32_t hkv,
                 uint32_t dim, uint32_t max_len) {
  fd_test_rng rng = {seed};
  Dense d{dtype, batch, hq, hkv, dim, max_len, {}, {}, {}, {}, {}};
  d.q = random_tensor(&rng, (size_t)batch * hq * dim, dtype, 3.0f);
  d.k = random_tensor(&rng, (size_t)batch * hkv * max_len * dim, dtype, 1.0f);
  d.v = random_tensor(&rng, (size_t)batch * hkv * max_len * dim, dtype, 1.0f);
  d.out.assign((size_t)batch * hq * dim * fd_test_dtype_size(dtype), 0xA5);
  for (uint32_t r = 0; r < batch; ++r) {
    // Cover the extremes: empty, one token, full length, and something between.
    const int32_t choices[4] = {0, 1, (int32_t)max_len, (int32_t)fd_test_range(&rng, 0, max_len)};
    d.lens.push_back(choices[r % 4]);
  }
  return d;
}

fd_status run_reference(Dense &d, float sm_scale) {
  return fd_reference_attention_dense(d.dtype, d.batch, d.hq, d.hkv, d.dim, d.max_len, d.q.data(),
                                      d.k.data(), d.v.data(), d.lens.data(), sm_scale,
                                      d.out.data());
}

/* softmax(scale * q.K) @ V in double, from the stored (already rounded) inputs. */
std::vector<double> expected(const Dense &d, double scale) {
  std::vector<double> out((size_t)d.batch * d.hq * d.dim, 0.0);
  const uint32_t group = d.hq / d.hkv;
  for (uint32_t r = 0; r < d.batch; ++r)
    for (uint32_t h = 0; h < d.hq; ++h) {
      const size_t qo = ((size_t)r * d.hq + h) * d.dim;
      const size_t kv = ((size_t)r * d.hkv + h / group) * d.max_len * d.dim;
      const int32_t len = d.lens[r];
      if (len == 0) continue;
      std::vector<double> s(len);
      double mx = -INFINITY;
      for (int32_t t = 0; t < len; ++t) {
        double dot = 0;
        for (uint32_t i = 0; i < d.dim; ++i)
          dot += (double)fd_test_load(d.q.data(), qo + i, d.dtype) *
                 fd_test_load(d.k.data(), kv + (size_t)t * d.dim + i, d.dtype);
        s[t] = dot * scale;
        mx = s[t] > mx ? s[t] : mx;
      }
      double sum = 0;
      for (int32_t t = 0; t < len; ++t) sum += (s[t] = std::exp(s[t] - mx));
      for (int32_t t = 0; t < len; ++t)
        for (uint32_t i = 0; i < d.dim; ++i)
          out[qo + i] += s[t] / sum * fd_test_load(d.v.data(), kv + (size_t)t * d.dim + i, d.dtype);
    }
  return out;
}

double tolerance(int32_t dtype) {
  return dtype == FD_DTYPE_F32 ? 1e-5 : dtype == FD_DTYPE_F16 ? 1e-3 : 5e-3;
}

/* Worst ||out - ref|| / ||ref|| over (row, head); empty rows must be exactly 0. */
void check_against_double(const Dense &d, double scale) {
  const std::vector<double> ref = expected(d, scale);
  double worst = 0;
  for (uint32_t r = 0; r < d.batch; ++r)
    for (uint32_t h = 0; h < d.hq; ++h) {
      const size_t base = ((size_t)r * d.hq + h) * d.dim;
      double num = 0, den = 0;
      for (uint32_t i = 0; i < d.dim; ++i) {
        const double got = fd_test_load(d.out.data(), base + i, d.dtype);
        if (d.lens[r] == 0) {
          assert_true(got == 0.0);
          continue;
        }
        assert_true(std::isfinite(got));
        num += (got - ref[base + i]) * (got - ref[base + i]);
        den += ref[base + i] * ref[base + i];
      }
      if (d.lens[r] > 0) worst = std::fmax(worst, std::sqrt(num / den));
    }
  if (worst > tolerance(d.dtype)) {
    print_error("dtype %d hq %u hkv %u dim %u: rel err %.3g > %.3g\n", d.dtype, d.hq, d.hkv, d.dim,
                worst, tolerance(d.dtype));
    fail();
  }
}

void test_matches_double(void **state) {
  (void)state;
  const struct {
    uint32_t batch, hq, hkv, dim, max_len;
  } shapes[] = {
      {4, 4, 4, 64, 50}, {5, 8, 2, 128, 77}, {3, 32, 1, 40, 33}, {4, 6, 3, 3, 9}, {2, 1, 1, 1, 1}};
  const int32_t dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  uint64_t seed = 1;
  for (const auto &s : shapes)
    for (int32_t dtype : dtypes) {
      Dense d = make_dense(seed++, dtype, s.batch, s.hq, s.hkv, s.dim, s.max_len);
      FD_ASSERT_OK(run_reference(d, 0.0f));
      check_against_double(d, 1.0 / std::sqrt((double)s.dim));
      FD_ASSERT_OK(run_reference(d, 0.3f));
      check_against_double(d, (double)0.3f);
    }
}

void test_empty_rows_are_zero(void **state) {
  (void)state;
  Dense d = make_dense(42, FD_DTYPE_BF16, 3, 4, 2, 16, 8);
  d.lens = {0, 0, 0};
  FD_ASSERT_OK(run_reference(d, 0.0f));
  for (uint8_t byte : d.out) assert_int_equal(byte, 0);
}

void test_default_scale_is_inverse_sqrt_dim(void **state) {
  (void)state;
  Dense a = make_dense(7, FD_DTYPE_F32, 4, 8, 2, 128, 40);
  Dense b = a;
  FD_ASSERT_OK(run_reference(a, 0.0f));
  FD_ASSERT_OK(run_reference(b, 1.0f / std::sqrt(128.0f)));
  assert_memory_equal(a.out.data(), b.out.data(), a.out.size());
  /* And a different scale really changes the result (the scale is used). */
  FD_ASSERT_OK(run_reference(b, 1.0f));
  assert_true(std::memcmp(a.out.data(), b.out.data(), a.out.size()) != 0);
}

/* Every error path: status, message, and the output left untouched. */
void test_errors(void **state) {
  (void)state;
  const Dense base = make_dense(3, FD_DTYPE_F16, 2, 4, 2, 8, 6);
  const std::vector<uint8_t> poison = base.out;
#define EXPECT_REF_FAILS(mutate, substring)                                                       \
  do {                                                                                            \
    Dense d = base;                                                                               \
    const void *q = d.q.data(), *k = d.k.data(), *v = d.v.data();                                 \
    const int32_t *lens = d.lens.data();                                                          \
    void *out = d.out.data();                                                                     \
    float scale = 0.f;                                                                            \
    mutate;                                                                                       \
    FD_ASSERT_FAILS(fd_reference_attention_dense(d.dtype, d.batch, d.hq, d.hkv, d.dim, d.max_len, \
                                                 q, k, v, lens, scale, out),                      \
                    FD_ERR_INVALID_ARGUMENT, substring);                                          \
    assert_memory_equal(d.out.data(), poison.data(), poison.size());                              \
  } while (0)
  EXPECT_REF_FAILS(d.dtype = 3, "dtype");
  EXPECT_REF_FAILS(d.dtype = -1, "dtype");
  EXPECT_REF_FAILS(d.batch = 0, "batch");
  EXPECT_REF_FAILS(d.hq = 0, "num_q_heads");
  EXPECT_REF_FAILS(d.hkv = 0, "num_kv_heads");
  EXPECT_REF_FAILS(d.hq = 3, "multiple of num_kv_heads");
  EXPECT_REF_FAILS(d.dim = 0, "head_dim");
  EXPECT_REF_FAILS(d.max_len = 0, "max_seq_len");
  EXPECT_REF_FAILS(q = nullptr, "q must not be NULL");
  EXPECT_REF_FAILS(k = nullptr, "k must not be NULL");
  EXPECT_REF_FAILS(v = nullptr, "v must not be NULL");
  EXPECT_REF_FAILS(lens = nullptr, "seq_lens must not be NULL");
  EXPECT_REF_FAILS(out = nullptr, "out must not be NULL");
  EXPECT_REF_FAILS(scale = -1.f, "sm_scale");
  EXPECT_REF_FAILS(scale = NAN, "sm_scale");
  EXPECT_REF_FAILS(scale = INFINITY, "sm_scale");
  EXPECT_REF_FAILS(d.lens[1] = -1, "seq_lens[1] = -1");
  EXPECT_REF_FAILS(d.lens[0] = 7, "seq_lens[0] = 7");
  EXPECT_REF_FAILS((d.batch = 0xffffffffu, d.hq = 0xffffffffu, d.hkv = 1), "too large");
  /* Typed reads need element-aligned arrays (f16: 2 bytes, seq_lens: 4). */
  EXPECT_REF_FAILS(q = d.q.data() + 1, "q (");
  EXPECT_REF_FAILS(q = d.q.data() + 1, "must be aligned to 2 bytes");
  EXPECT_REF_FAILS(k = d.k.data() + 1, "k (");
  EXPECT_REF_FAILS(v = d.v.data() + 1, "v (");
  EXPECT_REF_FAILS(out = d.out.data() + 1, "out (");
  EXPECT_REF_FAILS(lens = (const int32_t *)((const char *)d.lens.data() + 2), "seq_lens (");
  EXPECT_REF_FAILS(lens = (const int32_t *)((const char *)d.lens.data() + 2),
                   "must be aligned to 4 bytes");
#undef EXPECT_REF_FAILS
}

/* fd_reference_attention: with one token per row and no variant it gives
 * the bits of fd_reference_attention_dense; a q_indptr of one token per row
 * too; each variant changes the result; every bad field is refused naming
 * it, with the output untouched. (Multi-token and variant values are checked
 * against a double-precision reference in test_decode_multi_token.) */
fd_reference_params params_of(Dense &d) {
  fd_reference_params p;
  fd_reference_params_init(&p);
  p.dtype = d.dtype;
  p.batch = d.batch;
  p.num_q_heads = d.hq;
  p.num_kv_heads = d.hkv;
  p.head_dim = d.dim;
  p.max_seq_len = d.max_len;
  p.q = d.q.data();
  p.k = d.k.data();
  p.v = d.v.data();
  p.seq_lens = d.lens.data();
  p.out = d.out.data();
  return p;
}

void test_params_form(void **state) {
  (void)state;
  Dense a = make_dense(11, FD_DTYPE_BF16, 4, 8, 2, 32, 20);
  for (int32_t &len : a.lens) len = len == 0 ? 1 : len; /* q_indptr needs >= 1 token */
  Dense b = a;
  FD_ASSERT_OK(run_reference(a, 0.0f));
  fd_reference_params p = params_of(b);
  FD_ASSERT_OK(fd_reference_attention(&p));
  assert_memory_equal(a.out.data(), b.out.data(), a.out.size());
  std::vector<int32_t> indptr(b.batch + 1);
  for (uint32_t r = 0; r <= b.batch; ++r) indptr[r] = (int32_t)r;
  b.out.assign(b.out.size(), 0xFF);
  p.q_indptr = indptr.data();
  FD_ASSERT_OK(fd_reference_attention(&p));
  assert_memory_equal(a.out.data(), b.out.data(), a.out.size());
  /* Each variant is used: a tight cap, a one-token window, a large sink. */
  std::vector<float> sinks(b.hq, 30.f);
  for (int variant = 0; variant < 3; ++variant) {
    fd_reference_params w = p;
    if (variant == 0) w.logit_softcap = 0.5f;
    if (variant == 1) w.sliding_window = 1;
    if (variant == 2) w.sinks = sinks.data();
    b.out.assign(b.out.size(), 0xFF);
    FD_ASSERT_OK(fd_reference_attention(&w));
    assert_true(std::memcmp(a.out.data(), b.out.data(), a.out.size()) != 0);
  }
  /* A sink of -inf and a window longer than every row change nothing. */
  std::fill(sinks.begin(), sinks.end(), -INFINITY);
  fd_reference_params w = p;
  w.sinks = sinks.data();
  w.sliding_window = (int32_t)b.max_len;
  b.out.assign(b.out.size(), 0xFF);
  FD_ASSERT_OK(fd_reference_attention(&w));
  assert_memory_equal(a.out.data(), b.out.data(), a.out.size());
}

void test_params_errors(void **state) {
  (void)state;
  Dense base = make_dense(5, FD_DTYPE_F32, 2, 4, 2, 8, 6);
  base.lens = {3, 6};
  /* Five query tokens (2 + 3) in q and out. */
  const size_t token_bytes = (size_t)base.hq * base.dim * fd_test_dtype_size(base.dtype);
  base.q.resize(5 * token_bytes, 0);
  base.out.assign(5 * token_bytes, 0xA5);
  const std::vector<uint8_t> poison = base.out;
  std::vector<int32_t> indptr = {0, 2, 5};
  std::vector<float> sinks(base.hq, 0.f);
  FD_ASSERT_FAILS(fd_reference_attention(NULL), FD_ERR_INVALID_ARGUMENT, "params");
#define EXPECT_PARAMS_FAIL(mutate, substring)                                        \
  do {                                                                               \
    Dense d = base;                                                                  \
    std::vector<int32_t> ip = indptr;                                                \
    std::vector<float> sk = sinks;                                                   \
    fd_reference_params p = params_of(d);                                            \
    p.q_indptr = ip.data();                                                          \
    mutate;                                                                          \
    FD_ASSERT_FAILS(fd_reference_attention(&p), FD_ERR_INVALID_ARGUMENT, substring); \
    assert_memory_equal(d.out.data(), poison.data(), poison.size());                 \
  } while (0)
  EXPECT_PARAMS_FAIL(p.struct_size = 8, "struct_size");
  EXPECT_PARAMS_FAIL(p.struct_size = sizeof p + 8, "struct_size");
  EXPECT_PARAMS_FAIL(ip[0] = 1, "q_indptr[0] must be 0");
  EXPECT_PARAMS_FAIL(ip[1] = 0, "q_indptr[1]");
  EXPECT_PARAMS_FAIL(ip[1] = 4, "q_indptr[1] = 4");
  EXPECT_PARAMS_FAIL(ip[2] = 1, "q_indptr[2]");
  EXPECT_PARAMS_FAIL(p.logit_softcap = -1.f, "logit_softcap");
  EXPECT_PARAMS_FAIL(p.logit_softcap = NAN, "logit_softcap");
  EXPECT_PARAMS_FAIL(p.logit_softcap = INFINITY, "logit_softcap");
  EXPECT_PARAMS_FAIL(p.sliding_window = -1, "sliding_window");
  EXPECT_PARAMS_FAIL((sk[3] = NAN, p.sinks = sk.data()), "sinks[3] is NaN");
  EXPECT_PARAMS_FAIL(p.q = NULL, "q must not be NULL");
  EXPECT_PARAMS_FAIL(p.batch = 0, "batch");
#undef EXPECT_PARAMS_FAIL
  /* The well-formed call succeeds (so each failure above is its field's). */
  Dense d = base;
  fd_reference_params p = params_of(d);
  p.q_indptr = indptr.data();
  p.sinks = sinks.data();
  FD_ASSERT_OK(fd_reference_attention(&p));
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_double),
      cmocka_unit_test(test_empty_rows_are_zero),
      cmocka_unit_test(test_default_scale_is_inverse_sqrt_dim),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_params_form),
      cmocka_unit_test(test_params_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
