/* The CUDA backend's split-KV planning (src/attention/decode_splits.cpp),
 * checked on the CPU with the CTA slots of an H200 (132 SMs; 3 resident
 * CTAs per SM at head_dim 128, 4 at 64, 2 in the deep shape; the swapped
 * FP8 kernel 4 and 6, 3 and 4 in its deep shape, staged by cp.async or
 * TMA): the split counts, lead units and deep shape it picks for the
 * benchmark grid are those the H200 ran and timed (16-bit: call 6 of
 * docs/perf/h200-session10-ae15739-2026-12-02.json; FP8: session 12,
 * docs/perf/h200-session12-57eb3ef-2026-12-02.json; decode_bench --quick:
 * its "splits" column is slot_splits()), and the deep shape only where it
 * serves: 16-bit token-major plain calls of one query token, lists of at
 * most 2 items per SM of at least 4 tiles, or unsplit lists of up to two
 * deep waves; FP8 swapped lists that fill exactly one wave of its deep
 * shape; TMA staging only for FP8 one-wave lists of items of at most 4
 * tiles. The CUDA suites check what the kernels do with these
 * lists (gpu_decode, gpu_fp8). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <initializer_list>
#include <vector>

#include "attention/decode_splits.hpp"
#include "fd_test.h"

namespace {

using fd::DecodeProblem;
using fd::DecodeWorkList;

/* An H200's slots for a problem of head_dim `dim` (no Hopper kernel: one
 * query token per row). */
fd::cuda::DecodeSlots h200(uint32_t dim) {
  fd::cuda::DecodeSlots s;
  s.sms = 132;
  s.ctas_per_sm = dim == 64 ? 4 : 3;
  s.deep_ctas_per_sm = 2;
  s.sm90_device = true;
  return s;
}

struct Shape {
  const char *name;
  uint32_t hq, hkv, dim;
};
const Shape kA = {"A", 32, 8, 128}, kB = {"B", 32, 32, 128}, kC = {"C", 16, 2, 128},
            kD = {"D", 32, 4, 64};

/* decode_bench's problem: `batch` rows planned for `len` keys (ragged rows:
 * the 8192 hint), block 16, token-major, automatic splits. */
DecodeProblem problem(const Shape &sh, uint32_t batch, int32_t len, int32_t kv_dtype) {
  DecodeProblem pb;
  pb.batch = batch;
  pb.num_q_heads = sh.hq;
  pb.num_kv_heads = sh.hkv;
  pb.head_dim = sh.dim;
  pb.group_size = sh.hq / sh.hkv;
  pb.q_dtype = pb.out_dtype = FD_DTYPE_BF16;
  pb.kv.dtype = kv_dtype;
  pb.kv.layout = FD_LAYOUT_TOKEN_MAJOR;
  pb.kv.block_size = 16;
  pb.kv.num_kv_heads = sh.hkv;
  pb.kv.head_dim = sh.dim;
  pb.max_seq_len = len;
  return pb;
}

/* The slots src/cuda/decode_cuda.cpp gives a problem on an H200: the
 * swapped FP8 kernel's (4 CTAs per SM at head_dim 128, 6 at 64; its deep
 * shape 3 and 4) for the calls it serves. */
fd::cuda::DecodeSlots h200_for(const DecodeProblem &pb) {
  fd::cuda::DecodeSlots s = h200(pb.head_dim);
  if (fd::cuda::takes_swapped(pb)) {
    s.ctas_per_sm = pb.head_dim == 64 ? 6 : 4;
    s.deep_ctas_per_sm = pb.head_dim == 64 ? 4 : 3; /* its deep shape */
  }
  return s;
}

DecodeWorkList plan(const DecodeProblem &pb) {
  return fd::cuda::plan_decode_splits(pb, pb.max_seq_len, false, h200_for(pb));
}

struct GridCase {
  const Shape *shape;
  uint32_t batch;
  int32_t len;
  int32_t splits, fp8_splits;  // slot_splits() the H200 ran, 16-bit / FP8 K/V
  bool deep;                   // 16-bit: the deep shape
  bool tma;                    // FP8: TMA staging (one-wave lists of items of <= 4 tiles)
  bool fp8_deep;               // FP8: the swapped kernel's deep shape (one full wave of it)
};

