/* Request-id lists of the cache's batch calls (fd_tx_begin,
 * fd_cache_blocks_needed, fd_cache_export, fd_cache_max_blocks_per_seq) and
 * long runs of large transactions: which error a bad list gets (the first
 * duplicate index, then the first unknown or inactive id, in list order), that
 * a refused list changes nothing and leaves no trace on later checks, and
 * that transactions of changing batch sizes, committed and aborted past the
 * history's wrap-around, keep rows, tables and terminal handles exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <map>
#include <string>
#include <vector>

#include "fd_test.h"
#include "test_cache_support.h"

namespace {

/* Requests 1, 2, 3 active (with tokens), 4 finished, 5 cancelled; 99 unknown. */
fd_cache *mixed_cache() {
  fd_cache *c = cs_make_cache(2, 1, 4, 4, 64);
  cs_add(c, {1, 2, 3, 4, 5});
  cs_grow(c, {1, 2, 3, 4}, 5);
  FD_ASSERT_OK(fd_cache_finish_request(c, 4));
  FD_ASSERT_OK(fd_cache_cancel_request(c, 5));
  return c;
}

/* Uniform in [0, n). */
size_t below(fd_test_rng *rng, size_t n) {
  return (size_t)fd_test_range(rng, 0, (int64_t)n - 1);
}

const std::vector<uint64_t> kWatched = {1, 2, 3, 4, 5};

struct BadList {
  std::vector<uint64_t> ids;
  fd_status status;
  const char *message;
};

/* Each list fails the same way in every batch call, and changes nothing. */
void bad_lists_fail_in_order(void **) {
  const BadList cases[] = {
      {{1, 2, 1}, FD_ERR_INVALID_ARGUMENT, "request_ids[2] = 1 is a duplicate"},
      {{1, 2, 3, 2, 1}, FD_ERR_INVALID_ARGUMENT, "request_ids[3] = 2 is a duplicate"},
      /* A duplicate is reported before an unknown or inactive id, wherever
       * the unknown id is. */
      {{99, 1, 1}, FD_ERR_INVALID_ARGUMENT, "request_ids[2] = 1 is a duplicate"},
      {{1, 1, 99}, FD_ERR_INVALID_ARGUMENT, "request_ids[1] = 1 is a duplicate"},
      {{99, 99}, FD_ERR_INVALID_ARGUMENT, "request_ids[1] = 99 is a duplicate"},
      {{1, 99, 2, 99, 2}, FD_ERR_INVALID_ARGUMENT, "request_ids[3] = 99 is a duplicate"},
      {{4, 2, 4}, FD_ERR_INVALID_ARGUMENT, "request_ids[2] = 4 is a duplicate"},
      /* Then the first id that is unknown or not active. */
      {{1, 4, 99}, FD_ERR_INVALID_STATE, "request 4 is finished, not active"},
      {{1, 99, 4}, FD_ERR_NOT_FOUND, "unknown request 99"},
      {{3, 5}, FD_ERR_INVALID_STATE, "request 5 is cancelled, not active"},
  };
  fd_cache *c = mixed_cache();
  for (const BadList &b : cases) {
    const CsSnapshot before = cs_snapshot(c, kWatched);
    const uint32_t n = (uint32_t)b.ids.size();
    fd_tx tx = {777, 888};
    FD_ASSERT_FAILS(fd_tx_begin(c, b.ids.data(), n, &tx), b.status, b.message);
    assert_true(tx.id == 777 && tx.cache_version == 888);
    uint32_t needed = 555, free_blocks = 666;
    FD_ASSERT_FAILS(fd_cache_blocks_needed(c, b.ids.data(), n, &needed, &free_blocks), b.status,
                    b.message);
    assert_int_equal(needed, 555);
    assert_int_equal(free_blocks, 666);
    /* Export and max_blocks_per_seq accept repeated ids: only the
     * unknown/inactive cases fail there, with the same message. */
    if (b.status != FD_ERR_INVALID_ARGUMENT) {
      std::vector<int32_t> tables(n * 8, 4242), lens(n, 4242);
      FD_ASSERT_FAILS(fd_cache_export(c, b.ids.data(), n, 8, tables.data(), lens.data()), b.status,
                      b.message);
      assert_true(tables == std::vector<int32_t>(n * 8, 4242));
      assert_true(lens == std::vector<int32_t>(n, 4242));
      uint32_t most = 999;
      FD_ASSERT_FAILS(fd_cache_max_blocks_per_seq(c, b.ids.data(), n, &most), b.status, b.message);
      assert_int_equal(most, 999);
    }
    cs_assert_same(before, cs_snapshot(c, kWatched));
  }
  /* A refused list leaves no trace on the next check: the same ids, now
   * without the repeat, are accepted, and a repeat is still caught. */
  const uint64_t ok[3] = {2, 1, 3};
  uint32_t needed = 0;
  FD_ASSERT_OK(fd_cache_blocks_needed(c, ok, 3, &needed, NULL));
  assert_int_equal(needed, 0); /* 5 tokens each, block_size 4 */
  FD_ASSERT_OK(fd_cache_blocks_needed(c, ok, 3, &needed, NULL));
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ok, 3, &tx));
  /* With a transaction open: a duplicate is still reported first, then the
   * open transaction. */
  const uint64_t dup[2] = {3, 3};
  FD_ASSERT_FAILS(fd_tx_begin(c, dup, 2, &tx), FD_ERR_INVALID_ARGUMENT,
                  "request_ids[1] = 3 is a duplicate");
  FD_ASSERT_FAILS(fd_tx_begin(c, ok, 3, &tx), FD_ERR_INVALID_STATE,
                  "cannot begin a transaction while transaction");
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

