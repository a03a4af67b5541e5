/* Paged KV cache: construction, configuration, request lifecycle, free-list
 * order, capacity, export and metrics (docs/semantics.md S4, S7). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>
}

#include "fd_test.h"
#include "test_cache_support.h"

#if defined(__SANITIZE_ADDRESS__)
/* create_checks_size_and_memory asks for 2^54 bytes on purpose: let the
 * sanitizer's calloc return NULL (as libc's does) instead of aborting. */
extern "C" __attribute__((visibility("default"), used)) const char *__asan_default_options(void) {
  return "allocator_may_return_null=1";
}
#endif

namespace {

fd_cache_config small_config() {
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_layers = 2;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 4;
  cfg.block_size = 4;
  cfg.max_blocks = 8;
  cfg.dtype = FD_DTYPE_F32;
  return cfg;
}

void config_defaults(void **) {
  fd_cache_config cfg;
  memset(&cfg, 0xab, sizeof cfg);
  fd_cache_config_init(&cfg);
  assert_int_equal(cfg.struct_size, sizeof cfg);
  assert_int_equal(cfg.num_layers, 1);
  assert_int_equal(cfg.num_kv_heads, 8);
  assert_int_equal(cfg.head_dim, 128);
  assert_int_equal(cfg.block_size, 16);
  assert_int_equal(cfg.max_blocks, 1024);
  assert_int_equal(cfg.prefix_cache_capacity_blocks, 0);
  assert_int_equal(cfg.dtype, FD_DTYPE_F16);
  assert_int_equal(cfg.layout, FD_LAYOUT_TOKEN_MAJOR);
  assert_int_equal(cfg.device.type, FD_DEVICE_CPU);
  assert_int_equal(cfg.device.ordinal, 0);
  fd_cache_config_init(NULL); /* ignored */

  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  fd_cache_config got;
  memset(&got, 0, sizeof got);
  got.struct_size = sizeof got;
  FD_ASSERT_OK(fd_cache_get_config(c, &got));
  assert_memory_equal(&got, &cfg, sizeof cfg);
  fd_cache_destroy(c);
  fd_cache_destroy(NULL);
}

void config_older_struct_takes_defaults(void **) {
  /* A caller compiled against a header that ended at max_blocks. */
  fd_cache_config cfg = small_config();
  cfg.dtype = 12345; /* beyond struct_size: must be ignored */
  cfg.prefix_cache_capacity_blocks = 999;
  cfg.struct_size = offsetof(fd_cache_config, max_blocks) + 4;
  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  fd_cache_config got;
  memset(&got, 0x5a, sizeof got);
  got.struct_size = sizeof got;
  FD_ASSERT_OK(fd_cache_get_config(c, &got));
  assert_int_equal(got.max_blocks, 8);
  assert_int_equal(got.dtype, FD_DTYPE_F16);
  assert_int_equal(got.prefix_cache_capacity_blocks, 0);

  /* get_config fills only what fits. */
  fd_cache_config part;
  memset(&part, 0x5a, sizeof part);
  part.struct_size = offsetof(fd_cache_config, max_blocks) + 4;
  FD_ASSERT_OK(fd_cache_get_config(c, &part));
  assert_int_equal(part.struct_size, offsetof(fd_cache_config, max_blocks) + 4);
  assert_int_equal(part.num_layers, 2);
  assert_int_equal(part.max_blocks, 8);
  assert_int_equal((uint32_t)part.prefix_cache_capacity_blocks, 0x5a5a5a5au);

  part.struct_size = 8;
  FD_ASSERT_FAILS(fd_cache_get_config(c, &part), FD_ERR_INVALID_ARGUMENT, "struct_size");
  FD_ASSERT_FAILS(fd_cache_get_config(c, NULL), FD_ERR_INVALID_ARGUMENT, "config");
  FD_ASSERT_FAILS(fd_cache_get_config(NULL, &got), FD_ERR_INVALID_ARGUMENT, "cache");
  fd_cache_destroy(c);
}

void expect_create_fails(const fd_cache_config &cfg, fd_status status, const char *text) {
  fd_cache *sentinel = (fd_cache *)(uintptr_t)0x1234;
  fd_cache *out = sentinel;
  FD_ASSERT_FAILS(fd_cache_create(&cfg, &out), status, text);
  assert_ptr_equal(out, sentinel); /* untouched on failure */
}

void create_rejects_bad_config(void **) {
  fd_cache_config cfg = small_config();
  fd_cache *out = NULL;
  FD_ASSERT_FAILS(fd_cache_create(NULL, &out), FD_ERR_INVALID_ARGUMENT, "config");
  FD_ASSERT_FAILS(fd_cache_create(&cfg, NULL), FD_ERR_INVALID_ARGUMENT, "out");

  struct {
    uint32_t fd_cache_config::*field;
    const char *name;
  } sizes[] = {{&fd_cache_config::num_layers, "num_layers"},
               {&fd_cache_config::num_kv_heads, "num_kv_heads"},
               {&fd_cache_config::head_dim, "head_dim"},
               {&fd_cache_config::block_size, "block_size"},
               {&fd_cache_config::max_blocks, "max_blocks"}};
  for (auto &s : sizes) {
    fd_cache_config bad = small_config();
    bad.*(s.field) = 0;
    expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, s.name);
  }
  fd_cache_config bad = small_config();
  bad.struct_size = 8;
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "struct_size");
  bad.struct_size = sizeof(fd_cache_config) + 8;
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "struct_size");
  bad = small_config();
  bad.prefix_cache_capacity_blocks = 9;
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "prefix_cache_capacity_blocks");
  bad = small_config();
  bad.dtype = 5; /* 3 and 4 are FP8 since 0.2 (tests/test_fp8_cache.cpp) */
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "dtype");
  bad = small_config();
  bad.layout = 2;
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "layout");
  bad = small_config();
  bad.device.type = 2;
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "device.type");
  bad = small_config();
  bad.device.ordinal = 1;
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "ordinal");
  bad = small_config();
  bad.device.type = FD_DEVICE_CUDA;
  bad.device.ordinal = -1;
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "ordinal");
  bad = small_config();
  bad.max_blocks = 0x80000000u;
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "INT32_MAX");
  bad = small_config();
  bad.max_blocks = 1u << 28;
  bad.block_size = 16; /* 2^32 tokens: seq_len would overflow int32 */
  expect_create_fails(bad, FD_ERR_INVALID_ARGUMENT, "seq_lens");
}

