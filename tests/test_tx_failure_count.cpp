/* What transaction_failure_count counts (issue 11; flashdec.h, reading R3 of
 * tests/model/cache_model.hpp): transactions that could not get or write
 * their token, not misuse that names no transaction.
 *   - counted: a begin or legacy append refused for capacity
 *     (FD_ERR_OUT_OF_BLOCKS, with capacity_failure_count), and every failed
 *     layer write of the open transaction (wrong layer, NULL, misaligned or
 *     overlapping data, bad RoPE arguments, a storage failure);
 *   - not counted: begins and appends refused for their arguments or state
 *     (NULL or empty, duplicate, unknown, finished or cancelled ids, an open
 *     transaction), writes with a stale, finished or unknown handle, and
 *     failed commit, abort and view calls.
 * Every failure checks the status, the message and that nothing else
 * changed. */
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

/* Runs a failing call and checks that the only change is `counted` more
 * transaction failures (and, for capacity, one more capacity failure). */
#define EXPECT_FAILURE(cache, ids, expr, status, text, counted, capacity) \
  do {                                                                    \
    const CsFrozen before_ = cs_freeze(cache, ids, false);                \
    FD_ASSERT_FAILS(expr, status, text);                                  \
    CsFrozen expected_ = before_;                                         \
    expected_.snap.metrics.transaction_failure_count += (counted);        \
    expected_.snap.metrics.capacity_failure_count += (capacity);          \
    cs_assert_unchanged(cache, expected_, false);                         \
  } while (0)

void begins_and_appends(void **) {
  /* One layer (legacy append works), 2 blocks of 2 tokens. */
  fd_cache *c = cs_make_cache(1, 1, 2, 2, 2);
  cs_add(c, {1, 2, 3, 4});
  FD_ASSERT_OK(fd_cache_finish_request(c, 3));
  FD_ASSERT_OK(fd_cache_cancel_request(c, 4));
  const std::vector<uint64_t> all = {1, 2, 3, 4};
  float kv[8] = {0};
  fd_tx tx = {0, 0};
  const uint64_t dup[2] = {1, 1}, unknown[2] = {1, 9}, finished[1] = {3}, cancelled[1] = {4};
  const uint64_t one[1] = {1};

  for (int append = 0; append < 2; ++append) {
#define CALL(ids, n) \
  (append ? fd_cache_append(c, ids, n, kv, kv, NULL) : fd_tx_begin(c, ids, n, &tx))
    EXPECT_FAILURE(c, all, CALL(NULL, 1), FD_ERR_INVALID_ARGUMENT, "request_ids", 0, 0);
    EXPECT_FAILURE(c, all, CALL(one, 0), FD_ERR_INVALID_ARGUMENT, "count", 0, 0);
    EXPECT_FAILURE(c, all, CALL(dup, 2), FD_ERR_INVALID_ARGUMENT, "duplicate", 0, 0);
    EXPECT_FAILURE(c, all, CALL(unknown, 2), FD_ERR_NOT_FOUND, "9", 0, 0);
    EXPECT_FAILURE(c, all, CALL(finished, 1), FD_ERR_INVALID_STATE, "finished", 0, 0);
    EXPECT_FAILURE(c, all, CALL(cancelled, 1), FD_ERR_INVALID_STATE, "cancelled", 0, 0);
#undef CALL
  }
  EXPECT_FAILURE(c, all, fd_cache_append(c, one, 1, NULL, kv, NULL), FD_ERR_INVALID_ARGUMENT, "k",
                 0, 0);

  /* A transaction is open: another begin or an append is refused, uncounted. */
  FD_ASSERT_OK(fd_tx_begin(c, one, 1, &tx));
  const uint64_t two[1] = {2};
  fd_tx other = {0, 0};
  EXPECT_FAILURE(c, all, fd_tx_begin(c, two, 1, &other), FD_ERR_INVALID_STATE, "open", 0, 0);
  EXPECT_FAILURE(c, all, fd_cache_append(c, two, 1, kv, kv, NULL), FD_ERR_INVALID_STATE, "open", 0,
                 0);
  FD_ASSERT_OK(fd_tx_abort(c, tx));

  /* Capacity: counted in both counters, by begin and by append. */
  const uint64_t both[2] = {1, 2};
  FD_ASSERT_OK(fd_cache_append(c, both, 2, kv, kv, NULL)); /* both blocks taken */
  FD_ASSERT_OK(fd_cache_append(c, both, 2, kv, kv, NULL));
  EXPECT_FAILURE(c, all, fd_tx_begin(c, both, 2, &tx), FD_ERR_OUT_OF_BLOCKS, "free", 1, 1);
  EXPECT_FAILURE(c, all, fd_cache_append(c, one, 1, kv, kv, NULL), FD_ERR_OUT_OF_BLOCKS, "free", 1,
                 1);
  fd_cache_destroy(c);
}

