/* Failures of the K/V storage behind a cache (a device copy or launch error),
 * injected through a storage double installed with the internal test hook:
 * - fd_prefix_register is all or nothing (docs/semantics.md S6, docs/abi.md rule 9):
 *   a failing copy leaves the registry, the free list and every counter as
 *   they were, and a later registration gets exactly the blocks it would
 *   have got without the failure;
 * - a failing layer write counts in transaction_failure_count and leaves the
 *   transaction open where it was (S5);
 * - a failing legacy append leaves no transaction open behind it (S5.1). */
// The library's headers come before cmocka.h, whose fail() macro would
// clash with fd::fail.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/cache_test_hook.hpp"
#include "core/error.hpp"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include "fd_test.h"

namespace {

/* Delegates to the real storage; fails on request, after doing part of the
 * work (as a device copy that errors half way would). */
class FailingStorage final : public fd::KvStorage {
 public:
  explicit FailingStorage(std::unique_ptr<fd::KvStorage> inner) : inner_(std::move(inner)) {}

  bool fail_copy = false;
  bool fail_write = false;

  void write_layer(uint32_t layer, const fd::RowLocation *rows, size_t num_rows, const void *k,
                   const void *v, fd_stream stream) override {
    if (fail_write) throw fd::Error(FD_ERR_DEVICE, "injected write failure");
    inner_->write_layer(layer, rows, num_rows, k, v, stream);
  }
  void write_layer_rope(uint32_t layer, const fd::RowLocation *rows, const int32_t *positions,
                        size_t num_rows, const void *q, uint32_t num_q_heads, const void *k,
                        const void *v, uint32_t rotary_dim, float rope_base, void *q_out,
                        fd_stream stream) override {
    if (fail_write) throw fd::Error(FD_ERR_DEVICE, "injected write failure");
    inner_->write_layer_rope(layer, rows, positions, num_rows, q, num_q_heads, k, v, rotary_dim,
                             rope_base, q_out, stream);
  }
  void copy_blocks_in(const int32_t *blocks, size_t num_blocks, const void *k_blocks,
                      const void *v_blocks, fd_stream stream) override {
    if (fail_copy) {
      // The first block of K lands (single-layer caches), then the error.
      inner_->copy_blocks_in(blocks, 1, k_blocks, k_blocks, stream);
      throw fd::Error(FD_ERR_DEVICE, "injected copy failure");
    }
    inner_->copy_blocks_in(blocks, num_blocks, k_blocks, v_blocks, stream);
  }
  fd::LayerStorage layer(uint32_t layer) override { return inner_->layer(layer); }
  void reserve_rows(size_t n) override { inner_->reserve_rows(n); }
  void stage_rows(const fd::RowLocation *rows, const int32_t *positions,
                  size_t n) noexcept override {
    inner_->stage_rows(rows, positions, n);
  }
  void check_write(size_t n, const void *q, uint32_t hq, const void *k, const void *v,
                   const void *q_out) const override {
    inner_->check_write(n, q, hq, k, v, q_out);
  }
  void export_tables(size_t table_ints, size_t len_ints, int32_t *tables, int32_t *lens,
                     fd_stream stream, fd::ExportFill fill) override {
    inner_->export_tables(table_ints, len_ints, tables, lens, stream, fill);
  }
  fd_status async_error(std::string *message) const override {
    return inner_->async_error(message);
  }

 private:
  std::unique_ptr<fd::KvStorage> inner_;
};

/* One layer, one head, head_dim 2, block_size 2, FP32: a block is 4 floats. */
fd_cache *make_cache(uint32_t max_blocks, uint32_t prefix_capacity, FailingStorage **storage) {
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_layers = 1;
  cfg.num_kv_heads = 1;
  cfg.head_dim = 2;
  cfg.block_size = 2;
  cfg.max_blocks = max_blocks;
  cfg.prefix_cache_capacity_blocks = prefix_capacity;
  cfg.dtype = FD_DTYPE_F32;
  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  std::unique_ptr<fd::KvStorage> &slot = fd::cache_storage_for_test(c);
  auto wrapped = std::make_unique<FailingStorage>(std::move(slot));
  *storage = wrapped.get();
  slot = std::move(wrapped);
  return c;
}

/* `n` blocks whose every element is `value`. */
std::vector<float> blocks_of(uint32_t n, float value) {
  return std::vector<float>(size_t{n} * 4, value);
}

void register_ok(fd_cache *c, const char *id, uint32_t n, float value) {
  const std::vector<float> b = blocks_of(n, value);
  FD_ASSERT_OK(fd_prefix_register(c, id, b.data(), b.data(), n, NULL));
}

fd_cache_metrics metrics_of(fd_cache *c) {
  fd_cache_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_cache_metrics_get(c, &m));
  return m;
}

/* Everything a registration could change: metrics (counters, version,
 * resident prefixes), the free list in order, and each prefix's blocks,
 * reference count and LRU clock. */
struct Observed {
  fd_cache_metrics metrics;
  std::vector<int32_t> free_list;
  std::map<std::string, std::vector<int32_t>> blocks;
  std::map<std::string, std::pair<uint32_t, uint64_t>> refs_and_last_use;
};

