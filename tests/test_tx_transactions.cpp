/* Multi-layer token transactions (docs/semantics.md S5): begin/write/commit/abort,
 * views, handle errors, the terminal history, and every error rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <cmath>

#include "fd_test.h"
#include "test_cache_support.h"

namespace {

/* Distinct value for (layer, row, head, dim, which): exactly representable in
 * bf16/f16 (small integers). */
float tag(uint32_t layer, uint32_t row, uint32_t head, uint32_t dim, int which) {
  const float x = (float)(layer * 64 + row * 16 + head * 4 + dim + 1);
  return which == 0 ? x : -x;
}

std::vector<unsigned char> layer_data(int32_t dtype, uint32_t layer, uint32_t rows, uint32_t heads,
                                      uint32_t head_dim, int which) {
  std::vector<unsigned char> buf(rows * heads * head_dim * fd_test_dtype_size(dtype));
  for (uint32_t r = 0; r < rows; ++r)
    for (uint32_t h = 0; h < heads; ++h)
      for (uint32_t d = 0; d < head_dim; ++d)
        fd_test_store(buf.data(), (r * heads + h) * head_dim + d, dtype,
                      tag(layer, r, h, d, which));
  return buf;
}

/* A transaction over rows that cross a block boundary and rows that do not,
 * for every dtype and layout, written layer by layer and committed. */