const GridCase kGrid[] = {
    {&kA, 1, 32768, 47, 64, false, false, false}, {&kA, 1, 2048, 16, 32, false, true, false},
    {&kA, 8, 8192, 6, 8, false, false, false},    {&kA, 32, 4096, 1, 2, true, false, false},
    {&kA, 64, 4096, 1, 1, true, false, false},    {&kA, 128, 2048, 1, 1, false, false, false},
    {&kA, 256, 1024, 4, 1, false, false, false},  {&kA, 64, 8192, 7, 9, false, false, false},
    {&kB, 1, 32768, 12, 16, false, false, false}, {&kB, 1, 2048, 11, 16, false, true, false},
    {&kB, 8, 8192, 4, 4, false, false, false},    {&kB, 32, 4096, 3, 1, false, false, false},
    {&kB, 64, 4096, 5, 1, false, false, false},   {&kB, 128, 2048, 1, 1, false, false, false},
    {&kB, 256, 1024, 1, 1, false, false, false},  {&kB, 64, 8192, 4, 4, false, false, false},
    {&kC, 1, 32768, 128, 128, true, true, false}, {&kC, 1, 2048, 32, 32, false, true, false},
    {&kC, 8, 8192, 22, 32, false, true, false},   {&kC, 32, 4096, 6, 8, false, false, false},
    {&kC, 64, 4096, 3, 4, false, false, false},   {&kC, 128, 2048, 1, 2, true, false, false},
    {&kC, 256, 1024, 1, 1, true, false, false},   {&kC, 64, 8192, 4, 4, false, false, false},
    {&kD, 1, 32768, 128, 128, false, true, true}, {&kD, 1, 2048, 32, 32, false, true, false},
    {&kD, 8, 8192, 16, 22, false, false, false},  {&kD, 32, 4096, 4, 6, false, false, false},
    {&kD, 64, 4096, 2, 3, false, false, false},   {&kD, 128, 2048, 1, 1, false, false, true},
    {&kD, 256, 1024, 1, 3, false, false, false},  {&kD, 64, 8192, 16, 4, false, false, false},
};

/* Every grid case, 16-bit and FP8 K/V: the split count the H200 ran, the
 * deep shape exactly where the case says (FP8: the swapped kernel's), and TMA
 * staging exactly where it says (FP8 only: the one-wave lists of short items
 * it ran faster on the H200, session 11). */
void test_benchmark_grid(void **state) {
  (void)state;
  for (const GridCase &g : kGrid) {
    for (const int32_t kv : {FD_DTYPE_BF16, FD_DTYPE_FP8_E4M3}) {
      const bool fp8 = kv == FD_DTYPE_FP8_E4M3;
      const DecodeWorkList w = plan(problem(*g.shape, g.batch, g.len, kv));
      const int32_t want = fp8 ? g.fp8_splits : g.splits;
      const bool deep = fp8 ? g.fp8_deep : g.deep;
      const bool tma = fp8 && g.tma;
      if (w.slot_splits() != want || w.deep_stages != deep || w.tma_stages != tma) {
        fail_msg("%s %ux%d %s: %d splits, deep %d, TMA %d; want %d splits, deep %d, TMA %d",
                 g.shape->name, g.batch, g.len, fp8 ? "fp8" : "bf16", w.slot_splits(),
                 w.deep_stages, w.tma_stages, want, deep, tma);
      }
      /* 16-bit: unsplit deep lists fit two deep waves, split ones one;
       * FP8 (the swapped kernel's deep shape, 3 / 4 CTAs per SM): exactly
       * one full wave. */
      if (w.deep_stages) {
        const int64_t per_sm = g.shape->dim == 64 ? 4 : 3;
        if (fp8)
          assert_true(w.size() > 132 * (per_sm - 1) && w.size() <= 132 * per_sm);
        else
          assert_true(w.size() <= (w.num_splits == 1 ? 2 : 1) * 132 * 2);
        assert_int_equal(w.lead_units, 0);
        assert_true(w.tiles_per_split >= 4);
      }
      assert_true(w.sm90_device);
      if (fp8) {
        /* Dim-major FP8 K/V: the same swapped kernel and slots, in its
         * regular shape, staged by cp.async (a TMA box is a token-major
         * block): the splits token-major K/V would take without the deep
         * shape, which are the grid's where that shape is not taken (D 128
         * x 2048: 3 instead of 1). */
        DecodeProblem dm = problem(*g.shape, g.batch, g.len, kv);
        dm.kv.layout = FD_LAYOUT_DIM_MAJOR;
        const DecodeWorkList d = plan(dm);
        fd::cuda::DecodeSlots no_deep = h200_for(dm);
        no_deep.deep_ctas_per_sm = 0;
        const DecodeProblem tm = problem(*g.shape, g.batch, g.len, kv);
        const int32_t want_dm =
            fd::cuda::plan_decode_splits(tm, tm.max_seq_len, false, no_deep).slot_splits();
        if (d.slot_splits() != want_dm || d.deep_stages || d.tma_stages)
          fail_msg("%s %ux%d fp8 dim-major: %d splits, deep %d, TMA %d; want %d, 0, 0",
                   g.shape->name, g.batch, g.len, d.slot_splits(), d.deep_stages, d.tma_stages,
                   want_dm);
        if (!deep) assert_int_equal(want_dm, want);
      }
    }
  }
}

