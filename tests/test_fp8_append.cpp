/* fd_kv_append / fd_rope_kv_append into FP8 caches on the CPU (S1.1, S3.2):
 * every stored byte equals the host conversion of x / scale (the rotated K
 * in FP32, rounded once), both layouts, E4M3 and E5M2, inputs in bf16, f16
 * and f32, NaN / infinity / huge inputs affect their own element only, the
 * rotated Q is fd_rope_apply's; older structs; every error path with its
 * status, its message and nothing written. */
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
#include "test_fp8_support.h"

namespace {

struct Problem {
  int32_t dtype = FD_DTYPE_BF16;           /* q, k, v, q_out */
  int32_t cache_dtype = FD_DTYPE_FP8_E4M3; /* k_cache, v_cache */
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  uint32_t tokens = 5, hq = 4, hkv = 2, dim = 16, bs = 4, blocks = 6, rotary = 12;
  float k_scale = 0.125f, v_scale = 3.f;
  std::vector<uint8_t> q, q_out, k, v, kc, vc;
  std::vector<int32_t> ids, offs, pos;
};

void build(Problem &p, uint64_t seed) {
  fd_test_rng rng = {seed};
  const size_t e = fd::dtype_size(p.dtype);
  const size_t kv = (size_t)p.tokens * p.hkv * p.dim, qn = (size_t)p.tokens * p.hq * p.dim;
  p.q.resize(qn * e);
  p.q_out.assign(qn * e, 0);
  p.k.resize(kv * e);
  p.v.resize(kv * e);
  for (size_t i = 0; i < qn; ++i) f8_store(p.q.data(), i, p.dtype, 2.f * fd_test_normal(&rng));
  for (size_t i = 0; i < kv; ++i) {
    f8_store(p.k.data(), i, p.dtype, 4.f * fd_test_normal(&rng));
    f8_store(p.v.data(), i, p.dtype, 50.f * fd_test_normal(&rng));
  }
  /* Special values: each must affect its own element only. */
  f8_store(p.k.data(), 3, p.dtype, NAN);
  f8_store(p.v.data(), 5, p.dtype, INFINITY);
  f8_store(p.v.data(), 6, p.dtype, -INFINITY);
  f8_store(p.v.data(), 7, p.dtype, 1e6f);       /* beyond both formats x scale 3 (f16: inf) */
  f8_store(p.k.data(), kv - 1, p.dtype, 1e-6f); /* FP8 subnormal or zero */
  const size_t cache = (size_t)p.blocks * p.hkv * p.bs * p.dim;
  p.kc.assign(cache, 0x5a);
  p.vc.assign(cache, 0xa5);
  p.ids.resize(p.tokens);
  p.offs.resize(p.tokens);
  p.pos.resize(p.tokens);
  for (uint32_t i = 0; i < p.tokens; ++i) {
    p.ids[i] = (int32_t)((i * 5 + 1) % p.blocks);
    p.offs[i] = (int32_t)((i * 3) % p.bs);
    p.pos[i] = (int32_t)(i * 7 + 2);
  }
}

fd_kv_append_params params(Problem &p) {
  fd_kv_append_params a;
  fd_kv_append_params_init(&a);
  a.dtype = p.dtype;
  a.cache_dtype = p.cache_dtype;
  a.k_scale = p.k_scale;
  a.v_scale = p.v_scale;
  a.layout = p.layout;
  a.num_tokens = p.tokens;
  a.num_q_heads = p.hq;
  a.num_kv_heads = p.hkv;
  a.head_dim = p.dim;
  a.block_size = p.bs;
  a.num_blocks = p.blocks;
  a.rotary_dim = p.rotary;
  a.rope_base = 10000.f;
  a.q = p.q.data();
  a.q_out = p.q_out.data();
  a.k = p.k.data();
  a.v = p.v.data();
  a.k_cache = p.kc.data();
  a.v_cache = p.vc.data();
  a.block_ids = p.ids.data();
  a.offsets = p.offs.data();
  a.positions = p.pos.data();
  return a;
}

size_t cache_index(const Problem &p, int32_t block, uint32_t h, int32_t off, uint32_t d) {
  const size_t head = ((size_t)block * p.hkv + h) * p.bs * p.dim;
  return p.layout == FD_LAYOUT_TOKEN_MAJOR ? head + (size_t)off * p.dim + d
                                           : head + (size_t)d * p.bs + (size_t)off;
}

/* The caches the call must produce from the initial patterns: K rotated in
 * FP32 (fd_rope_apply on an exact f32 copy) when `rope`, then quantised. */
void expected(const Problem &p, bool rope, std::vector<uint8_t> &kc, std::vector<uint8_t> &vc) {
  const size_t kv = (size_t)p.tokens * p.hkv * p.dim;
  std::vector<float> k(kv);
  for (size_t i = 0; i < kv; ++i) k[i] = f8_load(p.k.data(), i, p.dtype);
  if (rope)
    FD_ASSERT_OK(fd_rope_apply(FD_DTYPE_F32, k.data(), p.tokens, p.hkv, p.dim, p.pos.data(),
                               p.rotary, 10000.f));
  kc.assign(p.kc.size(), 0x5a);
  vc.assign(p.vc.size(), 0xa5);
  for (uint32_t i = 0; i < p.tokens; ++i)
    for (uint32_t h = 0; h < p.hkv; ++h)
      for (uint32_t d = 0; d < p.dim; ++d) {
        const size_t s = ((size_t)i * p.hkv + h) * p.dim + d;
        const size_t at = cache_index(p, p.ids[i], h, p.offs[i], d);
        kc[at] = f8_quantise(p.cache_dtype, k[s], p.k_scale);
        vc[at] = f8_quantise(p.cache_dtype, f8_load(p.v.data(), s, p.dtype), p.v_scale);
      }
}

void test_quantises_exactly(void **state) {
  (void)state;
  uint64_t seed = 1;
  for (int32_t cache : {FD_DTYPE_FP8_E4M3, FD_DTYPE_FP8_E5M2})
    for (int32_t dtype : {FD_DTYPE_BF16, FD_DTYPE_F16, FD_DTYPE_F32})
      for (int32_t layout : {FD_LAYOUT_TOKEN_MAJOR, FD_LAYOUT_DIM_MAJOR})
        for (bool rope : {false, true}) {
          Problem p;
          p.cache_dtype = cache;
          p.dtype = dtype;
          p.layout = layout;
          build(p, seed++);
          fd_kv_append_params a = params(p);
          FD_ASSERT_OK(rope ? fd_rope_kv_append(&a) : fd_kv_append(&a));
          std::vector<uint8_t> kc, vc;
          expected(p, rope, kc, vc);
          assert_memory_equal(kc.data(), p.kc.data(), kc.size());
          assert_memory_equal(vc.data(), p.vc.data(), vc.size());
          if (rope) {
            std::vector<uint8_t> q = p.q;
            FD_ASSERT_OK(fd_rope_apply(dtype, q.data(), p.tokens, p.hq, p.dim, p.pos.data(),
                                       p.rotary, 10000.f));
            assert_memory_equal(q.data(), p.q_out.data(), q.size());
          }
          /* The special values: NaN, saturation, as the rule says. */
          const size_t at5 = cache_index(p, p.ids[0], 0, p.offs[0], 5);
          const size_t at6 = cache_index(p, p.ids[0], 0, p.offs[0], 6);
          const size_t at7 = cache_index(p, p.ids[0], 0, p.offs[0], 7);
          const uint8_t max = cache == FD_DTYPE_FP8_E4M3 ? 0x7e : 0x7b;
          assert_int_equal(p.vc[at5], max);
          assert_int_equal(p.vc[at6], 0x80 | max);
          assert_int_equal(p.vc[at7], max);
          if (!rope) assert_int_equal(p.kc[cache_index(p, p.ids[0], 0, p.offs[0], 3)], 0x7f);
        }
}

/* In-place q_out, and an older caller's struct (no cache_dtype): its own
 * type, scales 1 (the 0.1 behaviour, bytes copied). */
void test_in_place_and_older_struct(void **state) {
  (void)state;
  Problem p;
  build(p, 99);
  fd_kv_append_params a = params(p);
  a.q_out = p.q.data();
  std::vector<uint8_t> q = p.q;
  FD_ASSERT_OK(fd_rope_kv_append(&a));
  FD_ASSERT_OK(
      fd_rope_apply(p.dtype, q.data(), p.tokens, p.hq, p.dim, p.pos.data(), p.rotary, 10000.f));
  assert_memory_equal(q.data(), p.q.data(), q.size());

  Problem o;
  o.cache_dtype = FD_DTYPE_BF16;
  build(o, 5);
  o.kc.assign(o.kc.size() * 2, 0);
  o.vc.assign(o.vc.size() * 2, 0);
  fd_kv_append_params b = params(o);
  b.struct_size = (uint32_t)offsetof(fd_kv_append_params, cache_dtype);
  b.cache_dtype = FD_DTYPE_FP8_E4M3; /* beyond struct_size: not read */
  b.k_scale = -1.f;
  FD_ASSERT_OK(fd_kv_append(&b));
  for (uint32_t i = 0; i < o.tokens; ++i)
    for (uint32_t d = 0; d < o.dim; ++d) {
      const size_t s = (size_t)i * o.hkv * o.dim + d;
      const size_t at = cache_index(o, o.ids[i], 0, o.offs[i], d);
      assert_memory_equal(o.k.data() + 2 * s, o.kc.data() + 2 * at, 2);
    }
}

void test_errors(void **state) {
  (void)state;
  Problem p;
  build(p, 3);
  const std::vector<uint8_t> kc0 = p.kc, vc0 = p.vc, qo0 = p.q_out;
  struct Bad {
    void (*edit)(fd_kv_append_params &);
    fd_status status;
    const char *message;
  } cases[] = {
      {[](fd_kv_append_params &a) { a.k_scale = 0.f; }, FD_ERR_INVALID_ARGUMENT,
       "params->k_scale must be finite and > 0"},
      {[](fd_kv_append_params &a) { a.k_scale = -0.5f; }, FD_ERR_INVALID_ARGUMENT,
       "params->k_scale"},
      {[](fd_kv_append_params &a) { a.v_scale = NAN; }, FD_ERR_INVALID_ARGUMENT, "params->v_scale"},
      {[](fd_kv_append_params &a) { a.v_scale = INFINITY; }, FD_ERR_INVALID_ARGUMENT,
       "params->v_scale"},
      {[](fd_kv_append_params &a) { a.reserved1 = 1; }, FD_ERR_INVALID_ARGUMENT,
       "params->reserved1 must be 0"},
      {[](fd_kv_append_params &a) { a.dtype = FD_DTYPE_FP8_E4M3; }, FD_ERR_INVALID_ARGUMENT,
       "params->dtype fp8_e4m3 is a storage type"},
      {[](fd_kv_append_params &a) { a.cache_dtype = 7; }, FD_ERR_INVALID_ARGUMENT,
       "params->cache_dtype 7 is not an fd_dtype"},
      {[](fd_kv_append_params &a) { a.cache_dtype = -2; }, FD_ERR_INVALID_ARGUMENT,
       "params->cache_dtype -2"},
      /* Scales quantise into FP8 only. */
      {[](fd_kv_append_params &a) { a.cache_dtype = FD_DTYPE_BF16; }, FD_ERR_INVALID_ARGUMENT,
       "params->k_scale is 0.125, but scales quantise into an FP8 cache_dtype"},
      /* A valid combination that is not served. */
      {[](fd_kv_append_params &a) {
         a.cache_dtype = FD_DTYPE_F16;
         a.k_scale = a.v_scale = 1.f;
       },
       FD_ERR_UNSUPPORTED, "params->cache_dtype f16 with dtype bf16 is not served"},
      /* Typed arrays: inputs aligned to dtype (2), caches to 1 byte. */
      {[](fd_kv_append_params &a) { a.k = (const char *)a.k + 1; }, FD_ERR_INVALID_ARGUMENT,
       "params->k ("},
      {[](fd_kv_append_params &a) { a.num_tokens = 0; }, FD_ERR_INVALID_ARGUMENT, "num_tokens"},
  };
  for (const Bad &b : cases)
    for (bool rope : {false, true}) {
      fd_kv_append_params a = params(p);
      b.edit(a);
      FD_ASSERT_FAILS(rope ? fd_rope_kv_append(&a) : fd_kv_append(&a), b.status, b.message);
      assert_memory_equal(kc0.data(), p.kc.data(), kc0.size());
      assert_memory_equal(vc0.data(), p.vc.data(), vc0.size());
      assert_memory_equal(qo0.data(), p.q_out.data(), qo0.size());
    }
  /* An FP8 cache at an odd address is fine (1-byte elements). */
  std::vector<uint8_t> kc(p.kc.size() + 1, 0x5a), vc(p.vc.size() + 1, 0xa5);
  fd_kv_append_params a = params(p);
  a.k_cache = kc.data() + 1;
  a.v_cache = vc.data() + 1;
  FD_ASSERT_OK(fd_kv_append(&a));
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quantises_exactly),
      cmocka_unit_test(test_in_place_and_older_struct),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
