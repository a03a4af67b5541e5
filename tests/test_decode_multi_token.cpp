/* Multi-token queries and attention variants on the CPU backend
 * (docs/semantics.md S2.2, S2.3): rows of
 * q_len >= 1 query tokens given by q_indptr, causal over the paged K/V (query
 * j of a row of seq_len L and q_len n sees positions <= L - n + j). Checked
 * against a double-precision causal reference computed here from dense
 * copies of K and V, on random cases (q_len 1 to a whole prompt, rows longer
 * than one 256-token chunk, GQA/MQA/MHA, all dtypes, both layouts); one token
 * per row through q_indptr gives the bits of q_indptr NULL; results are the
 * same bits for any thread count and through a plan; every bad input is
 * refused with its status and message and nothing written. The variants
 * (logit soft-cap, sliding window, attention sinks) are in the same
 * reference and checked alone and together, with the edge values of each. */
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
#include <initializer_list>
#include <numeric>
#include <vector>

#include "fd_test.h"

namespace {

struct Case {
  int32_t dtype = FD_DTYPE_F32;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  uint32_t hq = 4, hkv = 2, dim = 16, bs = 8;
  std::vector<int32_t> lens, q_lens;
  uint32_t cpu_threads = 1;
  uint64_t seed = 1;
  float softcap = 0.f;      /* fd_decode_params.logit_softcap */
  int32_t window = 0;       /* fd_decode_params.sliding_window */
  std::vector<float> sinks; /* empty: NULL */
};

/* A paged problem (packed storage of the layout, blocks in a random
 * permutation, NaN everywhere no row uses) and dense K/V copies. */
struct Problem {
  Case c;
  uint32_t batch = 0, mbps = 0, num_blocks = 0, max_len = 0;
  std::vector<int32_t> indptr;
  std::vector<uint8_t> q, out, k_cache, v_cache;
  std::vector<float> k_dense, v_dense; /* [batch, hkv, max_len, dim], values as stored */
  std::vector<int32_t> tables, lens;
  size_t es = 0;
};

Problem build(const Case &c) {
  Problem p;
  p.c = c;
  p.batch = (uint32_t)c.lens.size();
  p.es = fd_test_dtype_size(c.dtype);
  p.lens = c.lens;
  p.indptr.assign(p.batch + 1, 0);
  for (uint32_t r = 0; r < p.batch; ++r) p.indptr[r + 1] = p.indptr[r] + c.q_lens[r];
  for (int32_t l : c.lens) p.max_len = std::max(p.max_len, (uint32_t)l);
  p.mbps = std::max<uint32_t>(1, (p.max_len + c.bs - 1) / c.bs);
  fd_test_rng rng = {c.seed};
  const size_t q_elems = (size_t)p.indptr[p.batch] * c.hq * c.dim;
  p.q.resize(q_elems * p.es);
  for (size_t i = 0; i < q_elems; ++i)
    fd_test_store(p.q.data(), i, c.dtype, 3.f * fd_test_normal(&rng));
  const size_t kv_elems = (size_t)p.batch * c.hkv * p.mbps * c.bs * c.dim;
  p.k_dense.resize(kv_elems);
  p.v_dense.resize(kv_elems);
  for (size_t i = 0; i < kv_elems; ++i) {
    /* Round through the dtype so the reference sees what the cache holds. */
    uint32_t bits[2];
    fd_test_store(bits, 0, c.dtype, fd_test_normal(&rng));
    p.k_dense[i] = fd_test_load(bits, 0, c.dtype);
    fd_test_store(bits, 0, c.dtype, fd_test_normal(&rng));
    p.v_dense[i] = fd_test_load(bits, 0, c.dtype);
  }
  uint32_t used = 0;
  for (int32_t l : p.lens) used += ((uint32_t)l + c.bs - 1) / c.bs;
  p.num_blocks = used + 1;
  std::vector<int32_t> perm(p.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[fd_test_next(&rng) % i]);
  p.tables.assign((size_t)p.batch * p.mbps, -1);
  size_t next = 0;
  for (uint32_t r = 0; r < p.batch; ++r)
    for (uint32_t i = 0; i < ((uint32_t)p.lens[r] + c.bs - 1) / c.bs; ++i)
      p.tables[(size_t)r * p.mbps + i] = perm[next++];
  const size_t block_elems = (size_t)c.hkv * c.bs * c.dim;
  p.k_cache.assign(p.num_blocks * block_elems * p.es, 0xFF);
  p.v_cache.assign(p.num_blocks * block_elems * p.es, 0xFF);
  const bool tm = c.layout == FD_LAYOUT_TOKEN_MAJOR;
  for (uint32_t r = 0; r < p.batch; ++r)
    for (uint32_t h = 0; h < c.hkv; ++h)
      for (int32_t t = 0; t < p.lens[r]; ++t)
        for (uint32_t d = 0; d < c.dim; ++d) {
          const size_t block = (size_t)p.tables[(size_t)r * p.mbps + (uint32_t)t / c.bs];
          const size_t in_block = tm ? ((size_t)t % c.bs) * c.dim + d : (size_t)d * c.bs + t % c.bs;
          const size_t off = block * block_elems + h * c.bs * c.dim + in_block;
          const size_t dense = (((size_t)r * c.hkv + h) * p.mbps * c.bs + (size_t)t) * c.dim + d;
          fd_test_store(p.k_cache.data(), off, c.dtype, p.k_dense[dense]);
          fd_test_store(p.v_cache.data(), off, c.dtype, p.v_dense[dense]);
        }
  p.out.assign(q_elems * p.es, 0xFF); /* NaN poison */
  return p;
}

fd_decode_params params_for(Problem &p) {
  fd_decode_params prm;
  fd_decode_params_init(&prm);
  fd_test_decode_dtype(&prm, p.c.dtype);
  prm.layout = p.c.layout;
  prm.batch = p.batch;
  prm.num_q_heads = p.c.hq;
  prm.num_kv_heads = p.c.hkv;
  prm.head_dim = p.c.dim;
  prm.block_size = p.c.bs;
  prm.num_blocks = p.num_blocks;
  prm.max_blocks_per_seq = p.mbps;
  prm.q = p.q.data();
  prm.q_indptr = p.indptr.data();
  prm.k_cache = p.k_cache.data();
  prm.v_cache = p.v_cache.data();
  prm.block_tables = p.tables.data();
  prm.seq_lens = p.lens.data();
  prm.out = p.out.data();
  prm.cpu_threads = p.c.cpu_threads;
  prm.logit_softcap = p.c.softcap;
  prm.sliding_window = p.c.window;
  prm.sinks = p.c.sinks.empty() ? NULL : p.c.sinks.data();
  return prm;
}

/* Worst ||out - ref|| / ||ref|| over (query token, head) against causal
 * attention in double precision; every output finite. */
double worst_rel_error(const Problem &p, const uint8_t *out) {
  const Case &c = p.c;
  const uint32_t group = c.hq / c.hkv;
  const double scale = 1.0 / std::sqrt((double)c.dim);
  double worst = 0;
  std::vector<double> w;
  for (uint32_t r = 0; r < p.batch; ++r) {
    const int32_t n = c.q_lens[r], len = p.lens[r];
    for (int32_t j = 0; j < n; ++j) {
      const int32_t position = len - n + j; /* attends [first, position] */
      const int32_t first = c.window > 0 ? std::max(0, position - c.window + 1) : 0;
      const size_t token = (size_t)p.indptr[r] + (size_t)j;
      for (uint32_t h = 0; h < c.hq; ++h) {
        const uint32_t kvh = h / group;
        const size_t qi = (token * c.hq + h) * c.dim;
        const float *k = &p.k_dense[((size_t)r * c.hkv + kvh) * p.mbps * c.bs * c.dim];
        const float *v = &p.v_dense[((size_t)r * c.hkv + kvh) * p.mbps * c.bs * c.dim];
        w.assign((size_t)(position + 1), 0.0);
        double mx = -INFINITY;
        for (int32_t t = first; t <= position; ++t) {
          double s = 0;
          for (uint32_t d = 0; d < c.dim; ++d)
            s += (double)fd_test_load(p.q.data(), qi + d, c.dtype) * k[(size_t)t * c.dim + d];
          s *= scale;
          if (c.softcap > 0.f) s = c.softcap * std::tanh(s / c.softcap);
          w[(size_t)t] = s;
          mx = std::max(mx, s);
        }
        const double sink = c.sinks.empty() ? -INFINITY : (double)c.sinks[h];
        mx = std::max(mx, sink);
        double sum = c.sinks.empty() ? 0.0 : std::exp(sink - mx); /* a sink adds no value */
        for (int32_t t = first; t <= position; ++t)
          sum += (w[(size_t)t] = std::exp(w[(size_t)t] - mx));
        double num = 0, den = 0;
        for (uint32_t d = 0; d < c.dim; ++d) {
          double want = 0;
          for (int32_t t = first; t <= position; ++t)
            want += w[(size_t)t] * v[(size_t)t * c.dim + d];
          want /= sum;
          const double got = fd_test_load(out, qi + d, c.dtype);
          if (!std::isfinite(got)) return INFINITY;
          num += (got - want) * (got - want);
          den += want * want;
        }
        /* A large sink can take nearly all the mass: compare absolutely then. */
        worst = std::max(worst, std::sqrt(num / std::max(den, 1e-6)));
      }
    }
  }
  return worst;
}

double tolerance(int32_t dtype) {
  return dtype == FD_DTYPE_F32 ? 1e-5 : dtype == FD_DTYPE_F16 ? 1e-3 : 5e-3;
}

/* fd_reference_attention over the dense copies (stored in the case's
 * dtype): the public dense reference, with the same query tokens and
 * variants. Returns its output (NaN-poisoned before the call). */
std::vector<uint8_t> dense_reference(const Problem &p) {
  const Case &c = p.c;
  const size_t n = p.k_dense.size();
  std::vector<uint8_t> k(n * p.es), v(n * p.es);
  for (size_t i = 0; i < n; ++i) {
    fd_test_store(k.data(), i, c.dtype, p.k_dense[i]);
    fd_test_store(v.data(), i, c.dtype, p.v_dense[i]);
  }
  std::vector<uint8_t> out(p.out.size(), 0xFF);
  fd_reference_params rp;
  fd_reference_params_init(&rp);
  rp.dtype = c.dtype;
  rp.batch = p.batch;
  rp.num_q_heads = c.hq;
  rp.num_kv_heads = c.hkv;
  rp.head_dim = c.dim;
  rp.max_seq_len = p.mbps * c.bs;
  rp.q = p.q.data();
  rp.q_indptr = p.indptr.data();
  rp.k = k.data();
  rp.v = v.data();
  rp.seq_lens = p.lens.data();
  rp.out = out.data();
  rp.logit_softcap = c.softcap;
  rp.sliding_window = c.window;
  rp.sinks = c.sinks.empty() ? NULL : c.sinks.data();
  FD_ASSERT_OK(fd_reference_attention(&rp));
  return out;
}

void check_error(const Problem &p, const uint8_t *out, const char *what) {
  const double err = worst_rel_error(p, out);
  if (!(err <= tolerance(p.c.dtype))) {
    print_error("%s: dtype %d layout %d hq %u hkv %u dim %u bs %u: rel error %.3g > %.3g\n", what,
                p.c.dtype, p.c.layout, p.c.hq, p.c.hkv, p.c.dim, p.c.bs, err, tolerance(p.c.dtype));
    fail();
  }
}

/* The paged CPU backend and the public dense reference, each against the
 * double-precision reference above. */
void run_and_check(Problem &p) {
  fd_decode_params prm = params_for(p);
  FD_ASSERT_OK(fd_decode(&prm));
  check_error(p, p.out.data(), "fd_decode");
  const std::vector<uint8_t> dense = dense_reference(p);
  check_error(p, dense.data(), "fd_reference_attention");
}

/* Random cases: q_len from 1 to the whole row (a prompt chunk with no cache
 * before it), rows from one token to several 256-token chunks. */
void test_random_cases(void **state) {
  (void)state;
  fd_test_rng rng = {7};
  const int32_t dtypes[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  const uint32_t heads[4][2] = {{4, 2}, {8, 1}, {3, 3}, {8, 8}};
  for (int i = 0; i < 36; ++i) {
    Case c;
    c.dtype = dtypes[i % 3];
    c.layout = (i / 3) % 2 ? FD_LAYOUT_DIM_MAJOR : FD_LAYOUT_TOKEN_MAJOR;
    c.hq = heads[i % 4][0];
    c.hkv = heads[i % 4][1];
    c.dim = i % 5 == 0 ? 40 : 16;
    const uint32_t block_sizes[3] = {4, 8, 16};
    c.bs = block_sizes[(i / 2) % 3];
    c.seed = 100 + (uint64_t)i;
    const uint32_t batch = (uint32_t)fd_test_range(&rng, 1, 4);
    for (uint32_t r = 0; r < batch; ++r) {
      const int32_t len = (int32_t)fd_test_range(&rng, 1, i % 4 == 0 ? 700 : 90);
      const int32_t q_len =
          r == 0 && i % 6 == 0 ? len : (int32_t)fd_test_range(&rng, 1, std::min(len, 9));
      c.lens.push_back(len);
      c.q_lens.push_back(q_len);
    }
    Problem p = build(c);
    run_and_check(p);
  }
}

/* A whole 600-token prompt as the query of one row (no cache before it),
 * beside a row of 3 new tokens over 900 cached ones: chunks a query token
 * cannot see at all (past its causal limit) must add nothing. */
void test_prompt_chunk_beside_decode(void **state) {
  (void)state;
  for (int32_t dtype : {FD_DTYPE_F32, FD_DTYPE_BF16}) {
    Case c;
    c.dtype = dtype;
    c.hq = 8, c.hkv = 2, c.dim = 32, c.bs = 16;
    c.lens = {600, 903};
    c.q_lens = {600, 3};
    c.cpu_threads = 3;
    Problem p = build(c);
    run_and_check(p);
  }
}

/* One query token per row through q_indptr: the bits of q_indptr NULL. */
void test_one_token_rows_match_plain_decode(void **state) {
  (void)state;
  Case c;
  c.dtype = FD_DTYPE_BF16;
  c.lens = {1, 300, 45};
  c.q_lens = {1, 1, 1};
  Problem p = build(c);
  fd_decode_params prm = params_for(p);
  FD_ASSERT_OK(fd_decode(&prm));
  const std::vector<uint8_t> with_indptr = p.out;
  p.out.assign(p.out.size(), 0xFF);
  prm.q_indptr = NULL;
  FD_ASSERT_OK(fd_decode(&prm));
  assert_memory_equal(with_indptr.data(), p.out.data(), p.out.size());
}

/* The same bits for any thread count, and through a plan. */
void test_deterministic_and_planned(void **state) {
  (void)state;
  Case c;
  c.dtype = FD_DTYPE_F16;
  c.lens = {777, 40, 520};
  c.q_lens = {8, 40, 5};
  Problem p = build(c);
  fd_decode_params prm = params_for(p);
  FD_ASSERT_OK(fd_decode(&prm));
  const std::vector<uint8_t> want = p.out;
  for (uint32_t threads : {2u, 4u, 7u}) {
    prm.cpu_threads = threads;
    p.out.assign(p.out.size(), 0xFF);
    FD_ASSERT_OK(fd_decode(&prm));
    assert_memory_equal(want.data(), p.out.data(), want.size());
  }
  prm.max_q_len_hint = 40;
  fd_decode_plan *plan = NULL;
  FD_ASSERT_OK(fd_decode_plan_create(&prm, p.lens.data(), &plan));
  p.out.assign(p.out.size(), 0xFF);
  FD_ASSERT_OK(fd_decode_run(plan, &prm));
  assert_memory_equal(want.data(), p.out.data(), want.size());
  fd_decode_plan_destroy(plan);
}

/* The variants alone and together on random cases: soft-caps of 20, 30 and
 * 50 (peaked q makes them bind), windows 1, block - 1, block, block + 1,
 * shorter and longer than the rows, sinks of -inf, 0, a large value and
 * random ones; one and several query tokens; rows longer than one chunk
 * (a window then skips whole chunks). */
void test_variants(void **state) {
  (void)state;
  fd_test_rng rng = {11};
  const int32_t dtypes[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  const float caps[4] = {0.f, 20.f, 30.f, 50.f};
  for (int i = 0; i < 48; ++i) {
    Case c;
    c.dtype = dtypes[i % 3];
    c.layout = (i / 3) % 2 ? FD_LAYOUT_DIM_MAJOR : FD_LAYOUT_TOKEN_MAJOR;
    c.hq = i % 2 ? 8 : 4, c.hkv = 2, c.dim = 16, c.bs = 8;
    c.seed = 300 + (uint64_t)i;
    c.softcap = caps[i % 4];
    const int32_t windows[8] = {0, 1, 7, 8, 9, 100, 600, 5000};
    c.window = windows[(i / 4) % 8];
    const uint32_t batch = (uint32_t)fd_test_range(&rng, 1, 3);
    for (uint32_t r = 0; r < batch; ++r) {
      const int32_t len = (int32_t)fd_test_range(&rng, 1, i % 3 == 0 ? 900 : 120);
      c.lens.push_back(len);
      c.q_lens.push_back(i % 5 == 0 ? std::min(len, 6) : 1);
    }
    switch (i % 6) {
      case 0: break; /* no sinks */
      case 1: c.sinks.assign(c.hq, -INFINITY); break;
      case 2: c.sinks.assign(c.hq, 0.f); break;
      case 3: c.sinks.assign(c.hq, 12.f); break;
      default:
        for (uint32_t h = 0; h < c.hq; ++h) c.sinks.push_back(4.f * fd_test_normal(&rng));
    }
    Problem p = build(c);
    run_and_check(p);
  }
}

/* Variants that change nothing give the plain bits: sinks of -inf, a window
 * at least as long as every row. */
/* The head dims of current models on the CPU backend (issue 16: any even
 * head_dim up to 512): Phi-3's 96, Gemma's 256 and 512, with one and several
 * query tokens, GQA, both layouts and the variants Gemma uses (soft-cap,
 * window). */
void test_model_head_dims(void **state) {
  (void)state;
  const uint32_t dims[3] = {96, 256, 512};
  for (int i = 0; i < 6; ++i) {
    Case c;
    c.dtype = i % 2 ? FD_DTYPE_BF16 : FD_DTYPE_F16;
    c.layout = i % 3 == 0 ? FD_LAYOUT_DIM_MAJOR : FD_LAYOUT_TOKEN_MAJOR;
    c.dim = dims[i % 3];
    c.hq = 8, c.hkv = 2, c.bs = 16;
    c.lens = {300, 17, 64};
    c.q_lens = {1, 5, 64};
    c.seed = 900 + (uint64_t)i;
    if (i >= 3) c.softcap = 30.f, c.window = 100;
    Problem p = build(c);
    run_and_check(p);
  }
}

void test_neutral_variants_are_bit_equal(void **state) {
  (void)state;
  Case c;
  c.dtype = FD_DTYPE_BF16;
  c.lens = {700, 33, 1};
  c.q_lens = {4, 1, 1};
  Problem p = build(c);
  fd_decode_params prm = params_for(p);
  FD_ASSERT_OK(fd_decode(&prm));
  const std::vector<uint8_t> plain = p.out;
  std::vector<float> no_sinks(c.hq, -INFINITY);
  prm.sinks = no_sinks.data();
  p.out.assign(p.out.size(), 0xFF);
  FD_ASSERT_OK(fd_decode(&prm));
  assert_memory_equal(plain.data(), p.out.data(), plain.size());
  prm.sinks = NULL;
  prm.sliding_window = 700;
  p.out.assign(p.out.size(), 0xFF);
  FD_ASSERT_OK(fd_decode(&prm));
  assert_memory_equal(plain.data(), p.out.data(), plain.size());
}

/* Bad query lengths: status, message, nothing written. */
#define EXPECT_FAILS(mutate, status, substring)                      \
  do {                                                               \
    Problem p = error_base();                                        \
    fd_decode_params prm_ = params_for(p);                           \
    fd_decode_params *prm = &prm_;                                   \
    mutate;                                                          \
    const std::vector<uint8_t> before = p.out;                       \
    FD_ASSERT_FAILS(fd_decode(prm), status, substring);              \
    assert_memory_equal(before.data(), p.out.data(), before.size()); \
  } while (0)

Problem error_base() {
  Case c;
  c.lens = {5, 12, 3};
  c.q_lens = {2, 4, 1};
  return build(c);
}

void test_errors(void **state) {
  (void)state;
  EXPECT_FAILS(p.indptr[0] = 1, FD_ERR_INVALID_ARGUMENT, "q_indptr[0] must be 0");
  EXPECT_FAILS(p.indptr[2] = 1, FD_ERR_INVALID_ARGUMENT, "q_indptr must increase");
  EXPECT_FAILS(p.indptr[1] = 0, FD_ERR_INVALID_ARGUMENT, "row 0 0 query tokens");
  EXPECT_FAILS(p.indptr[3] = 2, FD_ERR_INVALID_ARGUMENT, "smaller than batch");
  /* Row 2 has 3 cached tokens: 4 query tokens cannot all be among them. */
  EXPECT_FAILS((p.indptr[3] = 10, p.q.resize(p.q.size() * 2), prm->q = p.q.data(),
                p.out.resize(p.out.size() * 2, 0xFF), prm->out = p.out.data()),
               FD_ERR_INVALID_ARGUMENT, "row 2 has 4 query tokens but seq_lens[2] = 3");
  EXPECT_FAILS(prm->max_q_len_hint = 3, FD_ERR_INVALID_ARGUMENT,
               "row 1 has 4 query tokens, more than max_q_len_hint = 3");
  EXPECT_FAILS(prm->max_q_len_hint = -1, FD_ERR_INVALID_ARGUMENT, "max_q_len_hint");
  EXPECT_FAILS(prm->q_indptr = (const int32_t *)((const char *)p.indptr.data() + 2),
               FD_ERR_INVALID_ARGUMENT, "q_indptr (");
  /* out is sized by the query tokens (7 here), not by the batch. */
  EXPECT_FAILS(prm->out = (void *)((char *)prm->q + 4 * p.c.hq * p.c.dim * p.es),
               FD_ERR_INVALID_ARGUMENT, "out must not overlap q");
  /* Variant values. */
  EXPECT_FAILS(prm->logit_softcap = -1.f, FD_ERR_INVALID_ARGUMENT, "logit_softcap");
  EXPECT_FAILS(prm->logit_softcap = NAN, FD_ERR_INVALID_ARGUMENT, "logit_softcap");
  EXPECT_FAILS(prm->logit_softcap = INFINITY, FD_ERR_INVALID_ARGUMENT, "logit_softcap");
  EXPECT_FAILS(prm->sliding_window = -1, FD_ERR_INVALID_ARGUMENT, "sliding_window must be >= 0");
  static const float sinks[5] = {0.f, 0.f, NAN, 0.f, 0.f};
  EXPECT_FAILS(prm->sinks = sinks, FD_ERR_INVALID_ARGUMENT, "sinks[2] is NaN");
  EXPECT_FAILS(prm->sinks = (const float *)((const char *)sinks + 2), FD_ERR_INVALID_ARGUMENT,
               "sinks (");
  /* The CUDA backend serves none of them yet: refused before anything runs
   * (without a device the missing device is reported first). */
  {
    int32_t devices = 0;
    FD_ASSERT_OK(fd_cuda_device_count(&devices));
    const fd_status want = devices > 0 ? FD_ERR_UNSUPPORTED : FD_ERR_NO_DEVICE;
    static const float zero_sinks[4] = {0.f, 0.f, 0.f, 0.f};
    for (int field = 0; field < 3; ++field) {
      Problem p = error_base();
      fd_decode_params prm_ = params_for(p);
      prm_.device.type = FD_DEVICE_CUDA, prm_.q_indptr = NULL;
      fd_test_decode_dtype(&prm_, FD_DTYPE_F16); /* a type CUDA serves; nothing is read */
      const char *name = field == 0 ? "logit_softcap" : field == 1 ? "sliding_window" : "sinks";
      if (field == 0) prm_.logit_softcap = 30.f;
      if (field == 1) prm_.sliding_window = 64;
      if (field == 2) prm_.sinks = zero_sinks;
      size_t bytes = 12345;
      FD_ASSERT_FAILS(fd_decode_workspace_size(&prm_, &bytes), want,
                      devices > 0 ? name : "CUDA device");
      assert_int_equal(bytes, 12345);
    }
  }
  /* On CUDA the host plans from the hint (it cannot read a device
   * q_indptr): refused before the device is looked at. */
  EXPECT_FAILS(prm->device.type = FD_DEVICE_CUDA, FD_ERR_INVALID_ARGUMENT,
               "max_q_len_hint must be > 0 with q_indptr on CUDA");
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_cases),
      cmocka_unit_test(test_prompt_chunk_beside_decode),
      cmocka_unit_test(test_one_token_rows_match_plain_decode),
      cmocka_unit_test(test_deterministic_and_planned),
      cmocka_unit_test(test_variants),
      cmocka_unit_test(test_model_head_dims),
      cmocka_unit_test(test_neutral_variants_are_bit_equal),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
