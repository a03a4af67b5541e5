/* Helpers shared by the cache, transaction and prefix suites (C++ only).
 * Include after <stdarg.h>, <stddef.h>, <setjmp.h>, <stdint.h>, <cmocka.h>
 * and "fd_test.h". */
#ifndef FD_TEST_CACHE_SUPPORT_H
#define FD_TEST_CACHE_SUPPORT_H

#include <cstring>
#include <vector>

#include "flashdec.h"

/* A small CPU cache; fails the test when creation fails. */
static inline fd_cache *cs_make_cache(uint32_t layers, uint32_t heads, uint32_t head_dim,
                                      uint32_t block_size, uint32_t max_blocks,
                                      uint32_t prefix_capacity = 0, int32_t dtype = FD_DTYPE_F32,
                                      int32_t layout = FD_LAYOUT_TOKEN_MAJOR) {
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_layers = layers;
  cfg.num_kv_heads = heads;
  cfg.head_dim = head_dim;
  cfg.block_size = block_size;
  cfg.max_blocks = max_blocks;
  cfg.prefix_cache_capacity_blocks = prefix_capacity;
  cfg.dtype = dtype;
  cfg.layout = layout;
  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  assert_non_null(c);
  return c;
}

static inline fd_cache_metrics cs_metrics(const fd_cache *c) {
  fd_cache_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_cache_metrics_get(c, &m));
  return m;
}

static inline uint64_t cs_version(const fd_cache *c) {
  uint64_t v = 0;
  FD_ASSERT_OK(fd_cache_state_version(c, &v));
  return v;
}

static inline int32_t cs_state(const fd_cache *c, uint64_t id) {
  int32_t s = -1;
  FD_ASSERT_OK(fd_cache_request_state(c, id, &s));
  return s;
}

/* Committed block table of one active request (no padding). */
static inline std::vector<int32_t> cs_table(const fd_cache *c, uint64_t id) {
  uint32_t n = 0;
  FD_ASSERT_OK(fd_cache_max_blocks_per_seq(c, &id, 1, &n));
  std::vector<int32_t> row(n + 1, 7777);
  FD_ASSERT_OK(fd_cache_export(c, &id, 1, n, row.data(), NULL));
  assert_int_equal(row[n], 7777); /* nothing past the stride */
  row.resize(n);
  return row;
}

static inline int32_t cs_seq_len(const fd_cache *c, uint64_t id) {
  int32_t len = -1;
  FD_ASSERT_OK(fd_cache_export(c, &id, 1, 0, NULL, &len));
  return len;
}

/* Adds each id (must be new or active). */
static inline void cs_add(fd_cache *c, std::vector<uint64_t> ids) {
  for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_add_request(c, id));
}

/* Grows each listed request by `tokens` tokens through full transactions,
 * writing zeros to every layer. */
static inline void cs_grow(fd_cache *c, std::vector<uint64_t> ids, int tokens) {
  fd_cache_config cfg;
  cfg.struct_size = sizeof cfg;
  FD_ASSERT_OK(fd_cache_get_config(c, &cfg));
  std::vector<unsigned char> kv(ids.size() * cfg.num_kv_heads * cfg.head_dim * 4, 0);
  for (int t = 0; t < tokens; ++t) {
    fd_tx tx;
    FD_ASSERT_OK(fd_tx_begin(c, ids.data(), (uint32_t)ids.size(), &tx));
    for (uint32_t l = 0; l < cfg.num_layers; ++l)
      FD_ASSERT_OK(fd_tx_write_layer(c, tx, l, kv.data(), kv.data(), NULL));
    FD_ASSERT_OK(fd_tx_commit(c, tx));
  }
}

/* The current free-list order, front first, observed through the block ids a
 * transaction over fresh empty requests receives; the transaction is aborted
 * (which restores the exact order) and the probe requests are cancelled (they
 * own nothing), so the free list is left as it was. Needs no open
 * transaction. */
static inline std::vector<int32_t> cs_free_list(fd_cache *c) {
  static uint64_t next_probe_id = 0xF000000000000000ull;
  const uint32_t n = (uint32_t)cs_metrics(c).free_blocks;
  if (n == 0) return std::vector<int32_t>();
  std::vector<uint64_t> ids(n);
  for (uint32_t i = 0; i < n; ++i) {
    ids[i] = next_probe_id++;
    FD_ASSERT_OK(fd_cache_add_request(c, ids[i]));
  }
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ids.data(), n, &tx));
  std::vector<int32_t> blocks(n, -2);
  FD_ASSERT_OK(fd_tx_get_rows(c, tx, n, NULL, NULL, blocks.data(), NULL, NULL));
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  for (uint64_t id : ids) FD_ASSERT_OK(fd_cache_cancel_request(c, id));
  return blocks;
}

