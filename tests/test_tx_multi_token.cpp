/* Multi-token transactions (docs/semantics.md S5, S5.2, S5.3): fd_tx_begin_multi,
 * fd_tx_get_tokens, layer writes of token_count tokens (plain and fused
 * RoPE), commit, abort, fd_tx_commit_keep and fd_cache_truncate, and every
 * error rule of the new calls (status, message naming the parameter, nothing
 * changed). Expected locations are derived here from the committed block
 * tables and the free-list order (both observed through the public API), not
 * from the library's own bookkeeping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <climits>
#include <cmath>

#include "fd_test.h"
#include "test_cache_support.h"

namespace {

fd_cache_config config_of(const fd_cache *c) {
  fd_cache_config cfg;
  cfg.struct_size = sizeof cfg;
  FD_ASSERT_OK(fd_cache_get_config(c, &cfg));
  return cfg;
}

/* Where a multi-token begin must put each token: rows in order, each row's
 * tokens at seq_len .. seq_len + k - 1; a logical block past the committed
 * table takes the next block of `free_list` (front first). */
struct Expect {
  std::vector<int32_t> pos, blk, off;        // per token, packed in row order
  std::vector<std::vector<int32_t>> tables;  // per row, new blocks included
  std::vector<int32_t> first_pos, eff;       // per row
  std::vector<int32_t> new_blocks;           // in allocation order
  uint32_t max_width = 0;
};

Expect expect_tokens(fd_cache *c, const std::vector<uint64_t> &ids,
                     const std::vector<uint32_t> &counts, const std::vector<int32_t> &free_list) {
  const int32_t bs = (int32_t)config_of(c).block_size;
  Expect e;
  size_t next = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    std::vector<int32_t> table = cs_table(c, ids[r]);
    const int32_t seq = cs_seq_len(c, ids[r]);
    e.first_pos.push_back(seq);
    e.eff.push_back(seq + (int32_t)counts[r]);
    for (uint32_t j = 0; j < counts[r]; ++j) {
      const int32_t p = seq + (int32_t)j;
      while ((size_t)(p / bs) >= table.size()) {
        assert_true(next < free_list.size());
        table.push_back(free_list[next]);
        e.new_blocks.push_back(free_list[next++]);
      }
      e.pos.push_back(p);
      e.blk.push_back(table[(size_t)(p / bs)]);
      e.off.push_back(p % bs);
    }
    e.max_width = std::max(e.max_width, (uint32_t)table.size());
    e.tables.push_back(table);
  }
  return e;
}

/* Checks every view of the open transaction `tx` against `e`. */
void assert_view(fd_cache *c, fd_tx tx, const std::vector<uint64_t> &ids, const Expect &e) {
  const uint32_t n = (uint32_t)ids.size(), tokens = (uint32_t)e.pos.size();
  fd_tx_info info;
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_tx_get_info(c, tx, &info));
  assert_int_equal(info.batch, n);
  assert_int_equal(info.token_count, tokens);
  assert_int_equal(info.state, FD_TX_OPEN);
  assert_int_equal(info.new_block_count, e.new_blocks.size());
  assert_int_equal(info.max_blocks_per_seq, e.max_width);

  std::vector<int32_t> pos(tokens + 1, -7), blk(tokens + 1, -7), off(tokens + 1, -7);
  FD_ASSERT_OK(fd_tx_get_tokens(c, tx, tokens + 1, pos.data(), blk.data(), off.data()));
  assert_int_equal(pos[tokens], -7); /* nothing past token_count */
  pos.resize(tokens), blk.resize(tokens), off.resize(tokens);
  assert_true(pos == e.pos);
  assert_true(blk == e.blk);
  assert_true(off == e.off);
  /* Any output may be NULL. */
  std::vector<int32_t> blk2(tokens, -1);
  FD_ASSERT_OK(fd_tx_get_tokens(c, tx, tokens, NULL, blk2.data(), NULL));
  assert_true(blk2 == e.blk);

  std::vector<uint64_t> rid(n);
  std::vector<int32_t> rpos(n), rblk(n), roff(n), reff(n);
  FD_ASSERT_OK(
      fd_tx_get_rows(c, tx, n, rid.data(), rpos.data(), rblk.data(), roff.data(), reff.data()));
  size_t first = 0;
  for (uint32_t r = 0; r < n; ++r) {
    assert_true(rid[r] == ids[r]);
    assert_int_equal(rpos[r], e.first_pos[r]);
    assert_int_equal(rblk[r], e.blk[first]); /* the row's first new token */
    assert_int_equal(roff[r], e.off[first]);
    assert_int_equal(reff[r], e.eff[r]);
    first += (size_t)(e.eff[r] - e.first_pos[r]);
  }

  const uint32_t stride = e.max_width + 1;
  std::vector<int32_t> tables(n * stride, 55), async_tables(n * stride, 55), lens(n, -1);
  FD_ASSERT_OK(fd_tx_block_tables(c, tx, stride, tables.data()));
  FD_ASSERT_OK(fd_tx_block_tables_async(c, tx, stride, async_tables.data(), lens.data(), NULL));
  for (uint32_t r = 0; r < n; ++r) {
    std::vector<int32_t> want = e.tables[r];
    want.resize(stride, -1);
    assert_true(std::vector<int32_t>(tables.begin() + r * stride,
                                     tables.begin() + (r + 1) * stride) == want);
    assert_int_equal(lens[r], e.eff[r]);
  }
  assert_true(async_tables == tables);
  /* The packed tokens' offsets per row (fd_decode's q_indptr). */
  std::vector<int32_t> indptr(n + 2, -7), want_indptr(1, 0);
  for (uint32_t r = 0; r < n; ++r)
    want_indptr.push_back(want_indptr.back() + (e.eff[r] - e.first_pos[r]));
  FD_ASSERT_OK(fd_tx_token_indptr_async(c, tx, indptr.data(), NULL));
  assert_int_equal(indptr[n + 1], -7); /* nothing past batch + 1 entries */
  indptr.resize(n + 1);
  assert_true(indptr == want_indptr);
  /* The smallest valid stride is max_blocks_per_seq. */
  if (e.max_width > 0)
    FD_ASSERT_FAILS(fd_tx_block_tables(c, tx, e.max_width - 1, tables.data()),
                    FD_ERR_INVALID_ARGUMENT, "table_stride");
}

