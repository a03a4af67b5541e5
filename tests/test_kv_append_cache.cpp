/* The cache side of issue 5 on the CPU backend: external (caller-owned)
 * storage with NHD strides driven through transactions and prefixes,
 * validation of the new config fields (status, message, no handle), the
 * config round trip, fd_cache_export_async / fd_tx_block_tables_async on a
 * CPU cache (host destinations) and fd_cache_async_error. */
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

const uint32_t L = 2, H = 2, D = 8, B = 4, N = 6, HQ = 4;

fd_cache_config nhd_config(std::vector<uint16_t> &k, std::vector<uint16_t> &v) {
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.num_layers = L, c.num_kv_heads = H, c.head_dim = D, c.block_size = B, c.max_blocks = N;
  c.prefix_cache_capacity_blocks = 2;
  c.dtype = FD_DTYPE_BF16;
  /* NHD pages [blocks, block_size, heads, dim] per layer, plus a gap. */
  const int64_t layer = (int64_t)N * B * H * D + 8;
  k.assign((size_t)(layer * L), 0x1111), v.assign((size_t)(layer * L), 0x2222);
  c.k_storage = k.data(), c.v_storage = v.data();
  c.stride_layer = layer;
  c.stride_block = B * H * D, c.stride_head = D, c.stride_token = H * D, c.stride_dim = 1;
  return c;
}

size_t at(uint32_t l, int32_t blk, uint32_t h, int32_t t, uint32_t d) {
  return (size_t)l * ((size_t)N * B * H * D + 8) + (size_t)blk * B * H * D + (size_t)t * H * D +
         h * D + d;
}

void test_external_storage_transaction(void **state) {
  (void)state;
  std::vector<uint16_t> ks, vs;
  fd_cache_config c = nhd_config(ks, vs);
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  /* External storage is not cleared. */
  assert_int_equal(ks[0], 0x1111);
  void *kp = NULL, *vp = NULL;
  int64_t strides[4];
  FD_ASSERT_OK(fd_cache_layer_storage(cache, 1, &kp, &vp, strides));
  assert_ptr_equal(kp, ks.data() + at(1, 0, 0, 0, 0));
  assert_int_equal(strides[0], B * H * D);
  assert_int_equal(strides[2], H * D);

  const uint64_t ids[3] = {7, 8, 9};
  for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(cache, id));
  fd_test_rng rng = {3};
  for (int step = 0; step < 6; ++step) {
    fd_tx tx;
    FD_ASSERT_OK(fd_tx_begin(cache, ids, 3, &tx));
    int32_t blk[3], off[3], pos[3];
    FD_ASSERT_OK(fd_tx_get_rows(cache, tx, 3, NULL, pos, blk, off, NULL));
    for (uint32_t l = 0; l < L; ++l) {
      std::vector<uint16_t> q(3 * HQ * D), k(3 * H * D), v(3 * H * D), q_out(q.size());
      for (auto &x : q) x = fd_test_f32_to_bf16(fd_test_normal(&rng));
      for (auto &x : k) x = fd_test_f32_to_bf16(fd_test_normal(&rng));
      for (auto &x : v) x = fd_test_f32_to_bf16(fd_test_normal(&rng));
      /* Expected: the checked primitive on a copy of the layer's storage. */
      std::vector<uint16_t> kc = ks, vc = vs, q_ref(q.size());
      fd_kv_append_params a;
      fd_kv_append_params_init(&a);
      a.dtype = FD_DTYPE_BF16, a.num_tokens = 3, a.num_q_heads = HQ, a.num_kv_heads = H;
      a.head_dim = D, a.block_size = B, a.num_blocks = N, a.rotary_dim = 6, a.rope_base = 500.f;
      a.q = q.data(), a.q_out = q_ref.data(), a.k = k.data(), a.v = v.data();
      a.k_cache = kc.data() + at(l, 0, 0, 0, 0), a.v_cache = vc.data() + at(l, 0, 0, 0, 0);
      a.stride_block = B * H * D, a.stride_head = D, a.stride_token = H * D, a.stride_dim = 1;
      a.block_ids = blk, a.offsets = off, a.positions = pos;
      FD_ASSERT_OK(fd_rope_kv_append(&a));
      FD_ASSERT_OK(fd_tx_write_layer_rope(cache, tx, l, q.data(), HQ, k.data(), v.data(), 6, 500.f,
                                          q_out.data(), NULL));
      assert_memory_equal(ks.data(), kc.data(), ks.size() * 2);
      assert_memory_equal(vs.data(), vc.data(), vs.size() * 2);
      assert_memory_equal(q_out.data(), q_ref.data(), q.size() * 2);
      /* The raw V of row 2 sits at its NHD address. */
      assert_int_equal(vs[at(l, blk[2], 1, off[2], 3)], v[(2 * H + 1) * D + 3]);
    }
    FD_ASSERT_OK(fd_tx_commit(cache, tx));
  }
  /* The gap between layers was never written. */
  assert_int_equal(ks[at(0, N, 0, 0, 0)], 0x1111);
  FD_ASSERT_OK(fd_cache_validate(cache));
  FD_ASSERT_OK(fd_cache_async_error(cache));
  fd_cache_destroy(cache);
}