void multi_layer_commit(void **) {
  const int32_t dtypes[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  for (int32_t dtype : dtypes)
    for (int32_t layout = 0; layout < 2; ++layout) {
      const uint32_t L = 3, H = 2, D = 4, B = 4;
      fd_cache *c = cs_make_cache(L, H, D, B, 16, 0, dtype, layout);
      cs_add(c, {1, 2, 3, 4});
      cs_grow(c, {1, 2, 3}, 3);
      cs_grow(c, {1}, 1); /* 1: 4 tokens (full block), 2 and 3: 3 tokens, 4: empty */
      const std::vector<int32_t> before1 = cs_table(c, 1), before2 = cs_table(c, 2);
      uint64_t ids[4] = {2, 4, 1, 3};
      const uint64_t v0 = cs_version(c);
      fd_tx tx;
      FD_ASSERT_OK(fd_tx_begin(c, ids, 4, &tx));
      assert_true(tx.cache_version == cs_version(c));
      assert_true(tx.cache_version > v0);

      fd_tx_info info;
      info.struct_size = sizeof info;
      FD_ASSERT_OK(fd_tx_get_info(c, tx, &info));
      assert_int_equal(info.batch, 4);
      assert_int_equal(info.next_layer, 0);
      assert_int_equal(info.state, FD_TX_OPEN);
      assert_int_equal(info.new_block_count, 2); /* rows 4 and 1 */
      assert_int_equal(info.max_blocks_per_seq, 2);

      uint64_t rid[4];
      int32_t pos[4], blk[4], off[4], eff[4];
      FD_ASSERT_OK(fd_tx_get_rows(c, tx, 4, rid, pos, blk, off, eff));
      const int32_t want_pos[4] = {3, 0, 4, 3}, want_off[4] = {3, 0, 0, 3};
      for (int r = 0; r < 4; ++r) {
        assert_true(rid[r] == ids[r]);
        assert_int_equal(pos[r], want_pos[r]);
        assert_int_equal(off[r], want_off[r]);
        assert_int_equal(eff[r], want_pos[r] + 1);
      }
      assert_int_equal(blk[0], before2[0]); /* room left in its block */
      /* New blocks come from the free-list front in row order. */
      assert_int_equal(blk[1], 3);
      assert_int_equal(blk[2], 4);

      int32_t tables[4 * 3];
      FD_ASSERT_OK(fd_tx_block_tables(c, tx, 3, tables));
      const int32_t want_tables[12] = {before2[0], -1, -1, 3,      -1, -1,
                                       before1[0], 4,  -1, blk[3], -1, -1};
      assert_memory_equal(tables, want_tables, sizeof want_tables);

      for (uint32_t l = 0; l < L; ++l) {
        std::vector<unsigned char> k = layer_data(dtype, l, 4, H, D, 0);
        std::vector<unsigned char> v = layer_data(dtype, l, 4, H, D, 1);
        FD_ASSERT_OK(fd_tx_write_layer(c, tx, l, k.data(), v.data(), NULL));
        FD_ASSERT_OK(fd_tx_get_info(c, tx, &info));
        assert_int_equal(info.next_layer, l + 1);
        /* Nothing is visible before commit. */
        assert_int_equal(cs_seq_len(c, 4), 0);
      }
      assert_true(cs_version(c) == tx.cache_version); /* writes do not change ownership */
      FD_ASSERT_OK(fd_tx_commit(c, tx));
      assert_true(cs_version(c) > tx.cache_version);

      assert_int_equal(cs_seq_len(c, 1), 5);
      assert_int_equal(cs_seq_len(c, 2), 4);
      assert_int_equal(cs_seq_len(c, 3), 4);
      assert_int_equal(cs_seq_len(c, 4), 1);
      assert_true(cs_table(c, 1) == (std::vector<int32_t>{before1[0], 4}));
      assert_true(cs_table(c, 4) == (std::vector<int32_t>{3}));
      for (uint32_t r = 0; r < 4; ++r)
        for (uint32_t l = 0; l < L; ++l)
          for (uint32_t h = 0; h < H; ++h)
            for (uint32_t d = 0; d < D; ++d) {
              assert_true(cs_read_kv(c, 0, l, blk[r], h, (uint32_t)off[r], d) ==
                          tag(l, r, h, d, 0));
              assert_true(cs_read_kv(c, 1, l, blk[r], h, (uint32_t)off[r], d) ==
                          tag(l, r, h, d, 1));
            }
      /* Earlier tokens (written as zeros) stay zero. */
      assert_true(cs_read_kv(c, 0, 1, blk[0], 1, 2, 3) == 0.f);

      fd_cache_metrics m = cs_metrics(c);
      assert_int_equal(m.transaction_layer_write_count, 3 * 4 + 3);
      assert_int_equal(m.retained_transaction_state_count, 0);
      assert_int_equal(m.open_transaction_count, 0);
      FD_ASSERT_OK(fd_cache_validate(c));
      fd_cache_destroy(c);
    }
}

void abort_restores_free_list(void **) {
  fd_cache *c = cs_make_cache(2, 1, 2, 2, 12);
  cs_add(c, {1, 2, 3, 4, 5});
  cs_grow(c, {1, 2, 3}, 3);                    /* 1: [0,3], 2: [1,4], 3: [2,5] */
  FD_ASSERT_OK(fd_cache_finish_request(c, 2)); /* front: 4, 1, 6.. */
  cs_grow(c, {4}, 1);                          /* takes 4 */
  cs_grow(c, {1}, 1);                          /* 1 now at 4 tokens: full */
  const std::vector<int32_t> free_before = cs_free_list(c);
  assert_true(free_before == (std::vector<int32_t>{1, 6, 7, 8, 9, 10, 11}));
  CsFrozen f = cs_freeze(c, {1, 3, 4, 5});

  uint64_t ids[4] = {5, 1, 3, 4}; /* 5 and 1 need blocks; 3 and 4 do not */
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ids, 4, &tx));
  int32_t blk[4];
  FD_ASSERT_OK(fd_tx_get_rows(c, tx, 4, NULL, NULL, blk, NULL, NULL));
  assert_int_equal(blk[0], 1);
  assert_int_equal(blk[1], 6);
  std::vector<float> k(4 * 2, 3.5f);
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, k.data(), k.data(), NULL));
  FD_ASSERT_OK(fd_tx_abort(c, tx));

  fd_cache_metrics m = cs_metrics(c);
  const fd_cache_metrics &b = f.snap.metrics;
  assert_int_equal(m.transaction_abort_count, b.transaction_abort_count + 1);
  assert_int_equal(m.transaction_rollback_block_count, b.transaction_rollback_block_count + 2);
  assert_int_equal(m.allocation_count, b.allocation_count + 2); /* not undone */
  assert_int_equal(m.free_count, b.free_count);                 /* a rollback is not a free */
  assert_int_equal(m.used_blocks, b.used_blocks);
  assert_int_equal(m.retained_transaction_state_count, 0);
  assert_int_equal(m.terminal_transaction_history_count, b.terminal_transaction_history_count + 1);
  /* The written bytes stay but are invisible. */
  assert_true(cs_read_kv(c, 0, 0, 6, 0, 0, 0) == 3.5f);
  assert_true(cs_snapshot(c, f.ids).tables == f.snap.tables);
  assert_true(cs_snapshot(c, f.ids).seq_lens == f.snap.seq_lens);
  assert_true(cs_free_list(c) == free_before);
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