/* Export and max_blocks_per_seq of a list that repeats an active id: every
 * row is exported (repeats included). */
void repeated_ids_export(void **) {
  fd_cache *c = mixed_cache();
  const uint64_t ids[4] = {2, 1, 2, 2};
  uint32_t most = 0;
  FD_ASSERT_OK(fd_cache_max_blocks_per_seq(c, ids, 4, &most));
  assert_int_equal(most, 2);
  std::vector<int32_t> tables(4 * 3, 4242), lens(4, 4242);
  FD_ASSERT_OK(fd_cache_export(c, ids, 4, 3, tables.data(), lens.data()));
  const std::vector<int32_t> t1 = cs_table(c, 1), t2 = cs_table(c, 2);
  for (int r = 0; r < 4; ++r) {
    const std::vector<int32_t> &want = r == 1 ? t1 : t2;
    assert_int_equal(lens[r], 5);
    assert_int_equal(tables[r * 3 + 0], want[0]);
    assert_int_equal(tables[r * 3 + 1], want[1]);
    assert_int_equal(tables[r * 3 + 2], -1);
  }
  fd_cache_destroy(c);
}

/* Shadow of what the cache must report: committed blocks per request. */
struct Shadow {
  std::map<uint64_t, std::vector<int32_t>> blocks;
  std::map<uint64_t, int32_t> seq_len;
};

/* 600 transactions over batches whose size and membership change every
 * time (1 to 300 rows), committed or aborted, with requests replaced now and
 * then: the rows, block tables and terminal handles stay exact, also once
 * the history of 256 has wrapped around twice. */
