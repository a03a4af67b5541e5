/* The header's alignment rule applied to every array argument of every
 * public function (issue 11, bug 1): an array (tensor, id list, table,
 * length list, output array, array of structs) that does not start on a
 * multiple of its element alignment is FD_ERR_INVALID_ARGUMENT, the message
 * names the parameter ("<name> (<address>) must be aligned to <n> bytes"),
 * nothing changes (out-pointers and output arrays stay untouched) and, where
 * the header names one, only the counter it names moves (a failed layer
 * write of the open transaction: transaction_failure_count + 1; a refused
 * engine layer: the step is aborted). The ops entry points (fd_decode,
 * fd_kv_append, fd_rope_apply, fd_reference_attention_dense) are covered by
 * their own suites. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>
}

#include <string>

#include "fd_test.h"
#include "test_cache_support.h"
#include "test_engine_support.h"

namespace {

/* Aligned scratch that the tests shift by a few bytes. */
struct alignas(64) Scratch {
  unsigned char bytes[4096];
};

template <class T>
T *shifted(T *p, size_t bytes) {
  return reinterpret_cast<T *>(reinterpret_cast<unsigned char *>(p) + bytes);
}
template <class T>
const T *shifted(const T *p, size_t bytes) {
  return reinterpret_cast<const T *>(reinterpret_cast<const unsigned char *>(p) + bytes);
}

/* Runs `expr` twice: the message names the parameter ("<name> (<address>)
 * must be ...") and the alignment. */
#define EXPECT_MISALIGNED(expr, name, alignment)                                           \
  do {                                                                                     \
    FD_ASSERT_FAILS(expr, FD_ERR_INVALID_ARGUMENT, (std::string(name) + " (").c_str());    \
    const std::string want = "must be aligned to " + std::to_string(alignment) + " bytes"; \
    FD_ASSERT_FAILS(expr, FD_ERR_INVALID_ARGUMENT, want.c_str());                          \
  } while (0)

/* One-layer f32 cache (legacy append works) with prefixes, and requests 1
 * and 2 holding a token each. */
fd_cache *cache_with_requests() {
  fd_cache *c = cs_make_cache(1, 2, 4, 4, 8, 2, FD_DTYPE_F32);
  cs_add(c, {1, 2});
  cs_grow(c, {1, 2}, 1);
  return c;
}

void cache_id_lists_and_tables(void **) {
  fd_cache *c = cache_with_requests();
  Scratch s;
  memset(&s, 0, sizeof s);
  uint64_t *ids = reinterpret_cast<uint64_t *>(s.bytes);
  ids[0] = 1;
  ids[1] = 2;
  /* ids 4 bytes past a uint64 boundary: int32-aligned, not uint64-aligned. */
  uint64_t *bad_ids = reinterpret_cast<uint64_t *>(s.bytes + 516);
  memcpy(bad_ids, ids, 2 * sizeof(uint64_t));
  int32_t *tables = reinterpret_cast<int32_t *>(s.bytes + 1024);
  int32_t *lens = reinterpret_cast<int32_t *>(s.bytes + 2048);
  const CsFrozen before = cs_freeze(c, {1, 2});
  memset(s.bytes + 1024, 0x5a, 2048);
  const Scratch untouched = s;

  uint32_t needed = 77, free_blocks = 77;
  EXPECT_MISALIGNED(fd_cache_blocks_needed(c, bad_ids, 2, &needed, &free_blocks), "request_ids", 8);
  assert_int_equal(needed, 77);
  assert_int_equal(free_blocks, 77);
  uint32_t most = 77;
  EXPECT_MISALIGNED(fd_cache_max_blocks_per_seq(c, bad_ids, 2, &most), "request_ids", 8);
  assert_int_equal(most, 77);
  EXPECT_MISALIGNED(fd_cache_export(c, bad_ids, 2, 4, tables, lens), "request_ids", 8);
  EXPECT_MISALIGNED(fd_cache_export(c, ids, 2, 4, shifted(tables, 2), lens), "block_tables", 4);
  EXPECT_MISALIGNED(fd_cache_export(c, ids, 2, 4, tables, shifted(lens, 1)), "seq_lens", 4);
  EXPECT_MISALIGNED(fd_cache_export_async(c, bad_ids, 2, 4, tables, lens, NULL), "request_ids", 8);
  EXPECT_MISALIGNED(fd_cache_export_async(c, ids, 2, 4, shifted(tables, 1), lens, NULL),
                    "block_tables", 4);
  EXPECT_MISALIGNED(fd_cache_export_async(c, ids, 2, 4, tables, shifted(lens, 2), NULL), "seq_lens",
                    4);
  void *k = NULL, *v = NULL;
  int64_t *strides = reinterpret_cast<int64_t *>(s.bytes + 3072);
  EXPECT_MISALIGNED(fd_cache_layer_storage(c, 0, &k, &v, shifted(strides, 4)), "strides", 8);
  assert_null(k);
  assert_null(v);
  /* Nothing was written anywhere. */
  assert_memory_equal(s.bytes, untouched.bytes, sizeof s.bytes);
  cs_assert_unchanged(c, before);
  fd_cache_destroy(c);
}