/* Error rules of begin: nothing changes, the out-handle is untouched. */
void begin_errors(void **) {
  fd_cache *c = cs_make_cache(1, 1, 2, 2, 4);
  cs_add(c, {1, 2, 3});
  cs_grow(c, {1}, 1);
  FD_ASSERT_OK(fd_cache_cancel_request(c, 3));
  CsFrozen f = cs_freeze(c, {1, 2, 3});
  fd_tx tx = {77, 88};
  uint64_t ok[2] = {1, 2}, dup[3] = {1, 2, 1}, unknown[2] = {1, 5}, term[2] = {3, 1};
  FD_ASSERT_FAILS(fd_tx_begin(c, NULL, 1, &tx), FD_ERR_INVALID_ARGUMENT, "request_ids");
  FD_ASSERT_FAILS(fd_tx_begin(c, ok, 0, &tx), FD_ERR_INVALID_ARGUMENT, "count");
  FD_ASSERT_FAILS(fd_tx_begin(c, ok, 2, NULL), FD_ERR_INVALID_ARGUMENT, "tx");
  FD_ASSERT_FAILS(fd_tx_begin(NULL, ok, 2, &tx), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(fd_tx_begin(c, dup, 3, &tx), FD_ERR_INVALID_ARGUMENT, "request_ids[2] = 1");
  FD_ASSERT_FAILS(fd_tx_begin(c, unknown, 2, &tx), FD_ERR_NOT_FOUND, "unknown request 5");
  FD_ASSERT_FAILS(fd_tx_begin(c, term, 2, &tx), FD_ERR_INVALID_STATE, "request 3 is cancelled");
  assert_int_equal(tx.id, 77);
  assert_int_equal(tx.cache_version, 88);
  cs_assert_unchanged(c, f);

  fd_tx open;
  FD_ASSERT_OK(fd_tx_begin(c, ok, 1, &open));
  f = cs_freeze(c, {1, 2, 3}, false);
  FD_ASSERT_FAILS(fd_tx_begin(c, ok + 1, 1, &tx), FD_ERR_INVALID_STATE,
                  "while transaction 4 is open");
  FD_ASSERT_FAILS(fd_tx_begin(c, ok, 1, &tx), FD_ERR_INVALID_STATE, "open");
  assert_int_equal(tx.id, 77);
  cs_assert_unchanged(c, f, false);
  FD_ASSERT_OK(fd_tx_abort(c, open));
  fd_cache_destroy(c);
}

/* Error rules of write_layer / write_layer_rope / commit on an open
 * transaction: it stays open and unchanged; failed writes count in
 * transaction_failure_count (and nothing else moves). */
void write_and_commit_errors(void **) {
  fd_cache *c = cs_make_cache(3, 2, 4, 2, 6);
  cs_add(c, {1, 2});
  cs_grow(c, {1}, 1);
  uint64_t ids[2] = {1, 2};
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ids, 2, &tx));
  std::vector<float> kv(2 * 2 * 4, 1.f), q(2 * 4 * 4, 1.f), qo(2 * 4 * 4, 9.f);
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 1, kv.data(), kv.data(), NULL));
  const CsTxView view = cs_tx_view(c, tx);
  CsFrozen f = cs_freeze(c, {1, 2}, false);
  const void *K = kv.data();

  struct Case {
    fd_status got;
    fd_status want;
    const char *text;
  };
  /* Each failing write moves transaction_failure_count by one. */
  int failures = 0;
