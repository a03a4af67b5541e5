/* fd_cache_validate (docs/semantics.md S7): corrupts a healthy cache through the
 * internal test hook, one invariant at a time, and checks that the matching
 * check fires with a message in words. Also unit-tests the block allocator
 * and the transaction history directly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <functional>
#include <vector>

#include "cache/block_allocator.hpp"
#include "cache/cache_test_hook.hpp"
#include "cache/transaction.hpp"
#include "fd_test.h"

namespace {

/* A healthy cache: max_blocks 12, block_size 2, prefix capacity 4.
 * prefix "a" = 2 blocks attached to request 1 (which has a 1-token tail),
 * prefix "b" = 2 blocks idle, request 3 empty,
 * request 4 finished. Request 2 has 4 tokens (2 full blocks). */
fd_cache *healthy_cache() {
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_layers = 1;
  cfg.num_kv_heads = 1;
  cfg.head_dim = 2;
  cfg.block_size = 2;
  cfg.max_blocks = 12;
  cfg.prefix_cache_capacity_blocks = 4;
  cfg.dtype = FD_DTYPE_F32;
  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  std::vector<float> blocks(2 * 2 * 2, 1.f), kv(4, 0.f);
  FD_ASSERT_OK(fd_prefix_register(c, "a", blocks.data(), blocks.data(), 2, NULL));
  FD_ASSERT_OK(fd_prefix_register(c, "b", blocks.data(), blocks.data(), 2, NULL));
  for (uint64_t id = 1; id <= 4; ++id) FD_ASSERT_OK(fd_cache_add_request(c, id));
  FD_ASSERT_OK(fd_prefix_attach(c, 1, "a"));
  uint64_t both[2] = {1, 2}, two = 2, four = 4;
  FD_ASSERT_OK(fd_cache_append(c, both, 2, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_cache_append(c, &two, 1, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_cache_append(c, &two, 1, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_cache_append(c, &two, 1, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_cache_append(c, &four, 1, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_cache_finish_request(c, 4));
  FD_ASSERT_OK(fd_cache_validate(c));
  return c;
}

/* Opens a transaction over requests 1, 2, 3 (2 and 3 need new blocks). */
fd_tx open_tx(fd_cache *c) {
  uint64_t ids[3] = {1, 2, 3};
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ids, 3, &tx));
  FD_ASSERT_OK(fd_cache_validate(c));
  return tx;
}

struct Corruption {
  const char *name;
  bool with_tx;
  std::function<void(fd::CacheState &)> corrupt;
  const char *expect;
};

}  // namespace

/* Each case corrupts one thing; validate must report it. */
static void every_invariant_fires(void **) {
  const std::vector<Corruption> cases = {
      {"free list duplicate", false,
       [](fd::CacheState &s) {
         auto &fl = s.allocator.reversed_free_list_for_test();
         fl.push_back(fl.front());
       },
       "the free list holds block"},
      {"free list out of range", false,
       [](fd::CacheState &s) { s.allocator.reversed_free_list_for_test().push_back(12); },
       "outside [0, 12)"},
      {"leaked block", false,
       [](fd::CacheState &s) { s.allocator.reversed_free_list_for_test().pop_back(); }, "leaked"},
      {"free and private", false,
       [](fd::CacheState &s) {
         s.allocator.reversed_free_list_for_test().push_back(
             s.requests.all_for_test().at(2).blocks[0]);
       },
       "held by both the free list and request 2"},
      {"two prefixes share a block", false,
       [](fd::CacheState &s) {
         auto &p = s.prefixes.all_for_test();
         const int32_t old = p.at("b").blocks[1];
         p.at("b").blocks[1] = p.at("a").blocks[0];
         s.allocator.reversed_free_list_for_test().push_back(old);
       },
       "held by both prefix \"a\" and prefix \"b\""},
      {"private and prefix", false,
       [](fd::CacheState &s) {
         auto &r = s.requests.all_for_test().at(1);
         const int32_t tail = r.blocks[2];
         r.blocks[2] = s.prefixes.all_for_test().at("b").blocks[0];
         s.allocator.reversed_free_list_for_test().push_back(tail);
       },
       "held by both prefix \"b\" and request 1"},
      {"empty prefix", false,
       [](fd::CacheState &s) {
         auto &p = s.prefixes.all_for_test().at("b");
         for (int32_t b : p.blocks) s.allocator.reversed_free_list_for_test().push_back(b);
         p.blocks.clear();
       },
       "prefix \"b\" has no blocks"},
      {"prefixes over capacity", false,
       [](fd::CacheState &s) {
         auto &fl = s.allocator.reversed_free_list_for_test();
         s.prefixes.all_for_test().at("b").blocks.push_back(fl.back());
         fl.pop_back();
       },
       "more than the prefix capacity 4"},
      {"block count vs seq_len", false,
       [](fd::CacheState &s) { s.requests.all_for_test().at(2).seq_len = 5; },
       "request 2 owns 2 blocks, but seq_len 5 needs 3"},
      {"negative seq_len", false,
       [](fd::CacheState &s) { s.requests.all_for_test().at(3).seq_len = -1; }, "negative seq_len"},
      {"attached to a missing prefix", false,
       [](fd::CacheState &s) { s.requests.all_for_test().at(1).prefix_id = "zz"; }, "not resident"},
      {"first blocks differ from the prefix", false,
       [](fd::CacheState &s) { s.requests.all_for_test().at(1).prefix_id = "b"; },
       "first blocks differ from its prefix \"b\""},
      {"prefix blocks without prefix", false,
       [](fd::CacheState &s) { s.requests.all_for_test().at(3).prefix_blocks = 1; },
       "prefix blocks but no prefix"},
      {"seq_len shorter than the prefix", false,
       [](fd::CacheState &s) {
         /* 1 owns 3 blocks (prefix 2 + tail); seq_len 3 would need 2: drop
          * the tail too, so only the prefix check can fire. */
         auto &r = s.requests.all_for_test().at(1);
         s.allocator.reversed_free_list_for_test().push_back(r.blocks[2]);
         r.blocks.pop_back();
         r.seq_len = 3;
       },
       "shorter than its prefix"},
      {"reference count", false,
       [](fd::CacheState &s) { s.prefixes.all_for_test().at("b").ref_count = 1; },
       "prefix \"b\" has reference count 1 but 0 attached"},
      {"terminal request owns blocks", false,
       [](fd::CacheState &s) {
         auto &fl = s.allocator.reversed_free_list_for_test();
         s.requests.all_for_test().at(4).blocks.push_back(fl.back());
         fl.pop_back();
       },
       "finished request 4 still owns"},
      {"terminal request keeps a prefix", false,
       [](fd::CacheState &s) { s.requests.all_for_test().at(4).prefix_id = "b"; },
       "finished request 4 still owns"},
      {"request counters", false,
       [](fd::CacheState &s) { s.requests.all_for_test().at(3).state = FD_REQUEST_CANCELLED; },
       "request counters"},
      {"invalid request state", false,
       [](fd::CacheState &s) { s.requests.all_for_test().at(3).state = 9; }, "invalid state 9"},
      {"history over its limit", false, [](fd::CacheState &s) { s.history.set_size_for_test(257); },
       "more than its limit 256"},
      {"in-transaction flag without a transaction", false,
       [](fd::CacheState &s) { s.requests.all_for_test().at(3).in_transaction = true; }, "flag"},
      /* With an open transaction over 1, 2, 3. */
      {"transaction flag on a non-row", true, [](fd::CacheState &s) { s.open_tx->rows.pop_back(); },
       "request 3"},
      {"transaction position", true, [](fd::CacheState &s) { s.open_tx->rows[1].position = 2; },
       "position 2 differs from its seq_len 4"},
      {"transaction offset", true, [](fd::CacheState &s) { s.open_tx->rows[0].offset = 0; },
       "does not match what it owns"},
      {"transaction block", true,
       [](fd::CacheState &s) {
         s.open_tx->rows[0].block = s.requests.all_for_test().at(1).blocks[0];
       },
       "does not match what it owns"},
      {"transaction new-block order", true,
       [](fd::CacheState &s) { std::swap(s.open_tx->new_blocks[0], s.open_tx->new_blocks[1]); },
       "new blocks differ"},
      {"transaction block also free", true,
       [](fd::CacheState &s) {
         s.allocator.reversed_free_list_for_test().push_back(s.open_tx->new_blocks[0]);
       },
       "held by both the free list and transaction"},
      {"transaction layers", true, [](fd::CacheState &s) { s.open_tx->next_layer = 2; },
       "written 2 layers, more than num_layers 1"},
      {"transaction id", true, [](fd::CacheState &s) { s.open_tx->id = s.next_tx_id; },
       "not yet issued"},
      {"transaction version", true,
       [](fd::CacheState &s) { s.open_tx->cache_version = s.state_version + 1; },
       "newer than the cache's"},
      {"transaction row for a terminal request", true,
       [](fd::CacheState &s) {
         s.open_tx->rows[2].request_id = 4;
         s.requests.all_for_test().at(3).in_transaction = false;
       },
       "row for request 4, which is not active"},
  };
  for (const Corruption &k : cases) {
    fd_cache *c = healthy_cache();
    if (k.with_tx) open_tx(c);
    k.corrupt(fd::cache_state_for_test(c));
    const fd_status st = fd_cache_validate(c);
    const char *msg = fd_last_error_message();
    if (st != FD_ERR_INVARIANT || strstr(msg, k.expect) == NULL) {
      print_error("case \"%s\": got %s \"%s\", expected FD_ERR_INVARIANT with \"%s\"\n", k.name,
                  fd_status_string(st), msg, k.expect);
      fail();
    }
    fd_cache_destroy(c);
  }
}

/* Healthy caches pass, with and without an open transaction. */
static void healthy_passes(void **) {
  fd_cache *c = healthy_cache();
  fd_tx tx = open_tx(c);
  std::vector<float> kv(6, 0.f);
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_cache_validate(c));
  FD_ASSERT_OK(fd_tx_commit(c, tx));
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

static void allocator_order_and_counters(void **) {
  fd::BlockAllocator a(4);
  assert_true(a.free_list() == (std::vector<int32_t>{0, 1, 2, 3}));
  const int32_t b0 = a.allocate(), b1 = a.allocate();
  assert_int_equal(b0, 0);
  assert_int_equal(b1, 1);
  a.release(b0);
  a.release(b1);
  assert_true(a.free_list() == (std::vector<int32_t>{1, 0, 2, 3}));
  std::vector<int32_t> got = {a.allocate(), a.allocate(), a.allocate()};
  assert_true(got == (std::vector<int32_t>{1, 0, 2}));
  a.rollback(got);
  assert_true(a.free_list() == (std::vector<int32_t>{1, 0, 2, 3}));
  const fd::AllocatorCounters &n = a.counters();
  assert_int_equal(n.allocation_count, 5);
  assert_int_equal(n.fresh_allocation_count, 3);
  assert_int_equal(n.reuse_count, 2);
  assert_int_equal(n.free_count, 2);
  a.record_capacity_failure();
  assert_int_equal(a.counters().capacity_failure_count, 1);
  assert_int_equal(a.free_blocks(), 4);
}

static void history_ring(void **) {
  fd::TransactionHistory h;
  assert_int_equal(h.limit(), 256);
  for (uint64_t id = 1; id <= 300; ++id) {
    fd::TerminalTransaction e;
    e.id = id;
    e.cache_version = id * 10;
    e.state = id % 2 ? FD_TX_COMMITTED : FD_TX_ABORTED;
    h.push(std::move(e));
  }
  assert_int_equal(h.size(), 256);
  assert_null(h.find(44));
  assert_non_null(h.find(45));
  assert_int_equal(h.find(45)->cache_version, 450);
  assert_int_equal(h.find(300)->state, FD_TX_ABORTED);
  assert_null(h.find(301));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_invariant_fires),
      cmocka_unit_test(healthy_passes),
      cmocka_unit_test(allocator_order_and_counters),
      cmocka_unit_test(history_ring),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