void create_checks_size_and_memory(void **) {
  fd_cache_config cfg = small_config();
  cfg.num_layers = 0xffffffffu;
  cfg.num_kv_heads = 0xffffffffu;
  cfg.head_dim = 0xffffffffu;
  expect_create_fails(cfg, FD_ERR_INVALID_ARGUMENT, "overflows");
  /* 2^20 layers * 2^20 blocks * 2^12 elements * 4 bytes = 2^54 bytes: no
   * machine has that, and it does not overflow. */
  cfg = small_config();
  cfg.num_layers = 1u << 20;
  cfg.max_blocks = 1u << 20;
  cfg.block_size = 64;
  cfg.head_dim = 64;
  cfg.num_kv_heads = 1;
  expect_create_fails(cfg, FD_ERR_OUT_OF_MEMORY, "cannot allocate");
}

void create_cuda_device(void **) {
  fd_cache_config cfg = small_config();
  cfg.device.type = FD_DEVICE_CUDA;
  cfg.dtype = FD_DTYPE_F16;
  int32_t count = 0;
  FD_ASSERT_OK(fd_cuda_device_count(&count));
  if (count == 0) {
    expect_create_fails(cfg, FD_ERR_NO_DEVICE, "CUDA");
    return;
  }
  /* With a device the cache keeps its K/V in device memory. */
  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  fd_cache_config got;
  fd_cache_config_init(&got);
  FD_ASSERT_OK(fd_cache_get_config(c, &got));
  assert_int_equal(got.device.type, FD_DEVICE_CUDA);
  assert_int_equal(got.device.ordinal, 0);
  fd_cache_destroy(c);
  cfg.device.ordinal = count; /* one past the last device */
  expect_create_fails(cfg, FD_ERR_NO_DEVICE, "CUDA");
}

