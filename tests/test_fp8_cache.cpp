/* FP8 caches on the CPU (S1.1, S4.1, S5, S6): configuration (input_dtype,
 * reserved1, per-layer scales) and every refusal with nothing created;
 * transaction writes (plain and fused RoPE, one and several tokens per row)
 * and the legacy append quantise every byte exactly with the layer's
 * scales, both layouts; fd_cache_set_kv_scales changes what later writes
 * store and is refused with nothing changed; prefix blocks are copied in
 * the storage type; inputs are aligned to input_dtype. */
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
#include "test_cache_support.h"
#include "test_fp8_support.h"

namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 16, kBs = 4, kBlocks = 8;

fd_cache_config fp8_config(int32_t dtype, int32_t input, int32_t layout = FD_LAYOUT_TOKEN_MAJOR) {
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.num_layers = kLayers;
  c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.block_size = kBs;
  c.max_blocks = kBlocks;
  c.prefix_cache_capacity_blocks = 2;
  c.dtype = dtype;
  c.input_dtype = input;
  c.layout = layout;
  return c;
}

void expect_create_fails(const fd_cache_config &c, fd_status status, const char *message) {
  fd_cache *cache = (fd_cache *)&kLayers; /* a sentinel: must stay untouched */
  FD_ASSERT_FAILS(fd_cache_create(&c, &cache), status, message);
  assert_ptr_equal(cache, (fd_cache *)&kLayers);
}

void test_config(void **state) {
  (void)state;
  const float good[kLayers] = {0.5f, 2.f};
  /* input_dtype: an FP8 cache takes f16, bf16 or (CPU) f32. */
  expect_create_fails(fp8_config(FD_DTYPE_FP8_E4M3, -1), FD_ERR_INVALID_ARGUMENT,
                      "config.input_dtype -1: an FP8 cache (dtype fp8_e4m3) takes K and V in f16");
  expect_create_fails(fp8_config(FD_DTYPE_FP8_E5M2, FD_DTYPE_FP8_E4M3), FD_ERR_INVALID_ARGUMENT,
                      "config.input_dtype 3");
  expect_create_fails(fp8_config(FD_DTYPE_FP8_E4M3, 9), FD_ERR_INVALID_ARGUMENT,
                      "config.input_dtype 9");
  expect_create_fails(fp8_config(FD_DTYPE_BF16, FD_DTYPE_F16), FD_ERR_INVALID_ARGUMENT,
                      "config.input_dtype 1 must be -1 or the cache's dtype bf16");
  fd_cache_config c = fp8_config(FD_DTYPE_FP8_E4M3, FD_DTYPE_BF16);
  c.reserved1 = 3;
  expect_create_fails(c, FD_ERR_INVALID_ARGUMENT, "config.reserved1 must be 0");
  /* Scales: FP8 caches only, each finite and > 0, naming the entry. */
  c = fp8_config(FD_DTYPE_BF16, -1);
  c.k_scales = good;
  expect_create_fails(c, FD_ERR_INVALID_ARGUMENT, "config.k_scales must be NULL");
  c = fp8_config(FD_DTYPE_F16, FD_DTYPE_F16);
  c.v_scales = good;
  expect_create_fails(c, FD_ERR_INVALID_ARGUMENT, "config.v_scales must be NULL");
  for (float bad : {0.f, -1.f, NAN, INFINITY, -INFINITY}) {
    const float ks[kLayers] = {1.f, bad};
    c = fp8_config(FD_DTYPE_FP8_E4M3, FD_DTYPE_BF16);
    c.k_scales = ks;
    expect_create_fails(c, FD_ERR_INVALID_ARGUMENT, "config.k_scales[1] = ");
    c.k_scales = good;
    c.v_scales = ks;
    expect_create_fails(c, FD_ERR_INVALID_ARGUMENT, "config.v_scales[1] = ");
  }
  c = fp8_config(FD_DTYPE_FP8_E4M3, FD_DTYPE_BF16);
  c.k_scales = (const float *)((const char *)good + 2);
  expect_create_fails(c, FD_ERR_INVALID_ARGUMENT, "config.k_scales (");
  /* f32 input is a CPU type. */
  c = fp8_config(FD_DTYPE_FP8_E4M3, FD_DTYPE_F32);
  c.device.type = FD_DEVICE_CUDA;
  expect_create_fails(c, FD_ERR_UNSUPPORTED, "config.input_dtype f32 is served by the CPU");

  /* Created: the config reads back as given, scales NULL (copied; read them
   * with fd_cache_get_kv_scales); no scales means all 1. */
  c = fp8_config(FD_DTYPE_FP8_E5M2, FD_DTYPE_F32);
  c.k_scales = good;
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  fd_cache_config back;
  back.struct_size = sizeof back;
  FD_ASSERT_OK(fd_cache_get_config(cache, &back));
  assert_int_equal(back.dtype, FD_DTYPE_FP8_E5M2);
  assert_int_equal(back.input_dtype, FD_DTYPE_F32);
  assert_null(back.k_scales);
  assert_null(back.v_scales);
  float ks[kLayers], vs[kLayers];
  FD_ASSERT_OK(fd_cache_get_kv_scales(cache, ks, vs));
  assert_true(ks[0] == 0.5f && ks[1] == 2.f && vs[0] == 1.f && vs[1] == 1.f);
  /* bytes_per_block counts one byte per element. */
  assert_int_equal(cs_metrics(cache).bytes_per_block, kLayers * 2 * kHeads * kBs * kDim);
  fd_cache_destroy(cache);
  /* A cache that is not FP8: input_dtype -1 or its dtype, scales all 1. */
  c = fp8_config(FD_DTYPE_BF16, FD_DTYPE_BF16);
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  FD_ASSERT_OK(fd_cache_get_kv_scales(cache, ks, NULL));
  assert_true(ks[0] == 1.f && ks[1] == 1.f);
  FD_ASSERT_FAILS(fd_cache_set_kv_scales(cache, good, good), FD_ERR_INVALID_STATE, "not FP8");
  fd_cache_destroy(cache);
  /* An older struct (before input_dtype) gets the defaults. */
  c = fp8_config(FD_DTYPE_BF16, FD_DTYPE_F16);
  c.struct_size = (uint32_t)offsetof(fd_cache_config, input_dtype);
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  fd_cache_destroy(cache);
}