/* Exactly representable test value of (layer, token, head, dim) in f16 and f32. */
float tag(uint32_t layer, uint32_t token, uint32_t head, uint32_t dim, int which) {
  const float x = (float)(layer * 256 + token * 8 + head * 4 + dim + 1);
  return which == 0 ? x : -x;
}

std::vector<unsigned char> token_data(int32_t dtype, uint32_t layer, uint32_t tokens, uint32_t H,
                                      uint32_t D, int which) {
  std::vector<unsigned char> buf(tokens * H * D * fd_test_dtype_size(dtype));
  for (uint32_t t = 0; t < tokens; ++t)
    for (uint32_t h = 0; h < H; ++h)
      for (uint32_t d = 0; d < D; ++d)
        fd_test_store(buf.data(), (t * H + h) * D + d, dtype, tag(layer, t, h, d, which));
  return buf;
}

/* Rows of different lengths, some crossing several block boundaries, some
 * not; every view, the stored data (both layouts) and the commit. */
void multi_token_views_data_commit(void **) {
  const int32_t dtypes[2] = {FD_DTYPE_F32, FD_DTYPE_F16};
  for (int32_t dtype : dtypes)
    for (int32_t layout = 0; layout < 2; ++layout) {
      const uint32_t L = 2, H = 2, D = 4, B = 4;
      fd_cache *c = cs_make_cache(L, H, D, B, 32, 0, dtype, layout);
      cs_add(c, {1, 2, 3, 4});
      cs_grow(c, {1, 3, 4}, 3);
      cs_grow(c, {3, 4}, 2);
      cs_grow(c, {3}, 3); /* 1: 3 tokens, 2: empty, 3: 8 (two full blocks), 4: 5 */
      FD_ASSERT_OK(fd_cache_finish_request(c, 1));
      cs_add(c, {5});
      cs_grow(c, {5}, 3); /* fragment the free list a little */
      const std::vector<uint64_t> ids = {5, 2, 3, 4};
      const std::vector<uint32_t> counts = {6, 1, 9, 2};
      const std::vector<int32_t> free_before = cs_free_list(c);
      const Expect e = expect_tokens(c, ids, counts, free_before);
      const fd_cache_metrics m0 = cs_metrics(c);
      const std::vector<std::vector<int32_t>> committed = {cs_table(c, 5), cs_table(c, 2),
                                                           cs_table(c, 3), cs_table(c, 4)};

      fd_tx tx;
      FD_ASSERT_OK(fd_tx_begin_multi(c, ids.data(), counts.data(), 4, &tx));
      assert_true(tx.cache_version == cs_version(c));
      assert_view(c, tx, ids, e);
      FD_ASSERT_OK(fd_cache_validate(c));
      const fd_cache_metrics m1 = cs_metrics(c);
      assert_int_equal(m1.allocation_count, m0.allocation_count + e.new_blocks.size());
      assert_int_equal(m1.reserved_transaction_blocks, e.new_blocks.size());
      assert_int_equal(m1.pending_request_count, 4);
      assert_int_equal(m1.free_blocks, m0.free_blocks - e.new_blocks.size());

      const uint32_t tokens = (uint32_t)e.pos.size();
      for (uint32_t l = 0; l < L; ++l) {
        std::vector<unsigned char> k = token_data(dtype, l, tokens, H, D, 0);
        std::vector<unsigned char> v = token_data(dtype, l, tokens, H, D, 1);
        FD_ASSERT_OK(fd_tx_write_layer(c, tx, l, k.data(), v.data(), NULL));
        for (size_t r = 0; r < ids.size(); ++r) /* nothing visible before commit */
          assert_true(cs_table(c, ids[r]) == committed[r]);
      }
      assert_int_equal(cs_seq_len(c, 2), 0);
      FD_ASSERT_OK(fd_tx_commit(c, tx));
      for (size_t r = 0; r < ids.size(); ++r) {
        assert_int_equal(cs_seq_len(c, ids[r]), e.eff[r]);
        assert_true(cs_table(c, ids[r]) == e.tables[r]);
      }
      for (uint32_t t = 0; t < tokens; ++t)
        for (uint32_t l = 0; l < L; ++l)
          for (uint32_t h = 0; h < H; ++h)
            for (uint32_t d = 0; d < D; ++d) {
              assert_true(cs_read_kv(c, 0, l, e.blk[t], h, (uint32_t)e.off[t], d) ==
                          tag(l, t, h, d, 0));
              assert_true(cs_read_kv(c, 1, l, e.blk[t], h, (uint32_t)e.off[t], d) ==
                          tag(l, t, h, d, 1));
            }
      const fd_cache_metrics m2 = cs_metrics(c);
      assert_int_equal(m2.transaction_commit_count, m0.transaction_commit_count + 1);
      assert_int_equal(m2.transaction_layer_write_count, m0.transaction_layer_write_count + L);
      assert_int_equal(m2.active_tokens, m0.active_tokens + tokens);
      assert_int_equal(m2.used_blocks, m0.used_blocks + e.new_blocks.size());
      FD_ASSERT_OK(fd_cache_validate(c));
      fd_cache_destroy(c);
    }
}

/* fd_tx_begin is fd_tx_begin_multi with every count 1: same views, same
 * blocks, token_count == batch, same state after commit. */