void create_zero_initialised_storage(void **) {
  for (int layout = 0; layout < 2; ++layout) {
    fd_cache *c = cs_make_cache(2, 2, 4, 4, 3, 0, FD_DTYPE_BF16, layout);
    void *k[2], *v[2];
    int64_t st[4];
    for (uint32_t l = 0; l < 2; ++l) FD_ASSERT_OK(fd_cache_layer_storage(c, l, &k[l], &v[l], st));
    /* Layers are consecutive: layer 1 starts max_blocks * block_elems later. */
    assert_int_equal((char *)k[1] - (char *)k[0], 3 * 2 * 4 * 4 * 2);
    if (layout == FD_LAYOUT_TOKEN_MAJOR) {
      assert_int_equal(st[0], 32);
      assert_int_equal(st[1], 16);
      assert_int_equal(st[2], 4);
      assert_int_equal(st[3], 1);
    } else {
      assert_int_equal(st[0], 32);
      assert_int_equal(st[1], 16);
      assert_int_equal(st[2], 1);
      assert_int_equal(st[3], 4);
    }
    const size_t bytes = 2 * 3 * 32 * 2; /* both layers */
    std::vector<unsigned char> zero(bytes, 0);
    assert_memory_equal(k[0], zero.data(), bytes);
    assert_memory_equal(v[0], zero.data(), bytes);

    void *p = (void *)1;
    int64_t st2[4] = {9, 9, 9, 9};
    FD_ASSERT_FAILS(fd_cache_layer_storage(c, 2, &p, &p, st2), FD_ERR_INVALID_ARGUMENT, "layer 2");
    assert_ptr_equal(p, (void *)1);
    assert_int_equal(st2[0], 9);
    FD_ASSERT_FAILS(fd_cache_layer_storage(c, 0, NULL, &p, st2), FD_ERR_INVALID_ARGUMENT, "k");
    FD_ASSERT_FAILS(fd_cache_layer_storage(c, 0, &p, NULL, st2), FD_ERR_INVALID_ARGUMENT, "v");
    FD_ASSERT_FAILS(fd_cache_layer_storage(c, 0, &p, &p, NULL), FD_ERR_INVALID_ARGUMENT, "strides");
    FD_ASSERT_FAILS(fd_cache_layer_storage(NULL, 0, &p, &p, st2), FD_ERR_INVALID_ARGUMENT, "cache");
    fd_cache_destroy(c);
  }
}