#define WRITE_FAILS(expr, status, text)  \
  do {                                   \
    FD_ASSERT_FAILS(expr, status, text); \
    ++failures;                          \
  } while (0)
  WRITE_FAILS(fd_tx_write_layer(c, tx, 1, K, K, NULL), FD_ERR_INVALID_ARGUMENT,
              "transaction requires layer 2, got layer 1");
  WRITE_FAILS(fd_tx_write_layer(c, tx, 3, K, K, NULL), FD_ERR_INVALID_ARGUMENT,
              "transaction requires layer 2, got layer 3");
  WRITE_FAILS(fd_tx_write_layer(c, tx, 0, K, K, NULL), FD_ERR_INVALID_ARGUMENT,
              "requires layer 2, got layer 0");
  WRITE_FAILS(fd_tx_write_layer(c, tx, 2, NULL, K, NULL), FD_ERR_INVALID_ARGUMENT, "k must");
  WRITE_FAILS(fd_tx_write_layer(c, tx, 2, K, NULL, NULL), FD_ERR_INVALID_ARGUMENT, "v must");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 3, q.data(), 4, K, K, 4, 1e4f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "transaction requires layer 2, got layer 3");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, NULL, 4, K, K, 4, 1e4f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "q must");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 4, K, K, 4, 1e4f, NULL, NULL),
              FD_ERR_INVALID_ARGUMENT, "q_out");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 4, NULL, K, 4, 1e4f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "k must");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 4, K, NULL, 4, 1e4f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "v must");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 0, K, K, 4, 1e4f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "num_q_heads 0");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 3, K, K, 4, 1e4f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "multiple");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 4, K, K, 3, 1e4f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "rotary_dim");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 4, K, K, 0, 1e4f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "rotary_dim");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 4, K, K, 6, 1e4f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "rotary_dim");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 4, K, K, 4, 0.f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "rope_base");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 4, K, K, 4, NAN, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "rope_base");
  WRITE_FAILS(fd_tx_write_layer_rope(c, tx, 2, q.data(), 4, K, K, 4, -1.f, qo.data(), NULL),
              FD_ERR_INVALID_ARGUMENT, "rope_base");
#undef WRITE_FAILS
  for (float x : qo) assert_true(x == 9.f); /* q_out untouched */
  /* Commit before every layer is written: refused, stays open, not a write failure. */
  FD_ASSERT_FAILS(fd_tx_commit(c, tx), FD_ERR_INVALID_STATE, "written 2 of 3 layers");
  FD_ASSERT_FAILS(fd_tx_write_layer(NULL, tx, 2, K, K, NULL), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(fd_tx_commit(NULL, tx), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(fd_tx_abort(NULL, tx), FD_ERR_INVALID_ARGUMENT, "cache");

  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.transaction_failure_count,
                   f.snap.metrics.transaction_failure_count + (uint64_t)failures);
  m.transaction_failure_count = f.snap.metrics.transaction_failure_count;
  assert_memory_equal(&m, &f.snap.metrics, sizeof m);
  f.snap.metrics = cs_metrics(c);
  cs_assert_unchanged(c, f, false);
  cs_assert_same_view(view, cs_tx_view(c, tx));

  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 2, K, K, NULL));
  /* Every layer written: a further write names that. */
  FD_ASSERT_FAILS(fd_tx_write_layer(c, tx, 3, K, K, NULL), FD_ERR_INVALID_ARGUMENT,
                  "written all 3 layers");
  FD_ASSERT_OK(fd_tx_commit(c, tx));
  assert_int_equal(cs_seq_len(c, 1), 2);
  assert_int_equal(cs_seq_len(c, 2), 1);
  fd_cache_destroy(c);
}