/* A C 256 x 1024 list would take lead units at 3 CTAs per SM (512 units on
 * 396 slots); its rows of 1024 tokens fit two deep waves, so it runs
 * unsplit in the deep shape instead. */
void test_two_wave_unsplit(void **state) {
  (void)state;
  const DecodeWorkList w = plan(problem(kC, 256, 1024, FD_DTYPE_BF16));
  assert_int_equal(w.num_splits, 1);
  assert_int_equal(w.lead_units, 0);
  assert_true(w.deep_stages);
  /* 3 x 132 units (one regular wave): unsplit, and 4 x 132 + 1 units (past
   * two deep waves): the regular choice. */
  assert_true(plan(problem(kC, 264, 1024, FD_DTYPE_BF16)).deep_stages);
  const DecodeWorkList past = plan(problem(kC, 265, 1024, FD_DTYPE_BF16));
  assert_false(past.deep_stages);
}

/* `base` changed one way at a time in what neither the deep shape nor TMA
 * staging serves: dim-major K/V (first; the swapped kernel serves it), an
 * attention variant (a soft-cap, a sliding window), several query tokens
 * per row. */
std::vector<DecodeProblem> unserved_variants(const DecodeProblem &base) {
  std::vector<DecodeProblem> out(4, base);
  out[0].kv.layout = FD_LAYOUT_DIM_MAJOR;
  out[1].variant.logit_softcap = 30.f;
  out[2].variant.sliding_window = 128;
  out[3].max_q_len = 4;
  return out;
}

/* Where the deep shape does not serve: dim-major K/V, an attention variant,
 * several query tokens per row, head_dim 64 and 96, FP8 K/V; and items of
 * fewer than 4 tiles. Each keeps the regular shape. */
void test_deep_serves(void **state) {
  (void)state;
  const DecodeProblem base = problem(kC, 1, 32768, FD_DTYPE_BF16);
  assert_true(plan(base).deep_stages);
  for (const DecodeProblem &u : unserved_variants(base)) assert_false(plan(u).deep_stages);
  DecodeProblem p = base;
  p.kv.dtype = FD_DTYPE_FP8_E4M3;
  assert_false(plan(p).deep_stages);
  p = base;
  p.head_dim = p.kv.head_dim = 96;
  assert_false(plan(p).deep_stages);
  /* Explicit splits: 2 rows x 2 KV heads x 4 splits of a 4096-token hint
   * (16 tiles each) take it; of a 512-token hint (2 tiles each) not. */
  p = problem(kC, 2, 4096, FD_DTYPE_BF16);
  p.num_splits = 4;
  assert_true(plan(p).deep_stages);
  p = problem(kC, 2, 512, FD_DTYPE_BF16);
  p.num_splits = 4;
  assert_false(plan(p).deep_stages);
  /* No deep shape on the device (deep_ctas_per_sm 0): never. */
  fd::cuda::DecodeSlots none = h200(128);
  none.deep_ctas_per_sm = 0;
  assert_false(fd::cuda::plan_decode_splits(base, base.max_seq_len, false, none).deep_stages);
}

/* Which calls the swapped FP8 kernel serves (and the plan sizes for its
 * slots): FP8 K/V of either layout, one query token per row, groups of at
 * most 8 heads, no attention variant. */