void one_token_is_the_same(void **) {
  fd_cache *a = cs_make_cache(1, 1, 2, 2, 12), *b = cs_make_cache(1, 1, 2, 2, 12);
  for (fd_cache *c : {a, b}) {
    cs_add(c, {1, 2, 3});
    cs_grow(c, {1, 2}, 3);
    cs_grow(c, {2}, 1);
  }
  const uint64_t ids[3] = {3, 2, 1};
  const uint32_t ones[3] = {1, 1, 1};
  fd_tx ta, tb;
  FD_ASSERT_OK(fd_tx_begin(a, ids, 3, &ta));
  FD_ASSERT_OK(fd_tx_begin_multi(b, ids, ones, 3, &tb));
  fd_tx_info ia, ib;
  ia.struct_size = ib.struct_size = sizeof ia;
  FD_ASSERT_OK(fd_tx_get_info(a, ta, &ia));
  FD_ASSERT_OK(fd_tx_get_info(b, tb, &ib));
  assert_memory_equal(&ia, &ib, sizeof ia);
  assert_int_equal(ia.token_count, 3);
  int32_t ra[15], rb[15], ka[9], kb[9];
  FD_ASSERT_OK(fd_tx_get_rows(a, ta, 3, NULL, ra, ra + 3, ra + 6, ra + 9));
  FD_ASSERT_OK(fd_tx_get_rows(b, tb, 3, NULL, rb, rb + 3, rb + 6, rb + 9));
  FD_ASSERT_OK(fd_tx_get_tokens(a, ta, 3, ka, ka + 3, ka + 6));
  FD_ASSERT_OK(fd_tx_get_tokens(b, tb, 3, kb, kb + 3, kb + 6));
  assert_memory_equal(ra, rb, 12 * sizeof(int32_t));
  assert_memory_equal(ka, kb, sizeof ka);
  /* One token per row: the tokens are the rows. */
  assert_memory_equal(ka, ra, 9 * sizeof(int32_t));
  std::vector<float> kv(3 * 2, 1.f);
  FD_ASSERT_OK(fd_tx_write_layer(a, ta, 0, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_tx_write_layer(b, tb, 0, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_tx_commit(a, ta));
  FD_ASSERT_OK(fd_tx_commit(b, tb));
  const std::vector<uint64_t> all = {1, 2, 3};
  cs_assert_same(cs_snapshot(a, all), cs_snapshot(b, all));
  fd_cache_destroy(a);
  fd_cache_destroy(b);
}

/* An older caller's fd_tx_info (without token_count) still works: the
 * fields it has are filled, nothing past its struct_size is written. */
void tx_info_old_struct_size(void **) {
  fd_cache *c = cs_make_cache(1, 1, 2, 2, 8);
  cs_add(c, {1});
  const uint64_t id = 1;
  const uint32_t k = 5;
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin_multi(c, &id, &k, 1, &tx));
  fd_tx_info info;
  memset(&info, 0x5a, sizeof info);
  info.struct_size = offsetof(fd_tx_info, token_count);
  FD_ASSERT_OK(fd_tx_get_info(c, tx, &info));
  assert_int_equal(info.batch, 1);
  assert_int_equal(info.new_block_count, 3);
  assert_int_equal(info.max_blocks_per_seq, 3);
  assert_int_equal(info.token_count, 0x5a5a5a5au);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  fd_cache_destroy(c);
}

/* The fused RoPE write rotates every token of a row at its own position:
 * stored K and returned Q equal fd_rope_apply over the same tokens and
 * positions; V is stored raw. */
void rope_each_token_at_its_position(void **) {
  const int32_t dtypes[3] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
  for (int32_t dtype : dtypes)
    for (int32_t layout = 0; layout < 2; ++layout)
      for (int in_place = 0; in_place < 2; ++in_place) {
        const uint32_t L = 2, KH = 2, QH = 4, D = 8, B = 4, ROT = 6;
        const float base = 10000.f;
        fd_cache *c = cs_make_cache(L, KH, D, B, 16, 0, dtype, layout);
        cs_add(c, {1, 2});
        cs_grow(c, {1}, 3);
        const std::vector<uint64_t> ids = {1, 2};
        const std::vector<uint32_t> counts = {6, 5};
        const Expect e = expect_tokens(c, ids, counts, cs_free_list(c));
        fd_tx tx;
        FD_ASSERT_OK(fd_tx_begin_multi(c, ids.data(), counts.data(), 2, &tx));
        const uint32_t T = (uint32_t)e.pos.size();
        const size_t es = fd_test_dtype_size(dtype);
        fd_test_rng rng = {(uint64_t)(100 + dtype * 10 + layout * 2 + in_place)};
        for (uint32_t l = 0; l < L; ++l) {
          std::vector<unsigned char> q(T * QH * D * es), k(T * KH * D * es), v(k.size()),
              qo(q.size(), 0xee);
          for (size_t i = 0; i < q.size() / es; ++i)
            fd_test_store(q.data(), i, dtype, fd_test_normal(&rng));
          for (size_t i = 0; i < k.size() / es; ++i) {
            fd_test_store(k.data(), i, dtype, fd_test_normal(&rng));
            fd_test_store(v.data(), i, dtype, fd_test_normal(&rng));
          }
          std::vector<unsigned char> q_want = q, k_want = k;
          FD_ASSERT_OK(fd_rope_apply(dtype, q_want.data(), T, QH, D, e.pos.data(), ROT, base));
          FD_ASSERT_OK(fd_rope_apply(dtype, k_want.data(), T, KH, D, e.pos.data(), ROT, base));
          const std::vector<unsigned char> k_in = k, v_in = v;
          void *q_out = in_place ? q.data() : qo.data();
          FD_ASSERT_OK(fd_tx_write_layer_rope(c, tx, l, q.data(), QH, k.data(), v.data(), ROT, base,
                                              q_out, NULL));
          assert_memory_equal(q_out, q_want.data(), q_want.size());
          assert_true(k == k_in); /* the caller's K and V are not modified */
          assert_true(v == v_in);
          for (uint32_t t = 0; t < T; ++t)
            for (uint32_t h = 0; h < KH; ++h)
              for (uint32_t d = 0; d < D; ++d) {
                const size_t i = ((size_t)t * KH + h) * D + d;
                assert_true(cs_read_kv(c, 0, l, e.blk[t], h, (uint32_t)e.off[t], d) ==
                            fd_test_load(k_want.data(), i, dtype));
                assert_true(cs_read_kv(c, 1, l, e.blk[t], h, (uint32_t)e.off[t], d) ==
                            fd_test_load(v_in.data(), i, dtype));
              }
        }
        FD_ASSERT_OK(fd_tx_commit(c, tx));
        assert_int_equal(cs_seq_len(c, 1), 9);
        assert_int_equal(cs_seq_len(c, 2), 5);
        FD_ASSERT_OK(fd_cache_validate(c));
        fd_cache_destroy(c);
      }
}

/* A cache with a fragmented free list: requests 1..3 grown, 2 finished. */
fd_cache *fragmented_cache() {
  fd_cache *c = cs_make_cache(2, 1, 2, 2, 24);
  cs_add(c, {1, 2, 3, 4});
  cs_grow(c, {1, 2, 3}, 3);
  FD_ASSERT_OK(fd_cache_finish_request(c, 2));
  cs_grow(c, {4}, 1); /* 1: 3 tokens, 3: 3 tokens, 4: 1 token */
  return c;
}

/* Abort restores the exact free list: a following begin of the same counts
 * gets the same blocks. */
void abort_restores_free_list(void **) {
  fd_cache *c = fragmented_cache();
  const std::vector<uint64_t> ids = {3, 1, 4};
  const std::vector<uint32_t> counts = {4, 5, 1};
  CsFrozen f = cs_freeze(c, {1, 2, 3, 4});
  const Expect e = expect_tokens(c, ids, counts, f.free_list);
  assert_true(e.new_blocks.size() >= 4);

  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin_multi(c, ids.data(), counts.data(), 3, &tx));
  std::vector<int32_t> first(e.pos.size());
  FD_ASSERT_OK(fd_tx_get_tokens(c, tx, (uint32_t)first.size(), NULL, first.data(), NULL));
  assert_true(first == e.blk);
  std::vector<float> kv(e.pos.size() * 2, 2.5f);
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_tx_abort(c, tx));

  const fd_cache_metrics m = cs_metrics(c);
  const fd_cache_metrics &b = f.snap.metrics;
  assert_int_equal(m.transaction_rollback_block_count,
                   b.transaction_rollback_block_count + e.new_blocks.size());
  assert_int_equal(m.free_count, b.free_count); /* a rollback is not a free */
  assert_int_equal(m.free_blocks, b.free_blocks);
  assert_true(cs_snapshot(c, f.ids).tables == f.snap.tables);
  assert_true(cs_snapshot(c, f.ids).seq_lens == f.snap.seq_lens);
  assert_true(cs_free_list(c) == f.free_list);

  FD_ASSERT_OK(fd_tx_begin_multi(c, ids.data(), counts.data(), 3, &tx));
  std::vector<int32_t> again(e.pos.size());
  FD_ASSERT_OK(fd_tx_get_tokens(c, tx, (uint32_t)again.size(), NULL, again.data(), NULL));
  assert_true(again == first);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