/* Random inputs of `input` type: n elements. */
std::vector<uint8_t> random_input(int32_t input, size_t n, fd_test_rng *rng, float amplitude) {
  std::vector<uint8_t> x(n * fd::dtype_size(input));
  for (size_t i = 0; i < n; ++i) f8_store(x.data(), i, input, amplitude * fd_test_normal(rng));
  return x;
}

/* The stored element (layer, block, head, offset, dim) of K or V. */
uint8_t stored(fd_cache *c, uint32_t layer, bool v, int32_t block, uint32_t h, int32_t off,
               uint32_t d) {
  void *k_base = NULL, *v_base = NULL;
  int64_t s[4];
  FD_ASSERT_OK(fd_cache_layer_storage(c, layer, &k_base, &v_base, s));
  const uint8_t *base = static_cast<const uint8_t *>(v ? v_base : k_base);
  return base[block * s[0] + h * s[1] + off * s[2] + d * s[3]];
}

/* Writes every layer of one transaction (token_counts tokens per row):
 * layer 0 plain, layer 1 with RoPE; checks every stored byte and q_out. */
void write_and_check(fd_cache *c, int32_t dtype, int32_t input, const uint64_t *ids,
                     const uint32_t *counts, uint32_t rows, const float *ks, const float *vs,
                     fd_test_rng *rng) {
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin_multi(c, ids, counts, rows, &tx));
  uint32_t tokens = 0;
  for (uint32_t i = 0; i < rows; ++i) tokens += counts[i];
  std::vector<int32_t> pos(tokens), blk(tokens), off(tokens);
  FD_ASSERT_OK(fd_tx_get_tokens(c, tx, tokens, pos.data(), blk.data(), off.data()));
  const uint32_t hq = 2 * kHeads, rotary = kDim;
  const size_t kv_n = (size_t)tokens * kHeads * kDim, q_n = (size_t)tokens * hq * kDim;
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    const std::vector<uint8_t> k = random_input(input, kv_n, rng, 3.f);
    const std::vector<uint8_t> v = random_input(input, kv_n, rng, 0.02f);
    const std::vector<uint8_t> q = random_input(input, q_n, rng, 1.f);
    std::vector<uint8_t> q_out(q.size(), 0);
    std::vector<float> kf(kv_n);
    for (size_t i = 0; i < kv_n; ++i) kf[i] = f8_load(k.data(), i, input);
    if (layer == 0) {
      FD_ASSERT_OK(fd_tx_write_layer(c, tx, layer, k.data(), v.data(), NULL));
    } else {
      FD_ASSERT_OK(fd_tx_write_layer_rope(c, tx, layer, q.data(), hq, k.data(), v.data(), rotary,
                                          10000.f, q_out.data(), NULL));
      FD_ASSERT_OK(fd_rope_apply(FD_DTYPE_F32, kf.data(), tokens, kHeads, kDim, pos.data(), rotary,
                                 10000.f));
      std::vector<uint8_t> q_want = q;
      FD_ASSERT_OK(
          fd_rope_apply(input, q_want.data(), tokens, hq, kDim, pos.data(), rotary, 10000.f));
      assert_memory_equal(q_want.data(), q_out.data(), q_want.size());
    }
    for (uint32_t t = 0; t < tokens; ++t)
      for (uint32_t h = 0; h < kHeads; ++h)
        for (uint32_t d = 0; d < kDim; ++d) {
          const size_t i = ((size_t)t * kHeads + h) * kDim + d;
          assert_int_equal(stored(c, layer, false, blk[t], h, off[t], d),
                           f8_quantise(dtype, kf[i], ks[layer]));
          assert_int_equal(stored(c, layer, true, blk[t], h, off[t], d),
                           f8_quantise(dtype, f8_load(v.data(), i, input), vs[layer]));
        }
  }
  FD_ASSERT_OK(fd_tx_commit(c, tx));
}