void cache_append_and_begin(void **) {
  fd_cache *c = cache_with_requests();
  Scratch s;
  memset(&s, 0, sizeof s);
  uint64_t *ids = reinterpret_cast<uint64_t *>(s.bytes);
  ids[0] = 1;
  ids[1] = 2;
  uint64_t *bad_ids = reinterpret_cast<uint64_t *>(s.bytes + 36);
  memcpy(bad_ids, ids, 2 * sizeof(uint64_t));
  float *kv = reinterpret_cast<float *>(s.bytes + 1024); /* [2, 2, 4] f32 */
  const CsFrozen before = cs_freeze(c, {1, 2});

  EXPECT_MISALIGNED(fd_cache_append(c, bad_ids, 2, kv, kv, NULL), "request_ids", 8);
  EXPECT_MISALIGNED(fd_cache_append(c, ids, 2, shifted(kv, 2), kv, NULL), "k", 4);
  EXPECT_MISALIGNED(fd_cache_append(c, ids, 2, kv, shifted(kv, 1), NULL), "v", 4);
  fd_tx tx = {0xdeadull, 0xbeefull};
  EXPECT_MISALIGNED(fd_tx_begin(c, bad_ids, 2, &tx), "request_ids", 8);
  assert_true(tx.id == 0xdeadull && tx.cache_version == 0xbeefull);
  /* Argument errors of begin and append are not transaction failures (R3). */
  cs_assert_unchanged(c, before);
  fd_cache_destroy(c);
}