/* Commits a prepared transaction over `ids` with `keep`, checking lengths,
 * tables, the free list (dropped new blocks in front, in allocation order)
 * and the data of the kept tokens. */
void keep_case(const std::vector<uint32_t> &counts, const std::vector<uint32_t> &keep) {
  fd_cache *c = cs_make_cache(1, 1, 2, 4, 20);
  cs_add(c, {1, 2, 3});
  cs_grow(c, {1}, 2);
  cs_grow(c, {2}, 4); /* 1: 2 tokens, 2: 4 (one full block), 3: empty */
  const std::vector<uint64_t> ids = {1, 2, 3};
  const std::vector<int32_t> free_before = cs_free_list(c);
  const Expect e = expect_tokens(c, ids, counts, free_before);
  const std::vector<std::vector<int32_t>> committed = {cs_table(c, 1), cs_table(c, 2),
                                                       cs_table(c, 3)};
  const fd_cache_metrics m0 = cs_metrics(c);
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin_multi(c, ids.data(), counts.data(), 3, &tx));
  const uint32_t T = (uint32_t)e.pos.size();
  std::vector<float> k(T * 2), v(T * 2);
  for (uint32_t i = 0; i < T * 2; ++i) k[i] = (float)(i + 1), v[i] = -(float)(i + 1);
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, k.data(), v.data(), NULL));
  const uint64_t v_before = cs_version(c);
  FD_ASSERT_OK(fd_tx_commit_keep(c, tx, keep.data(), 3));
  assert_true(cs_version(c) > v_before);

  /* Expected: each row keeps the blocks its kept tokens reach; the other new
   * blocks return to the front in allocation order. */
  std::vector<int32_t> dropped;
  size_t token = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    const int32_t len = e.first_pos[r] + (int32_t)keep[r];
    const size_t blocks = (size_t)((len + 3) / 4);
    std::vector<int32_t> want(e.tables[r].begin(), e.tables[r].begin() + (long)blocks);
    for (size_t b = std::max(blocks, committed[r].size()); b < e.tables[r].size(); ++b)
      dropped.push_back(e.tables[r][b]);
    assert_int_equal(cs_seq_len(c, ids[r]), len);
    assert_true(cs_table(c, ids[r]) == want);
    for (uint32_t j = 0; j < keep[r]; ++j) {
      const size_t t = token + j;
      assert_true(cs_read_kv(c, 0, 0, e.blk[t], 0, (uint32_t)e.off[t], 1) == k[t * 2 + 1]);
      assert_true(cs_read_kv(c, 1, 0, e.blk[t], 0, (uint32_t)e.off[t], 0) == v[t * 2]);
    }
    token += counts[r];
  }
  std::vector<int32_t> want_free = dropped;
  want_free.insert(want_free.end(), free_before.begin() + (long)e.new_blocks.size(),
                   free_before.end());
  const fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.transaction_commit_count, m0.transaction_commit_count + 1);
  assert_int_equal(m.transaction_rollback_block_count,
                   m0.transaction_rollback_block_count + dropped.size());
  assert_int_equal(m.free_count, m0.free_count);
  assert_int_equal(m.retained_transaction_state_count, 0);
  FD_ASSERT_OK(fd_cache_validate(c));
  assert_true(cs_free_list(c) == want_free);
  /* The transaction is committed: the history says so. */
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, tx, keep.data(), 3), FD_ERR_INVALID_STATE,
                  "already committed");
  FD_ASSERT_FAILS(fd_tx_abort(c, tx), FD_ERR_INVALID_STATE, "already committed");
  fd_cache_destroy(c);
}

void commit_keep_none_partial_all(void **) {
  /* Row 1 (seq 2): 7 tokens reach 2 new blocks; row 2 (seq 4): 9 tokens, 3
   * new blocks; row 3 (empty): 3 tokens, 1 new block. */
  const std::vector<uint32_t> counts = {7, 9, 3};
  keep_case(counts, {0, 0, 0});
  keep_case(counts, {3, 0, 3}); /* drops row 1's second new block and all of row 2's */
  keep_case(counts, {2, 4, 1}); /* kept tokens end exactly on block boundaries */
  keep_case(counts, {6, 5, 2});
  keep_case(counts, {7, 9, 3}); /* all: nothing returned */
  keep_case({1, 1, 1}, {1, 0, 1});
}