void test_writes_quantise(void **state) {
  (void)state;
  fd_test_rng rng = {42};
  for (int32_t dtype : {FD_DTYPE_FP8_E4M3, FD_DTYPE_FP8_E5M2})
    for (int32_t input : {FD_DTYPE_BF16, FD_DTYPE_F16, FD_DTYPE_F32})
      for (int32_t layout : {FD_LAYOUT_TOKEN_MAJOR, FD_LAYOUT_DIM_MAJOR}) {
        const float ks[kLayers] = {3.f / 448.f, 0.75f}, vs[kLayers] = {1.f, 1e-4f};
        fd_cache_config cfg = fp8_config(dtype, input, layout);
        cfg.k_scales = ks;
        cfg.v_scales = vs;
        fd_cache *c = NULL;
        FD_ASSERT_OK(fd_cache_create(&cfg, &c));
        const uint64_t ids[2] = {10, 11};
        cs_add(c, {10, 11});
        const uint32_t one[2] = {1, 1}, several[2] = {3, 6};
        write_and_check(c, dtype, input, ids, one, 2, ks, vs, &rng);
        write_and_check(c, dtype, input, ids, several, 2, ks, vs, &rng);
        /* New scales apply to later writes; stored bytes stay. */
        const uint8_t before = stored(c, 0, false, cs_table(c, 10)[0], 0, 0, 0);
        const float ks2[kLayers] = {0.01f, 4.f}, vs2[kLayers] = {2.f, 0.5f};
        FD_ASSERT_OK(fd_cache_set_kv_scales(c, ks2, vs2));
        float got[kLayers];
        FD_ASSERT_OK(fd_cache_get_kv_scales(c, NULL, got));
        assert_true(got[0] == 2.f && got[1] == 0.5f);
        assert_int_equal(stored(c, 0, false, cs_table(c, 10)[0], 0, 0, 0), before);
        write_and_check(c, dtype, input, ids, one, 2, ks2, vs2, &rng);
        FD_ASSERT_OK(fd_cache_validate(c));
        fd_cache_destroy(c);
      }
}