void large_batches_churn(void **) {
  const uint32_t bs = 4, pool = 300;
  fd_cache *c = cs_make_cache(1, 1, 2, bs, 32768);
  fd_test_rng rng = {20261201};
  Shadow s;
  std::vector<uint64_t> ids(pool);
  uint64_t next_id = 1;
  for (uint64_t &id : ids) {
    id = next_id++;
    FD_ASSERT_OK(fd_cache_add_request(c, id));
    s.seq_len[id] = 0;
  }
  std::vector<fd_tx> handles;
  std::vector<bool> committed;
  std::vector<float> kv(pool * 2, 0.f);
  for (int step = 0; step < 600; ++step) {
    /* A batch: a random subset in random order. */
    std::vector<uint64_t> batch = ids;
    for (size_t i = batch.size(); i > 1; --i) std::swap(batch[i - 1], batch[below(&rng, i)]);
    batch.resize(1 + below(&rng, pool));
    const uint32_t n = (uint32_t)batch.size();
    fd_tx tx;
    FD_ASSERT_OK(fd_tx_begin(c, batch.data(), n, &tx));
    std::vector<uint64_t> got_ids(n);
    std::vector<int32_t> pos(n), blk(n), off(n), eff(n);
    FD_ASSERT_OK(
        fd_tx_get_rows(c, tx, n, got_ids.data(), pos.data(), blk.data(), off.data(), eff.data()));
    fd_tx_info info;
    info.struct_size = sizeof info;
    FD_ASSERT_OK(fd_tx_get_info(c, tx, &info));
    assert_int_equal(info.batch, n);
    const uint32_t stride = info.max_blocks_per_seq + 1;
    std::vector<int32_t> tables(size_t{n} * stride, 4242);
    FD_ASSERT_OK(fd_tx_block_tables(c, tx, stride, tables.data()));
    uint32_t widest = 0;
    for (uint32_t r = 0; r < n; ++r) {
      const uint64_t id = batch[r];
      const std::vector<int32_t> &owned = s.blocks[id];
      assert_true(got_ids[r] == id);
      assert_int_equal(pos[r], s.seq_len[id]);
      assert_int_equal(off[r], s.seq_len[id] % (int32_t)bs);
      assert_int_equal(eff[r], s.seq_len[id] + 1);
      if (off[r] != 0) assert_int_equal(blk[r], owned.back());
      const size_t width = owned.size() + (off[r] == 0 ? 1 : 0);
      widest = width > widest ? (uint32_t)width : widest;
      const int32_t *row = &tables[r * stride];
      for (size_t b = 0; b < owned.size(); ++b) assert_int_equal(row[b], owned[b]);
      if (off[r] == 0) assert_int_equal(row[owned.size()], blk[r]);
      for (size_t b = width; b < stride; ++b) assert_int_equal(row[b], -1);
    }
    assert_int_equal(info.max_blocks_per_seq, widest);
    FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, kv.data(), kv.data(), NULL));
    const bool commit = below(&rng, 3) != 0;
    if (commit) {
      FD_ASSERT_OK(fd_tx_commit(c, tx));
      for (uint32_t r = 0; r < n; ++r) {
        if (off[r] == 0) s.blocks[batch[r]].push_back(blk[r]);
        ++s.seq_len[batch[r]];
      }
    } else {
      FD_ASSERT_OK(fd_tx_abort(c, tx));
    }
    handles.push_back(tx);
    committed.push_back(commit);
    /* Now and then, replace a few requests (their blocks return). */
    if (step % 50 == 49) {
      for (int k = 0; k < 20; ++k) {
        uint64_t &id = ids[below(&rng, pool)];
        FD_ASSERT_OK(fd_cache_finish_request(c, id));
        s.blocks.erase(id);
        s.seq_len.erase(id);
        id = next_id++;
        FD_ASSERT_OK(fd_cache_add_request(c, id));
        s.seq_len[id] = 0;
      }
    }
    if (step % 37 == 0) FD_ASSERT_OK(fd_cache_validate(c));
  }
  /* The last 256 handles name their outcome; older ones are unknown. */
  for (size_t i = 0; i < handles.size(); ++i) {
    const std::string id = std::to_string(handles[i].id);
    if (i + 256 < handles.size()) {
      FD_ASSERT_FAILS(fd_tx_commit(c, handles[i]), FD_ERR_NOT_FOUND,
                      ("unknown transaction " + id).c_str());
    } else {
      const std::string want =
          "transaction " + id + (committed[i] ? " is already committed" : " is already aborted");
      FD_ASSERT_FAILS(fd_tx_abort(c, handles[i]), FD_ERR_INVALID_STATE, want.c_str());
      fd_tx stale = handles[i];
      ++stale.cache_version;
      FD_ASSERT_FAILS(fd_tx_commit(c, stale), FD_ERR_STALE_HANDLE, "stale transaction handle");
    }
  }
  /* The committed state matches the shadow. */
  for (uint64_t id : ids) {
    assert_int_equal(cs_seq_len(c, id), s.seq_len[id]);
    assert_true(cs_table(c, id) == s.blocks[id]);
  }
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bad_lists_fail_in_order),
      cmocka_unit_test(repeated_ids_export),
      cmocka_unit_test(large_batches_churn),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