Observed observe(fd_cache *c) {
  Observed o;
  o.metrics = metrics_of(c);
  fd::CacheState &s = fd::cache_state_for_test(c);
  o.free_list = s.allocator.free_list();
  for (const auto &kv : s.prefixes.all()) {
    o.blocks[kv.first] = kv.second.blocks;
    o.refs_and_last_use[kv.first] = {kv.second.ref_count, kv.second.last_use};
  }
  return o;
}

void assert_same(const Observed &a, const Observed &b) {
  assert_memory_equal(&a.metrics, &b.metrics, sizeof a.metrics);
  assert_true(a.free_list == b.free_list);
  assert_true(a.blocks == b.blocks);
  assert_true(a.refs_and_last_use == b.refs_and_last_use);
}

/* The K values the cache holds in physical block `block`. */
std::vector<float> k_block(fd_cache *c, int32_t block) {
  void *k = NULL, *v = NULL;
  int64_t strides[4];
  FD_ASSERT_OK(fd_cache_layer_storage(c, 0, &k, &v, strides));
  const float *base = static_cast<const float *>(k) + block * strides[0];
  return std::vector<float>(base, base + 4);
}

/* Registers `id` on a cache prepared by `prepare`, once with an injected
 * copy failure and then for real, and on a twin without the failure: the
 * failure changes nothing, and afterwards both caches agree exactly. */
void failing_then_ok(uint32_t max_blocks, uint32_t capacity, void (*prepare)(fd_cache *),
                     uint32_t n, uint64_t expect_evictions) {
  FailingStorage *fs = NULL, *twin_fs = NULL;
  fd_cache *c = make_cache(max_blocks, capacity, &fs);
  fd_cache *twin = make_cache(max_blocks, capacity, &twin_fs);
  prepare(c);
  prepare(twin);
  const Observed before = observe(c);
  const std::vector<float> b = blocks_of(n, 7.f);

  fs->fail_copy = true;
  FD_ASSERT_FAILS(fd_prefix_register(c, "new", b.data(), b.data(), n, NULL), FD_ERR_DEVICE,
                  "injected copy failure");
  assert_same(observe(c), before);
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_prefix_info info;
  info.struct_size = sizeof info;
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "new", &info), FD_ERR_NOT_FOUND, "unknown prefix \"new\"");

  fs->fail_copy = false;
  FD_ASSERT_OK(fd_prefix_register(c, "new", b.data(), b.data(), n, NULL));
  FD_ASSERT_OK(fd_prefix_register(twin, "new", b.data(), b.data(), n, NULL));
  FD_ASSERT_OK(fd_cache_validate(c));
  assert_same(observe(c), observe(twin));
  assert_int_equal(metrics_of(c).prefix_eviction_count,
                   before.metrics.prefix_eviction_count + expect_evictions);
  const Observed after = observe(c);
  for (int32_t block : after.blocks.at("new")) {
    const std::vector<float> got = k_block(c, block);
    for (float x : got) assert_true(x == 7.f);
  }
  fd_cache_destroy(c);
  fd_cache_destroy(twin);
}

/* Free blocks and capacity to spare: no eviction. */
void prepare_roomy(fd_cache *c) {
  register_ok(c, "a", 1, 1.f);
}

/* Capacity 4 full with "a" (LRU) and "b", 2 blocks each: a 2-block
 * registration evicts "a" and reuses exactly its blocks. */
void prepare_full_capacity(fd_cache *c) {
  register_ok(c, "a", 2, 1.f);
  register_ok(c, "b", 2, 2.f);
}

/* "a" (1 block, LRU) must go, and the new prefix needs free blocks as
 * well: its blocks are a's block, then the free list's front. A finished
 * request has put its blocks at that front out of order. */
void prepare_mixed(fd_cache *c) {
  register_ok(c, "a", 1, 1.f);
  register_ok(c, "b", 1, 2.f);
  FD_ASSERT_OK(fd_cache_add_request(c, 5));
  const std::vector<float> kv(2, 3.f);
  const uint64_t id = 5;
  for (int i = 0; i < 5; ++i) FD_ASSERT_OK(fd_cache_append(c, &id, 1, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_cache_finish_request(c, 5));
}

/* Two unreferenced victims, and a referenced prefix that must survive. */
void prepare_two_victims(fd_cache *c) {
  register_ok(c, "a", 1, 1.f);
  register_ok(c, "b", 2, 2.f);
  register_ok(c, "keep", 1, 3.f);
  FD_ASSERT_OK(fd_cache_add_request(c, 9));
  FD_ASSERT_OK(fd_prefix_attach(c, 9, "keep"));
}

/* The victim ("a", 3 blocks) frees more than the 1-block registration
 * needs: it takes a's last block, the rest stays at the free list's front. */
void prepare_big_victim(fd_cache *c) {
  register_ok(c, "a", 3, 1.f);
  register_ok(c, "b", 1, 2.f);
}

}  // namespace

