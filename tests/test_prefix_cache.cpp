/* Shared prefix blocks (docs/semantics.md S6): register, attach, evict, LRU
 * eviction, capacity failures, metrics, and every error rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include "fd_test.h"
#include "test_cache_support.h"

namespace {

const uint32_t L = 2, H = 2, D = 4, B = 2;

/* Prefix blocks [L, n, H, B, D] (f32) whose element values encode
 * (layer, block, head, token, dim) and `salt`. */
std::vector<float> prefix_blocks(uint32_t n, float salt) {
  std::vector<float> x((size_t)L * n * H * B * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = salt + (float)i;
  return x;
}

fd_prefix_info info_of(fd_cache *c, const char *id) {
  fd_prefix_info info;
  memset(&info, 0x44, sizeof info);
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_prefix_get_info(c, id, &info));
  return info;
}

void reg(fd_cache *c, const char *id, uint32_t n) {
  std::vector<float> k = prefix_blocks(n, 1000.f), v = prefix_blocks(n, -1000.f);
  FD_ASSERT_OK(fd_prefix_register(c, id, k.data(), v.data(), n, NULL));
}

void register_attach_share(void **) {
  for (int32_t layout = 0; layout < 2; ++layout) {
    fd_cache *c = cs_make_cache(L, H, D, B, 12, 6, FD_DTYPE_F32, layout);
    std::vector<float> k = prefix_blocks(2, 0.5f), v = prefix_blocks(2, -0.5f);
    char id[] = "system";
    uint64_t v0 = cs_version(c);
    FD_ASSERT_OK(fd_prefix_register(c, id, k.data(), v.data(), 2, NULL));
    id[0] = 'X'; /* the id was copied */
    assert_true(cs_version(c) > v0);
    fd_prefix_info info = info_of(c, "system");
    assert_int_equal(info.num_blocks, 2);
    assert_int_equal(info.ref_count, 0);
    assert_int_equal(info.first_block, 0);
    assert_int_equal(info.reserved0, 0);
    assert_int_equal(info.reserved1, 0);
    /* Blocks were copied in storage order: block i of layer l. */
    for (uint32_t l = 0; l < L; ++l)
      for (uint32_t b = 0; b < 2; ++b)
        for (uint32_t h = 0; h < H; ++h)
          for (uint32_t t = 0; t < B; ++t)
            for (uint32_t d = 0; d < D; ++d) {
              const size_t inner =
                  layout == FD_LAYOUT_TOKEN_MAJOR ? (size_t)t * D + d : (size_t)d * B + t;
              const size_t i = (((size_t)l * 2 + b) * H + h) * B * D + inner;
              assert_true(cs_read_kv(c, 0, l, (int32_t)b, h, t, d) == k[i]);
              assert_true(cs_read_kv(c, 1, l, (int32_t)b, h, t, d) == v[i]);
            }

    cs_add(c, {1, 2, 3});
    v0 = cs_version(c);
    FD_ASSERT_OK(fd_prefix_attach(c, 1, "system"));
    assert_true(cs_version(c) > v0);
    FD_ASSERT_OK(fd_prefix_attach(c, 2, "system"));
    assert_true(cs_table(c, 1) == (std::vector<int32_t>{0, 1}));
    assert_int_equal(cs_seq_len(c, 1), 4);
    info = info_of(c, "system");
    assert_int_equal(info.ref_count, 2);

    fd_cache_metrics m = cs_metrics(c);
    assert_int_equal(m.resident_prefix_count, 1);
    assert_int_equal(m.resident_prefix_blocks, 2);
    assert_int_equal(m.active_prefix_references, 2);
    assert_int_equal(m.shared_prefix_blocks, 2);
    assert_int_equal(m.saved_prefix_blocks, 2);
    assert_int_equal(m.saved_prefix_bytes, 2 * m.bytes_per_block);
    assert_int_equal(m.prefix_registration_count, 1);
    assert_int_equal(m.prefix_hit_count, 2);
    assert_int_equal(m.prefix_miss_count, 0);
    assert_true(m.prefix_hit_ratio == 1.0);
    assert_int_equal(m.used_blocks, 2);
    assert_int_equal(m.active_tokens, 8);
    assert_int_equal(m.physical_data_tokens, 4); /* shared tokens counted once */

    /* The tail is private: the next token needs a new block per request. */
    uint64_t ids[2] = {1, 2};
    uint32_t needed = 0;
    FD_ASSERT_OK(fd_cache_blocks_needed(c, ids, 2, &needed, NULL));
    assert_int_equal(needed, 2);
    cs_grow(c, {1, 2}, 1);
    assert_true(cs_table(c, 1) == (std::vector<int32_t>{0, 1, 2}));
    assert_true(cs_table(c, 2) == (std::vector<int32_t>{0, 1, 3}));
    /* Prefix contents are untouched by the tail writes. */
    assert_true(cs_read_kv(c, 0, 1, 1, 1, 1, 3) ==
                k[((1 * 2 + 1) * H + 1) * B * D +
                  (layout == FD_LAYOUT_TOKEN_MAJOR ? 1 * D + 3 : 3 * B + 1)]);
    m = cs_metrics(c);
    assert_int_equal(m.physical_data_tokens, 6);
    assert_int_equal(m.used_blocks, 4);
    FD_ASSERT_OK(fd_cache_validate(c));

    /* Finishing drops the reference and frees only the private tail. */
    FD_ASSERT_OK(fd_cache_finish_request(c, 1));
    info = info_of(c, "system");
    assert_int_equal(info.ref_count, 1);
    m = cs_metrics(c);
    assert_int_equal(m.free_count, 1);
    assert_int_equal(m.used_blocks, 3);
    assert_int_equal(m.saved_prefix_blocks, 0);
    assert_int_equal(m.shared_prefix_blocks, 2);
    FD_ASSERT_OK(fd_cache_cancel_request(c, 2));
    m = cs_metrics(c);
    assert_int_equal(m.active_prefix_references, 0);
    assert_int_equal(m.shared_prefix_blocks, 0);
    assert_int_equal(m.resident_prefix_blocks, 2);
    assert_int_equal(m.used_blocks, 2);

    /* Evict frees the prefix blocks to the front (last block first). */
    v0 = cs_version(c);
    FD_ASSERT_OK(fd_prefix_evict(c, "system"));
    assert_true(cs_version(c) > v0);
    m = cs_metrics(c);
    assert_int_equal(m.resident_prefix_count, 0);
    assert_int_equal(m.prefix_eviction_count, 1);
    assert_int_equal(m.free_count, 4);
    assert_true(cs_free_list(c) == (std::vector<int32_t>{1, 0, 3, 2, 4, 5, 6, 7, 8, 9, 10, 11}));
    FD_ASSERT_OK(fd_cache_validate(c));
    fd_cache_destroy(c);
  }
}