void test_swapped_serves(void **state) {
  (void)state;
  const DecodeProblem base = problem(kC, 1, 2048, FD_DTYPE_FP8_E4M3);
  assert_true(fd::cuda::takes_swapped(base));
  DecodeProblem p = base;
  p.kv.layout = FD_LAYOUT_DIM_MAJOR;
  assert_true(fd::cuda::takes_swapped(p));
  p.group_size = 1;
  p.num_q_heads = 2;
  assert_true(fd::cuda::takes_swapped(p));
  const std::vector<DecodeProblem> unserved = unserved_variants(base);
  for (size_t i = 1; i < unserved.size(); ++i) assert_false(fd::cuda::takes_swapped(unserved[i]));
  p = base;
  p.num_q_heads = 32;
  p.group_size = 16;
  assert_false(fd::cuda::takes_swapped(p));
  p = base;
  p.kv.dtype = FD_DTYPE_BF16;
  assert_false(fd::cuda::takes_swapped(p));
}

/* The swapped kernel's deep shape: lists that fill exactly one wave of it
 * ((deep - 1) x 132 < items <= deep x 132; deep = 4 CTAs per SM at head_dim
 * 64, 3 at 128) of items of at least 4 tiles; rows of at most 4096 tokens
 * whose units fill it run unsplit. Not for a list one layer short or one
 * item over, items of fewer than 4 tiles, dim-major K/V, or calls the
 * swapped kernel does not serve (groups over 8, an attention variant). */
void test_swap_deep_serves(void **state) {
  (void)state;
  /* D (4 KV heads): 100 x 4 = 400 units of 2048 tokens: unsplit, deep. */
  DecodeProblem p = problem(kD, 100, 2048, FD_DTYPE_FP8_E4M3);
  DecodeWorkList w = plan(p);
  assert_true(w.deep_stages);
  assert_int_equal(w.num_splits, 1);
  assert_int_equal(w.size(), 400);
  assert_true(plan(problem(kD, 132, 2048, FD_DTYPE_FP8_E4M3)).deep_stages);
  assert_false(plan(problem(kD, 99, 2048, FD_DTYPE_FP8_E4M3)).deep_stages);  /* 396 */
  assert_false(plan(problem(kD, 133, 2048, FD_DTYPE_FP8_E4M3)).deep_stages); /* 532 */
  /* C (2 KV heads, head_dim 128): 133 x 2 = 266 units of 1024 tokens. */
  assert_true(plan(problem(kC, 133, 1024, FD_DTYPE_FP8_E4M3)).deep_stages);
  assert_true(plan(problem(kC, 198, 1024, FD_DTYPE_FP8_E4M3)).deep_stages);
  assert_false(plan(problem(kC, 132, 1024, FD_DTYPE_FP8_E4M3)).deep_stages);
  assert_false(plan(problem(kC, 199, 1024, FD_DTYPE_FP8_E4M3)).deep_stages);
  /* Items of 3 tiles (192 tokens) do not take it. */
  assert_false(plan(problem(kD, 100, 192, FD_DTYPE_FP8_E4M3)).deep_stages);
  /* Neither do calls the swapped kernel does not serve. */
  const DecodeProblem base = problem(kD, 100, 2048, FD_DTYPE_FP8_E4M3);
  const std::vector<DecodeProblem> unserved = unserved_variants(base);
  for (size_t i = 1; i < unserved.size(); ++i) assert_false(plan(unserved[i]).deep_stages);
  p = base;
  p.num_q_heads = 64;
  p.group_size = 16;
  assert_false(plan(p).deep_stages);
  /* Nor dim-major K/V (unserved_variants' first). */
  assert_false(plan(unserved[0]).deep_stages);
}

/* Batches the plan knows to be ragged (host lengths: mean at most 2/3 of
 * the longest row, at least 16 rows, rows over 4096 tokens) are cut into at
 * least 1.25 waves of CTAs: C ragged over FP8 (128 units, 528 swapped
 * slots) 4 -> 6 splits, as the H200 ran fastest (session 12); the same
 * batch planned from the hint, or known to be uniform, keeps 4; lists with
 * that many waves already (D, A ragged; C over 16-bit K/V) and batches of
 * fewer rows keep theirs. */