void test_external_storage_prefix(void **state) {
  (void)state;
  std::vector<uint16_t> ks, vs;
  fd_cache_config c = nhd_config(ks, vs);
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  /* Packed token-major prefix blocks [L, 2, H, B, D]. */
  std::vector<uint16_t> kb((size_t)L * 2 * H * B * D), vb(kb.size());
  for (size_t i = 0; i < kb.size(); ++i) kb[i] = (uint16_t)i, vb[i] = (uint16_t)(i + 30000);
  FD_ASSERT_OK(fd_prefix_register(cache, "sys", kb.data(), vb.data(), 2, NULL));
  fd_prefix_info info;
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_prefix_get_info(cache, "sys", &info));
  const int32_t first = info.first_block;
  for (uint32_t l = 0; l < L; ++l)
    for (uint32_t h = 0; h < H; ++h)
      for (uint32_t t = 0; t < B; ++t)
        for (uint32_t d = 0; d < D; ++d) {
          const size_t src = (((size_t)l * 2 * H + h) * B + t) * D + d; /* block 0 of the prefix */
          assert_int_equal(ks[at(l, first, h, (int32_t)t, d)], kb[src]);
          assert_int_equal(vs[at(l, first, h, (int32_t)t, d)], vb[src]);
        }
  fd_cache_destroy(cache);
}

void test_config_fields(void **state) {
  (void)state;
  std::vector<uint16_t> ks, vs;
  fd_cache_config good = nhd_config(ks, vs);
  fd_cache *cache = (fd_cache *)(uintptr_t)0x1;
  struct {
    void (*edit)(fd_cache_config &);
    const char *text;
  } bad[] = {
      {[](fd_cache_config &c) { c.v_storage = NULL; }, "must both be set"},
      {[](fd_cache_config &c) { c.reserved0 = 3; }, "reserved0 must be 0, got 3"},
      {[](fd_cache_config &c) { c.stride_head = 0; }, "stride_head must be > 0"},
      {[](fd_cache_config &c) { c.stride_dim = 2; }, "stride_dim must be 1 for the token-major"},
      {[](fd_cache_config &c) { c.layout = FD_LAYOUT_DIM_MAJOR; }, "stride_token must be 1"},
      {[](fd_cache_config &c) { c.stride_layer = -1; }, "stride_layer must be >= 0"},
      {[](fd_cache_config &c) { c.stride_block = INT64_MAX / 2; }, "more than INT64_MAX bytes"},
      {[](fd_cache_config &c) { c.stride_layer = INT64_MAX / 2; }, "more than INT64_MAX bytes"},
      {[](fd_cache_config &c) { c.dtype = 9; }, "dtype 9"},
      {[](fd_cache_config &c) { c.stride_token = -1; }, "stride_token must be > 0"},
      {[](fd_cache_config &c) { c.k_storage = c.v_storage = NULL; }, "stride_layer is"},
  };
  for (const auto &b : bad) {
    fd_cache_config c = good;
    b.edit(c);
    FD_ASSERT_FAILS(fd_cache_create(&c, &cache), FD_ERR_INVALID_ARGUMENT, b.text);
    assert_ptr_equal(cache, (fd_cache *)(uintptr_t)0x1);
  }
  /* Round trip, and an older caller's struct without the new tail. */
  cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&good, &cache));
  fd_cache_config back;
  memset(&back, 0, sizeof back);
  back.struct_size = sizeof back;
  FD_ASSERT_OK(fd_cache_get_config(cache, &back));
  assert_ptr_equal(back.k_storage, ks.data());
  assert_ptr_equal(back.v_storage, vs.data());
  assert_int_equal(back.stride_layer, good.stride_layer);
  assert_int_equal(back.stride_token, H * D);
  fd_cache_config old;
  memset(&old, 0xCD, sizeof old);
  old.struct_size = (uint32_t)offsetof(fd_cache_config, k_storage) + 4; /* half a pointer */
  FD_ASSERT_OK(fd_cache_get_config(cache, &old));
  assert_int_equal(old.reserved0, 0);
  uint32_t tail;
  memcpy(&tail, (const char *)&old + offsetof(fd_cache_config, k_storage), 4);
  assert_int_equal(tail, 0xCDCDCDCDu); /* a field that only partly fits is not written */
  fd_cache_destroy(cache);
  fd_cache_config small = good;
  small.struct_size = (uint32_t)offsetof(fd_cache_config, reserved0);
  small.k_storage = NULL; /* beyond struct_size: ignored, owned storage */
  cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&small, &cache));
  FD_ASSERT_OK(fd_cache_get_config(cache, &back));
  assert_null(back.k_storage);
  fd_cache_destroy(cache);
}