void lru_eviction(void **) {
  fd_cache *c = cs_make_cache(L, H, D, B, 20, 6);
  reg(c, "a", 2);
  reg(c, "b", 2);
  reg(c, "c", 2); /* capacity full; LRU order a, b, c */
  cs_add(c, {1, 2});
  FD_ASSERT_OK(fd_prefix_attach(c, 1, "a")); /* a: most recent, referenced */
  /* Needs 1 block: the LRU unreferenced prefix is b. */
  reg(c, "d", 1);
  fd_prefix_info info;
  info.struct_size = sizeof info;
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "b", &info), FD_ERR_NOT_FOUND, "unknown prefix \"b\"");
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.prefix_eviction_count, 1);
  assert_int_equal(m.resident_prefix_blocks, 5);
  assert_int_equal(m.resident_prefix_count, 3);
  /* b's blocks (2, 3) were released to the front and 3 was reused. */
  assert_int_equal(info_of(c, "d").first_block, 3);

  /* Closing an attached request touches its prefix: finish 1, then c is
   * older than a. */
  FD_ASSERT_OK(fd_cache_finish_request(c, 1));
  assert_true(info_of(c, "a").last_use > info_of(c, "d").last_use);
  /* Needs 2 blocks (5 + 2 - 6 = 1, but eviction goes by whole prefixes in
   * LRU order): c (2 blocks) is the least recently used. */
  reg(c, "e", 2);
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "c", &info), FD_ERR_NOT_FOUND, "\"c\"");
  info_of(c, "a");
  info_of(c, "d");
  m = cs_metrics(c);
  assert_int_equal(m.prefix_eviction_count, 2);
  assert_int_equal(m.resident_prefix_blocks, 5);

  /* An attach is a touch too: attach d, then the LRU idle one is a, then e. */
  FD_ASSERT_OK(fd_prefix_attach(c, 2, "d"));
  reg(c, "f", 3); /* need 5 + 3 - 6 = 2: evict a (2) */
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "a", &info), FD_ERR_NOT_FOUND, "\"a\"");
  info_of(c, "e");
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