void view_errors(void **) {
  fd_cache *c = cs_make_cache(1, 1, 2, 2, 6);
  cs_add(c, {1, 2});
  cs_grow(c, {1}, 2); /* 1 is full: gets a second block */
  uint64_t ids[2] = {1, 2};
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ids, 2, &tx));
  const CsTxView view = cs_tx_view(c, tx);
  assert_int_equal(view.info.max_blocks_per_seq, 2);
  CsFrozen f = cs_freeze(c, {1, 2}, false);

  fd_tx_info info;
  memset(&info, 0x33, sizeof info);
  info.struct_size = 4;
  FD_ASSERT_FAILS(fd_tx_get_info(c, tx, &info), FD_ERR_INVALID_ARGUMENT, "struct_size");
  FD_ASSERT_FAILS(fd_tx_get_info(c, tx, NULL), FD_ERR_INVALID_ARGUMENT, "info");
  FD_ASSERT_FAILS(fd_tx_get_info(NULL, tx, &info), FD_ERR_INVALID_ARGUMENT, "cache");
  /* A smaller struct gets what fits. */
  info.struct_size = offsetof(fd_tx_info, next_layer) + 4;
  FD_ASSERT_OK(fd_tx_get_info(c, tx, &info));
  assert_int_equal(info.batch, 2);
  assert_int_equal(info.next_layer, 0);
  assert_int_equal((uint32_t)info.state, 0x33333333u);

  int32_t pos[2] = {-7, -7};
  FD_ASSERT_FAILS(fd_tx_get_rows(c, tx, 1, NULL, pos, NULL, NULL, NULL), FD_ERR_INVALID_ARGUMENT,
                  "capacity 1");
  assert_int_equal(pos[0], -7);
  FD_ASSERT_OK(fd_tx_get_rows(c, tx, 0, NULL, NULL, NULL, NULL, NULL)); /* nothing asked */
  FD_ASSERT_FAILS(fd_tx_get_rows(NULL, tx, 2, NULL, pos, NULL, NULL, NULL), FD_ERR_INVALID_ARGUMENT,
                  "cache");

  int32_t tables[4] = {5, 5, 5, 5};
  FD_ASSERT_FAILS(fd_tx_block_tables(c, tx, 1, tables), FD_ERR_INVALID_ARGUMENT, "table_stride 1");
  for (int32_t t : tables) assert_int_equal(t, 5);
  FD_ASSERT_FAILS(fd_tx_block_tables(c, tx, 2, NULL), FD_ERR_INVALID_ARGUMENT, "block_tables");
  FD_ASSERT_FAILS(fd_tx_block_tables(NULL, tx, 2, tables), FD_ERR_INVALID_ARGUMENT, "cache");
  cs_assert_unchanged(c, f, false);
  cs_assert_same_view(view, cs_tx_view(c, tx));
  FD_ASSERT_OK(fd_tx_abort(c, tx));

  /* Views work only while the transaction is open. */
  info.struct_size = sizeof info;
  FD_ASSERT_FAILS(fd_tx_get_info(c, tx, &info), FD_ERR_INVALID_STATE, "already aborted");
  FD_ASSERT_FAILS(fd_tx_get_rows(c, tx, 2, NULL, pos, NULL, NULL, NULL), FD_ERR_INVALID_STATE,
                  "already aborted");
  FD_ASSERT_FAILS(fd_tx_block_tables(c, tx, 2, tables), FD_ERR_INVALID_STATE, "already aborted");
  fd_cache_destroy(c);
}

/* The four handle errors, for every function that takes a handle. */
void expect_handle_error(fd_cache *c, fd_tx h, fd_status status, const char *text) {
  std::vector<float> kv(16, 0.f), q(16, 0.f);
  fd_tx_info info;
  info.struct_size = sizeof info;
  int32_t buf[16];
  const uint64_t failures = cs_metrics(c).transaction_failure_count;
  FD_ASSERT_FAILS(fd_tx_write_layer(c, h, 0, kv.data(), kv.data(), NULL), status, text);
  FD_ASSERT_FAILS(
      fd_tx_write_layer_rope(c, h, 0, q.data(), 1, kv.data(), kv.data(), 2, 1e4f, q.data(), NULL),
      status, text);
  FD_ASSERT_FAILS(fd_tx_commit(c, h), status, text);
  FD_ASSERT_FAILS(fd_tx_abort(c, h), status, text);
  FD_ASSERT_FAILS(fd_tx_get_info(c, h, &info), status, text);
  FD_ASSERT_FAILS(fd_tx_get_rows(c, h, 16, NULL, buf, NULL, NULL, NULL), status, text);
  FD_ASSERT_FAILS(fd_tx_block_tables(c, h, 16, buf), status, text);
  /* A handle error is not a failed write of the open transaction. */
  assert_int_equal(cs_metrics(c).transaction_failure_count, failures);
}