void request_lifecycle(void **) {
  fd_cache *c = cs_make_cache(1, 1, 4, 4, 8);
  assert_int_equal(cs_state(c, 1), FD_REQUEST_UNKNOWN);
  uint64_t v0 = cs_version(c);
  FD_ASSERT_OK(fd_cache_add_request(c, 1));
  assert_int_equal(cs_state(c, 1), FD_REQUEST_ACTIVE);
  uint64_t v1 = cs_version(c);
  assert_true(v1 > v0);
  /* Adding an active id again is a no-op: nothing changes, not even the version. */
  CsFrozen f = cs_freeze(c, {1}, false);
  FD_ASSERT_OK(fd_cache_add_request(c, 1));
  cs_assert_unchanged(c, f, false);

  cs_add(c, {2, 3});
  cs_grow(c, {1, 2}, 5); /* 2 blocks each */
  assert_int_equal(cs_seq_len(c, 1), 5);
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.active_request_count, 3);
  assert_int_equal(m.used_blocks, 4);

  uint64_t before = cs_version(c);
  FD_ASSERT_OK(fd_cache_finish_request(c, 1));
  assert_true(cs_version(c) > before);
  before = cs_version(c);
  FD_ASSERT_OK(fd_cache_cancel_request(c, 2));
  assert_true(cs_version(c) > before);
  assert_int_equal(cs_state(c, 1), FD_REQUEST_FINISHED);
  assert_int_equal(cs_state(c, 2), FD_REQUEST_CANCELLED);
  m = cs_metrics(c);
  assert_int_equal(m.active_request_count, 1);
  assert_int_equal(m.finished_request_count, 1);
  assert_int_equal(m.cancelled_request_count, 1);
  assert_int_equal(m.used_blocks, 0);
  assert_int_equal(m.free_count, 4);
  FD_ASSERT_OK(fd_cache_validate(c));

  /* Error rules: every failure changes nothing. */
  f = cs_freeze(c, {1, 2, 3, 4});
  FD_ASSERT_FAILS(fd_cache_add_request(c, 1), FD_ERR_INVALID_STATE, "finished");
  FD_ASSERT_FAILS(fd_cache_add_request(c, 2), FD_ERR_INVALID_STATE, "cancelled");
  FD_ASSERT_FAILS(fd_cache_finish_request(c, 1), FD_ERR_INVALID_STATE, "request 1 is finished");
  FD_ASSERT_FAILS(fd_cache_cancel_request(c, 1), FD_ERR_INVALID_STATE, "request 1 is finished");
  FD_ASSERT_FAILS(fd_cache_finish_request(c, 2), FD_ERR_INVALID_STATE, "cancelled");
  FD_ASSERT_FAILS(fd_cache_finish_request(c, 4), FD_ERR_NOT_FOUND, "unknown request 4");
  FD_ASSERT_FAILS(fd_cache_cancel_request(c, 4), FD_ERR_NOT_FOUND, "unknown request 4");
  int32_t state = 77;
  FD_ASSERT_FAILS(fd_cache_request_state(c, 1, NULL), FD_ERR_INVALID_ARGUMENT, "state");
  FD_ASSERT_FAILS(fd_cache_request_state(NULL, 1, &state), FD_ERR_INVALID_ARGUMENT, "cache");
  assert_int_equal(state, 77);
  FD_ASSERT_FAILS(fd_cache_add_request(NULL, 1), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(fd_cache_finish_request(NULL, 1), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(fd_cache_cancel_request(NULL, 1), FD_ERR_INVALID_ARGUMENT, "cache");
  uint64_t ver = 5;
  FD_ASSERT_FAILS(fd_cache_state_version(NULL, &ver), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(fd_cache_state_version(c, NULL), FD_ERR_INVALID_ARGUMENT, "version");
  assert_int_equal(ver, 5);
  cs_assert_unchanged(c, f);
  /* Request ids are full 64-bit values. */
  FD_ASSERT_OK(fd_cache_add_request(c, UINT64_MAX));
  assert_int_equal(cs_state(c, UINT64_MAX), FD_REQUEST_ACTIVE);
  fd_cache_destroy(c);
}

void free_list_reuse_order(void **) {
  fd_cache *c = cs_make_cache(1, 1, 4, 2, 6);
  /* Fresh blocks in order 0, 1, 2, ... */
  cs_add(c, {1, 2});
  cs_grow(c, {1, 2}, 3); /* 1: [0, 2], 2: [1, 3] */
  assert_true(cs_table(c, 1) == (std::vector<int32_t>{0, 2}));
  assert_true(cs_table(c, 2) == (std::vector<int32_t>{1, 3}));
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.fresh_allocation_count, 4);
  assert_int_equal(m.reuse_count, 0);
  assert_true(cs_free_list(c) == (std::vector<int32_t>{4, 5}));

  /* Finishing 1 releases 0 then 2, each to the front: 2 is reused first. */
  FD_ASSERT_OK(fd_cache_finish_request(c, 1));
  assert_true(cs_free_list(c) == (std::vector<int32_t>{2, 0, 4, 5}));
  cs_add(c, {3});
  cs_grow(c, {3}, 1);
  assert_true(cs_table(c, 3) == (std::vector<int32_t>{2}));
  m = cs_metrics(c);
  /* The probes above allocated too: count only through the identity. */
  assert_int_equal(m.allocation_count, m.fresh_allocation_count + m.reuse_count);
  assert_int_equal(m.fresh_allocation_count, 6);
  assert_int_equal(m.free_count, 2);
  FD_ASSERT_OK(fd_cache_cancel_request(c, 2));
  assert_true(cs_free_list(c) == (std::vector<int32_t>{3, 1, 0, 4, 5}));
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

void allocator_counters_exact(void **) {
  fd_cache *c = cs_make_cache(1, 1, 4, 1, 3);
  cs_add(c, {1});
  cs_grow(c, {1}, 2); /* blocks 0, 1: fresh */
  FD_ASSERT_OK(fd_cache_finish_request(c, 1));
  cs_add(c, {2});
  cs_grow(c, {2}, 3); /* 1 (reuse), 0 (reuse), 2 (fresh) */
  assert_true(cs_table(c, 2) == (std::vector<int32_t>{1, 0, 2}));
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.allocation_count, 5);
  assert_int_equal(m.fresh_allocation_count, 3);
  assert_int_equal(m.reuse_count, 2);
  assert_int_equal(m.free_count, 2);
  assert_int_equal(m.capacity_failure_count, 0);
  fd_cache_destroy(c);
}

void capacity_and_blocks_needed(void **) {
  fd_cache *c = cs_make_cache(1, 1, 4, 2, 3);
  cs_add(c, {1, 2, 3});
  uint64_t ids[3] = {1, 2, 3};
  uint32_t needed = 0, free_blocks = 0;
  FD_ASSERT_OK(fd_cache_blocks_needed(c, ids, 3, &needed, &free_blocks));
  assert_int_equal(needed, 3);
  assert_int_equal(free_blocks, 3);
  cs_grow(c, {1, 2}, 1);
  FD_ASSERT_OK(fd_cache_blocks_needed(c, ids, 3, &needed, NULL));
  assert_int_equal(needed, 1); /* rows 1, 2 have room in their block */
  cs_grow(c, {1, 2}, 1);       /* seq_len 2: full blocks */
  FD_ASSERT_OK(fd_cache_blocks_needed(c, ids, 3, &needed, &free_blocks));
  assert_int_equal(needed, 3);
  assert_int_equal(free_blocks, 1);

  /* Growing all three needs 3 blocks, 1 is free: refused, nothing changes
   * except capacity_failure_count and transaction_failure_count. */
  CsFrozen f = cs_freeze(c, {1, 2, 3});
  std::vector<float> kv(3 * 4, 1.f);
  FD_ASSERT_FAILS(fd_cache_append(c, ids, 3, kv.data(), kv.data(), NULL), FD_ERR_OUT_OF_BLOCKS,
                  "needs 3 new blocks, only 1");
  fd_tx tx = {99, 99};
  FD_ASSERT_FAILS(fd_tx_begin(c, ids, 3, &tx), FD_ERR_OUT_OF_BLOCKS, "only 1");
  assert_int_equal(tx.id, 99);
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.capacity_failure_count, f.snap.metrics.capacity_failure_count + 2);
  assert_int_equal(m.transaction_failure_count, f.snap.metrics.transaction_failure_count + 2);
  m.capacity_failure_count -= 2;
  m.transaction_failure_count -= 2;
  assert_memory_equal(&m, &f.snap.metrics, sizeof m);
  CsFrozen f2 = f;
  f2.snap.metrics = cs_metrics(c);
  cs_assert_unchanged(c, f2);
  /* One row fits. */
  cs_grow(c, {3}, 1);
  assert_int_equal(cs_metrics(c).free_blocks, 0);
  fd_cache_destroy(c);
}