void test_known_ragged(void **state) {
  (void)state;
  auto splits = [](const Shape &sh, uint32_t batch, int32_t kv, int64_t total) {
    const DecodeProblem pb = problem(sh, batch, 8192, kv);
    return fd::cuda::plan_decode_splits(pb, 8192, false, h200_for(pb), total).slot_splits();
  };
  const int64_t ragged = 64 * 4160; /* the mean of U[128, 8192] */
  assert_int_equal(splits(kC, 64, FD_DTYPE_FP8_E4M3, ragged), 6);
  assert_int_equal(splits(kC, 64, FD_DTYPE_FP8_E4M3, 0), 4);
  assert_int_equal(splits(kC, 64, FD_DTYPE_FP8_E4M3, 64 * 8192), 4);
  assert_int_equal(splits(kC, 64, FD_DTYPE_FP8_E4M3, 64 * 5462), 4); /* mean just over 2/3 */
  assert_int_equal(splits(kC, 64, FD_DTYPE_FP8_E4M3, 64 * 5461), 6);
  assert_int_equal(splits(kC, 64, FD_DTYPE_BF16, ragged), 4);
  assert_int_equal(splits(kD, 64, FD_DTYPE_FP8_E4M3, ragged), 4);
  assert_int_equal(splits(kA, 64, FD_DTYPE_FP8_E4M3, ragged), 9);
  assert_int_equal(splits(kC, 8, FD_DTYPE_FP8_E4M3, 8 * 4160), 32);
  assert_int_equal(splits(kC, 8, FD_DTYPE_FP8_E4M3, 0), 32);
}

/* Where TMA staging does not serve, from a list that takes it (C 1 x 2048
 * over FP8): dim-major K/V, an attention variant, several query tokens per
 * row, groups over 8 heads, 16-bit K/V, a device other than compute
 * capability 9.0; and a grid past one wave (the same short items over more
 * rows) or items of more than 4 tiles. */
void test_tma_serves(void **state) {
  (void)state;
  const DecodeProblem base = problem(kC, 1, 2048, FD_DTYPE_FP8_E4M3);
  assert_true(plan(base).tma_stages);
  for (const DecodeProblem &u : unserved_variants(base)) assert_false(plan(u).tma_stages);
  DecodeProblem p = base;
  p.num_q_heads = 32;
  p.group_size = 16;
  assert_false(plan(p).tma_stages);
  p = base;
  p.kv.dtype = FD_DTYPE_BF16;
  assert_false(plan(p).tma_stages);
  fd::cuda::DecodeSlots other = h200(128);
  other.sm90_device = false;
  assert_false(fd::cuda::plan_decode_splits(base, base.max_seq_len, false, other).tma_stages);
  /* Two explicit splits of one tile: 132 rows x 2 KV heads x 2 fill the
   * swapped kernel's 528 slots (TMA), 133 rows do not. */
  p = problem(kC, 132, 128, FD_DTYPE_FP8_E4M3);
  p.num_splits = 2;
  const DecodeWorkList fits = plan(p);
  assert_int_equal(fits.size(), 528);
  assert_true(fits.tma_stages);
  p.batch = 133;
  assert_false(plan(p).tma_stages);
  /* 4 tiles per item take it, 5 do not. */
  p = problem(kC, 1, 512, FD_DTYPE_FP8_E4M3);
  p.num_splits = 2;
  assert_true(plan(p).tma_stages);
  p = problem(kC, 1, 640, FD_DTYPE_FP8_E4M3);
  p.num_splits = 2;
  assert_false(plan(p).tma_stages);
}

/* decode_bench's ragged rows (64 of U[128, 8192], seed 0), as the plan
 * sees them with host lengths. */
std::vector<int32_t> bench_ragged_lens() {
  std::vector<int32_t> lens;
  fd_test_rng rng = {0}; /* the same splitmix64 sequence as decode_bench's */
  for (int r = 0; r < 64; ++r)
    lens.push_back(128 + static_cast<int32_t>(fd_test_next(&rng) % (8192 - 128 + 1)));
  return lens;
}