/* fd_tx_commit == fd_tx_commit_keep keeping every token. */
void commit_is_keep_all(void **) {
  fd_cache *a = fragmented_cache(), *b = fragmented_cache();
  const uint64_t ids[2] = {4, 1};
  const uint32_t counts[2] = {5, 2};
  fd_tx ta, tb;
  FD_ASSERT_OK(fd_tx_begin_multi(a, ids, counts, 2, &ta));
  FD_ASSERT_OK(fd_tx_begin_multi(b, ids, counts, 2, &tb));
  std::vector<float> kv(7 * 2, 0.f);
  for (uint32_t l = 0; l < 2; ++l) {
    FD_ASSERT_OK(fd_tx_write_layer(a, ta, l, kv.data(), kv.data(), NULL));
    FD_ASSERT_OK(fd_tx_write_layer(b, tb, l, kv.data(), kv.data(), NULL));
  }
  FD_ASSERT_OK(fd_tx_commit(a, ta));
  FD_ASSERT_OK(fd_tx_commit_keep(b, tb, counts, 2));
  const std::vector<uint64_t> all = {1, 3, 4};
  cs_assert_same(cs_snapshot(a, all), cs_snapshot(b, all));
  assert_true(cs_free_list(a) == cs_free_list(b));
  fd_cache_destroy(a);
  fd_cache_destroy(b);
}

/* Truncate: blocks past the new ends return to the front in table order,
 * prefix blocks are never released, data before the new end is kept, and a
 * following transaction appends at the new end. */
void truncate_releases_blocks(void **) {
  const uint32_t B = 4;
  fd_cache *c = cs_make_cache(1, 1, 2, B, 24, 4);
  std::vector<float> pk(2 * B * 2), pv(2 * B * 2);
  for (size_t i = 0; i < pk.size(); ++i) pk[i] = (float)i, pv[i] = -(float)i;
  FD_ASSERT_OK(fd_prefix_register(c, "sys", pk.data(), pv.data(), 2, NULL));
  cs_add(c, {1, 2, 3});
  FD_ASSERT_OK(fd_prefix_attach(c, 1, "sys"));
  const uint64_t g1[2] = {1, 2};
  const uint32_t n1[2] = {5, 10};
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin_multi(c, g1, n1, 2, &tx));
  std::vector<float> kv(15 * 2);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = (float)(100 + i);
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, kv.data(), kv.data(), NULL));
  FD_ASSERT_OK(fd_tx_commit(c, tx)); /* 1: 13 tokens (2 prefix blocks + 2), 2: 10 (3 blocks) */
  cs_grow(c, {3}, 2);
  const std::vector<int32_t> t1 = cs_table(c, 1), t2 = cs_table(c, 2), t3 = cs_table(c, 3);
  assert_int_equal(t1.size(), 4);
  assert_int_equal(t2.size(), 3);
  const std::vector<int32_t> free0 = cs_free_list(c);
  const fd_cache_metrics m0 = cs_metrics(c);
  const uint64_t v0 = cs_version(c);
  const float kept = cs_read_kv(c, 0, 0, t1[2], 0, 0, 1); /* token 8 of request 1 */

  /* No-op: the current lengths. Nothing changes, the version included. */
  const uint64_t same_ids[3] = {1, 2, 3};
  const int32_t same[3] = {13, 10, 2};
  FD_ASSERT_OK(fd_cache_truncate(c, same_ids, same, 3));
  assert_true(cs_version(c) == v0);
  const fd_cache_metrics m_same = cs_metrics(c);
  assert_memory_equal(&m_same, &m0, sizeof m0);

  const uint64_t ids[2] = {1, 2};
  const int32_t lens[2] = {9, 4};
  FD_ASSERT_OK(fd_cache_truncate(c, ids, lens, 2));
  assert_true(cs_version(c) > v0);
  assert_int_equal(cs_seq_len(c, 1), 9);
  assert_int_equal(cs_seq_len(c, 2), 4);
  assert_true(cs_table(c, 1) == std::vector<int32_t>(t1.begin(), t1.begin() + 3));
  assert_true(cs_table(c, 2) == std::vector<int32_t>{t2[0]});
  assert_true(cs_table(c, 3) == t3);
  /* Released in table order, each to the front: row 1's block 3, then row
   * 2's blocks 1 and 2; the last released is handed out first. */
  std::vector<int32_t> want_free = {t2[2], t2[1], t1[3]};
  want_free.insert(want_free.end(), free0.begin(), free0.end());
  assert_true(cs_free_list(c) == want_free);
  const fd_cache_metrics m1 = cs_metrics(c);
  assert_int_equal(m1.free_count, m0.free_count + 3);
  assert_int_equal(m1.active_tokens, m0.active_tokens - 10);
  assert_int_equal(m1.used_blocks, m0.used_blocks - 3);
  assert_true(cs_read_kv(c, 0, 0, t1[2], 0, 0, 1) == kept);
  FD_ASSERT_OK(fd_cache_validate(c));

  /* Down to the prefix exactly, and a request to 0: every private block goes. */
  const int32_t to_prefix[2] = {8, 0};
  const uint64_t ids13[2] = {1, 3};
  FD_ASSERT_OK(fd_cache_truncate(c, ids13, to_prefix, 2));
  assert_true(cs_table(c, 1) == std::vector<int32_t>(t1.begin(), t1.begin() + 2));
  assert_true(cs_table(c, 3).empty());
  assert_int_equal(cs_seq_len(c, 3), 0);
  fd_prefix_info pi;
  pi.struct_size = sizeof pi;
  FD_ASSERT_OK(fd_prefix_get_info(c, "sys", &pi));
  assert_int_equal(pi.ref_count, 1);
  FD_ASSERT_OK(fd_cache_validate(c));

  /* The next transaction appends at the new end, into the front block. */
  const std::vector<int32_t> free1 = cs_free_list(c);
  const uint64_t one = 1;
  const uint32_t two = 2;
  FD_ASSERT_OK(fd_tx_begin_multi(c, &one, &two, 1, &tx));
  int32_t pos[2], blk[2];
  FD_ASSERT_OK(fd_tx_get_tokens(c, tx, 2, pos, blk, NULL));
  assert_int_equal(pos[0], 8);
  assert_int_equal(pos[1], 9);
  assert_int_equal(blk[0], free1[0]);
  assert_int_equal(blk[1], free1[0]);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  fd_cache_destroy(c);
}

/* ---- error paths: status, message naming the parameter, nothing changed ---- */

/* The refusals fd_tx_begin_multi and fd_cache_blocks_needed_multi share
 * (the same checks of the id and count lists, the same messages), through
 * `call(cache, ids, token_counts, count)` on a cache of 6 blocks of 2 with
 * requests 1 (3 tokens), 2 (empty) and 3 (cancelled). */