void capacity_failures(void **) {
  fd_prefix_info info;
  info.struct_size = sizeof info;
  fd_cache *c = cs_make_cache(L, H, D, B, 6, 4);
  reg(c, "a", 2);
  reg(c, "b", 2);
  cs_add(c, {1, 2});
  FD_ASSERT_OK(fd_prefix_attach(c, 1, "a"));
  FD_ASSERT_OK(fd_prefix_attach(c, 2, "b"));
  std::vector<float> k = prefix_blocks(5, 0.f);
  CsFrozen f = cs_freeze(c, {1, 2});
  /* n > capacity. */
  FD_ASSERT_FAILS(fd_prefix_register(c, "x", k.data(), k.data(), 5, NULL), FD_ERR_OUT_OF_BLOCKS,
                  "more than prefix_cache_capacity_blocks 4");
  cs_assert_unchanged(c, f);
  /* Every resident prefix is referenced: nothing can be evicted. */
  f = cs_freeze(c, {1, 2});
  FD_ASSERT_FAILS(fd_prefix_register(c, "x", k.data(), k.data(), 1, NULL), FD_ERR_OUT_OF_BLOCKS,
                  "insufficient evictable prefix capacity");
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.capacity_failure_count, f.snap.metrics.capacity_failure_count + 1);
  assert_int_equal(m.prefix_capacity_failure_count,
                   f.snap.metrics.prefix_capacity_failure_count + 1);
  f.snap.metrics.capacity_failure_count++;
  f.snap.metrics.prefix_capacity_failure_count++;
  cs_assert_unchanged(c, f);

  /* Free blocks are the limit: 2 free, a referenced, b idle. A 3-block
   * prefix needs max(4 + 3 - 4, 3 - 2) = 3; b's 2 blocks cannot cover it,
   * so b must not be evicted either. */
  FD_ASSERT_OK(fd_cache_finish_request(c, 2));
  f = cs_freeze(c, {1, 2});
  FD_ASSERT_FAILS(fd_prefix_register(c, "x", k.data(), k.data(), 3, NULL), FD_ERR_OUT_OF_BLOCKS,
                  "insufficient evictable prefix capacity");
  f.snap.metrics.capacity_failure_count++;
  f.snap.metrics.prefix_capacity_failure_count++;
  cs_assert_unchanged(c, f);
  info_of(c, "b");
  /* A 2-block prefix fits after evicting b. */
  reg(c, "y", 2);
  m = cs_metrics(c);
  assert_int_equal(m.prefix_eviction_count, 1);
  assert_int_equal(m.resident_prefix_blocks, 4);

  /* Free blocks alone can be the limit: resident 2 of 4, but private blocks
   * fill the pool, and the only resident prefix is referenced. */
  FD_ASSERT_OK(fd_prefix_evict(c, "y"));
  cs_add(c, {3});
  cs_grow(c, {3}, 8); /* 4 blocks: pool full */
  assert_int_equal(cs_metrics(c).free_blocks, 0);
  f = cs_freeze(c, {1, 2, 3});
  FD_ASSERT_FAILS(fd_prefix_register(c, "z", k.data(), k.data(), 2, NULL), FD_ERR_OUT_OF_BLOCKS,
                  "insufficient evictable prefix capacity");
  f.snap.metrics.capacity_failure_count++;
  f.snap.metrics.prefix_capacity_failure_count++;
  cs_assert_unchanged(c, f);
  /* Once a is idle it is evicted, and z reuses its blocks (last released first). */
  const int32_t a_first = info_of(c, "a").first_block;
  FD_ASSERT_OK(fd_cache_finish_request(c, 1));
  reg(c, "z", 2);
  assert_int_equal(info_of(c, "z").first_block, a_first + 1);
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "a", &info), FD_ERR_NOT_FOUND, "\"a\"");
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