void handle_errors_and_history(void **) {
  fd_cache *c = cs_make_cache(1, 1, 2, 2, 100);
  cs_add(c, {1, 2});
  uint64_t id = 1;
  std::vector<float> kv(2, 0.f);

  fd_tx first;
  FD_ASSERT_OK(fd_tx_begin(c, &id, 1, &first));
  assert_int_equal(first.id, 1); /* ids start at 1 */
  FD_ASSERT_OK(fd_tx_write_layer(c, first, 0, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_tx_commit(c, first));
  fd_tx second;
  FD_ASSERT_OK(fd_tx_begin(c, &id, 1, &second));
  assert_int_equal(second.id, 2);
  FD_ASSERT_OK(fd_tx_abort(c, second));
  fd_tx open;
  FD_ASSERT_OK(fd_tx_begin(c, &id, 1, &open));
  assert_int_equal(open.id, 3);

  CsFrozen f = cs_freeze(c, {1, 2}, false);
  fd_tx_info info;
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_tx_get_info(c, open, &info));
  expect_handle_error(c, first, FD_ERR_INVALID_STATE, "transaction 1 is already committed");
  expect_handle_error(c, second, FD_ERR_INVALID_STATE, "transaction 2 is already aborted");
  expect_handle_error(c, fd_tx{open.id, open.cache_version + 1}, FD_ERR_STALE_HANDLE,
                      "stale transaction handle");
  expect_handle_error(c, fd_tx{open.id, open.cache_version - 1}, FD_ERR_STALE_HANDLE,
                      "stale transaction handle");
  expect_handle_error(c, fd_tx{first.id, first.cache_version + 7}, FD_ERR_STALE_HANDLE,
                      "stale transaction handle");
  expect_handle_error(c, fd_tx{second.id, 0}, FD_ERR_STALE_HANDLE, "stale");
  expect_handle_error(c, fd_tx{4, open.cache_version}, FD_ERR_NOT_FOUND, "unknown transaction 4");
  expect_handle_error(c, fd_tx{0, 0}, FD_ERR_NOT_FOUND, "unknown transaction 0");
  cs_assert_unchanged(c, f, false);
  FD_ASSERT_OK(fd_tx_abort(c, open));

  /* The history keeps the last 256 terminal transactions. */
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.terminal_transaction_history_count, 3);
  std::vector<fd_tx> handles;
  for (int i = 0; i < 300; ++i) {
    fd_tx t;
    FD_ASSERT_OK(fd_tx_begin(c, &id, 1, &t));
    if (i % 2 == 0) {
      FD_ASSERT_OK(fd_tx_write_layer(c, t, 0, kv.data(), kv.data(), NULL));
      FD_ASSERT_OK(fd_tx_commit(c, t));
    } else {
      FD_ASSERT_OK(fd_tx_abort(c, t));
    }
    handles.push_back(t);
    m = cs_metrics(c);
    assert_int_equal(m.terminal_transaction_history_count, i + 4 < 256 ? i + 4 : 256);
    assert_int_equal(m.retained_transaction_state_count, 0);
  }
  assert_int_equal(m.terminal_transaction_history_limit, 256);
  /* 303 terminal transactions: ids 1..47 dropped, 48..303 kept. */
  expect_handle_error(c, first, FD_ERR_NOT_FOUND, "unknown transaction 1");
  expect_handle_error(c, handles[43], FD_ERR_NOT_FOUND, "unknown transaction 47");
  expect_handle_error(c, handles[44], FD_ERR_INVALID_STATE, "transaction 48 is already committed");
  expect_handle_error(c, handles[45], FD_ERR_INVALID_STATE, "transaction 49 is already aborted");
  expect_handle_error(c, handles[299], FD_ERR_INVALID_STATE, "303 is already aborted");
  expect_handle_error(c, fd_tx{handles[44].id, handles[45].cache_version}, FD_ERR_STALE_HANDLE,
                      "stale");
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

/* RoPE computed here independently, in double precision (S3.1). */
void rope_expect(const std::vector<float> &x, std::vector<float> *out, uint32_t tokens,
                 uint32_t heads, uint32_t head_dim, const int32_t *pos, uint32_t rot, double base) {
  out->assign(x.begin(), x.end());
  for (uint32_t t = 0; t < tokens; ++t)
    for (uint32_t h = 0; h < heads; ++h)
      for (uint32_t i = 0; i < rot / 2; ++i) {
        const double freq = std::pow(base, -2.0 * i / rot);
        const double a = pos[t] * freq;
        const size_t row = ((size_t)t * heads + h) * head_dim;
        const double x1 = x[row + i], x2 = x[row + rot / 2 + i];
        (*out)[row + i] = (float)(x1 * std::cos(a) - x2 * std::sin(a));
        (*out)[row + rot / 2 + i] = (float)(x2 * std::cos(a) + x1 * std::sin(a));
      }
}

