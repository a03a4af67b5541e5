/* fd_kv_append / fd_rope_kv_append on the CPU (S3.2): results against an
 * independent scatter of fd_rope_apply's rotation for every dtype, both
 * layouts, NHD and padded strides, rotary_dim < head_dim and in-place q_out;
 * every error path with its status, its message and nothing written. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cstring>
#include <vector>

#include "fd_test.h"

namespace {

enum Storage { kPacked, kNhd, kPadded };

/* One append problem with host buffers; the caches start filled with a
 * recognisable pattern so that stray writes and "nothing written" show. */
struct Problem {
  int32_t dtype = FD_DTYPE_BF16;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  int storage = kPacked;
  uint32_t tokens = 5, hq = 4, hkv = 2, dim = 16, bs = 4, blocks = 6, rotary = 16;
  float base = 10000.f;
  int64_t sb = 0, sh = 0, st = 0, sd = 0; /* actual strides */
  std::vector<uint8_t> q, q_out, k, v, kc, vc;
  std::vector<int32_t> ids, offs, pos;
};

size_t esz(const Problem &p) {
  return fd_test_dtype_size(p.dtype);
}

void build(Problem &p, uint64_t seed) {
  const int64_t H = p.hkv, D = p.dim, B = p.bs;
  const bool dm = p.layout == FD_LAYOUT_DIM_MAJOR;
  if (p.storage == kPacked) {
    p.sb = H * B * D, p.sh = B * D, p.st = dm ? 1 : D, p.sd = dm ? B : 1;
  } else if (p.storage == kNhd) { /* token-major NHD pages */
    p.sb = B * H * D, p.sh = D, p.st = H * D, p.sd = 1;
  } else { /* gaps everywhere */
    if (dm)
      p.st = 1, p.sd = B + 3, p.sh = D * (B + 3) + 5, p.sb = H * p.sh + 7;
    else
      p.sd = 1, p.st = D + 3, p.sh = B * (D + 3) + 5, p.sb = H * p.sh + 7;
  }
  fd_test_rng rng = {seed};
  const size_t e = esz(p);
  const size_t qn = (size_t)p.tokens * p.hq * p.dim, kn = (size_t)p.tokens * p.hkv * p.dim;
  p.q.resize(qn * e), p.q_out.assign(qn * e, 0xEE), p.k.resize(kn * e), p.v.resize(kn * e);
  for (size_t i = 0; i < qn; ++i) fd_test_store(p.q.data(), i, p.dtype, fd_test_normal(&rng));
  for (size_t i = 0; i < kn; ++i) {
    fd_test_store(p.k.data(), i, p.dtype, fd_test_normal(&rng));
    fd_test_store(p.v.data(), i, p.dtype, fd_test_normal(&rng));
  }
  const size_t cache = (size_t)(p.sb * p.blocks) * e;
  p.kc.assign(cache, 0x5A), p.vc.assign(cache, 0xA5);
  /* Distinct (block, offset) slots in random order, random positions. */
  std::vector<int32_t> slots(p.blocks * p.bs);
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = (int32_t)i;
  for (size_t i = slots.size(); i > 1; --i)
    std::swap(slots[i - 1], slots[(size_t)fd_test_range(&rng, 0, (int64_t)i - 1)]);
  for (uint32_t t = 0; t < p.tokens; ++t) {
    p.ids.push_back(slots[t] / (int32_t)p.bs);
    p.offs.push_back(slots[t] % (int32_t)p.bs);
    p.pos.push_back(t == 0 ? 0 : (int32_t)fd_test_range(&rng, 0, 70000));
  }
}

fd_kv_append_params params(Problem &p) {
  fd_kv_append_params a;
  fd_kv_append_params_init(&a);
  a.dtype = p.dtype;
  a.layout = p.layout;
  a.num_tokens = p.tokens;
  a.num_q_heads = p.hq;
  a.num_kv_heads = p.hkv;
  a.head_dim = p.dim;
  a.block_size = p.bs;
  a.num_blocks = p.blocks;
  a.rotary_dim = p.rotary;
  a.rope_base = p.base;
  a.q = p.q.data();
  a.q_out = p.q_out.data();
  a.k = p.k.data();
  a.v = p.v.data();
  a.k_cache = p.kc.data();
  a.v_cache = p.vc.data();
  if (p.storage != kPacked) {
    a.stride_block = p.sb, a.stride_head = p.sh, a.stride_token = p.st, a.stride_dim = p.sd;
  }
  a.block_ids = p.ids.data();
  a.offsets = p.offs.data();
  a.positions = p.pos.data();
  return a;
}