template <typename Call>
void shared_token_list_refusals(fd_cache *c, Call call) {
  const uint64_t ok[2] = {1, 2}, dup[3] = {1, 2, 1}, unknown[2] = {1, 5}, term[2] = {3, 1};
  const uint32_t k2[3] = {2, 3, 1}, zero[2] = {2, 0}, huge[2] = {0x7ffffffeu, 1},
                 halves[2] = {0x40000000u, 0x40000000u};
  FD_ASSERT_FAILS(call(NULL, ok, k2, 2), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(call(c, NULL, k2, 2), FD_ERR_INVALID_ARGUMENT, "request_ids");
  FD_ASSERT_FAILS(call(c, ok, k2, 0), FD_ERR_INVALID_ARGUMENT, "count");
  FD_ASSERT_FAILS(call(c, dup, k2, 3), FD_ERR_INVALID_ARGUMENT, "request_ids[2] = 1");
  FD_ASSERT_FAILS(call(c, unknown, k2, 2), FD_ERR_NOT_FOUND, "unknown request 5");
  FD_ASSERT_FAILS(call(c, term, k2, 2), FD_ERR_INVALID_STATE, "request 3 is cancelled");
  FD_ASSERT_FAILS(call(c, ok, zero, 2), FD_ERR_INVALID_ARGUMENT,
                  "token_counts[1] is 0: each row appends at least one token");
  FD_ASSERT_FAILS(call(c, ok, huge, 2), FD_ERR_INVALID_ARGUMENT, "token_counts[0]");
  FD_ASSERT_FAILS(call(c, ok, huge, 2), FD_ERR_INVALID_ARGUMENT, "INT32_MAX");
  FD_ASSERT_FAILS(call(c, ok, halves, 2), FD_ERR_INVALID_ARGUMENT, "token_counts sum");
  /* Misaligned token_counts. */
  alignas(8) unsigned char raw[16] = {0};
  FD_ASSERT_FAILS(call(c, ok, (const uint32_t *)(raw + 1), 2), FD_ERR_INVALID_ARGUMENT,
                  "token_counts");
}

fd_cache *refusal_cache() {
  fd_cache *c = cs_make_cache(1, 1, 2, 2, 6);
  cs_add(c, {1, 2, 3});
  cs_grow(c, {1}, 3);
  FD_ASSERT_OK(fd_cache_cancel_request(c, 3));
  return c;
}

void begin_multi_errors(void **) {
  fd_cache *c = refusal_cache();
  CsFrozen f = cs_freeze(c, {1, 2, 3});
  fd_tx tx = {77, 88};
  const uint64_t ok[2] = {1, 2};
  const uint32_t k2[3] = {2, 3, 1}, too_many[2] = {5, 5};
  shared_token_list_refusals(c, [&](fd_cache *cc, const uint64_t *ids, const uint32_t *k,
                                    uint32_t n) { return fd_tx_begin_multi(cc, ids, k, n, &tx); });
  FD_ASSERT_FAILS(fd_tx_begin_multi(c, ok, NULL, 2, &tx), FD_ERR_INVALID_ARGUMENT, "token_counts");
  FD_ASSERT_FAILS(fd_tx_begin_multi(c, ok, k2, 2, NULL), FD_ERR_INVALID_ARGUMENT, "tx");
  assert_int_equal(tx.id, 77);
  assert_int_equal(tx.cache_version, 88);
  cs_assert_unchanged(c, f);

  /* Capacity: 6 blocks, 2 used; 1 (3 tokens + 5) needs 2 new blocks, 2 (0 + 5)
   * needs 3: refused, and exactly the counters of a refused begin move. */
  assert_int_equal(cs_metrics(c).free_blocks, 4);
  f = cs_freeze(c, {1, 2, 3});
  FD_ASSERT_FAILS(fd_tx_begin_multi(c, ok, too_many, 2, &tx), FD_ERR_OUT_OF_BLOCKS,
                  "needs 5 new blocks, only 4 are free");
  fd_cache_metrics m = cs_metrics(c);
  assert_int_equal(m.capacity_failure_count, f.snap.metrics.capacity_failure_count + 1);
  assert_int_equal(m.transaction_failure_count, f.snap.metrics.transaction_failure_count + 1);
  f.snap.metrics.capacity_failure_count += 1;
  f.snap.metrics.transaction_failure_count += 1;
  cs_assert_unchanged(c, f);
  assert_int_equal(tx.id, 77);

  /* Exactly the free blocks: fine. */
  const uint32_t fits[2] = {5, 4}; /* 2 + 2 new blocks */
  FD_ASSERT_OK(fd_tx_begin_multi(c, ok, fits, 2, &tx));
  f = cs_freeze(c, {1, 2, 3}, false);
  fd_tx other = {77, 88};
  FD_ASSERT_FAILS(fd_tx_begin_multi(c, ok, k2, 1, &other), FD_ERR_INVALID_STATE, "is open");
  FD_ASSERT_FAILS(fd_cache_add_request(c, 9), FD_ERR_INVALID_STATE, "is open");
  assert_int_equal(other.id, 77);
  cs_assert_unchanged(c, f, false);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  fd_cache_destroy(c);
}

/* fd_cache_blocks_needed_multi is what fd_tx_begin_multi allocates, for rows
 * empty, mid-block and at a block boundary; NULL counts are
 * fd_cache_blocks_needed's answer; a need above the free blocks is an
 * answer, not an error. */
void blocks_needed_multi_matches_begin(void **) {
  fd_cache *c = cs_make_cache(1, 1, 2, 2, 9);
  cs_add(c, {1, 2, 3});
  cs_grow(c, {2, 3}, 3);
  cs_grow(c, {3}, 1); /* lengths 0, 3, 4 in blocks of 2 */
  const uint64_t ids[3] = {1, 2, 3};
  const uint32_t lists[][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 3}, {3, 3, 3}, {4, 1, 2}};
  for (const auto &k : lists) {
    uint32_t needed = 99, free_blocks = 99;
    FD_ASSERT_OK(fd_cache_blocks_needed_multi(c, ids, k, 3, &needed, &free_blocks));
    assert_int_equal(free_blocks, cs_metrics(c).free_blocks);
    fd_tx tx;
    FD_ASSERT_OK(fd_tx_begin_multi(c, ids, k, 3, &tx));
    fd_tx_info info;
    info.struct_size = sizeof info;
    FD_ASSERT_OK(fd_tx_get_info(c, tx, &info));
    assert_int_equal(needed, info.new_block_count);
    FD_ASSERT_OK(fd_tx_abort(c, tx));
  }
  uint32_t one = 0, multi = 0;
  FD_ASSERT_OK(fd_cache_blocks_needed(c, ids, 3, &one, NULL));
  FD_ASSERT_OK(fd_cache_blocks_needed_multi(c, ids, NULL, 3, &multi, NULL));
  assert_int_equal(one, 2); /* rows of 0 and 4 tokens start a block */
  assert_int_equal(multi, one);
  const uint32_t big[3] = {9, 9, 9}; /* 5 + 4 + 5 new blocks, 5 free */
  FD_ASSERT_OK(fd_cache_blocks_needed_multi(c, ids, big, 3, &multi, NULL));
  assert_int_equal(multi, 14);
  assert_int_equal(cs_metrics(c).free_blocks, 5);
  fd_cache_destroy(c);
}

