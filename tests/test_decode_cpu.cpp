/* fd_decode on the CPU (S2): the paged backend against the dense reference on
 * many randomized shapes, layouts, strides and element types; determinism
 * across thread counts; struct_size handling; and every error path. */
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

#include "alloc_failures.h"
#include "fd_test.h"

namespace {

/* How the K/V pages are laid out in memory (strides in elements). */
enum StrideMode {
  kPacked,         /* all strides 0: the library derives them */
  kExplicitPacked, /* the packed strides, spelled out */
  kHeadsOuter,     /* [kv_heads, num_blocks, ...]: heads outermost */
  kNhd,            /* token-major: vLLM NHD pages [num_blocks, block_size, kv_heads, dim];
                      dim-major: [num_blocks, dim, kv_heads, block_size] */
  kPadded,         /* gaps between tokens/dims, heads and blocks */
  kStrideModes
};

struct Case {
  int32_t dtype = FD_DTYPE_BF16;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  int mode = kPacked;
  uint32_t batch = 1, hq = 1, hkv = 1, dim = 8, bs = 4, mbps = 1;
  std::vector<int32_t> lens;
  uint32_t extra_blocks = 1; /* physical blocks no row uses */
  uint32_t cpu_threads = 1;
  uint64_t seed = 1;
};

/* A paged problem plus the same K/V in the dense reference's layout. */
struct Problem {
  Case c;
  uint32_t max_len = 0, num_blocks = 0;
  int64_t sb = 0, sh = 0, st = 0, sd = 0;
  std::vector<uint8_t> q, k_dense, v_dense, k_cache, v_cache, out;
  std::vector<int32_t> tables, lens;
};

void set_strides(Problem &p) {
  const int64_t H = p.c.hkv, D = p.c.dim, B = p.c.bs, N = p.num_blocks;
  const bool tm = p.c.layout == FD_LAYOUT_TOKEN_MAJOR;
  switch (p.c.mode) {
    case kPacked:
    case kExplicitPacked:
      p.sh = B * D, p.sb = H * B * D;
      p.st = tm ? D : 1, p.sd = tm ? 1 : B;
      break;
    case kHeadsOuter:
      p.sb = B * D, p.sh = N * B * D;
      p.st = tm ? D : 1, p.sd = tm ? 1 : B;
      break;
    case kNhd:
      if (tm)
        p.sb = B * H * D, p.st = H * D, p.sh = D, p.sd = 1;
      else
        p.sb = D * H * B, p.sd = H * B, p.sh = B, p.st = 1;
      break;
    default: /* kPadded */
      if (tm)
        p.sd = 1, p.st = D + 3, p.sh = B * (D + 3) + 5;
      else
        p.st = 1, p.sd = B + 3, p.sh = D * (B + 3) + 5;
      p.sb = H * p.sh + 11;
      break;
  }
}

Problem build(const Case &c) {
  Problem p;
  p.c = c;
  fd_test_rng rng = {c.seed};
  p.max_len = c.mbps * c.bs;
  p.lens = c.lens;
  const size_t es = fd_test_dtype_size(c.dtype);
  const size_t q_elems = (size_t)c.batch * c.hq * c.dim;
  const size_t kv_elems = (size_t)c.batch * c.hkv * p.max_len * c.dim;
  p.q.resize(q_elems * es);
  p.k_dense.resize(kv_elems * es);
  p.v_dense.resize(kv_elems * es);
  for (size_t i = 0; i < q_elems; ++i)
    fd_test_store(p.q.data(), i, c.dtype, 3.f * fd_test_normal(&rng));
  for (size_t i = 0; i < kv_elems; ++i)
    fd_test_store(p.k_dense.data(), i, c.dtype, fd_test_normal(&rng));
  for (size_t i = 0; i < kv_elems; ++i)
    fd_test_store(p.v_dense.data(), i, c.dtype, fd_test_normal(&rng));

  /* Physical blocks: a random permutation, so no row's blocks are adjacent by accident. */
  uint32_t used = 0;
  for (int32_t len : p.lens) used += ((uint32_t)len + c.bs - 1) / c.bs;
  p.num_blocks = used + c.extra_blocks;
  std::vector<int32_t> perm(p.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[fd_test_next(&rng) % i]);
  p.tables.assign((size_t)c.batch * c.mbps, -1);
  size_t next = 0;
  for (uint32_t r = 0; r < c.batch; ++r)
    for (uint32_t i = 0; i < ((uint32_t)p.lens[r] + c.bs - 1) / c.bs; ++i)
      p.tables[(size_t)r * c.mbps + i] = perm[next++];

  set_strides(p);
  const int64_t span = (int64_t)(p.num_blocks - 1) * p.sb + (int64_t)(c.hkv - 1) * p.sh +
                       (int64_t)(c.bs - 1) * p.st + (int64_t)(c.dim - 1) * p.sd + 1;
  /* Everything the kernel must not read is NaN (all-ones bits in every dtype). */
  p.k_cache.assign((size_t)span * es, 0xFF);
  p.v_cache.assign((size_t)span * es, 0xFF);
  for (uint32_t r = 0; r < c.batch; ++r)
    for (uint32_t h = 0; h < c.hkv; ++h)
      for (int32_t t = 0; t < p.lens[r]; ++t) {
        const int64_t block = p.tables[(size_t)r * c.mbps + (uint32_t)t / c.bs];
        for (uint32_t d = 0; d < c.dim; ++d) {
          const int64_t off = block * p.sb + h * p.sh + (t % (int32_t)c.bs) * p.st + d * p.sd;
          const size_t dense = (((size_t)r * c.hkv + h) * p.max_len + (size_t)t) * c.dim + d;
          memcpy(&p.k_cache[(size_t)off * es], &p.k_dense[dense * es], es);
          memcpy(&p.v_cache[(size_t)off * es], &p.v_dense[dense * es], es);
        }
      }
  p.out.assign(q_elems * es, 0xFF); /* NaN poison: must come back fully written */
  return p;
}

fd_decode_params params_for(Problem &p) {
  fd_decode_params prm;
  fd_decode_params_init(&prm);
  fd_test_decode_dtype(&prm, p.c.dtype);
  prm.layout = p.c.layout;
  prm.batch = p.c.batch;
  prm.num_q_heads = p.c.hq;
  prm.num_kv_heads = p.c.hkv;
  prm.head_dim = p.c.dim;
  prm.block_size = p.c.bs;
  prm.num_blocks = p.num_blocks;
  prm.max_blocks_per_seq = p.c.mbps;
  prm.q = p.q.data();
  prm.k_cache = p.k_cache.data();
  prm.v_cache = p.v_cache.data();
  if (p.c.mode != kPacked) {
    prm.stride_block = p.sb;
    prm.stride_head = p.sh;
    prm.stride_token = p.st;
    prm.stride_dim = p.sd;
  }
  prm.block_tables = p.tables.data();
  prm.seq_lens = p.lens.data();
  prm.out = p.out.data();
  prm.cpu_threads = p.c.cpu_threads;
  return prm;
}

std::vector<uint8_t> dense_reference(Problem &p) {
  std::vector<uint8_t> out(p.out.size(), 0xFF);
  FD_ASSERT_OK(fd_reference_attention_dense(p.c.dtype, p.c.batch, p.c.hq, p.c.hkv, p.c.dim,
                                            p.max_len, p.q.data(), p.k_dense.data(),
                                            p.v_dense.data(), p.lens.data(), 0.f, out.data()));
  return out;
}

double tolerance(int32_t dtype) {
  return dtype == FD_DTYPE_F32 ? 1e-5 : dtype == FD_DTYPE_F16 ? 1e-3 : 5e-3;
}

/* Worst ||out - ref|| / ||ref|| over (row, head); every output finite; empty rows zero. */
double worst_rel_error(const Problem &p, const std::vector<uint8_t> &ref) {
  double worst = 0;
  for (uint32_t r = 0; r < p.c.batch; ++r)
    for (uint32_t h = 0; h < p.c.hq; ++h) {
      double num = 0, den = 0;
      for (uint32_t d = 0; d < p.c.dim; ++d) {
        const size_t i = ((size_t)r * p.c.hq + h) * p.c.dim + d;
        const double got = fd_test_load(p.out.data(), i, p.c.dtype);
        const double want = fd_test_load(ref.data(), i, p.c.dtype);
        if (!std::isfinite(got)) return INFINITY;
        if (p.lens[r] == 0 && got != 0.0) return INFINITY;
        num += (got - want) * (got - want);
        den += want * want;
      }
      if (p.lens[r] > 0) worst = std::max(worst, std::sqrt(num / den));
    }
  return worst;
}

void run_and_compare(Problem &p) {
  fd_decode_params prm = params_for(p);
  FD_ASSERT_OK(fd_decode(&prm));
  const double err = worst_rel_error(p, dense_reference(p));
  if (!(err <= tolerance(p.c.dtype))) {
    print_error(
        "seed %llu dtype %d layout %d mode %d batch %u hq %u hkv %u dim %u bs %u mbps %u: "
        "rel err %.3g > %.3g\n",
        (unsigned long long)p.c.seed, p.c.dtype, p.c.layout, p.c.mode, p.c.batch, p.c.hq, p.c.hkv,
        p.c.dim, p.c.bs, p.c.mbps, err, tolerance(p.c.dtype));
    fail();
  }
}

/* Lengths that sit on and around block boundaries, plus 0, 1 and the maximum. */
int32_t pick_len(fd_test_rng *rng, uint32_t bs, uint32_t max_len, uint32_t which) {
  const int64_t k = fd_test_range(rng, 1, max_len / bs);
  int64_t len = 0;
  switch (which % 7) {
    case 0: len = max_len; break;
    case 1: len = 0; break;
    case 2: len = 1; break;
    case 3: len = k * bs; break;
    case 4: len = k * bs - 1; break;
    case 5: len = k * bs + 1; break;
    default: len = fd_test_range(rng, 0, max_len); break;
  }
  return (int32_t)std::min<int64_t>(std::max<int64_t>(len, 0), max_len);
}

void test_paged_matches_dense_sweep(void **state) {
  (void)state;
  const uint32_t dims[] = {64, 128, 40, 17};
  const uint32_t groups[] = {1, 2, 4, 8, 32};
  const uint32_t block_sizes[] = {1, 8, 16, 32};
  const int32_t dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  const uint32_t threads[] = {1, 2, 0};
  fd_test_rng rng = {2024};
  uint32_t index = 0;
  for (uint32_t dim : dims)
    for (uint32_t group : groups)
      for (uint32_t bs : block_sizes)
        for (uint32_t rep = 0; rep < 2; ++rep, ++index) {
          Case c;
          c.seed = 1000 + index;
          /* Cycle deterministically so every dtype x layout x stride mode occurs. */
          c.dtype = dtypes[index % 3];
          c.layout = (index / 3) % 2 ? FD_LAYOUT_DIM_MAJOR : FD_LAYOUT_TOKEN_MAJOR;
          c.mode = (int)((index / 6 + rep) % kStrideModes);
          c.hkv = group == 32 ? 1 : (uint32_t)fd_test_range(&rng, 1, 3);
          c.hq = c.hkv * group;
          c.dim = dim;
          c.bs = bs;
          c.mbps = (uint32_t)fd_test_range(&rng, 1, std::max<uint32_t>(1, 160 / bs));
          c.batch = (uint32_t)fd_test_range(&rng, 1, 5);
          for (uint32_t r = 0; r < c.batch; ++r)
            c.lens.push_back(pick_len(&rng, bs, c.mbps * bs, r + index));
          c.extra_blocks = (uint32_t)fd_test_range(&rng, 1, 4);
          c.cpu_threads = threads[index % 3];
          Problem p = build(c);
          run_and_compare(p);
        }
}

/* Long rows (many tiles, several threads) and wide heads. */
void test_long_rows(void **state) {
  (void)state;
  const struct {
    int32_t dtype, layout;
    int mode;
    uint32_t hq, hkv, dim, bs;
  } shapes[] = {{FD_DTYPE_BF16, FD_LAYOUT_TOKEN_MAJOR, kPacked, 32, 8, 128, 16},
                {FD_DTYPE_F16, FD_LAYOUT_DIM_MAJOR, kPacked, 8, 1, 64, 32},
                {FD_DTYPE_F32, FD_LAYOUT_TOKEN_MAJOR, kNhd, 4, 2, 256, 8},
                {FD_DTYPE_BF16, FD_LAYOUT_DIM_MAJOR, kPadded, 6, 3, 72, 16}};
  uint64_t seed = 77;
  for (const auto &s : shapes) {
    Case c;
    c.seed = seed++;
    c.dtype = s.dtype;
    c.layout = s.layout;
    c.mode = s.mode;
    c.hq = s.hq, c.hkv = s.hkv, c.dim = s.dim, c.bs = s.bs;
    c.mbps = 2048 / s.bs;
    c.batch = 3;
    c.lens = {2048, 1337, 0};
    c.cpu_threads = 0;
    Problem p = build(c);
    run_and_compare(p);
  }
}

/* Decodes p once per thread count (output NaN-poisoned with 0xFF bytes
 * before each run) and requires the same output bits every time; p.out then
 * holds the last run's output. */
void expect_same_bits_for_thread_counts(Problem &p, std::initializer_list<uint32_t> counts) {
  std::vector<uint8_t> first;
  for (uint32_t threads : counts) {
    p.out.assign(p.out.size(), 0xFF);
    fd_decode_params prm = params_for(p);
    prm.cpu_threads = threads;
    FD_ASSERT_OK(fd_decode(&prm));
    if (first.empty())
      first = p.out;
    else
      assert_memory_equal(first.data(), p.out.data(), first.size());
  }
}

void test_deterministic_across_thread_counts(void **state) {
  (void)state;
  Case c;
  c.seed = 5;
  c.dtype = FD_DTYPE_BF16;
  c.hq = 16, c.hkv = 4, c.dim = 64, c.bs = 16, c.mbps = 128, c.batch = 3;
  c.lens = {2048, 1500, 1000};
  Problem p = build(c);
  expect_same_bits_for_thread_counts(p, {1u, 2u, 7u});
  assert_true(worst_rel_error(p, dense_reference(p)) <= tolerance(c.dtype));
}

/* Batch-1 rows around the CPU backend's chunk boundaries (rows are split
 * into chunks of 256 tokens that threads share): the same bits for every
 * thread count, and within the tolerance of the dense reference. */
void test_long_row_chunks_across_thread_counts(void **state) {
  (void)state;
  const int32_t chunk = 256;
  const int32_t lens[] = {chunk - 1, chunk, chunk + 1, 2 * chunk + 17, 8 * chunk};
  uint64_t seed = 300;
  for (int32_t len : lens)
    for (int32_t dtype : {FD_DTYPE_BF16, FD_DTYPE_F32}) {
      Case c;
      c.seed = seed++;
      c.dtype = dtype;
      c.hq = 32, c.hkv = 8, c.dim = 128, c.bs = 16, c.batch = 1;
      if (dtype == FD_DTYPE_F32) c.hq = 6, c.hkv = 2, c.dim = 40; /* odd group and dim tails */
      c.mbps = ((uint32_t)len + c.bs - 1) / c.bs;
      c.lens = {len};
      Problem p = build(c);
      expect_same_bits_for_thread_counts(p, {1u, 2u, 3u, 16u, 0u});
      const double err = worst_rel_error(p, dense_reference(p));
      if (!(err <= tolerance(dtype))) {
        print_error("len %d dtype %d: rel err %.3g\n", (int)len, (int)dtype, err);
        fail();
      }
    }
}

/* A batch mixing rows of one chunk, several chunks and none: the same bits
 * for every thread count. */
void test_mixed_chunk_rows_across_thread_counts(void **state) {
  (void)state;
  Case c;
  c.seed = 9;
  c.dtype = FD_DTYPE_F16;
  c.hq = 8, c.hkv = 2, c.dim = 64, c.bs = 16, c.mbps = 64, c.batch = 5;
  c.lens = {1024, 0, 255, 513, 1};
  Problem p = build(c);
  expect_same_bits_for_thread_counts(p, {1u, 4u, 7u});
  assert_true(worst_rel_error(p, dense_reference(p)) <= tolerance(c.dtype));
}

/* The token-major path widens 16-bit K/V eight at a time in vector form, the
 * dim-major path one value at a time; both must give the same FP32 tiles, so
 * the same output bits, subnormals included: half of
 * the K/V values (those with an odd last bit) get their exponent cleared
 * (f16 and bf16 subnormals). */
void make_some_subnormal(std::vector<uint8_t> &bytes, int32_t dtype) {
  const uint16_t keep = dtype == FD_DTYPE_F16 ? 0x83ffu : 0x807fu; /* sign + mantissa */
  for (size_t i = 0; i + 2 <= bytes.size(); i += 2) {
    uint16_t v;
    memcpy(&v, &bytes[i], 2);
    if (v & 1u) v = (uint16_t)(v & keep);
    memcpy(&bytes[i], &v, 2);
  }
}

void test_vector_conversion_matches_scalar(void **state) {
  (void)state;
  for (int32_t dtype : {FD_DTYPE_F16, FD_DTYPE_BF16})
    for (uint32_t dim : {128u, 40u, 17u}) {
      std::vector<uint8_t> outs[2];
      for (int layout = 0; layout < 2; ++layout) {
        Case c;
        c.seed = 77 + dim;
        c.dtype = dtype;
        c.layout = layout ? FD_LAYOUT_DIM_MAJOR : FD_LAYOUT_TOKEN_MAJOR;
        c.hq = 8, c.hkv = 2, c.dim = dim, c.bs = 16, c.mbps = 40, c.batch = 2;
        c.lens.push_back(600);
        c.lens.push_back(97);
        c.cpu_threads = layout ? 1u : 3u;
        Problem p = build(c);
        make_some_subnormal(p.k_cache, dtype);
        make_some_subnormal(p.v_cache, dtype);
        fd_decode_params prm = params_for(p);
        FD_ASSERT_OK(fd_decode(&prm));
        outs[layout] = p.out;
      }
      assert_memory_equal(outs[0].data(), outs[1].data(), outs[0].size());
    }
}

/* Table entries past a row's last used block are never read or checked. */
void test_unused_table_entries_ignored(void **state) {
  (void)state;
  Case c;
  c.dtype = FD_DTYPE_F32;
  c.hq = 4, c.hkv = 2, c.dim = 16, c.bs = 4, c.mbps = 5, c.batch = 3;
  c.lens = {5, 0, 8};
  Problem p = build(c);
  fd_decode_params prm = params_for(p);
  FD_ASSERT_OK(fd_decode(&prm));
  const std::vector<uint8_t> want = p.out;
  p.tables[2] = 123456;            /* row 0 uses 2 blocks */
  p.tables[5] = -7;                /* row 1 is empty */
  p.tables[5 * 2 + 2] = INT32_MAX; /* row 2 uses 2 blocks */
  p.out.assign(p.out.size(), 0xFF);
  FD_ASSERT_OK(fd_decode(&prm));
  assert_memory_equal(want.data(), p.out.data(), want.size());
}

/* sm_scale 0 means 1/sqrt(head_dim); a hint equal to the longest row changes nothing. */
void test_scale_default_and_hint(void **state) {
  (void)state;
  Case c;
  c.dtype = FD_DTYPE_F32;
  c.hq = 8, c.hkv = 2, c.dim = 64, c.bs = 8, c.mbps = 6, c.batch = 2;
  c.lens = {37, 20};
  Problem p = build(c);
  fd_decode_params prm = params_for(p);
  FD_ASSERT_OK(fd_decode(&prm));
  const std::vector<uint8_t> want = p.out;
  prm.sm_scale = 0.125f; /* = 1/sqrt(64) */
  prm.max_seq_len_hint = 37;
  p.out.assign(p.out.size(), 0xFF);
  FD_ASSERT_OK(fd_decode(&prm));
  assert_memory_equal(want.data(), p.out.data(), want.size());
  prm.sm_scale = 0.5f;
  FD_ASSERT_OK(fd_decode(&prm));
  assert_true(memcmp(want.data(), p.out.data(), want.size()) != 0);
}

void test_params_init(void **state) {
  (void)state;
  fd_decode_params prm;
  memset(&prm, 0x5A, sizeof prm);
  fd_decode_params_init(&prm);
  assert_int_equal(prm.struct_size, sizeof prm);
  assert_int_equal(prm.q_dtype, FD_DTYPE_BF16);
  assert_int_equal(prm.kv_dtype, FD_DTYPE_BF16);
  assert_int_equal(prm.out_dtype, FD_DTYPE_BF16);
  assert_true(prm.q_indptr == NULL);
  assert_int_equal(prm.max_q_len_hint, 0);
  assert_int_equal(prm.layout, FD_LAYOUT_TOKEN_MAJOR);
  assert_int_equal(prm.device.type, FD_DEVICE_CPU);
  assert_int_equal(prm.device.ordinal, 0);
  assert_int_equal(prm.num_splits, 0);
  assert_int_equal(prm.stride_block | prm.stride_head | prm.stride_token | prm.stride_dim, 0);
  assert_true(prm.q == NULL && prm.out == NULL && prm.workspace == NULL && prm.stream == NULL);
  assert_int_equal(prm.cpu_threads, 0);
  assert_true(prm.sm_scale == 0.f);
  fd_decode_params_init(NULL); /* ignored */
}

/* An older caller's struct ends at `out`: the tail must take defaults, whatever bytes follow. */
void test_older_struct_size(void **state) {
  (void)state;
  Case c;
  c.dtype = FD_DTYPE_F16;
  c.hq = 4, c.hkv = 1, c.dim = 32, c.bs = 16, c.mbps = 3, c.batch = 2;
  c.lens = {40, 3};
  Problem p = build(c);
  fd_decode_params prm = params_for(p);
  FD_ASSERT_OK(fd_decode(&prm));
  const std::vector<uint8_t> want = p.out;
  prm.struct_size = (uint32_t)(offsetof(fd_decode_params, out) + sizeof(void *));
  prm.max_seq_len_hint = -5;
  prm.num_splits = -1;
  prm.device.type = 99;
  prm.device.ordinal = 3;
  prm.sm_scale = -1.f;
  prm.flags = 0x80u;
  prm.max_q_len_hint = 7;
  p.out.assign(p.out.size(), 0xFF);
  FD_ASSERT_OK(fd_decode(&prm));
  assert_memory_equal(want.data(), p.out.data(), want.size());
  size_t bytes = 99;
  FD_ASSERT_OK(fd_decode_workspace_size(&prm, &bytes));
  assert_int_equal(bytes, 0);
}

/* The small valid problem every error case starts from. */
Problem error_base() {
  Case c;
  c.dtype = FD_DTYPE_F16;
  c.hq = 4, c.hkv = 2, c.dim = 8, c.bs = 4, c.mbps = 3, c.batch = 3;
  c.lens = {5, 0, 12};
  return build(c);
}

/* fd_decode and fd_decode_workspace_size must fail the same way, and neither
 * may write anything. */
#define EXPECT_DECODE_FAILS(mutate, status, substring)               \
  do {                                                               \
    Problem p = error_base();                                        \
    fd_decode_params prm_ = params_for(p);                           \
    fd_decode_params *prm = &prm_;                                   \
    mutate;                                                          \
    const std::vector<uint8_t> before = p.out;                       \
    FD_ASSERT_FAILS(fd_decode(prm), status, substring);              \
    assert_memory_equal(before.data(), p.out.data(), before.size()); \
  } while (0)

#define EXPECT_BOTH_FAIL(mutate, status, substring)                            \
  do {                                                                         \
    EXPECT_DECODE_FAILS(mutate, status, substring);                            \
    Problem p = error_base();                                                  \
    fd_decode_params prm_ = params_for(p);                                     \
    fd_decode_params *prm = &prm_;                                             \
    mutate;                                                                    \
    size_t bytes = 12345;                                                      \
    FD_ASSERT_FAILS(fd_decode_workspace_size(prm, &bytes), status, substring); \
    assert_int_equal(bytes, 12345);                                            \
  } while (0)

void test_parameter_errors(void **state) {
  (void)state;
  EXPECT_BOTH_FAIL(prm = NULL, FD_ERR_INVALID_ARGUMENT, "params must not be NULL");
  EXPECT_BOTH_FAIL(prm->struct_size = 0, FD_ERR_INVALID_ARGUMENT, "struct_size");
  EXPECT_BOTH_FAIL(prm->struct_size = (uint32_t)offsetof(fd_decode_params, out),
                   FD_ERR_INVALID_ARGUMENT, "struct_size");
  EXPECT_BOTH_FAIL(prm->struct_size = sizeof(fd_decode_params) + 8, FD_ERR_INVALID_ARGUMENT,
                   "struct_size");
  EXPECT_BOTH_FAIL(prm->q_dtype = 3, FD_ERR_INVALID_ARGUMENT, "q_dtype 3");
  EXPECT_BOTH_FAIL(prm->kv_dtype = 5, FD_ERR_INVALID_ARGUMENT, "kv_dtype 5");
  EXPECT_BOTH_FAIL(prm->out_dtype = -1, FD_ERR_INVALID_ARGUMENT, "out_dtype -1");
  EXPECT_BOTH_FAIL(prm->layout = 2, FD_ERR_INVALID_ARGUMENT, "layout 2");
  EXPECT_BOTH_FAIL(prm->device.type = 2, FD_ERR_INVALID_ARGUMENT, "device.type 2");
  EXPECT_BOTH_FAIL(prm->device.ordinal = 1, FD_ERR_INVALID_ARGUMENT, "device.ordinal");
  EXPECT_BOTH_FAIL((prm->device.type = FD_DEVICE_CUDA, prm->device.ordinal = -1),
                   FD_ERR_INVALID_ARGUMENT, "device.ordinal");
  EXPECT_BOTH_FAIL(prm->batch = 0, FD_ERR_INVALID_ARGUMENT, "batch must be > 0");
  EXPECT_BOTH_FAIL(prm->num_q_heads = 0, FD_ERR_INVALID_ARGUMENT, "num_q_heads must be > 0");
  EXPECT_BOTH_FAIL(prm->num_kv_heads = 0, FD_ERR_INVALID_ARGUMENT, "num_kv_heads must be > 0");
  EXPECT_BOTH_FAIL(prm->num_q_heads = 3, FD_ERR_INVALID_ARGUMENT, "multiple of num_kv_heads");
  EXPECT_BOTH_FAIL(prm->num_q_heads = 1, FD_ERR_INVALID_ARGUMENT, "multiple of num_kv_heads");
  EXPECT_BOTH_FAIL(prm->head_dim = 0, FD_ERR_INVALID_ARGUMENT, "head_dim must be > 0");
  EXPECT_BOTH_FAIL(prm->block_size = 0, FD_ERR_INVALID_ARGUMENT, "block_size must be > 0");
  EXPECT_BOTH_FAIL(prm->num_blocks = 0, FD_ERR_INVALID_ARGUMENT, "num_blocks must be > 0");
  EXPECT_BOTH_FAIL(prm->max_blocks_per_seq = 0, FD_ERR_INVALID_ARGUMENT,
                   "max_blocks_per_seq must be > 0");
  EXPECT_BOTH_FAIL(prm->sm_scale = -0.5f, FD_ERR_INVALID_ARGUMENT, "sm_scale");
  EXPECT_BOTH_FAIL(prm->sm_scale = NAN, FD_ERR_INVALID_ARGUMENT, "sm_scale");
  EXPECT_BOTH_FAIL(prm->sm_scale = INFINITY, FD_ERR_INVALID_ARGUMENT, "sm_scale");
  EXPECT_BOTH_FAIL(prm->flags = 0x80u, FD_ERR_INVALID_ARGUMENT, "flags");
  EXPECT_DECODE_FAILS(prm->q = NULL, FD_ERR_INVALID_ARGUMENT, "q must not be NULL");
  EXPECT_DECODE_FAILS(prm->k_cache = NULL, FD_ERR_INVALID_ARGUMENT, "k_cache must not be NULL");
  EXPECT_DECODE_FAILS(prm->v_cache = NULL, FD_ERR_INVALID_ARGUMENT, "v_cache must not be NULL");
  EXPECT_DECODE_FAILS(prm->block_tables = NULL, FD_ERR_INVALID_ARGUMENT,
                      "block_tables must not be NULL");
  EXPECT_DECODE_FAILS(prm->seq_lens = NULL, FD_ERR_INVALID_ARGUMENT, "seq_lens must not be NULL");
  EXPECT_DECODE_FAILS(prm->out = NULL, FD_ERR_INVALID_ARGUMENT, "out must not be NULL");
  EXPECT_BOTH_FAIL(prm->max_seq_len_hint = -1, FD_ERR_INVALID_ARGUMENT, "max_seq_len_hint");
  EXPECT_BOTH_FAIL(prm->max_seq_len_hint = 13, FD_ERR_INVALID_ARGUMENT, "max_seq_len_hint");
  EXPECT_BOTH_FAIL(prm->num_splits = -2, FD_ERR_INVALID_ARGUMENT, "num_splits");
  EXPECT_BOTH_FAIL(prm->workspace_size = 64, FD_ERR_INVALID_ARGUMENT, "workspace");
  EXPECT_BOTH_FAIL(prm->max_q_len_hint = -1, FD_ERR_INVALID_ARGUMENT, "max_q_len_hint");
  /* On CUDA the host cannot read q_indptr: the hint must bound the rows
   * (refused before the device is looked at; multi-token queries:
   * tests/test_decode_multi_token.cpp, gpu_decode). */
  static const int32_t indptr[4] = {0, 1, 2, 3};
  EXPECT_BOTH_FAIL((prm->device.type = FD_DEVICE_CUDA, prm->q_indptr = indptr),
                   FD_ERR_INVALID_ARGUMENT, "max_q_len_hint must be > 0 with q_indptr on CUDA");
  /* Since 0.2 (S1.1) the CPU backend serves q_dtype and out_dtype of any
   * compute type over any kv_dtype (tests/test_fp8_decode.cpp); FP8 is a
   * K/V type only, and the scales are finite and > 0. */
  EXPECT_BOTH_FAIL(prm->q_dtype = FD_DTYPE_FP8_E4M3, FD_ERR_INVALID_ARGUMENT, "q_dtype 3");
  EXPECT_BOTH_FAIL(prm->out_dtype = FD_DTYPE_FP8_E5M2, FD_ERR_INVALID_ARGUMENT,
                   "out_dtype 4 (fp8_e5m2) is a storage type");
  EXPECT_BOTH_FAIL(prm->k_scale = 0.f, FD_ERR_INVALID_ARGUMENT, "k_scale");
  EXPECT_BOTH_FAIL(prm->v_scale = -1.f, FD_ERR_INVALID_ARGUMENT, "v_scale");
  EXPECT_BOTH_FAIL(prm->k_scale = NAN, FD_ERR_INVALID_ARGUMENT, "k_scale");
  EXPECT_BOTH_FAIL(prm->v_scale = INFINITY, FD_ERR_INVALID_ARGUMENT, "v_scale");
  EXPECT_DECODE_FAILS(prm->out = (void *)prm->q, FD_ERR_INVALID_ARGUMENT, "out must not overlap q");
  EXPECT_DECODE_FAILS(prm->out = (void *)((const char *)prm->k_cache + 2), FD_ERR_INVALID_ARGUMENT,
                      "out must not overlap k_cache");
  EXPECT_DECODE_FAILS(prm->out = (void *)prm->seq_lens, FD_ERR_INVALID_ARGUMENT,
                      "out must not overlap seq_lens");
  /* Typed reads need element-aligned arrays (f16: 2 bytes, int32: 4). */
#define SHIFTED(ptr, bytes) ((char *)(ptr) + (bytes))
  EXPECT_BOTH_FAIL(prm->q = SHIFTED(prm->q, 1), FD_ERR_INVALID_ARGUMENT,
                   "must be aligned to 2 bytes");
  EXPECT_BOTH_FAIL(prm->q = SHIFTED(prm->q, 1), FD_ERR_INVALID_ARGUMENT, "q (");
  EXPECT_BOTH_FAIL(prm->k_cache = SHIFTED(prm->k_cache, 1), FD_ERR_INVALID_ARGUMENT, "k_cache (");
  EXPECT_BOTH_FAIL(prm->v_cache = SHIFTED(prm->v_cache, 1), FD_ERR_INVALID_ARGUMENT, "v_cache (");
  EXPECT_BOTH_FAIL(prm->out = SHIFTED(prm->out, 1), FD_ERR_INVALID_ARGUMENT, "out (");
  EXPECT_BOTH_FAIL(prm->block_tables = (const int32_t *)SHIFTED(prm->block_tables, 2),
                   FD_ERR_INVALID_ARGUMENT, "block_tables (");
  EXPECT_BOTH_FAIL(prm->seq_lens = (const int32_t *)SHIFTED(prm->seq_lens, 2),
                   FD_ERR_INVALID_ARGUMENT, "must be aligned to 4 bytes");
#undef SHIFTED
}

/* f32 is a CPU-only element type: refused for CUDA before the device is looked at. */
void test_f32_on_cuda_unsupported(void **state) {
  (void)state;
  Case c;
  c.dtype = FD_DTYPE_F32;
  c.hq = 8, c.hkv = 2, c.dim = 128, c.bs = 16, c.mbps = 2, c.batch = 2;
  c.lens = {17, 32};
  Problem p = build(c);
  fd_decode_params prm = params_for(p);
  prm.device.type = FD_DEVICE_CUDA;
  const std::vector<uint8_t> before = p.out;
  FD_ASSERT_FAILS(fd_decode(&prm), FD_ERR_UNSUPPORTED, "dtype f32");
  assert_memory_equal(before.data(), p.out.data(), before.size());
  size_t bytes = 12345;
  FD_ASSERT_FAILS(fd_decode_workspace_size(&prm, &bytes), FD_ERR_UNSUPPORTED, "dtype f32");
  assert_int_equal(bytes, 12345);
}

void test_stride_errors(void **state) {
  (void)state;
  /* Packed strides of the base problem: {H*B*D, B*D, D, 1} = {64, 32, 8, 1}. */
#define SET_STRIDES(b, h, t, d) \
  (prm->stride_block = (b), prm->stride_head = (h), prm->stride_token = (t), prm->stride_dim = (d))
  EXPECT_BOTH_FAIL(SET_STRIDES(64, 32, 8, 0), FD_ERR_INVALID_ARGUMENT, "stride_dim must be > 0");
  EXPECT_BOTH_FAIL(SET_STRIDES(0, 32, 8, 1), FD_ERR_INVALID_ARGUMENT, "stride_block must be > 0");
  EXPECT_BOTH_FAIL(SET_STRIDES(64, -32, 8, 1), FD_ERR_INVALID_ARGUMENT, "stride_head must be > 0");
  EXPECT_BOTH_FAIL(SET_STRIDES(64, 32, 0, 1), FD_ERR_INVALID_ARGUMENT, "stride_token must be > 0");
  EXPECT_BOTH_FAIL(SET_STRIDES(64, 32, 1, 4), FD_ERR_INVALID_ARGUMENT,
                   "stride_dim must be 1 for the token-major layout");
  EXPECT_BOTH_FAIL((prm->layout = FD_LAYOUT_DIM_MAJOR, SET_STRIDES(64, 32, 8, 1)),
                   FD_ERR_INVALID_ARGUMENT, "stride_token must be 1 for the dim-major layout");
  EXPECT_BOTH_FAIL(SET_STRIDES(INT64_MAX / 2, 32, 8, 1), FD_ERR_INVALID_ARGUMENT,
                   "too large to address");
  EXPECT_BOTH_FAIL((prm->num_blocks = 0xffffffffu, prm->num_kv_heads = 0xffffffffu,
                    prm->num_q_heads = 0xffffffffu, prm->head_dim = 0xffffffffu),
                   FD_ERR_INVALID_ARGUMENT, "too large to address");
#undef SET_STRIDES
}

/* Host indices are always checked before anything is written. */
void test_index_errors(void **state) {
  (void)state;
  /* Base: lens {5, 0, 12}, block_size 4, max_blocks_per_seq 3 (capacity 12). */
  EXPECT_DECODE_FAILS(p.lens[1] = -1, FD_ERR_INVALID_ARGUMENT, "seq_lens[1] = -1 (row 1)");
  EXPECT_DECODE_FAILS(p.lens[0] = 13, FD_ERR_INVALID_ARGUMENT, "seq_lens[0] = 13 (row 0)");
  EXPECT_DECODE_FAILS(p.lens[2] = INT32_MAX, FD_ERR_INVALID_ARGUMENT, "seq_lens[2] = 2147483647");
  EXPECT_DECODE_FAILS(prm->max_seq_len_hint = 11, FD_ERR_INVALID_ARGUMENT,
                      "seq_lens[2] = 12 (row 2) exceeds max_seq_len_hint = 11");
  EXPECT_DECODE_FAILS(p.tables[2 * 3 + 2] = -1, FD_ERR_INVALID_ARGUMENT,
                      "block_tables[2][2] = -1 (row 2");
  EXPECT_DECODE_FAILS(p.tables[1] = (int32_t)p.num_blocks, FD_ERR_INVALID_ARGUMENT,
                      "block_tables[0][1]");
  /* Row 1 becomes non-empty, so its first (unused, -1) table entry is now checked. */
  EXPECT_DECODE_FAILS(p.lens[1] = 1, FD_ERR_INVALID_ARGUMENT, "block_tables[1][0] = -1 (row 1");
}

void test_workspace_size_and_devices(void **state) {
  (void)state;
  Problem p = error_base();
  fd_decode_params prm = params_for(p);
  size_t bytes = 12345;
  FD_ASSERT_OK(fd_decode_workspace_size(&prm, &bytes));
  assert_int_equal(bytes, 0);
  FD_ASSERT_FAILS(fd_decode_workspace_size(&prm, NULL), FD_ERR_INVALID_ARGUMENT,
                  "bytes must not be NULL");
}

/* Buffers are not part of a workspace query or a plan: NULL is fine there. */
void test_plan_without_buffers(void **state) {
  (void)state;
  Problem p = error_base();
  fd_decode_params prm = params_for(p);
  prm.q = NULL, prm.k_cache = NULL, prm.v_cache = NULL, prm.out = NULL;
  prm.block_tables = NULL, prm.seq_lens = NULL;
  size_t bytes = 12345;
  FD_ASSERT_OK(fd_decode_workspace_size(&prm, &bytes));
  assert_int_equal(bytes, 0);
  fd_decode_plan *plan = NULL;
  FD_ASSERT_OK(fd_decode_plan_create(&prm, NULL, &plan));
  assert_non_null(plan);
  bytes = 12345;
  FD_ASSERT_OK(fd_decode_plan_workspace_size(plan, &bytes));
  assert_int_equal(bytes, 0); /* the CPU backend keeps partials in host scratch */
  /* A run needs every buffer. */
  FD_ASSERT_FAILS(fd_decode_run(plan, &prm), FD_ERR_INVALID_ARGUMENT, "q must not be NULL");
  fd_decode_plan_destroy(plan);
  fd_decode_plan_destroy(NULL); /* ignored */
}

/* Plan + run gives fd_decode's bits, with or without the exact host lengths,
 * and one plan serves every call of its shape (other buffers, other scale:
 * the run's params decide those). */
void test_plan_run_matches_decode(void **state) {
  (void)state;
  for (int32_t dtype : {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16}) {
    Case c;
    c.dtype = dtype;
    c.hq = 8, c.hkv = 2, c.dim = 64, c.bs = 16, c.mbps = 40, c.batch = 3;
    c.lens = {600, 0, 517};
    Problem p = build(c);
    fd_decode_params prm = params_for(p);
    prm.sm_scale = 0.3f;
    FD_ASSERT_OK(fd_decode(&prm));
    const std::vector<uint8_t> want = p.out;
    for (int with_lens = 0; with_lens < 2; ++with_lens) {
      fd_decode_plan *plan = NULL;
      FD_ASSERT_OK(fd_decode_plan_create(&prm, with_lens ? p.lens.data() : NULL, &plan));
      for (int layer = 0; layer < 2; ++layer) {
        p.out.assign(p.out.size(), 0xA5);
        FD_ASSERT_OK(fd_decode_run(plan, &prm));
        assert_memory_equal(want.data(), p.out.data(), want.size());
      }
      fd_decode_plan_destroy(plan);
    }
  }
}

/* Plan and run errors: status, message, and nothing written or created. */
void test_plan_errors(void **state) {
  (void)state;
  Problem p = error_base(); /* lens {5, 0, 12}, capacity 12 */
  fd_decode_params prm = params_for(p);
  fd_decode_plan *plan = (fd_decode_plan *)0x1; /* must stay untouched on failure */
  FD_ASSERT_FAILS(fd_decode_plan_create(NULL, NULL, &plan), FD_ERR_INVALID_ARGUMENT,
                  "params must not be NULL");
  FD_ASSERT_FAILS(fd_decode_plan_create(&prm, NULL, NULL), FD_ERR_INVALID_ARGUMENT,
                  "out must not be NULL");
  const int32_t too_long[3] = {5, 13, 12};
  FD_ASSERT_FAILS(fd_decode_plan_create(&prm, too_long, &plan), FD_ERR_INVALID_ARGUMENT,
                  "host_seq_lens[1] = 13");
  const int32_t negative[3] = {5, 0, -1};
  FD_ASSERT_FAILS(fd_decode_plan_create(&prm, negative, &plan), FD_ERR_INVALID_ARGUMENT,
                  "host_seq_lens[2] = -1");
  prm.max_seq_len_hint = 6; /* the lengths must respect the hint too */
  FD_ASSERT_FAILS(fd_decode_plan_create(&prm, p.lens.data(), &plan), FD_ERR_INVALID_ARGUMENT,
                  "host_seq_lens[2] = 12 is out of range [0, max_seq_len_hint = 6]");
  prm.max_seq_len_hint = 0;
  FD_ASSERT_FAILS(fd_decode_plan_create(&prm, (const int32_t *)((char *)p.lens.data() + 2), &plan),
                  FD_ERR_INVALID_ARGUMENT, "host_seq_lens (");
  static const int32_t indptr[4] = {0, 1, 2, 3};
  prm.q_indptr = indptr, prm.device.type = FD_DEVICE_CUDA;
  FD_ASSERT_FAILS(fd_decode_plan_create(&prm, NULL, &plan), FD_ERR_INVALID_ARGUMENT,
                  "max_q_len_hint must be > 0");
  prm.q_indptr = NULL, prm.device.type = FD_DEVICE_CPU;
  assert_ptr_equal(plan, (fd_decode_plan *)0x1);

  plan = NULL;
  FD_ASSERT_OK(fd_decode_plan_create(&prm, p.lens.data(), &plan));
  const std::vector<uint8_t> before = p.out;
  FD_ASSERT_FAILS(fd_decode_run(NULL, &prm), FD_ERR_INVALID_ARGUMENT, "plan must not be NULL");
  FD_ASSERT_FAILS(fd_decode_run(plan, NULL), FD_ERR_INVALID_ARGUMENT, "params must not be NULL");
  /* The shape a plan was made for cannot change under it. */
  fd_decode_params other = prm;
  other.batch = 2;
  FD_ASSERT_FAILS(fd_decode_run(plan, &other), FD_ERR_INVALID_ARGUMENT,
                  "params batch 2 differs from the plan's 3");
  other = prm;
  other.num_q_heads = 2, other.num_kv_heads = 1;
  FD_ASSERT_FAILS(fd_decode_run(plan, &other), FD_ERR_INVALID_ARGUMENT,
                  "params num_q_heads 2 differs from the plan's 4");
  other = prm;
  other.layout = FD_LAYOUT_DIM_MAJOR; /* the plan prepared a token-major kernel */
  FD_ASSERT_FAILS(fd_decode_run(plan, &other), FD_ERR_INVALID_ARGUMENT,
                  "params layout 1 differs from the plan's 0");
  other = prm;
  fd_test_decode_dtype(&other, FD_DTYPE_BF16); /* and f16 element types */
  FD_ASSERT_FAILS(fd_decode_run(plan, &other), FD_ERR_INVALID_ARGUMENT,
                  "params q_dtype 2 differs from the plan's 1");
  other = prm;
  other.device.type = FD_DEVICE_CUDA;
  FD_ASSERT_FAILS(fd_decode_run(plan, &other), FD_ERR_INVALID_ARGUMENT,
                  "params device.type 1 differs from the plan's 0");
  /* A run checks its own params and indices as fd_decode does. */
  other = prm;
  other.sm_scale = -1.f;
  FD_ASSERT_FAILS(fd_decode_run(plan, &other), FD_ERR_INVALID_ARGUMENT, "sm_scale");
  p.lens[0] = 13;
  FD_ASSERT_FAILS(fd_decode_run(plan, &prm), FD_ERR_INVALID_ARGUMENT, "seq_lens[0] = 13");
  p.lens[0] = 5;
  assert_memory_equal(before.data(), p.out.data(), before.size());
  size_t bytes = 0;
  FD_ASSERT_FAILS(fd_decode_plan_workspace_size(NULL, &bytes), FD_ERR_INVALID_ARGUMENT,
                  "plan must not be NULL");
  FD_ASSERT_FAILS(fd_decode_plan_workspace_size(plan, NULL), FD_ERR_INVALID_ARGUMENT,
                  "bytes must not be NULL");
  FD_ASSERT_OK(fd_decode_run(plan, &prm));
  fd_decode_plan_destroy(plan);
}

/* Whether an armed failure reaches the shared library's allocations: a
 * cache is always made with operator new. */
bool injection_reaches_library() {
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_kv_heads = 1, cfg.head_dim = 8, cfg.max_blocks = 2;
  fd_cache *cache = NULL;
  fd_alloc_fail_arm(0);
  const fd_status st = fd_cache_create(&cfg, &cache);
  const bool fired = fd_alloc_fail_disarm();
  if (st == FD_OK) fd_cache_destroy(cache);
  return fired;
}

/* A plan that cannot be allocated: FD_ERR_OUT_OF_MEMORY naming it, the out
 * handle untouched; every allocation of the call is failed in turn until
 * one run needs no more. */
void test_plan_create_out_of_memory(void **state) {
  (void)state;
  Problem p = error_base();
  fd_decode_params prm = params_for(p);
  int failed = 0;
  for (long k = 0;; ++k) {
    fd_decode_plan *plan = (fd_decode_plan *)0x1;
    fd_alloc_fail_arm(k);
    const fd_status st = fd_decode_plan_create(&prm, p.lens.data(), &plan);
    const bool used = fd_alloc_failures::t_allocations_left < 0;
    fd_alloc_fail_arm(-1);
    if (!used) {
      FD_ASSERT_OK(st);
      fd_decode_plan_destroy(plan);
      if (k == 0 && !injection_reaches_library()) {
        print_message(
            "NOTE: this binary's operator new does not reach libflashdec here (the "
            "toolchain binds the library's allocations inside it); skipped\n");
        return;
      }
      break;
    }
    assert_int_equal(st, FD_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(fd_last_error_message(), "fd_decode_plan"));
    assert_ptr_equal(plan, (fd_decode_plan *)0x1);
    ++failed;
  }
  assert_true(failed >= 1);
}

/* Without a usable CUDA device the CUDA backend answers NO_DEVICE. The shape is
 * one the CUDA kernel serves (S1), so only the missing device can fail it. */
void test_cuda_without_device(void **state) {
  (void)state;
  int32_t devices = -1;
  FD_ASSERT_OK(fd_cuda_device_count(&devices));
  if (devices != 0) {
    print_message("NOTE: %d CUDA device(s) visible; the no-device check is skipped\n", devices);
    return;
  }
  Case c;
  c.dtype = FD_DTYPE_BF16;
  c.hq = 8, c.hkv = 2, c.dim = 128, c.bs = 16, c.mbps = 4, c.batch = 2;
  c.lens = {40, 64};
  Problem p = build(c);
  fd_decode_params prm = params_for(p);
  prm.device.type = FD_DEVICE_CUDA;
  const std::vector<uint8_t> before = p.out;
  FD_ASSERT_FAILS(fd_decode(&prm), FD_ERR_NO_DEVICE, "CUDA device 0");
  assert_memory_equal(before.data(), p.out.data(), before.size());
  size_t bytes = 12345;
  FD_ASSERT_FAILS(fd_decode_workspace_size(&prm, &bytes), FD_ERR_NO_DEVICE, "CUDA device 0");
  assert_int_equal(bytes, 12345);
  fd_decode_plan *plan = NULL;
  FD_ASSERT_FAILS(fd_decode_plan_create(&prm, NULL, &plan), FD_ERR_NO_DEVICE, "CUDA device 0");
  assert_null(plan);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paged_matches_dense_sweep),
      cmocka_unit_test(test_long_rows),
      cmocka_unit_test(test_deterministic_across_thread_counts),
      cmocka_unit_test(test_long_row_chunks_across_thread_counts),
      cmocka_unit_test(test_mixed_chunk_rows_across_thread_counts),
      cmocka_unit_test(test_vector_conversion_matches_scalar),
      cmocka_unit_test(test_unused_table_entries_ignored),
      cmocka_unit_test(test_scale_default_and_hint),
      cmocka_unit_test(test_params_init),
      cmocka_unit_test(test_older_struct_size),
      cmocka_unit_test(test_parameter_errors),
      cmocka_unit_test(test_f32_on_cuda_unsupported),
      cmocka_unit_test(test_stride_errors),
      cmocka_unit_test(test_index_errors),
      cmocka_unit_test(test_workspace_size_and_devices),
      cmocka_unit_test(test_plan_without_buffers),
      cmocka_unit_test(test_plan_run_matches_decode),
      cmocka_unit_test(test_plan_errors),
      cmocka_unit_test(test_plan_create_out_of_memory),
      cmocka_unit_test(test_cuda_without_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