/* Expected caches and q_out, from fd_rope_apply and an element-wise scatter. */
void expect(const Problem &p, bool rope, std::vector<uint8_t> &kc, std::vector<uint8_t> &vc,
            std::vector<uint8_t> &q_out) {
  std::vector<uint8_t> k = p.k;
  q_out = p.q;
  if (rope) {
    FD_ASSERT_OK(
        fd_rope_apply(p.dtype, k.data(), p.tokens, p.hkv, p.dim, p.pos.data(), p.rotary, p.base));
    FD_ASSERT_OK(fd_rope_apply(p.dtype, q_out.data(), p.tokens, p.hq, p.dim, p.pos.data(), p.rotary,
                               p.base));
  }
  kc = p.kc, vc = p.vc;
  const size_t e = esz(p);
  for (uint32_t t = 0; t < p.tokens; ++t)
    for (uint32_t h = 0; h < p.hkv; ++h)
      for (uint32_t d = 0; d < p.dim; ++d) {
        const size_t src = (((size_t)t * p.hkv + h) * p.dim + d) * e;
        const size_t dst = (size_t)(p.ids[t] * p.sb + h * p.sh + p.offs[t] * p.st + d * p.sd) * e;
        memcpy(&kc[dst], &k[src], e);
        memcpy(&vc[dst], &p.v[src], e);
      }
}

void check_case(Problem p, uint64_t seed, bool in_place) {
  build(p, seed);
  for (int rope = 0; rope < 2; ++rope) {
    Problem run = p;
    std::vector<uint8_t> kc, vc, q_out;
    expect(run, rope != 0, kc, vc, q_out);
    fd_kv_append_params a = params(run);
    if (in_place) a.q_out = run.q.data();
    if (rope) {
      FD_ASSERT_OK(fd_rope_kv_append(&a));
      assert_memory_equal((in_place ? run.q : run.q_out).data(), q_out.data(), q_out.size());
    } else {
      FD_ASSERT_OK(fd_kv_append(&a));
      /* The plain form never touches Q. */
      std::vector<uint8_t> untouched(p.q_out.size(), 0xEE);
      assert_memory_equal(run.q_out.data(), untouched.data(), untouched.size());
    }
    assert_memory_equal(run.kc.data(), kc.data(), kc.size());
    assert_memory_equal(run.vc.data(), vc.data(), vc.size());
  }
}

void test_matches_reference(void **state) {
  (void)state;
  const int32_t dtypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  const int32_t layouts[] = {FD_LAYOUT_TOKEN_MAJOR, FD_LAYOUT_DIM_MAJOR};
  uint64_t seed = 1;
  int cases = 0;
  for (int32_t dt : dtypes)
    for (int32_t layout : layouts)
      for (int storage : {kPacked, kNhd, kPadded}) {
        if (storage == kNhd && layout == FD_LAYOUT_DIM_MAJOR) continue;
        for (uint32_t rotary : {16u, 6u}) {
          Problem p;
          p.dtype = dt, p.layout = layout, p.storage = storage, p.rotary = rotary;
          check_case(p, seed++, false);
          check_case(p, seed++, true);
          ++cases;
        }
      }
  /* A rotary_dim past the rotation's stack tables (256): the caller-provided
   * scratch path, same bits as fd_rope_apply. */
  for (int32_t dt : dtypes) {
    Problem p;
    p.dtype = dt, p.dim = 272, p.rotary = 264, p.tokens = 3;
    check_case(p, seed++, false);
    check_case(p, seed++, true);
    ++cases;
  }
  print_message("test_kv_append: %d cases x {plain, fused} x {q_out, in place}\n", cases);
}

/* A failing call returns `status` with `text` in the message and writes
 * nothing: caches and q_out keep their bytes. */