/* With the rows' lengths themselves (not only their sum), a batch known to
 * be ragged over 16-bit K/V takes the split count of least simulated time;
 * never more splits than the rules give. For decode_bench's ragged rows:
 * A 4, B 2, C 4, D 7 where the rules give 7, 4, 4 and 15 (session 15 on
 * the H200, docs/perf/h200-session15-8e1b429-2026-12-03.md: D 5.7% faster,
 * A and B within 0.2%). FP8 K/V keep the rules' counts. Without the
 * lengths, or for a batch that is not ragged, the rules of
 * test_known_ragged and the grid apply unchanged; the choice is
 * deterministic. */
void test_simulated_ragged(void **state) {
  (void)state;
  const std::vector<int32_t> lens = bench_ragged_lens();
  int64_t total = 0;
  int32_t longest = 0;
  for (int32_t l : lens) total += l, longest = l > longest ? l : longest;
  auto splits = [&](const Shape &sh, int32_t kv, const int32_t *spans) {
    const DecodeProblem pb = problem(sh, 64, 8192, kv);
    return fd::cuda::plan_decode_splits(pb, longest, false, h200_for(pb), total, spans)
        .slot_splits();
  };
  const struct {
    const Shape *shape;
    int32_t kv, want;
  } cases[] = {{&kA, FD_DTYPE_BF16, 4}, {&kA, FD_DTYPE_FP8_E4M3, 9},
               {&kB, FD_DTYPE_BF16, 2}, {&kB, FD_DTYPE_FP8_E4M3, 4},
               {&kC, FD_DTYPE_BF16, 4}, {&kC, FD_DTYPE_FP8_E4M3, 6},
               {&kD, FD_DTYPE_BF16, 7}, {&kD, FD_DTYPE_FP8_E4M3, 4}};
  for (const auto &k : cases) {
    assert_int_equal(splits(*k.shape, k.kv, lens.data()), k.want);
    assert_int_equal(splits(*k.shape, k.kv, lens.data()), k.want); /* deterministic */
  }
  /* Without the lengths: the rules (C FP8 6, C 16-bit 4: test_known_ragged). */
  assert_int_equal(splits(kC, FD_DTYPE_FP8_E4M3, nullptr), 6);
  assert_int_equal(splits(kC, FD_DTYPE_BF16, nullptr), 4);
  /* Random ragged batches (16-300 rows, 1-8 KV heads): never more splits
   * than the rules give, at least one. */
  fd_test_rng rng = {99};
  for (int i = 0; i < 24; ++i) {
    const uint32_t rows = static_cast<uint32_t>(fd_test_range(&rng, 16, 300));
    const Shape sh = {"R", 8, static_cast<uint32_t>(1u << fd_test_range(&rng, 0, 3)), 128};
    std::vector<int32_t> rl(rows);
    int64_t sum = 0;
    for (uint32_t r = 0; r < rows; ++r)
      sum += rl[r] = r == 0 ? 8192 : static_cast<int32_t>(fd_test_range(&rng, 0, 8192));
    const DecodeProblem pr = problem(sh, rows, 8192, FD_DTYPE_BF16);
    const int32_t sim =
        fd::cuda::plan_decode_splits(pr, 8192, false, h200_for(pr), sum, rl.data()).slot_splits();
    const int32_t rule =
        fd::cuda::plan_decode_splits(pr, 8192, false, h200_for(pr), sum).slot_splits();
    assert_true(sim >= 1 && sim <= rule);
  }
  /* Uniform rows given as lengths: not ragged, the grid's counts (C 64 x
   * 8192: 4 splits at 16-bit and FP8). */
  const std::vector<int32_t> uniform(64, 8192);
  const DecodeProblem pb = problem(kC, 64, 8192, FD_DTYPE_BF16);
  assert_int_equal(
      fd::cuda::plan_decode_splits(pb, 8192, false, h200_for(pb), 64 * 8192, uniform.data())
          .slot_splits(),
      fd::cuda::plan_decode_splits(pb, 8192, false, h200_for(pb), 64 * 8192).slot_splits());
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_benchmark_grid), cmocka_unit_test(test_two_wave_unsplit),
      cmocka_unit_test(test_swapped_serves), cmocka_unit_test(test_swap_deep_serves),
      cmocka_unit_test(test_known_ragged),   cmocka_unit_test(test_deep_serves),
      cmocka_unit_test(test_tma_serves),     cmocka_unit_test(test_simulated_ragged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