/* fd_cache_blocks_needed_multi refuses what fd_tx_begin_multi refuses, with
 * the same messages, and changes nothing. */
void blocks_needed_multi_errors(void **) {
  fd_cache *c = refusal_cache();
  const CsFrozen f = cs_freeze(c, {1, 2, 3});
  const uint64_t ok[2] = {1, 2};
  const uint32_t k2[2] = {2, 3};
  uint32_t needed = 77, free_blocks = 88;
  shared_token_list_refusals(
      c, [&](fd_cache *cc, const uint64_t *ids, const uint32_t *k, uint32_t n) {
        return fd_cache_blocks_needed_multi(cc, ids, k, n, &needed, &free_blocks);
      });
  FD_ASSERT_FAILS(fd_cache_blocks_needed_multi(c, ok, k2, 2, NULL, &free_blocks),
                  FD_ERR_INVALID_ARGUMENT, "needed");
  assert_int_equal(needed, 77);
  assert_int_equal(free_blocks, 88);
  cs_assert_unchanged(c, f);
  fd_cache_destroy(c);
}

/* commit_keep's refusals leave the transaction open and unchanged. */
void commit_keep_errors(void **) {
  fd_cache *c = cs_make_cache(2, 1, 2, 2, 12);
  cs_add(c, {1, 2});
  cs_grow(c, {1}, 1);
  const uint64_t ids[2] = {1, 2};
  const uint32_t counts[2] = {3, 2};
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin_multi(c, ids, counts, 2, &tx));
  std::vector<float> kv(5 * 2, 1.f);
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, kv.data(), kv.data(), NULL));
  const CsTxView view = cs_tx_view(c, tx);
  CsFrozen f = cs_freeze(c, {1, 2}, false);
  const uint32_t keep_ok[2] = {3, 1}, over[2] = {3, 3}, over0[2] = {4, 0};
  /* Not every layer written (the keeps are valid): invalid state, stays open. */
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, tx, keep_ok, 2), FD_ERR_INVALID_STATE,
                  "written 1 of 2 layers");
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 1, kv.data(), kv.data(), NULL));
  const CsTxView written = cs_tx_view(c, tx);
  f.snap = cs_snapshot(c, f.ids);
  FD_ASSERT_FAILS(fd_tx_commit_keep(NULL, tx, keep_ok, 2), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, tx, NULL, 2), FD_ERR_INVALID_ARGUMENT, "keep_counts");
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, tx, keep_ok, 1), FD_ERR_INVALID_ARGUMENT,
                  "count 1 must equal");
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, tx, keep_ok, 3), FD_ERR_INVALID_ARGUMENT, "count 3");
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, tx, over, 2), FD_ERR_INVALID_ARGUMENT,
                  "keep_counts[1] = 3 is more than the 2 tokens");
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, tx, over0, 2), FD_ERR_INVALID_ARGUMENT, "keep_counts[0]");
  alignas(8) unsigned char raw[16] = {0};
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, tx, (const uint32_t *)(raw + 2), 2), FD_ERR_INVALID_ARGUMENT,
                  "keep_counts");
  /* Bad handles. */
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, fd_tx{tx.id, tx.cache_version + 1}, keep_ok, 2),
                  FD_ERR_STALE_HANDLE, "stale");
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, fd_tx{tx.id + 5, tx.cache_version}, keep_ok, 2),
                  FD_ERR_NOT_FOUND, "unknown transaction");
  cs_assert_unchanged(c, f, false);
  cs_assert_same_view(written, cs_tx_view(c, tx));
  assert_int_equal(view.info.next_layer, 1);
  FD_ASSERT_OK(fd_tx_commit_keep(c, tx, keep_ok, 2));
  assert_int_equal(cs_seq_len(c, 1), 4);
  assert_int_equal(cs_seq_len(c, 2), 1);

  /* Aborted handle. */
  fd_tx t2;
  FD_ASSERT_OK(fd_tx_begin_multi(c, ids, counts, 2, &t2));
  FD_ASSERT_OK(fd_tx_abort(c, t2));
  FD_ASSERT_FAILS(fd_tx_commit_keep(c, t2, keep_ok, 2), FD_ERR_INVALID_STATE, "already aborted");
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