void layer_writes_and_handles(void **) {
  fd_cache *c = cs_make_cache(2, 1, 4, 4, 4);
  cs_add(c, {1});
  const std::vector<uint64_t> ids = {1};
  const uint64_t one[1] = {1};
  alignas(16) float kv[8] = {0}, q[8] = {0}, qo[8] = {0};

  /* A finished transaction, and the open one. */
  fd_tx done;
  FD_ASSERT_OK(fd_tx_begin(c, one, 1, &done));
  FD_ASSERT_OK(fd_tx_abort(c, done));
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, one, 1, &tx));

  /* Handles that name no open transaction: not counted. */
  fd_tx stale = tx;
  stale.cache_version += 1;
  fd_tx unknown = {tx.id + 100, tx.cache_version};
  EXPECT_FAILURE(c, ids, fd_tx_write_layer(c, stale, 0, kv, kv, NULL), FD_ERR_STALE_HANDLE, "stale",
                 0, 0);
  EXPECT_FAILURE(c, ids, fd_tx_write_layer(c, unknown, 0, kv, kv, NULL), FD_ERR_NOT_FOUND,
                 "unknown transaction", 0, 0);
  EXPECT_FAILURE(c, ids, fd_tx_write_layer(c, done, 0, kv, kv, NULL), FD_ERR_INVALID_STATE,
                 "already aborted", 0, 0);
  EXPECT_FAILURE(c, ids, fd_tx_write_layer_rope(c, done, 0, q, 1, kv, kv, 4, 10000.f, qo, NULL),
                 FD_ERR_INVALID_STATE, "already aborted", 0, 0);

  /* Failed writes of the open transaction: each counted once. */
  EXPECT_FAILURE(c, ids, fd_tx_write_layer(c, tx, 1, kv, kv, NULL), FD_ERR_INVALID_ARGUMENT,
                 "transaction requires layer 0, got layer 1", 1, 0);
  EXPECT_FAILURE(c, ids, fd_tx_write_layer(c, tx, 0, NULL, kv, NULL), FD_ERR_INVALID_ARGUMENT, "k",
                 1, 0);
  EXPECT_FAILURE(c, ids, fd_tx_write_layer(c, tx, 0, kv, (const char *)kv + 2, NULL),
                 FD_ERR_INVALID_ARGUMENT, "v (", 1, 0);
  EXPECT_FAILURE(c, ids, fd_tx_write_layer_rope(c, tx, 0, q, 1, kv, kv, 3, 10000.f, qo, NULL),
                 FD_ERR_INVALID_ARGUMENT, "rotary_dim", 1, 0);
  EXPECT_FAILURE(c, ids, fd_tx_write_layer_rope(c, tx, 0, q, 0, kv, kv, 4, 10000.f, qo, NULL),
                 FD_ERR_INVALID_ARGUMENT, "num_q_heads", 1, 0);
  EXPECT_FAILURE(c, ids, fd_tx_write_layer_rope(c, tx, 0, q, 1, kv, kv, 4, 10000.f, NULL, NULL),
                 FD_ERR_INVALID_ARGUMENT, "q_out", 1, 0);

  /* Failed commit (layers missing) and views: not counted. */
  EXPECT_FAILURE(c, ids, fd_tx_commit(c, tx), FD_ERR_INVALID_STATE, "layers", 0, 0);
  int32_t table[1];
  EXPECT_FAILURE(c, ids, fd_tx_block_tables(c, tx, 0, table), FD_ERR_INVALID_ARGUMENT,
                 "table_stride", 0, 0);
  EXPECT_FAILURE(c, ids, fd_tx_abort(c, stale), FD_ERR_STALE_HANDLE, "stale", 0, 0);

  /* The transaction is where it was: both layers still write and commit. */
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, kv, kv, NULL));
  FD_ASSERT_OK(fd_tx_write_layer_rope(c, tx, 1, q, 1, kv, kv, 4, 10000.f, qo, NULL));
  /* Every layer written: a further write is a wrong layer, counted. */
  EXPECT_FAILURE(c, ids, fd_tx_write_layer(c, tx, 2, kv, kv, NULL), FD_ERR_INVALID_ARGUMENT,
                 "commit it", 1, 0);
  FD_ASSERT_OK(fd_tx_commit(c, tx));
  EXPECT_FAILURE(c, ids, fd_tx_write_layer(c, tx, 0, kv, kv, NULL), FD_ERR_INVALID_STATE,
                 "already committed", 0, 0);
  assert_int_equal(cs_metrics(c).transaction_failure_count, 7);
  fd_cache_destroy(c);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(begins_and_appends),
      cmocka_unit_test(layer_writes_and_handles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