void id_list_errors(void **) {
  fd_cache *c = cs_make_cache(1, 1, 4, 2, 4);
  cs_add(c, {1, 2, 3});
  cs_grow(c, {1, 2}, 3);
  FD_ASSERT_OK(fd_cache_finish_request(c, 3));
  CsFrozen f = cs_freeze(c, {1, 2, 3});
  uint32_t n = 42, fb = 42;
  int32_t table[8], lens[2];
  for (int i = 0; i < 8; ++i) table[i] = 5;
  lens[0] = lens[1] = 5;
  uint64_t dup[2] = {1, 1}, unknown[2] = {1, 9}, term[2] = {1, 3}, ok[2] = {1, 2};

  FD_ASSERT_FAILS(fd_cache_blocks_needed(c, NULL, 1, &n, &fb), FD_ERR_INVALID_ARGUMENT,
                  "request_ids");
  FD_ASSERT_FAILS(fd_cache_blocks_needed(c, ok, 0, &n, &fb), FD_ERR_INVALID_ARGUMENT, "count");
  FD_ASSERT_FAILS(fd_cache_blocks_needed(c, dup, 2, &n, &fb), FD_ERR_INVALID_ARGUMENT, "duplicate");
  FD_ASSERT_FAILS(fd_cache_blocks_needed(c, unknown, 2, &n, &fb), FD_ERR_NOT_FOUND,
                  "unknown request 9");
  FD_ASSERT_FAILS(fd_cache_blocks_needed(c, term, 2, &n, &fb), FD_ERR_INVALID_STATE,
                  "request 3 is finished");
  FD_ASSERT_FAILS(fd_cache_blocks_needed(c, ok, 2, NULL, &fb), FD_ERR_INVALID_ARGUMENT, "needed");
  FD_ASSERT_FAILS(fd_cache_blocks_needed(NULL, ok, 2, &n, &fb), FD_ERR_INVALID_ARGUMENT, "cache");
  assert_int_equal(n, 42);
  assert_int_equal(fb, 42);

  FD_ASSERT_FAILS(fd_cache_max_blocks_per_seq(c, NULL, 1, &n), FD_ERR_INVALID_ARGUMENT,
                  "request_ids");
  FD_ASSERT_FAILS(fd_cache_max_blocks_per_seq(c, ok, 0, &n), FD_ERR_INVALID_ARGUMENT, "count");
  FD_ASSERT_FAILS(fd_cache_max_blocks_per_seq(c, unknown, 2, &n), FD_ERR_NOT_FOUND, "9");
  FD_ASSERT_FAILS(fd_cache_max_blocks_per_seq(c, term, 2, &n), FD_ERR_INVALID_STATE, "finished");
  FD_ASSERT_FAILS(fd_cache_max_blocks_per_seq(c, ok, 2, NULL), FD_ERR_INVALID_ARGUMENT,
                  "max_blocks_per_seq");
  FD_ASSERT_FAILS(fd_cache_max_blocks_per_seq(NULL, ok, 2, &n), FD_ERR_INVALID_ARGUMENT, "cache");
  assert_int_equal(n, 42);

  FD_ASSERT_FAILS(fd_cache_export(c, NULL, 1, 4, table, lens), FD_ERR_INVALID_ARGUMENT,
                  "request_ids");
  FD_ASSERT_FAILS(fd_cache_export(c, ok, 0, 4, table, lens), FD_ERR_INVALID_ARGUMENT, "count");
  FD_ASSERT_FAILS(fd_cache_export(c, unknown, 2, 4, table, lens), FD_ERR_NOT_FOUND, "9");
  FD_ASSERT_FAILS(fd_cache_export(c, term, 2, 4, table, lens), FD_ERR_INVALID_STATE, "finished");
  FD_ASSERT_FAILS(fd_cache_export(NULL, ok, 2, 4, table, lens), FD_ERR_INVALID_ARGUMENT, "cache");
  /* Rows own 2 blocks: a stride of 1 is too small and nothing is written. */
  FD_ASSERT_FAILS(fd_cache_export(c, ok, 2, 1, table, lens), FD_ERR_INVALID_ARGUMENT,
                  "table_stride 1");
  for (int i = 0; i < 8; ++i) assert_int_equal(table[i], 5);
  assert_int_equal(lens[0], 5);
  assert_int_equal(lens[1], 5);
  cs_assert_unchanged(c, f);
  fd_cache_destroy(c);
}