/* Everything observable about a cache that a failing call must not change:
 * metrics (which include state_version), the states of `ids`, and the
 * exported block tables and seq_lens of those that are active. */
struct CsSnapshot {
  fd_cache_metrics metrics;
  uint64_t version;
  std::vector<int32_t> states;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> seq_lens;
};

static inline CsSnapshot cs_snapshot(const fd_cache *c, const std::vector<uint64_t> &ids) {
  CsSnapshot s;
  s.metrics = cs_metrics(c);
  s.version = cs_version(c);
  for (uint64_t id : ids) {
    s.states.push_back(cs_state(c, id));
    if (s.states.back() == FD_REQUEST_ACTIVE) {
      s.tables.push_back(cs_table(c, id));
      s.seq_lens.push_back(cs_seq_len(c, id));
    }
  }
  return s;
}

static inline void cs_assert_same(const CsSnapshot &a, const CsSnapshot &b) {
  assert_memory_equal(&a.metrics, &b.metrics, sizeof a.metrics);
  assert_true(a.version == b.version);
  assert_true(a.states == b.states);
  assert_true(a.tables == b.tables);
  assert_true(a.seq_lens == b.seq_lens);
}

/* A snapshot plus the free-list order (taken first, since probing the free
 * list moves counters and the version). */
struct CsFrozen {
  std::vector<int32_t> free_list;
  CsSnapshot snap;
  std::vector<uint64_t> ids;
};

static inline CsFrozen cs_freeze(fd_cache *c, std::vector<uint64_t> ids, bool probe = true) {
  CsFrozen f;
  if (probe) f.free_list = cs_free_list(c);
  f.snap = cs_snapshot(c, ids);
  f.ids = ids;
  return f;
}

/* Asserts that nothing changed since cs_freeze (and that the invariants hold). */
static inline void cs_assert_unchanged(fd_cache *c, const CsFrozen &f, bool probe = true) {
  cs_assert_same(f.snap, cs_snapshot(c, f.ids));
  FD_ASSERT_OK(fd_cache_validate(c));
  if (probe) assert_true(cs_free_list(c) == f.free_list);
}

/* Element (block, head, token, dim) of layer `layer`'s K (which == 0) or V,
 * read through fd_cache_layer_storage's pointers and strides. */
static inline float cs_read_kv(fd_cache *c, int which, uint32_t layer, int32_t block, uint32_t head,
                               uint32_t token, uint32_t dim) {
  fd_cache_config cfg;
  cfg.struct_size = sizeof cfg;
  FD_ASSERT_OK(fd_cache_get_config(c, &cfg));
  void *k = NULL, *v = NULL;
  int64_t st[4];
  FD_ASSERT_OK(fd_cache_layer_storage(c, layer, &k, &v, st));
  const size_t i = (size_t)((int64_t)block * st[0] + (int64_t)head * st[1] +
                            (int64_t)token * st[2] + (int64_t)dim * st[3]);
  return fd_test_load(which == 0 ? k : v, i, cfg.dtype);
}

/* Everything an open transaction's views show: info, per-row view, per-token
 * view and block tables (at the smallest stride). */
struct CsTxView {
  fd_tx_info info;
  std::vector<int32_t> rows, tokens, tables;
};

static inline CsTxView cs_tx_view(fd_cache *c, fd_tx tx) {
  CsTxView v;
  v.info.struct_size = sizeof v.info;
  FD_ASSERT_OK(fd_tx_get_info(c, tx, &v.info));
  const uint32_t n = v.info.batch, t = v.info.token_count;
  v.rows.assign(4 * n, 0);
  FD_ASSERT_OK(
      fd_tx_get_rows(c, tx, n, NULL, &v.rows[0], &v.rows[n], &v.rows[2 * n], &v.rows[3 * n]));
  v.tokens.assign(3 * t, 0);
  FD_ASSERT_OK(fd_tx_get_tokens(c, tx, t, &v.tokens[0], &v.tokens[t], &v.tokens[2 * t]));
  v.tables.assign(n * v.info.max_blocks_per_seq, 0);
  FD_ASSERT_OK(fd_tx_block_tables(c, tx, v.info.max_blocks_per_seq, v.tables.data()));
  return v;
}

static inline void cs_assert_same_view(const CsTxView &a, const CsTxView &b) {
  assert_memory_equal(&a.info, &b.info, sizeof a.info);
  assert_true(a.rows == b.rows);
  assert_true(a.tokens == b.tokens);
  assert_true(a.tables == b.tables);
}

#endif /* FD_TEST_CACHE_SUPPORT_H */