void disabled_prefixes(void **) {
  fd_cache *c = cs_make_cache(L, H, D, B, 8, 0);
  cs_add(c, {1});
  std::vector<float> k = prefix_blocks(1, 0.f);
  CsFrozen f = cs_freeze(c, {1});
  FD_ASSERT_FAILS(fd_prefix_register(c, "a", k.data(), k.data(), 1, NULL), FD_ERR_UNSUPPORTED,
                  "disabled");
  FD_ASSERT_FAILS(fd_prefix_evict(c, "a"), FD_ERR_NOT_FOUND, "disabled");
  fd_prefix_info info;
  info.struct_size = sizeof info;
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "a", &info), FD_ERR_NOT_FOUND, "disabled");
  cs_assert_unchanged(c, f);
  /* An attach is a lookup that misses. */
  f = cs_freeze(c, {1});
  FD_ASSERT_FAILS(fd_prefix_attach(c, 1, "a"), FD_ERR_NOT_FOUND, "disabled");
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.prefix_miss_count, 1);
  assert_true(m.prefix_hit_ratio == 0.0);
  f.snap.metrics.prefix_miss_count++;
  cs_assert_unchanged(c, f);
  fd_cache_destroy(c);
}

void prefix_error_rules(void **) {
  fd_cache *c = cs_make_cache(L, H, D, B, 10, 4);
  reg(c, "a", 2);
  cs_add(c, {1, 2, 3, 4, 5});
  FD_ASSERT_OK(fd_prefix_attach(c, 1, "a"));
  cs_grow(c, {2}, 1);
  FD_ASSERT_OK(fd_cache_finish_request(c, 3));
  std::vector<float> k = prefix_blocks(1, 0.f);
  CsFrozen f = cs_freeze(c, {1, 2, 3, 4, 5});

  /* register */
  FD_ASSERT_FAILS(fd_prefix_register(c, NULL, k.data(), k.data(), 1, NULL), FD_ERR_INVALID_ARGUMENT,
                  "prefix_id");
  FD_ASSERT_FAILS(fd_prefix_register(c, "", k.data(), k.data(), 1, NULL), FD_ERR_INVALID_ARGUMENT,
                  "empty");
  FD_ASSERT_FAILS(fd_prefix_register(c, "b", NULL, k.data(), 1, NULL), FD_ERR_INVALID_ARGUMENT,
                  "k_blocks");
  FD_ASSERT_FAILS(fd_prefix_register(c, "b", k.data(), NULL, 1, NULL), FD_ERR_INVALID_ARGUMENT,
                  "v_blocks");
  FD_ASSERT_FAILS(fd_prefix_register(c, "b", k.data(), k.data(), 0, NULL), FD_ERR_INVALID_ARGUMENT,
                  "num_blocks");
  FD_ASSERT_FAILS(fd_prefix_register(c, "a", k.data(), k.data(), 1, NULL), FD_ERR_ALREADY_EXISTS,
                  "prefix \"a\" is already registered");
  FD_ASSERT_FAILS(fd_prefix_register(NULL, "b", k.data(), k.data(), 1, NULL),
                  FD_ERR_INVALID_ARGUMENT, "cache");
  /* attach */
  FD_ASSERT_FAILS(fd_prefix_attach(c, 4, NULL), FD_ERR_INVALID_ARGUMENT, "prefix_id");
  FD_ASSERT_FAILS(fd_prefix_attach(c, 4, ""), FD_ERR_INVALID_ARGUMENT, "empty");
  FD_ASSERT_FAILS(fd_prefix_attach(c, 9, "a"), FD_ERR_NOT_FOUND, "unknown request 9");
  FD_ASSERT_FAILS(fd_prefix_attach(c, 3, "a"), FD_ERR_INVALID_STATE, "request 3 is finished");
  FD_ASSERT_FAILS(fd_prefix_attach(c, 1, "a"), FD_ERR_INVALID_STATE, "already has prefix");
  FD_ASSERT_FAILS(fd_prefix_attach(c, 2, "a"), FD_ERR_INVALID_STATE, "not empty");
  FD_ASSERT_FAILS(fd_prefix_attach(NULL, 4, "a"), FD_ERR_INVALID_ARGUMENT, "cache");
  /* evict */
  FD_ASSERT_FAILS(fd_prefix_evict(c, NULL), FD_ERR_INVALID_ARGUMENT, "prefix_id");
  FD_ASSERT_FAILS(fd_prefix_evict(c, ""), FD_ERR_INVALID_ARGUMENT, "empty");
  FD_ASSERT_FAILS(fd_prefix_evict(c, "zz"), FD_ERR_NOT_FOUND, "unknown prefix \"zz\"");
  FD_ASSERT_FAILS(fd_prefix_evict(c, "a"), FD_ERR_INVALID_STATE, "attached to 1 active");
  FD_ASSERT_FAILS(fd_prefix_evict(NULL, "a"), FD_ERR_INVALID_ARGUMENT, "cache");
  /* get_info */
  fd_prefix_info info;
  memset(&info, 0x21, sizeof info);
  info.struct_size = sizeof info;
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "zz", &info), FD_ERR_NOT_FOUND, "zz");
  FD_ASSERT_FAILS(fd_prefix_get_info(c, NULL, &info), FD_ERR_INVALID_ARGUMENT, "prefix_id");
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "a", NULL), FD_ERR_INVALID_ARGUMENT, "info");
  FD_ASSERT_FAILS(fd_prefix_get_info(NULL, "a", &info), FD_ERR_INVALID_ARGUMENT, "cache");
  info.struct_size = 4;
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "a", &info), FD_ERR_INVALID_ARGUMENT, "struct_size");
  assert_int_equal(info.num_blocks, 0x21212121u);
  /* A smaller struct: last_use only partly fits and is not written. */
  info.struct_size = offsetof(fd_prefix_info, last_use) + 4;
  FD_ASSERT_OK(fd_prefix_get_info(c, "a", &info));
  assert_int_equal(info.num_blocks, 2);
  assert_int_equal(info.ref_count, 1);
  assert_true(info.last_use == 0x2121212121212121ull);
  cs_assert_unchanged(c, f);

  /* The miss counter moves on an unknown prefix, and only there. */
  f = cs_freeze(c, {1, 2, 3, 4, 5});
  FD_ASSERT_FAILS(fd_prefix_attach(c, 4, "zz"), FD_ERR_NOT_FOUND, "unknown prefix \"zz\"");
  f.snap.metrics.prefix_miss_count++;
  f.snap.metrics.prefix_hit_ratio = 0.5; /* 1 hit, 1 miss */
  cs_assert_unchanged(c, f);

  /* While a transaction is open every prefix operation is refused. */
  uint64_t id = 5;
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, &id, 1, &tx));
  f = cs_freeze(c, {1, 2, 3, 4, 5}, false);
  FD_ASSERT_FAILS(fd_prefix_register(c, "b", k.data(), k.data(), 1, NULL), FD_ERR_INVALID_STATE,
                  "register a prefix while transaction");
  FD_ASSERT_FAILS(fd_prefix_attach(c, 4, "a"), FD_ERR_INVALID_STATE,
                  "attach a prefix while transaction");
  FD_ASSERT_FAILS(fd_prefix_attach(c, 4, "zz"), FD_ERR_INVALID_STATE, "transaction");
  FD_ASSERT_FAILS(fd_prefix_evict(c, "a"), FD_ERR_INVALID_STATE, "evict a prefix while");
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_prefix_get_info(c, "a", &info)); /* reads still work */
  assert_int_equal(info.ref_count, 1);
  cs_assert_unchanged(c, f, false);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  FD_ASSERT_OK(fd_prefix_attach(c, 4, "a"));
  fd_cache_destroy(c);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(register_attach_share), cmocka_unit_test(lru_eviction),
      cmocka_unit_test(capacity_failures),     cmocka_unit_test(disabled_prefixes),
      cmocka_unit_test(prefix_error_rules),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