void export_order_and_padding(void **) {
  fd_cache *c = cs_make_cache(1, 1, 4, 2, 8);
  cs_add(c, {10, 20, 30});
  cs_grow(c, {10, 20}, 1);
  cs_grow(c, {10}, 4); /* 10: 5 tokens, 3 blocks; 20: 1 token; 30: empty */
  uint64_t ids[3] = {30, 10, 20};
  uint32_t mbps = 0;
  FD_ASSERT_OK(fd_cache_max_blocks_per_seq(c, ids, 3, &mbps));
  assert_int_equal(mbps, 3);
  const uint32_t stride = 4;
  int32_t table[12], lens[3];
  memset(table, 0x11, sizeof table);
  FD_ASSERT_OK(fd_cache_export(c, ids, 3, stride, table, lens));
  const int32_t expect[12] = {-1, -1, -1, -1, 0, 2, 3, -1, 1, -1, -1, -1};
  assert_memory_equal(table, expect, sizeof expect);
  assert_int_equal(lens[0], 0);
  assert_int_equal(lens[1], 5);
  assert_int_equal(lens[2], 1);
  /* seq_lens only, and tables only. */
  int32_t lens2[3] = {9, 9, 9};
  FD_ASSERT_OK(fd_cache_export(c, ids, 3, 0, NULL, lens2));
  assert_memory_equal(lens, lens2, sizeof lens);
  int32_t table2[12];
  FD_ASSERT_OK(fd_cache_export(c, ids, 3, stride, table2, NULL));
  assert_memory_equal(table2, expect, sizeof expect);
  /* Duplicates are fine for a read. */
  uint64_t twice[2] = {20, 20};
  FD_ASSERT_OK(fd_cache_export(c, twice, 2, 1, table2, lens2));
  assert_int_equal(table2[0], 1);
  assert_int_equal(table2[1], 1);
  /* An open transaction's new blocks are not exported. */
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ids, 3, &tx)); /* 30 and 20 need new blocks */
  FD_ASSERT_OK(fd_cache_export(c, ids, 3, stride, table2, lens2));
  assert_memory_equal(table2, expect, sizeof expect);
  assert_memory_equal(lens2, lens, sizeof lens);
  FD_ASSERT_OK(fd_cache_max_blocks_per_seq(c, ids, 3, &mbps));
  assert_int_equal(mbps, 3);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  fd_cache_destroy(c);
}