#define EXPECT_NOTHING_WRITTEN(call, status, text)                    \
  do {                                                                \
    const std::vector<uint8_t> kc0 = p.kc, vc0 = p.vc, qo0 = p.q_out; \
    FD_ASSERT_FAILS(call, status, text);                              \
    assert_memory_equal(p.kc.data(), kc0.data(), kc0.size());         \
    assert_memory_equal(p.vc.data(), vc0.data(), vc0.size());         \
    assert_memory_equal(p.q_out.data(), qo0.data(), qo0.size());      \
  } while (0)

/* Runs `edit` on fresh params and expects both entry points (or only the
 * fused one) to fail. */
template <class Edit>
void both_fail(Problem &p, Edit edit, fd_status status, const char *text, bool fused_only) {
  fd_kv_append_params a = params(p);
  edit(a);
  EXPECT_NOTHING_WRITTEN(fd_rope_kv_append(&a), status, text);
  if (!fused_only) EXPECT_NOTHING_WRITTEN(fd_kv_append(&a), status, text);
}

void test_errors(void **state) {
  (void)state;
  Problem p;
  build(p, 99);
  const fd_status INV = FD_ERR_INVALID_ARGUMENT;
  FD_ASSERT_FAILS(fd_kv_append(NULL), INV, "params must not be NULL");
  FD_ASSERT_FAILS(fd_rope_kv_append(NULL), INV, "params must not be NULL");
  fd_kv_append_params_init(NULL); /* ignored */

  // clang-format off
  both_fail(p, [](fd_kv_append_params &a) { a.struct_size = 8; }, INV, "struct_size 8 is too small", false);
  both_fail(p, [](fd_kv_append_params &a) { a.struct_size = sizeof a + 8; }, INV, "newer header", false);
  both_fail(p, [](fd_kv_append_params &a) { a.reserved0 = 1; }, INV, "reserved0 must be 0", false);
  both_fail(p, [](fd_kv_append_params &a) { a.dtype = 7; }, INV, "dtype 7", false);
  both_fail(p, [](fd_kv_append_params &a) { a.layout = 5; }, INV, "layout 5", false);
  both_fail(p, [](fd_kv_append_params &a) { a.num_tokens = 0; }, INV, "num_tokens must be > 0", false);
  both_fail(p, [](fd_kv_append_params &a) { a.num_kv_heads = 0; }, INV, "num_kv_heads must be > 0", false);
  both_fail(p, [](fd_kv_append_params &a) { a.head_dim = 0; }, INV, "head_dim must be > 0", false);
  both_fail(p, [](fd_kv_append_params &a) { a.block_size = 0; }, INV, "block_size must be > 0", false);
  both_fail(p, [](fd_kv_append_params &a) { a.num_blocks = 0; }, INV, "num_blocks must be > 0", false);
  both_fail(p, [](fd_kv_append_params &a) { a.k = NULL; }, INV, "params->k must not be NULL", false);
  both_fail(p, [](fd_kv_append_params &a) { a.v = NULL; }, INV, "params->v must not be NULL", false);
  both_fail(p, [](fd_kv_append_params &a) { a.k_cache = NULL; }, INV, "k_cache must not be NULL", false);
  both_fail(p, [](fd_kv_append_params &a) { a.v_cache = NULL; }, INV, "v_cache must not be NULL", false);
  both_fail(p, [](fd_kv_append_params &a) { a.block_ids = NULL; }, INV, "block_ids must not be NULL", false);
  both_fail(p, [](fd_kv_append_params &a) { a.offsets = NULL; }, INV, "offsets must not be NULL", false);
  both_fail(p, [](fd_kv_append_params &a) { a.q = NULL; }, INV, "params->q must not be NULL", true);
  both_fail(p, [](fd_kv_append_params &a) { a.q_out = NULL; }, INV, "q_out must not be NULL", true);
  both_fail(p, [](fd_kv_append_params &a) { a.positions = NULL; }, INV, "positions must not be NULL", true);
  both_fail(p, [](fd_kv_append_params &a) { a.num_q_heads = 3; }, INV, "num_q_heads 3 must be a positive multiple", true);
  both_fail(p, [](fd_kv_append_params &a) { a.num_q_heads = 0; }, INV, "num_q_heads 0", true);
  both_fail(p, [](fd_kv_append_params &a) { a.rotary_dim = 5; }, INV, "rotary_dim must be even", true);
  both_fail(p, [](fd_kv_append_params &a) { a.rotary_dim = 0; }, INV, "rotary_dim must be even", true);
  both_fail(p, [](fd_kv_append_params &a) { a.rotary_dim = 18; }, INV, "got 18", true);
  both_fail(p, [](fd_kv_append_params &a) { a.rope_base = 0.f; }, INV, "rope_base must be finite", true);
  both_fail(p, [](fd_kv_append_params &a) { a.rope_base = INFINITY; }, INV, "rope_base must be finite", true);
  both_fail(p, [](fd_kv_append_params &a) { a.stride_head = 32; }, INV, "stride_block must be > 0", false);
  both_fail(p, [](fd_kv_append_params &a) { a.stride_block = 256, a.stride_head = 64, a.stride_token = 16, a.stride_dim = 2; }, INV, "stride_dim must be 1 for the token-major layout", false);
  both_fail(p, [](fd_kv_append_params &a) { a.layout = FD_LAYOUT_DIM_MAJOR, a.stride_block = 256, a.stride_head = 64, a.stride_token = 16, a.stride_dim = 1; }, INV, "params->stride_token must be 1 for the dim-major layout", false);
  both_fail(p, [](fd_kv_append_params &a) { a.stride_block = 256, a.stride_head = 64, a.stride_token = -16, a.stride_dim = 1; }, INV, "params->stride_token must be > 0", false);
  both_fail(p, [](fd_kv_append_params &a) { a.device.type = 9; }, INV, "device.type 9", false);
  both_fail(p, [](fd_kv_append_params &a) { a.device.ordinal = 1; }, INV, "ordinal must be 0 for a CPU device", false);
  both_fail(p, [&](fd_kv_append_params &a) { a.q_out = p.q.data() + 2 * fd_test_dtype_size(p.dtype); }, INV, "q_out must equal q or not overlap it", true);
  both_fail(p, [&](fd_kv_append_params &a) { a.q_out = p.k.data(); }, INV, "q_out must not overlap k or v", true);
  /* Typed reads need element-aligned arrays (bf16: 2 bytes, int32: 4). */
  both_fail(p, [&](fd_kv_append_params &a) { a.k = p.k.data() + 1; }, INV, "params->k (", false);
  both_fail(p, [&](fd_kv_append_params &a) { a.v = p.v.data() + 1; }, INV, "must be aligned to 2 bytes", false);
  both_fail(p, [&](fd_kv_append_params &a) { a.k_cache = p.kc.data() + 1; }, INV, "params->k_cache (", false);
  both_fail(p, [&](fd_kv_append_params &a) { a.v_cache = p.vc.data() + 1; }, INV, "params->v_cache (", false);
  both_fail(p, [&](fd_kv_append_params &a) { a.block_ids = (const int32_t *)((const char *)p.ids.data() + 2); }, INV, "params->block_ids (", false);
  both_fail(p, [&](fd_kv_append_params &a) { a.offsets = (const int32_t *)((const char *)p.offs.data() + 2); }, INV, "must be aligned to 4 bytes", false);
  both_fail(p, [&](fd_kv_append_params &a) { a.q = p.q.data() + 1; }, INV, "params->q (", true);
  both_fail(p, [&](fd_kv_append_params &a) { a.q_out = p.q_out.data() + 1; }, INV, "params->q_out (", true);
  both_fail(p, [&](fd_kv_append_params &a) { a.positions = (const int32_t *)((const char *)p.pos.data() + 2); }, INV, "params->positions (", true);
  /* Sizes and strides whose products overflow are refused, not wrapped. */
  both_fail(p, [](fd_kv_append_params &a) { a.num_kv_heads = 0xffffffffu, a.num_q_heads = 0xffffffffu, a.head_dim = 0xffffffffu, a.rotary_dim = 16; }, INV, "k_cache/v_cache ([num_blocks, num_kv_heads, block_size, head_dim]) is too large to address", false);
  both_fail(p, [](fd_kv_append_params &a) { a.num_blocks = 0x7fffffffu, a.block_size = 0x7fffffffu; }, INV, "sizes and strides address) is too large", false);
  both_fail(p, [](fd_kv_append_params &a) { a.stride_block = INT64_MAX / 2, a.stride_head = 64, a.stride_token = 16, a.stride_dim = 1; }, INV, "k_cache/v_cache (the elements its sizes and strides address) is too large to address", false);
  both_fail(p, [](fd_kv_append_params &a) { a.stride_block = 256, a.stride_head = INT64_MAX, a.stride_token = 16, a.stride_dim = 1; }, INV, "too large to address", false);
  both_fail(p, [](fd_kv_append_params &a) { a.num_tokens = 0x80000000u, a.num_kv_heads = 0x80000000u, a.num_q_heads = 0x80000000u; }, INV, "params->k/v ([num_tokens, num_kv_heads, head_dim]) is too large to address", false);
  both_fail(p, [](fd_kv_append_params &a) { a.num_tokens = 0x80000000u, a.num_q_heads = 0x80000000u * 2u - 2u; }, INV, "params->q ([num_tokens, num_q_heads, head_dim]) is too large to address", true);
  // clang-format on

  /* Bad index values: named entry, nothing written (checked before any write). */
  p.ids[3] = (int32_t)p.blocks;
  both_fail(
      p, [](fd_kv_append_params &) {}, INV, "block_ids[3] = 6 is out of range [0, 6)", false);
  p.ids[3] = -1;
  both_fail(
      p, [](fd_kv_append_params &) {}, INV, "block_ids[3] = -1", false);
  p.ids[3] = 0;
  p.offs[4] = (int32_t)p.bs;
  both_fail(
      p, [](fd_kv_append_params &) {}, INV, "offsets[4] = 4 is out of range [0, 4)", false);
  p.offs[4] = -2;
  both_fail(
      p, [](fd_kv_append_params &) {}, INV, "offsets[4] = -2", false);
  p.offs[4] = 0;
  p.pos[2] = -5;
  both_fail(
      p, [](fd_kv_append_params &) {}, INV, "positions[2] = -5 must be >= 0", true);
  /* The plain form ignores positions. */
  fd_kv_append_params a = params(p);
  FD_ASSERT_OK(fd_kv_append(&a));
}