void write_layer_rope_matches_reference(void **) {
  const int32_t dtypes[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  for (int32_t dtype : dtypes)
    for (int32_t layout = 0; layout < 2; ++layout)
      for (int in_place = 0; in_place < 2; ++in_place) {
        const uint32_t L = 2, KH = 2, QH = 4, D = 8, B = 4, ROT = 6;
        const float base = 10000.f;
        fd_cache *c = cs_make_cache(L, KH, D, B, 8, 0, dtype, layout);
        cs_add(c, {1, 2, 3});
        cs_grow(c, {1}, 5);
        cs_grow(c, {2}, 2);
        fd_test_rng rng = {(uint64_t)(dtype * 10 + layout * 2 + in_place)};
        uint64_t ids[3] = {1, 2, 3};
        const int32_t pos[3] = {5, 2, 0};
        fd_tx tx;
        FD_ASSERT_OK(fd_tx_begin(c, ids, 3, &tx));
        int32_t blk[3], off[3];
        FD_ASSERT_OK(fd_tx_get_rows(c, tx, 3, NULL, NULL, blk, off, NULL));
        const double tol = dtype == FD_DTYPE_F32 ? 1e-5 : dtype == FD_DTYPE_F16 ? 2e-3 : 1.6e-2;
        for (uint32_t l = 0; l < L; ++l) {
          /* Inputs rounded to the dtype, kept as float for the expectation. */
          std::vector<float> qf(3 * QH * D), kf(3 * KH * D), vf(3 * KH * D);
          const size_t es = fd_test_dtype_size(dtype);
          std::vector<unsigned char> q(qf.size() * es), k(kf.size() * es), v(vf.size() * es),
              qo(qf.size() * es, 0xee);
          for (size_t i = 0; i < qf.size(); ++i) {
            fd_test_store(q.data(), i, dtype, fd_test_normal(&rng));
            qf[i] = fd_test_load(q.data(), i, dtype);
          }
          for (size_t i = 0; i < kf.size(); ++i) {
            fd_test_store(k.data(), i, dtype, fd_test_normal(&rng));
            kf[i] = fd_test_load(k.data(), i, dtype);
            fd_test_store(v.data(), i, dtype, fd_test_normal(&rng));
            vf[i] = fd_test_load(v.data(), i, dtype);
          }
          std::vector<float> q_want, k_want;
          rope_expect(qf, &q_want, 3, QH, D, pos, ROT, base);
          rope_expect(kf, &k_want, 3, KH, D, pos, ROT, base);
          void *q_out = in_place ? q.data() : qo.data();
          FD_ASSERT_OK(fd_tx_write_layer_rope(c, tx, l, q.data(), QH, k.data(), v.data(), ROT, base,
                                              q_out, NULL));
          for (size_t i = 0; i < qf.size(); ++i)
            assert_true(std::fabs(fd_test_load(q_out, i, dtype) - q_want[i]) <=
                        tol * (1.0 + std::fabs(q_want[i])));
          /* The caller's K and V are not modified. */
          for (size_t i = 0; i < kf.size(); ++i)
            assert_true(fd_test_load(k.data(), i, dtype) == kf[i]);
          for (uint32_t r = 0; r < 3; ++r)
            for (uint32_t h = 0; h < KH; ++h)
              for (uint32_t d = 0; d < D; ++d) {
                const size_t i = ((size_t)r * KH + h) * D + d;
                const float got_k = cs_read_kv(c, 0, l, blk[r], h, (uint32_t)off[r], d);
                const float got_v = cs_read_kv(c, 1, l, blk[r], h, (uint32_t)off[r], d);
                assert_true(std::fabs(got_k - k_want[i]) <= tol * (1.0 + std::fabs(k_want[i])));
                if (d >= ROT) assert_true(got_k == kf[i]); /* beyond rotary_dim: unchanged */
                assert_true(got_v == vf[i]);               /* V is raw */
              }
        }
        /* Row 3 is at position 0: rotation by angle 0 is the identity. */
        FD_ASSERT_OK(fd_tx_commit(c, tx));
        assert_int_equal(cs_seq_len(c, 1), 6);
        fd_cache_metrics m = cs_metrics(c);
        assert_int_equal(m.transaction_failure_count, 0);
        fd_cache_destroy(c);
      }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(multi_layer_commit),
      cmocka_unit_test(abort_restores_free_list),
      cmocka_unit_test(begin_errors),
      cmocka_unit_test(write_and_commit_errors),
      cmocka_unit_test(view_errors),
      cmocka_unit_test(handle_errors_and_history),
      cmocka_unit_test(write_layer_rope_matches_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