void metrics_math(void **) {
  /* 2 layers, 2 heads, head_dim 4, block 4, f16: bytes_per_block = 2*2*2*4*4*2. */
  fd_cache *c = cs_make_cache(2, 2, 4, 4, 10, 0, FD_DTYPE_F16);
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.struct_size, sizeof m);
  assert_int_equal(m.reserved0, 0);
  assert_int_equal(m.max_blocks, 10);
  assert_int_equal(m.used_blocks, 0);
  assert_int_equal(m.free_blocks, 10);
  assert_true(m.block_utilization == 0.0);
  assert_true(m.internal_fragmentation_ratio == 0.0);
  assert_int_equal(m.bytes_per_block, 256);
  assert_int_equal(m.terminal_transaction_history_limit, 256);
  assert_true(m.prefix_hit_ratio == 0.0);

  cs_add(c, {1, 2, 3});
  cs_grow(c, {1, 2}, 1);
  cs_grow(c, {1}, 5); /* 1: 6 tokens (2 blocks), 2: 1 token (1 block) */
  m = cs_metrics(c);
  assert_int_equal(m.used_blocks, 3);
  assert_int_equal(m.free_blocks, 7);
  assert_true(m.block_utilization == 0.3);
  assert_int_equal(m.active_tokens, 7);
  assert_int_equal(m.physical_data_tokens, 7);
  assert_int_equal(m.reserved_tokens, 12);
  assert_int_equal(m.internal_fragmentation_tokens, 5);
  assert_true(m.internal_fragmentation_ratio == 5.0 / 12.0);
  assert_int_equal(m.allocated_kv_bytes, 3 * 256);
  assert_int_equal(m.active_request_count, 3);
  assert_int_equal(m.transaction_begin_count, 6);
  assert_int_equal(m.transaction_commit_count, 6);
  assert_int_equal(m.transaction_layer_write_count, 12);
  assert_int_equal(m.terminal_transaction_history_count, 6);
  assert_int_equal(m.open_transaction_count, 0);
  assert_int_equal(m.retained_transaction_state_count, 0);
  assert_int_equal(m.state_version, cs_version(c));

  /* An open transaction: its blocks are used and reserved. */
  uint64_t ids[3] = {1, 2, 3};
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ids, 3, &tx)); /* only 3 needs a block */
  m = cs_metrics(c);
  assert_int_equal(m.open_transaction_count, 1);
  assert_int_equal(m.retained_transaction_state_count, 1);
  assert_int_equal(m.pending_request_count, 3);
  assert_int_equal(m.reserved_transaction_blocks, 1);
  assert_int_equal(m.reserved_transaction_bytes, 256);
  assert_int_equal(m.used_blocks, 4);
  assert_int_equal(m.active_tokens, 7); /* committed only */
  assert_int_equal(m.physical_data_tokens, 7);
  assert_int_equal(m.internal_fragmentation_tokens, 9);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  m = cs_metrics(c);
  assert_int_equal(m.transaction_abort_count, 1);
  assert_int_equal(m.transaction_rollback_block_count, 1);
  assert_int_equal(m.retained_transaction_state_count, 0);
  assert_int_equal(m.used_blocks, 3);

  /* A smaller struct gets only what fits; the rest is untouched. */
  fd_cache_metrics part;
  memset(&part, 0x77, sizeof part);
  part.struct_size = offsetof(fd_cache_metrics, max_blocks) + 8;
  FD_ASSERT_OK(fd_cache_metrics_get(c, &part));
  assert_int_equal(part.max_blocks, 10);
  assert_int_equal(part.reserved0, 0);
  assert_true(part.used_blocks == 0x7777777777777777ull);
  part.struct_size = offsetof(fd_cache_metrics, used_blocks) + 7; /* partial field */
  FD_ASSERT_OK(fd_cache_metrics_get(c, &part));
  assert_true(part.used_blocks == 0x7777777777777777ull);
  part.struct_size = offsetof(fd_cache_metrics, max_blocks) + 7;
  FD_ASSERT_FAILS(fd_cache_metrics_get(c, &part), FD_ERR_INVALID_ARGUMENT, "struct_size");
  FD_ASSERT_FAILS(fd_cache_metrics_get(c, NULL), FD_ERR_INVALID_ARGUMENT, "metrics");
  FD_ASSERT_FAILS(fd_cache_metrics_get(NULL, &part), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(fd_cache_validate(NULL), FD_ERR_INVALID_ARGUMENT, "cache");
  fd_cache_destroy(c);
}