void get_tokens_errors(void **) {
  fd_cache *c = cs_make_cache(1, 1, 2, 2, 8);
  cs_add(c, {1, 2});
  const uint64_t ids[2] = {1, 2};
  const uint32_t counts[2] = {3, 2};
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin_multi(c, ids, counts, 2, &tx));
  const CsTxView view = cs_tx_view(c, tx);
  CsFrozen f = cs_freeze(c, {1, 2}, false);
  int32_t pos[5] = {-7, -7, -7, -7, -7};
  FD_ASSERT_FAILS(fd_tx_get_tokens(c, tx, 4, pos, NULL, NULL), FD_ERR_INVALID_ARGUMENT,
                  "capacity 4 is smaller than the transaction's 5 tokens");
  FD_ASSERT_FAILS(fd_tx_get_tokens(c, tx, 2, NULL, pos, NULL), FD_ERR_INVALID_ARGUMENT,
                  "capacity 2");
  for (int32_t p : pos) assert_int_equal(p, -7);
  FD_ASSERT_OK(fd_tx_get_tokens(c, tx, 0, NULL, NULL, NULL)); /* nothing asked */
  FD_ASSERT_FAILS(fd_tx_get_tokens(NULL, tx, 5, pos, NULL, NULL), FD_ERR_INVALID_ARGUMENT, "cache");
  alignas(8) unsigned char raw[64];
  FD_ASSERT_FAILS(fd_tx_get_tokens(c, tx, 5, NULL, NULL, (int32_t *)(raw + 1)),
                  FD_ERR_INVALID_ARGUMENT, "offsets");
  FD_ASSERT_FAILS(fd_tx_get_tokens(c, fd_tx{tx.id, tx.cache_version + 1}, 5, pos, NULL, NULL),
                  FD_ERR_STALE_HANDLE, "stale");
  cs_assert_unchanged(c, f, false);
  cs_assert_same_view(view, cs_tx_view(c, tx));
  /* fd_tx_token_indptr_async: the same handle checks, and a NULL or
   * misaligned destination; nothing written. */
  int32_t indptr[3] = {-7, -7, -7};
  FD_ASSERT_FAILS(fd_tx_token_indptr_async(c, tx, NULL, NULL), FD_ERR_INVALID_ARGUMENT,
                  "token_indptr must not be NULL");
  FD_ASSERT_FAILS(fd_tx_token_indptr_async(c, tx, (int32_t *)(raw + 1), NULL),
                  FD_ERR_INVALID_ARGUMENT, "token_indptr");
  FD_ASSERT_FAILS(fd_tx_token_indptr_async(NULL, tx, indptr, NULL), FD_ERR_INVALID_ARGUMENT,
                  "cache");
  FD_ASSERT_FAILS(fd_tx_token_indptr_async(c, fd_tx{tx.id, tx.cache_version + 1}, indptr, NULL),
                  FD_ERR_STALE_HANDLE, "stale");
  for (int32_t p : indptr) assert_int_equal(p, -7);
  cs_assert_unchanged(c, f, false);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  FD_ASSERT_FAILS(fd_tx_get_tokens(c, tx, 5, pos, NULL, NULL), FD_ERR_INVALID_STATE,
                  "already aborted");
  FD_ASSERT_FAILS(fd_tx_token_indptr_async(c, tx, indptr, NULL), FD_ERR_INVALID_STATE,
                  "already aborted");
  for (int32_t p : indptr) assert_int_equal(p, -7);
  fd_cache_destroy(c);
}

void truncate_errors(void **) {
  fd_cache *c = cs_make_cache(1, 1, 2, 2, 12, 2);
  std::vector<float> pk(2 * 2 * 2, 1.f);
  FD_ASSERT_OK(fd_prefix_register(c, "p", pk.data(), pk.data(), 2, NULL));
  cs_add(c, {1, 2, 3});
  FD_ASSERT_OK(fd_prefix_attach(c, 1, "p"));
  cs_grow(c, {1, 2}, 3); /* 1: 7 tokens (4 of the prefix), 2: 3 */
  FD_ASSERT_OK(fd_cache_finish_request(c, 3));
  CsFrozen f = cs_freeze(c, {1, 2, 3});
  const uint64_t ok[2] = {1, 2}, dup[3] = {1, 2, 1}, unknown[2] = {2, 8}, term[2] = {3, 2};
  const int32_t lens[3] = {5, 1, 0}, neg[2] = {5, -1}, longer[2] = {8, 1}, cut[2] = {3, 1};
  FD_ASSERT_FAILS(fd_cache_truncate(NULL, ok, lens, 2), FD_ERR_INVALID_ARGUMENT, "cache");
  FD_ASSERT_FAILS(fd_cache_truncate(c, NULL, lens, 2), FD_ERR_INVALID_ARGUMENT, "request_ids");
  FD_ASSERT_FAILS(fd_cache_truncate(c, ok, NULL, 2), FD_ERR_INVALID_ARGUMENT, "seq_lens");
  FD_ASSERT_FAILS(fd_cache_truncate(c, ok, lens, 0), FD_ERR_INVALID_ARGUMENT, "count");
  FD_ASSERT_FAILS(fd_cache_truncate(c, dup, lens, 3), FD_ERR_INVALID_ARGUMENT,
                  "request_ids[2] = 1 is a duplicate");
  FD_ASSERT_FAILS(fd_cache_truncate(c, unknown, lens, 2), FD_ERR_NOT_FOUND, "unknown request 8");
  FD_ASSERT_FAILS(fd_cache_truncate(c, term, lens, 2), FD_ERR_INVALID_STATE,
                  "request 3 is finished");
  FD_ASSERT_FAILS(fd_cache_truncate(c, ok, neg, 2), FD_ERR_INVALID_ARGUMENT,
                  "seq_lens[1] = -1 is outside [0, 3]");
  FD_ASSERT_FAILS(fd_cache_truncate(c, ok, longer, 2), FD_ERR_INVALID_ARGUMENT,
                  "seq_lens[0] = 8 is outside [0, 7]");
  FD_ASSERT_FAILS(fd_cache_truncate(c, ok, cut, 2), FD_ERR_INVALID_ARGUMENT,
                  "seq_lens[0] = 3 would cut into the attached prefix \"p\"");
  alignas(8) unsigned char raw[32] = {0};
  FD_ASSERT_FAILS(fd_cache_truncate(c, ok, (const int32_t *)(raw + 1), 2), FD_ERR_INVALID_ARGUMENT,
                  "seq_lens");
  FD_ASSERT_FAILS(fd_cache_truncate(c, (const uint64_t *)(raw + 4), lens, 2),
                  FD_ERR_INVALID_ARGUMENT, "request_ids");
  cs_assert_unchanged(c, f);

  /* While a transaction is open. */
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ok, 1, &tx));
  f = cs_freeze(c, {1, 2, 3}, false);
  FD_ASSERT_FAILS(fd_cache_truncate(c, ok, lens, 2), FD_ERR_INVALID_STATE,
                  "cannot truncate requests while transaction");
  cs_assert_unchanged(c, f, false);
  FD_ASSERT_OK(fd_tx_abort(c, tx));
  /* The valid call that all of the above were variations of. */
  FD_ASSERT_OK(fd_cache_truncate(c, ok, lens, 2));
  assert_int_equal(cs_seq_len(c, 1), 5);
  assert_int_equal(cs_seq_len(c, 2), 1);
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(multi_token_views_data_commit),
      cmocka_unit_test(one_token_is_the_same),
      cmocka_unit_test(tx_info_old_struct_size),
      cmocka_unit_test(rope_each_token_at_its_position),
      cmocka_unit_test(abort_restores_free_list),
      cmocka_unit_test(commit_keep_none_partial_all),
      cmocka_unit_test(commit_is_keep_all),
      cmocka_unit_test(truncate_releases_blocks),
      cmocka_unit_test(begin_multi_errors),
      cmocka_unit_test(blocks_needed_multi_matches_begin),
      cmocka_unit_test(blocks_needed_multi_errors),
      cmocka_unit_test(commit_keep_errors),
      cmocka_unit_test(get_tokens_errors),
      cmocka_unit_test(truncate_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