void test_async_exports_on_cpu(void **state) {
  (void)state;
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.block_size = 2, c.max_blocks = 16;
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&c, &cache));
  const uint64_t ids[2] = {1, 2};
  for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(cache, id));
  std::vector<uint16_t> kv(2 * 8 * 128);
  for (int i = 0; i < 3; ++i)
    FD_ASSERT_OK(fd_cache_append(cache, ids, 2, kv.data(), kv.data(), NULL));
  int32_t want_t[2 * 4], want_l[2], got_t[2 * 4], got_l[2];
  FD_ASSERT_OK(fd_cache_export(cache, ids, 2, 4, want_t, want_l));
  memset(got_t, 0x7f, sizeof got_t), memset(got_l, 0x7f, sizeof got_l);
  FD_ASSERT_OK(fd_cache_export_async(cache, ids, 2, 4, got_t, got_l, NULL));
  assert_memory_equal(got_t, want_t, sizeof want_t);
  assert_memory_equal(got_l, want_l, sizeof want_l);
  /* Too small a stride, unknown id: nothing written. */
  memset(got_t, 0x7f, sizeof got_t);
  FD_ASSERT_FAILS(fd_cache_export_async(cache, ids, 2, 1, got_t, NULL, NULL),
                  FD_ERR_INVALID_ARGUMENT, "more than table_stride 1");
  const uint64_t unknown[1] = {77};
  FD_ASSERT_FAILS(fd_cache_export_async(cache, unknown, 1, 4, got_t, got_l, NULL), FD_ERR_NOT_FOUND,
                  "unknown request 77");
  FD_ASSERT_FAILS(fd_cache_export_async(NULL, ids, 2, 4, got_t, got_l, NULL),
                  FD_ERR_INVALID_ARGUMENT, "cache must not be NULL");
  assert_int_equal(got_t[0], 0x7f7f7f7f);

  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(cache, ids, 2, &tx));
  int32_t tx_t[2 * 4], tx_l[2], eff[2];
  FD_ASSERT_OK(fd_tx_block_tables(cache, tx, 4, want_t));
  FD_ASSERT_OK(fd_tx_get_rows(cache, tx, 2, NULL, NULL, NULL, NULL, eff));
  FD_ASSERT_OK(fd_tx_block_tables_async(cache, tx, 4, tx_t, tx_l, NULL));
  assert_memory_equal(tx_t, want_t, sizeof tx_t);
  assert_memory_equal(tx_l, eff, sizeof eff);
  assert_int_equal(tx_l[0], 4);
  FD_ASSERT_FAILS(fd_tx_block_tables_async(cache, tx, 1, tx_t, NULL, NULL), FD_ERR_INVALID_ARGUMENT,
                  "more than table_stride 1");
  FD_ASSERT_OK(fd_tx_abort(cache, tx));
  FD_ASSERT_FAILS(fd_tx_block_tables_async(cache, tx, 4, tx_t, tx_l, NULL), FD_ERR_INVALID_STATE,
                  "already aborted");
  FD_ASSERT_OK(fd_cache_async_error(cache));
  FD_ASSERT_FAILS(fd_cache_async_error(NULL), FD_ERR_INVALID_ARGUMENT, "cache must not be NULL");
  fd_cache_destroy(cache);
}

void test_cuda_cache_without_device(void **state) {
  (void)state;
  int32_t devices = 0;
  FD_ASSERT_OK(fd_cuda_device_count(&devices));
  if (devices > 0) skip(); /* covered by tests/gpu_cache_step.cpp */
  fd_cache_config c;
  fd_cache_config_init(&c);
  c.device.type = FD_DEVICE_CUDA;
  fd_cache *cache = NULL;
  FD_ASSERT_FAILS(fd_cache_create(&c, &cache), FD_ERR_NO_DEVICE, "CUDA device 0 requested");
  assert_null(cache);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_external_storage_transaction),
      cmocka_unit_test(test_external_storage_prefix),
      cmocka_unit_test(test_config_fields),
      cmocka_unit_test(test_async_exports_on_cpu),
      cmocka_unit_test(test_cuda_cache_without_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