static void register_copy_failure_victim_larger_than_needed(void **) {
  failing_then_ok(8, 4, prepare_big_victim, 1, 1);
}

static void register_copy_failure_without_eviction(void **) {
  failing_then_ok(8, 4, prepare_roomy, 2, 0);
}

static void register_copy_failure_reusing_victim_blocks(void **) {
  failing_then_ok(8, 4, prepare_full_capacity, 2, 1);
}

static void register_copy_failure_victim_and_free_blocks(void **) {
  failing_then_ok(10, 4, prepare_mixed, 4, 2);
}

static void register_copy_failure_two_victims(void **) {
  failing_then_ok(6, 4, prepare_two_victims, 3, 2);
}

/* A storage failure in a layer write is a failed write: counted, and the
 * transaction stays open at the same layer; retrying then works. */
static void write_failure_keeps_transaction(void **) {
  FailingStorage *fs = NULL;
  fd_cache *c = make_cache(8, 0, &fs);
  FD_ASSERT_OK(fd_cache_add_request(c, 1));
  const uint64_t id = 1;
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, &id, 1, &tx));
  const fd_cache_metrics before = metrics_of(c);
  std::vector<float> q(2, 1.f), kv(2, 2.f);

  fs->fail_write = true;
  FD_ASSERT_FAILS(fd_tx_write_layer(c, tx, 0, kv.data(), kv.data(), NULL), FD_ERR_DEVICE,
                  "injected write failure");
  FD_ASSERT_FAILS(
      fd_tx_write_layer_rope(c, tx, 0, q.data(), 1, kv.data(), kv.data(), 2, 1e4f, q.data(), NULL),
      FD_ERR_DEVICE, "injected write failure");
  fd_cache_metrics after = metrics_of(c);
  assert_int_equal(after.transaction_failure_count, before.transaction_failure_count + 2);
  after.transaction_failure_count = before.transaction_failure_count;
  assert_memory_equal(&after, &before, sizeof after);
  fd_tx_info info;
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_tx_get_info(c, tx, &info));
  assert_int_equal(info.next_layer, 0);
  assert_int_equal(info.state, FD_TX_OPEN);
  FD_ASSERT_OK(fd_cache_validate(c));

  fs->fail_write = false;
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_tx_commit(c, tx));
  assert_int_equal(metrics_of(c).transaction_layer_write_count,
                   before.transaction_layer_write_count + 1);
  fd_cache_destroy(c);
}

/* A legacy append whose layer write fails in the storage: the caller never
 * saw the transaction, so it is rolled back (none stays open to block the
 * cache); seq_lens, blocks and the free list are as before. */
static void legacy_append_write_failure_rolls_back(void **) {
  FailingStorage *fs = NULL;
  fd_cache *c = make_cache(8, 0, &fs);
  const uint64_t ids[2] = {1, 2};
  FD_ASSERT_OK(fd_cache_add_request(c, 1));
  FD_ASSERT_OK(fd_cache_add_request(c, 2));
  std::vector<float> kv(4, 2.f);
  FD_ASSERT_OK(fd_cache_append(c, ids, 1, kv.data(), kv.data(), NULL));
  const fd_cache_metrics before = metrics_of(c);
  const std::vector<int32_t> free_before = fd::cache_state_for_test(c).allocator.free_list();

  fs->fail_write = true;
  FD_ASSERT_FAILS(fd_cache_append(c, ids, 2, kv.data(), kv.data(), NULL), FD_ERR_DEVICE,
                  "injected write failure");
  const fd_cache_metrics after = metrics_of(c);
  assert_int_equal(after.open_transaction_count, 0);
  assert_int_equal(after.used_blocks, before.used_blocks);
  assert_int_equal(after.active_tokens, before.active_tokens);
  assert_int_equal(after.transaction_commit_count, before.transaction_commit_count);
  assert_int_equal(after.transaction_abort_count, before.transaction_abort_count + 1);
  assert_true(fd::cache_state_for_test(c).allocator.free_list() == free_before);
  int32_t lens[2] = {-1, -1};
  FD_ASSERT_OK(fd_cache_export(c, ids, 2, 0, NULL, lens));
  assert_int_equal(lens[0], 1);
  assert_int_equal(lens[1], 0);
  FD_ASSERT_OK(fd_cache_validate(c));

  fs->fail_write = false;
  FD_ASSERT_OK(fd_cache_append(c, ids, 2, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_cache_export(c, ids, 2, 0, NULL, lens));
  assert_int_equal(lens[0], 2);
  assert_int_equal(lens[1], 1);
  fd_cache_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(register_copy_failure_without_eviction),
      cmocka_unit_test(register_copy_failure_reusing_victim_blocks),
      cmocka_unit_test(register_copy_failure_victim_and_free_blocks),
      cmocka_unit_test(register_copy_failure_two_victims),
      cmocka_unit_test(register_copy_failure_victim_larger_than_needed),
      cmocka_unit_test(write_failure_keeps_transaction),
      cmocka_unit_test(legacy_append_write_failure_rolls_back),
  };
  return cmocka_run_group_tests_name("unit_cache_failures", tests, NULL, NULL);
}