void legacy_append(void **) {
  fd_cache *c = cs_make_cache(1, 2, 3, 2, 4, 0, FD_DTYPE_F32);
  cs_add(c, {1, 2});
  uint64_t ids[2] = {2, 1};
  float k[2 * 2 * 3], v[2 * 2 * 3];
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < 12; ++i) {
      k[i] = (float)(100 * t + i);
      v[i] = (float)(-100 * t - i);
    }
    FD_ASSERT_OK(fd_cache_append(c, ids, 2, k, v, NULL));
  }
  assert_int_equal(cs_seq_len(c, 1), 3);
  assert_int_equal(cs_seq_len(c, 2), 3);
  /* Row 0 was request 2, which got block 0 first. */
  std::vector<int32_t> t2 = cs_table(c, 2), t1 = cs_table(c, 1);
  assert_true(t2 == (std::vector<int32_t>{0, 2}));
  assert_true(t1 == (std::vector<int32_t>{1, 3}));
  /* Token 2 (offset 0 of the second block) of request 1 (row 1). */
  for (uint32_t h = 0; h < 2; ++h)
    for (uint32_t d = 0; d < 3; ++d) {
      const int i = (1 * 2 + (int)h) * 3 + (int)d;
      assert_true(cs_read_kv(c, 0, 0, t1[1], h, 0, d) == (float)(200 + i));
      assert_true(cs_read_kv(c, 1, 0, t1[1], h, 0, d) == (float)(-200 - i));
    }
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.transaction_begin_count, 3);
  assert_int_equal(m.transaction_commit_count, 3);
  assert_int_equal(m.transaction_layer_write_count, 3);

  /* Failures change nothing. */
  CsFrozen f = cs_freeze(c, {1, 2, 3});
  uint64_t unknown[2] = {1, 3}, dup[2] = {1, 1};
  FD_ASSERT_FAILS(fd_cache_append(c, ids, 2, NULL, v, NULL), FD_ERR_INVALID_ARGUMENT, "k");
  FD_ASSERT_FAILS(fd_cache_append(c, ids, 2, k, NULL, NULL), FD_ERR_INVALID_ARGUMENT, "v");
  FD_ASSERT_FAILS(fd_cache_append(c, NULL, 2, k, v, NULL), FD_ERR_INVALID_ARGUMENT, "request_ids");
  FD_ASSERT_FAILS(fd_cache_append(c, ids, 0, k, v, NULL), FD_ERR_INVALID_ARGUMENT, "count");
  FD_ASSERT_FAILS(fd_cache_append(c, unknown, 2, k, v, NULL), FD_ERR_NOT_FOUND, "3");
  FD_ASSERT_FAILS(fd_cache_append(c, dup, 2, k, v, NULL), FD_ERR_INVALID_ARGUMENT, "duplicate");
  FD_ASSERT_FAILS(fd_cache_append(NULL, ids, 2, k, v, NULL), FD_ERR_INVALID_ARGUMENT, "cache");
  cs_assert_unchanged(c, f);
  FD_ASSERT_OK(fd_cache_finish_request(c, 2));
  f = cs_freeze(c, {1, 2});
  FD_ASSERT_FAILS(fd_cache_append(c, ids, 2, k, v, NULL), FD_ERR_INVALID_STATE, "finished");
  cs_assert_unchanged(c, f);
  /* While a transaction is open. */
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, &ids[1], 1, &tx));
  f = cs_freeze(c, {1, 2}, false);
  FD_ASSERT_FAILS(fd_cache_append(c, &ids[1], 1, k, v, NULL), FD_ERR_INVALID_STATE, "is open");
  cs_assert_unchanged(c, f, false);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  fd_cache_destroy(c);

  /* Multi-layer caches must use transactions. */
  c = cs_make_cache(2, 1, 4, 2, 4);
  cs_add(c, {1});
  f = cs_freeze(c, {1});
  FD_ASSERT_FAILS(fd_cache_append(c, ids + 1, 1, k, v, NULL), FD_ERR_INVALID_STATE,
                  "num_layers == 1");
  cs_assert_unchanged(c, f);
  fd_cache_destroy(c);
}

void lifecycle_refused_while_transaction_open(void **) {
  fd_cache *c = cs_make_cache(1, 1, 4, 2, 4);
  cs_add(c, {1, 2});
  cs_grow(c, {1}, 1);
  uint64_t id = 1;
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, &id, 1, &tx));
  CsFrozen f = cs_freeze(c, {1, 2, 3}, false);
  FD_ASSERT_FAILS(fd_cache_add_request(c, 3), FD_ERR_INVALID_STATE, "transaction");
  FD_ASSERT_FAILS(fd_cache_add_request(c, 2), FD_ERR_INVALID_STATE, "add a request");
  FD_ASSERT_FAILS(fd_cache_finish_request(c, 2), FD_ERR_INVALID_STATE, "finish a request");
  FD_ASSERT_FAILS(fd_cache_cancel_request(c, 1), FD_ERR_INVALID_STATE, "cancel a request");
  cs_assert_unchanged(c, f, false);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  FD_ASSERT_OK(fd_cache_add_request(c, 3));
  fd_cache_destroy(c);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(config_defaults),
      cmocka_unit_test(config_older_struct_takes_defaults),
      cmocka_unit_test(create_rejects_bad_config),
      cmocka_unit_test(create_checks_size_and_memory),
      cmocka_unit_test(create_cuda_device),
      cmocka_unit_test(create_zero_initialised_storage),
      cmocka_unit_test(request_lifecycle),
      cmocka_unit_test(free_list_reuse_order),
      cmocka_unit_test(allocator_counters_exact),
      cmocka_unit_test(capacity_and_blocks_needed),
      cmocka_unit_test(id_list_errors),
      cmocka_unit_test(export_order_and_padding),
      cmocka_unit_test(metrics_math),
      cmocka_unit_test(legacy_append),
      cmocka_unit_test(lifecycle_refused_while_transaction_open),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