void transaction_writes_and_views(void **) {
  fd_cache *c = cache_with_requests();
  Scratch s;
  memset(&s, 0, sizeof s);
  const uint64_t ids[2] = {1, 2};
  float *kv = reinterpret_cast<float *>(s.bytes);       /* [2, 2, 4] f32 */
  float *q = reinterpret_cast<float *>(s.bytes + 256);  /* [2, 2, 4] f32 */
  float *qo = reinterpret_cast<float *>(s.bytes + 512); /* [2, 2, 4] f32 */
  unsigned char *out = s.bytes + 1024;
  fd_tx tx;
  FD_ASSERT_OK(fd_tx_begin(c, ids, 2, &tx));
  const CsSnapshot before = cs_snapshot(c, {1, 2});
  memset(out, 0x5a, 2048);
  const Scratch untouched = s;

  /* Failed layer writes of the open transaction: each one is counted. */
  EXPECT_MISALIGNED(fd_tx_write_layer(c, tx, 0, shifted(kv, 2), kv, NULL), "k", 4);
  EXPECT_MISALIGNED(fd_tx_write_layer(c, tx, 0, kv, shifted(kv, 1), NULL), "v", 4);
  EXPECT_MISALIGNED(
      fd_tx_write_layer_rope(c, tx, 0, shifted(q, 2), 2, kv, kv, 4, 10000.f, qo, NULL), "q", 4);
  EXPECT_MISALIGNED(
      fd_tx_write_layer_rope(c, tx, 0, q, 2, shifted(kv, 3), kv, 4, 10000.f, qo, NULL), "k", 4);
  EXPECT_MISALIGNED(
      fd_tx_write_layer_rope(c, tx, 0, q, 2, kv, shifted(kv, 2), 4, 10000.f, qo, NULL), "v", 4);
  EXPECT_MISALIGNED(
      fd_tx_write_layer_rope(c, tx, 0, q, 2, kv, kv, 4, 10000.f, shifted(qo, 1), NULL), "q_out", 4);
  const uint64_t failed_writes = 2 * 6; /* EXPECT_MISALIGNED calls twice */

  /* Views of the open transaction. */
  uint64_t *row_ids = reinterpret_cast<uint64_t *>(out);
  int32_t *ints = reinterpret_cast<int32_t *>(out + 512);
  EXPECT_MISALIGNED(fd_tx_get_rows(c, tx, 2, shifted(row_ids, 4), NULL, NULL, NULL, NULL),
                    "request_ids", 8);
  EXPECT_MISALIGNED(
      fd_tx_get_rows(c, tx, 2, row_ids, shifted(ints, 2), ints + 8, ints + 16, ints + 24),
      "positions", 4);
  EXPECT_MISALIGNED(
      fd_tx_get_rows(c, tx, 2, row_ids, ints, shifted(ints + 8, 1), ints + 16, ints + 24),
      "block_ids", 4);
  EXPECT_MISALIGNED(
      fd_tx_get_rows(c, tx, 2, row_ids, ints, ints + 8, shifted(ints + 16, 3), ints + 24),
      "offsets", 4);
  EXPECT_MISALIGNED(
      fd_tx_get_rows(c, tx, 2, row_ids, ints, ints + 8, ints + 16, shifted(ints + 24, 2)),
      "effective_seq_lens", 4);
  EXPECT_MISALIGNED(fd_tx_block_tables(c, tx, 4, shifted(ints, 2)), "block_tables", 4);
  EXPECT_MISALIGNED(fd_tx_block_tables_async(c, tx, 4, shifted(ints, 1), ints + 64, NULL),
                    "block_tables", 4);
  EXPECT_MISALIGNED(fd_tx_block_tables_async(c, tx, 4, ints, shifted(ints + 64, 2), NULL),
                    "effective_seq_lens", 4);
  assert_memory_equal(s.bytes, untouched.bytes, sizeof s.bytes);

  CsSnapshot expected = before;
  expected.metrics.transaction_failure_count += failed_writes;
  cs_assert_same(expected, cs_snapshot(c, {1, 2}));
  fd_tx_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_tx_get_info(c, tx, &info));
  assert_int_equal(info.next_layer, 0); /* the transaction did not move */
  FD_ASSERT_OK(fd_tx_write_layer(c, tx, 0, kv, kv, NULL));
  FD_ASSERT_OK(fd_tx_commit(c, tx));
  FD_ASSERT_OK(fd_cache_validate(c));
  fd_cache_destroy(c);
}

void prefix_blocks_and_external_storage(void **) {
  fd_cache *c = cache_with_requests();
  static Scratch s; /* one block of [1 layer, 2 heads, 4 tokens, 4 dims] f32 = 128 bytes */
  memset(&s, 0, sizeof s);
  const CsFrozen before = cs_freeze(c, {1, 2});
  EXPECT_MISALIGNED(fd_prefix_register(c, "p", s.bytes + 2, s.bytes + 512, 1, NULL), "k_blocks", 4);
  EXPECT_MISALIGNED(fd_prefix_register(c, "p", s.bytes, s.bytes + 513, 1, NULL), "v_blocks", 4);
  cs_assert_unchanged(c, before);
  fd_prefix_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  FD_ASSERT_FAILS(fd_prefix_get_info(c, "p", &info), FD_ERR_NOT_FOUND, "p");
  fd_cache_destroy(c);

  /* External storage is an array of the cache's dtype too. */
  static Scratch k, v;
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_kv_heads = 1;
  cfg.head_dim = 4;
  cfg.block_size = 4;
  cfg.max_blocks = 4;
  cfg.dtype = FD_DTYPE_F16;
  cfg.k_storage = k.bytes + 1;
  cfg.v_storage = v.bytes;
  fd_cache *out = reinterpret_cast<fd_cache *>(&k);
  EXPECT_MISALIGNED(fd_cache_create(&cfg, &out), "k_storage", 2);
  cfg.k_storage = k.bytes;
  cfg.v_storage = v.bytes + 3;
  EXPECT_MISALIGNED(fd_cache_create(&cfg, &out), "v_storage", 2);
  assert_ptr_equal(out, reinterpret_cast<fd_cache *>(&k));
  cfg.v_storage = v.bytes + 2; /* f16: 2-byte alignment is enough */
  FD_ASSERT_OK(fd_cache_create(&cfg, &out));
  fd_cache_destroy(out);
}