void test_set_scales_refusals(void **state) {
  (void)state;
  const float ks[kLayers] = {0.5f, 0.25f}, vs[kLayers] = {2.f, 4.f};
  fd_cache_config cfg = fp8_config(FD_DTYPE_FP8_E4M3, FD_DTYPE_BF16);
  cfg.k_scales = ks;
  cfg.v_scales = vs;
  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  const uint64_t version = cs_version(c);
  auto unchanged = [&] {
    float k[kLayers], v[kLayers];
    FD_ASSERT_OK(fd_cache_get_kv_scales(c, k, v));
    assert_memory_equal(k, ks, sizeof ks);
    assert_memory_equal(v, vs, sizeof vs);
    assert_int_equal(cs_version(c), version);
  };
  for (float bad : {0.f, -3.f, NAN, INFINITY}) {
    const float b[kLayers] = {1.f, bad};
    FD_ASSERT_FAILS(fd_cache_set_kv_scales(c, b, vs), FD_ERR_INVALID_ARGUMENT, "k_scales[1] = ");
    unchanged();
    FD_ASSERT_FAILS(fd_cache_set_kv_scales(c, ks, b), FD_ERR_INVALID_ARGUMENT, "v_scales[1] = ");
    unchanged();
  }
  FD_ASSERT_FAILS(fd_cache_set_kv_scales(c, NULL, vs), FD_ERR_INVALID_ARGUMENT, "k_scales");
  FD_ASSERT_FAILS(fd_cache_set_kv_scales(c, ks, NULL), FD_ERR_INVALID_ARGUMENT, "v_scales");
  unchanged();
  /* Refused while a transaction is open. */
  cs_add(c, {1});
  const uint64_t id = 1;
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, &id, 1, &tx));
  const float other[kLayers] = {1.f, 1.f};
  FD_ASSERT_FAILS(fd_cache_set_kv_scales(c, other, other), FD_ERR_INVALID_STATE,
                  "while transaction");
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  float k[kLayers];
  FD_ASSERT_OK(fd_cache_get_kv_scales(c, k, NULL));
  assert_memory_equal(k, ks, sizeof ks);
  fd_cache_destroy(c);
}

/* The legacy append quantises; inputs are aligned to input_dtype (f32: 4),
 * the prefix blocks are FP8 bytes, copied as given. */
void test_append_alignment_and_prefix(void **state) {
  (void)state;
  fd_cache_config cfg = fp8_config(FD_DTYPE_FP8_E4M3, FD_DTYPE_F32);
  cfg.num_layers = 1;
  const float ks[1] = {0.25f}, vs[1] = {8.f};
  cfg.k_scales = ks;
  cfg.v_scales = vs;
  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  cs_add(c, {5});
  const uint64_t id = 5;
  fd_test_rng rng = {9};
  const size_t n = (size_t)kHeads * kDim;
  std::vector<float> k(n + 1), v(n + 1);
  for (size_t i = 0; i < n + 1; ++i)
    k[i] = fd_test_normal(&rng), v[i] = 100.f * fd_test_normal(&rng);
  const fd_cache_metrics m0 = cs_metrics(c);
  FD_ASSERT_FAILS(fd_cache_append(c, &id, 1, (const char *)k.data() + 2, v.data(), NULL),
                  FD_ERR_INVALID_ARGUMENT, "must be aligned to 4 bytes");
  assert_int_equal(cs_metrics(c).transaction_begin_count, m0.transaction_begin_count);
  FD_ASSERT_OK(fd_cache_append(c, &id, 1, k.data(), v.data(), NULL));
  const int32_t block = cs_table(c, 5)[0];
  for (uint32_t h = 0; h < kHeads; ++h)
    for (uint32_t d = 0; d < kDim; ++d) {
      assert_int_equal(stored(c, 0, false, block, h, 0, d),
                       fd::f32_to_fp8_e4m3(k[h * kDim + d] / 0.25f));
      assert_int_equal(stored(c, 0, true, block, h, 0, d),
                       fd::f32_to_fp8_e4m3(v[h * kDim + d] / 8.f));
    }
  /* Prefix blocks: [layers, n, heads, block_size, head_dim] FP8 bytes. */
  std::vector<uint8_t> pk((size_t)kHeads * kBs * kDim), pv(pk.size());
  for (size_t i = 0; i < pk.size(); ++i) pk[i] = (uint8_t)(i * 7 + 1), pv[i] = (uint8_t)(i * 3);
  FD_ASSERT_OK(fd_prefix_register(c, "p", pk.data() + 0, pv.data(), 1, NULL));
  cs_add(c, {6});
  FD_ASSERT_OK(fd_prefix_attach(c, 6, "p"));
  const int32_t pb = cs_table(c, 6)[0];
  for (uint32_t h = 0; h < kHeads; ++h)
    for (uint32_t t = 0; t < kBs; ++t)
      for (uint32_t d = 0; d < kDim; ++d) {
        const size_t i = ((size_t)h * kBs + t) * kDim + d;
        assert_int_equal(stored(c, 0, false, pb, h, (int32_t)t, d), pk[i]);
        assert_int_equal(stored(c, 0, true, pb, h, (int32_t)t, d), pv[i]);
      }
  fd_cache_destroy(c);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),
      cmocka_unit_test(test_writes_quantise),
      cmocka_unit_test(test_set_scales_refusals),
      cmocka_unit_test(test_append_alignment_and_prefix),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