/* An older caller's struct (without device and stream) runs on the CPU. */
void test_older_struct(void **state) {
  (void)state;
  Problem p;
  build(p, 5);
  std::vector<uint8_t> kc, vc, q_out;
  expect(p, true, kc, vc, q_out);
  fd_kv_append_params a = params(p);
  a.device.type = 12345; /* outside the caller's struct: must be ignored */
  a.struct_size = (uint32_t)offsetof(fd_kv_append_params, device);
  FD_ASSERT_OK(fd_rope_kv_append(&a));
  assert_memory_equal(p.kc.data(), kc.data(), kc.size());
  assert_memory_equal(p.q_out.data(), q_out.data(), q_out.size());
}

/* The CUDA path without a usable device (or with host pointers on a GPU
 * machine) refuses before writing. */
void test_cuda_refusals(void **state) {
  (void)state;
  Problem p;
  build(p, 7);
  int32_t devices = 0;
  FD_ASSERT_OK(fd_cuda_device_count(&devices));
  fd_kv_append_params a = params(p);
  a.device.type = FD_DEVICE_CUDA;
  if (devices == 0) {
    EXPECT_NOTHING_WRITTEN(fd_kv_append(&a), FD_ERR_NO_DEVICE, "CUDA device 0 requested");
    EXPECT_NOTHING_WRITTEN(fd_rope_kv_append(&a), FD_ERR_NO_DEVICE, "CUDA device 0 requested");
  } else {
    EXPECT_NOTHING_WRITTEN(fd_kv_append(&a), FD_ERR_INVALID_ARGUMENT, "not device memory");
    /* f32 (with f32-sized buffers) is refused by the CUDA backend. */
    Problem f;
    f.dtype = FD_DTYPE_F32;
    build(f, 8);
    fd_kv_append_params b = params(f);
    b.device.type = FD_DEVICE_CUDA;
    FD_ASSERT_FAILS(fd_rope_kv_append(&b), FD_ERR_UNSUPPORTED, "f32");
  }
  a = params(p);
  a.device.type = FD_DEVICE_CUDA;
  a.device.ordinal = -1;
  EXPECT_NOTHING_WRITTEN(fd_kv_append(&a), FD_ERR_INVALID_ARGUMENT, "ordinal must be >= 0");
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_reference),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_older_struct),
      cmocka_unit_test(test_cuda_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