void engine_arrays(void **) {
  fd_cache *c = es_cache(1, 1, 4, 4, 8, 2);
  fd_engine *e = es_engine(c, 2);
  FD_ASSERT_OK(fd_engine_add_request(e, 1));
  FD_ASSERT_OK(fd_engine_admit(e, 1));
  static Scratch s;
  memset(&s, 0, sizeof s);
  float *buf = reinterpret_cast<float *>(s.bytes);
  uint64_t *ids = reinterpret_cast<uint64_t *>(s.bytes + 2048);
  ids[0] = 1;
  uint64_t *bad_ids = shifted(ids + 1, 4);
  memcpy(bad_ids, ids, sizeof *ids); /* not through the misaligned pointer */

  /* Prefix blocks through the engine. */
  const fd_engine_metrics m0 = es_metrics(e);
  EXPECT_MISALIGNED(fd_engine_register_prefix(e, "p", shifted(buf, 2), buf, 1, NULL), "k_blocks",
                    4);
  EXPECT_MISALIGNED(fd_engine_register_prefix(e, "p", buf, shifted(buf, 1), 1, NULL), "v_blocks",
                    4);
  /* Prefill: nothing changes. */
  EXPECT_MISALIGNED(fd_engine_prefill_request_layers(e, 1, shifted(buf, 2), buf), "k", 4);
  EXPECT_MISALIGNED(fd_engine_prefill_request_layers(e, 1, buf, shifted(buf, 2)), "v", 4);
  assert_int_equal(es_seq_len(c, 1), 0);
  /* begin_step: nothing changes. */
  fd_engine_step st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  EXPECT_MISALIGNED(fd_engine_begin_step(e, bad_ids, 1, &st), "request_ids", 8);
  assert_int_equal(st.outcome, 0);
  const fd_engine_metrics m1 = es_metrics(e);
  assert_memory_equal(&m0, &m1, sizeof m0);
  const fd_cache_metrics cm = es_cache_metrics(c);
  assert_int_equal(cm.resident_prefix_count, 0);
  assert_int_equal(cm.transaction_begin_count, 0);

  /* step_layer: a refused layer aborts the step, as a NULL pointer does. */
  const char *names[4] = {"q", "k", "v", "out_attention"};
  for (int which = 0; which < 4; ++which) {
    FD_ASSERT_OK(fd_engine_begin_step(e, ids, 1, &st));
    const void *in[3] = {buf, buf + 64, buf + 128};
    void *out = buf + 192;
    if (which < 3)
      in[which] = shifted(static_cast<const float *>(in[which]), 2);
    else
      out = shifted(static_cast<float *>(out), 1);
    const fd_engine_metrics before = es_metrics(e);
    FD_ASSERT_FAILS(fd_engine_step_layer(e, st.tx, 0, in[0], in[1], in[2], out, NULL),
                    FD_ERR_INVALID_ARGUMENT, (std::string(names[which]) + " (").c_str());
    assert_non_null(strstr(fd_last_error_message(), "must be aligned to 4 bytes"));
    const fd_engine_metrics after = es_metrics(e);
    assert_int_equal(after.transaction_abort_count, before.transaction_abort_count + 1);
    assert_int_equal(after.open_step_transaction_count, 0);
    assert_int_equal(after.transaction_layer_step_count, before.transaction_layer_step_count);
    assert_int_equal(es_seq_len(c, 1), 0);
  }
  FD_ASSERT_OK(fd_engine_validate(e));
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void scheduler_and_workload_arrays(void **) {
  fd_cache *c = es_cache(1, 1, 4, 4, 8);
  fd_engine *e = es_engine(c);
  fd_request_spec a = es_spec(1, 0, 2), b = es_spec(2, 0, 2);
  FD_ASSERT_OK(fd_engine_submit_request(e, &a));
  FD_ASSERT_OK(fd_engine_submit_request(e, &b));
  static Scratch s;
  memset(&s, 0, sizeof s);
  fd_request_fairness *fair = reinterpret_cast<fd_request_fairness *>(s.bytes);
  fair[0].id = 1;
  fd_request_fairness *bad_fair = shifted(fair + 2, 4);
  memcpy(bad_fair, fair, sizeof *fair); /* not through the misaligned pointer */
  fd_snapshot *snap = reinterpret_cast<fd_snapshot *>(&s);
  EXPECT_MISALIGNED(fd_engine_snapshot(e, 0, bad_fair, 1, &snap), "fairness", 8);
  assert_ptr_equal(snap, reinterpret_cast<fd_snapshot *>(&s));
  FD_ASSERT_OK(fd_engine_snapshot(e, 0, fair, 1, &snap));
  fd_scheduler_config sc;
  fd_scheduler_config_init(&sc);
  fd_scheduler *sched = NULL;
  FD_ASSERT_OK(fd_scheduler_create(&sc, &sched));
  fd_decision *d = NULL;
  FD_ASSERT_OK(fd_scheduler_plan(sched, snap, &d));

  uint64_t *ids = reinterpret_cast<uint64_t *>(s.bytes + 1024);
  memset(ids, 0x5a, 64);
  uint32_t count = 77;
  EXPECT_MISALIGNED(fd_decision_ids(d, FD_DECISION_ADMIT, shifted(ids, 4), 4, &count), "ids", 8);
  int32_t *reasons = reinterpret_cast<int32_t *>(s.bytes + 2048);
  memset(reasons, 0x5a, 64);
  EXPECT_MISALIGNED(fd_decision_reasons(d, shifted(reasons, 2), 7, &count), "reasons", 4);
  assert_int_equal(count, 77);
  for (int i = 0; i < 64; ++i) assert_int_equal(s.bytes[1024 + i], 0x5a);
  for (int i = 0; i < 64; ++i) assert_int_equal(s.bytes[2048 + i], 0x5a);
  fd_decision_destroy(d);
  fd_scheduler_destroy(sched);
  fd_snapshot_destroy(snap);
  fd_engine_destroy(e);
  fd_cache_destroy(c);

  /* Workload traces: an array of structs with 64-bit fields. */
  fd_workload_options o;
  fd_workload_options_init(&o);
  o.kind = FD_WORKLOAD_SCHEDULER;
  o.case_name = "boundary_deadlock";
  fd_workload_result *r = NULL;
  FD_ASSERT_OK(fd_workload_run(&o, &r));
  uint32_t n = 0;
  FD_ASSERT_OK(fd_workload_result_trace(r, 0, NULL, 0, &n));
  std::vector<fd_workload_trace_point> points(n + 1);
  memset(points.data(), 0x5a, points.size() * sizeof points[0]);
  count = 77;
  EXPECT_MISALIGNED(fd_workload_result_trace(r, 0, shifted(points.data(), 4), n, &count), "points",
                    8);
  assert_int_equal(count, 77);
  for (size_t i = 0; i < points.size() * sizeof points[0]; ++i)
    assert_int_equal(reinterpret_cast<const unsigned char *>(points.data())[i], 0x5a);
  fd_workload_result_destroy(r);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(cache_id_lists_and_tables),
      cmocka_unit_test(cache_append_and_begin),
      cmocka_unit_test(transaction_writes_and_views),
      cmocka_unit_test(prefix_blocks_and_external_storage),
      cmocka_unit_test(engine_arrays),
      cmocka_unit_test(scheduler_and_workload_arrays),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
