/* The struct_size policy (docs/abi.md rule 10), as every component
 * applies it:
 *  - inputs: a struct_size larger than the library's struct (a newer header)
 *    is refused; a struct_size that ends inside a field does not read that
 *    field (it keeps its default);
 *  - outputs: a larger struct_size is fine (the caller's tail stays as it
 *    was); one that ends inside a field writes only the whole fields before
 *    it; struct_size itself is never written.
 * Buffers are filled with 0xCD so that every byte the library writes, or must
 * not write, is visible. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "fd_test.h"

#define FILL 0xCD
#define EXTRA 16 /* bytes of a "newer" result struct past the library's */

static void assert_bytes(const unsigned char *p, size_t from, size_t to, unsigned char value) {
  for (size_t i = from; i < to; ++i) assert_int_equal(p[i], value);
}

/* ------------------------------------------------------------------------ */
/* Engine metrics (output). */

static fd_engine *engine_with_waiting_request(fd_cache **cache) {
  fd_cache_config cc;
  fd_cache_config_init(&cc);
  cc.num_kv_heads = 1;
  cc.head_dim = 8;
  cc.max_blocks = 4;
  FD_ASSERT_OK(fd_cache_create(&cc, cache));
  fd_engine *e = NULL;
  FD_ASSERT_OK(fd_engine_create(*cache, NULL, &e));
  FD_ASSERT_OK(fd_engine_add_request(e, 7)); /* waiting_request_count = 1 */
  return e;
}

static void test_engine_metrics(void **state) {
  (void)state;
  fd_cache *cache = NULL;
  fd_engine *e = engine_with_waiting_request(&cache);
  fd_engine_metrics want;
  want.struct_size = sizeof want;
  FD_ASSERT_OK(fd_engine_metrics_get(e, &want));
  assert_int_equal(want.waiting_request_count, 1);

  union {
    fd_engine_metrics m;
    unsigned char raw[sizeof(fd_engine_metrics) + EXTRA];
  } buf;

  /* Newer caller: our fields are filled, its extra bytes are left alone. */
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.m.struct_size = (uint32_t)sizeof buf.raw;
  FD_ASSERT_OK(fd_engine_metrics_get(e, &buf.m));
  assert_int_equal(buf.m.struct_size, sizeof buf.raw);
  assert_memory_equal(buf.raw + 4, (const unsigned char *)&want + 4, sizeof want - 4);
  assert_bytes(buf.raw, sizeof want, sizeof buf.raw, FILL);

  /* struct_size 12 ends inside waiting_request_count: only scheduler_managed
   * is written, no half of the count. */
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.m.struct_size = 12;
  FD_ASSERT_OK(fd_engine_metrics_get(e, &buf.m));
  assert_int_equal(buf.m.struct_size, 12);
  assert_int_equal(buf.m.scheduler_managed, want.scheduler_managed);
  assert_bytes(buf.raw, offsetof(fd_engine_metrics, waiting_request_count), sizeof buf.raw, FILL);

  /* Below the minimum (8): refused, nothing written. */
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.m.struct_size = 7;
  FD_ASSERT_FAILS(fd_engine_metrics_get(e, &buf.m), FD_ERR_INVALID_ARGUMENT,
                  "metrics->struct_size 7 is too small");
  assert_int_equal(buf.m.struct_size, 7);
  assert_bytes(buf.raw, 4, sizeof buf.raw, FILL);

  fd_engine_destroy(e);
  fd_cache_destroy(cache);
}

/* fd_engine_config (input): newer refused, no engine created. */
static void test_engine_config_newer_refused(void **state) {
  (void)state;
  fd_cache_config cc;
  fd_cache_config_init(&cc);
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&cc, &cache));
  fd_engine_config ec;
  fd_engine_config_init(&ec);
  ec.struct_size = (uint32_t)sizeof ec + 4;
  fd_engine *e = NULL;
  FD_ASSERT_FAILS(fd_engine_create(cache, &ec, &e), FD_ERR_INVALID_ARGUMENT, "newer header");
  assert_null(e);
  fd_cache_destroy(cache);
}

/* ------------------------------------------------------------------------ */
/* fd_decode_params (input). One query head over two f32 tokens. */

typedef struct {
  float q[4], k[16], v[16], out[4];
  int32_t table[1], lens[1];
} decode_case;

static fd_decode_params decode_params(decode_case *c) {
  for (int i = 0; i < 4; ++i) c->q[i] = 0.25f * (float)(i + 1);
  for (int i = 0; i < 16; ++i) {
    c->k[i] = 0.125f * (float)(i % 5);
    c->v[i] = (float)i;
  }
  c->table[0] = 0;
  c->lens[0] = 2;
  fd_decode_params p;
  fd_decode_params_init(&p);
  p.q_dtype = p.kv_dtype = p.out_dtype = FD_DTYPE_F32;
  p.batch = 1;
  p.num_q_heads = 1;
  p.num_kv_heads = 1;
  p.head_dim = 4;
  p.block_size = 4;
  p.num_blocks = 1;
  p.max_blocks_per_seq = 1;
  p.q = c->q;
  p.k_cache = c->k;
  p.v_cache = c->v;
  p.block_tables = c->table;
  p.seq_lens = c->lens;
  p.out = c->out;
  return p;
}

static void test_decode_params(void **state) {
  (void)state;
  decode_case c;
  fd_decode_params p = decode_params(&c);
  FD_ASSERT_OK(fd_decode(&p));
  float want[4];
  memcpy(want, c.out, sizeof want);

  /* Newer header: refused before anything is written. */
  memset(c.out, FILL, sizeof c.out);
  p.struct_size = (uint32_t)sizeof p + 8;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "newer header");
  assert_bytes((const unsigned char *)c.out, 0, sizeof c.out, FILL);

  /* struct_size ends inside `device` (after device.type): the field is not
   * read, so the invalid type is never seen and the CPU default serves. */
  p.device.type = 99;
  p.struct_size = (uint32_t)(offsetof(fd_decode_params, device) + sizeof(int32_t));
  FD_ASSERT_OK(fd_decode(&p));
  assert_memory_equal(c.out, want, sizeof want);

  /* Once the whole field is inside struct_size it is read (and refused). */
  memset(c.out, FILL, sizeof c.out);
  p.struct_size = (uint32_t)(offsetof(fd_decode_params, device) + sizeof(fd_device));
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "device.type 99");
  assert_bytes((const unsigned char *)c.out, 0, sizeof c.out, FILL);
}

/* ------------------------------------------------------------------------ */
/* Scheduler structs. */

static void test_scheduler_config(void **state) {
  (void)state;
  fd_scheduler_config config;
  fd_scheduler_config_init(&config);
  config.max_active_requests = 5;
  config.max_batch_requests = 3;

  /* Input from a newer header: refused, no handle. */
  config.struct_size = (uint32_t)sizeof config + 4;
  fd_scheduler *s = NULL;
  FD_ASSERT_FAILS(fd_scheduler_create(&config, &s), FD_ERR_INVALID_ARGUMENT,
                  "config->struct_size 24 is larger than this library's struct (20 bytes)");
  assert_null(s);

  config.struct_size = sizeof config;
  FD_ASSERT_OK(fd_scheduler_create(&config, &s));

  /* Output into a newer struct: every field, the tail untouched. */
  union {
    fd_scheduler_config c;
    unsigned char raw[sizeof(fd_scheduler_config) + EXTRA];
  } buf;
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.c.struct_size = (uint32_t)sizeof buf.raw;
  FD_ASSERT_OK(fd_scheduler_get_config(s, &buf.c));
  assert_int_equal(buf.c.struct_size, sizeof buf.raw);
  assert_int_equal(buf.c.max_active_requests, 5);
  assert_int_equal(buf.c.max_batch_requests, 3);
  assert_int_equal(buf.c.aging_threshold_steps, config.aging_threshold_steps);
  assert_bytes(buf.raw, sizeof config, sizeof buf.raw, FILL);

  /* Output into an older struct (through max_batch_requests). */
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.c.struct_size = (uint32_t)offsetof(fd_scheduler_config, reserve_blocks);
  FD_ASSERT_OK(fd_scheduler_get_config(s, &buf.c));
  assert_int_equal(buf.c.max_batch_requests, 3);
  assert_bytes(buf.raw, offsetof(fd_scheduler_config, reserve_blocks), sizeof buf.raw, FILL);

  fd_scheduler_destroy(s);
}

static fd_decision *plan(const fd_scheduler *s, const fd_snapshot *snap) {
  fd_decision *d = NULL;
  FD_ASSERT_OK(fd_scheduler_plan(s, snap, &d));
  return d;
}

static uint32_t admitted(const fd_decision *d) {
  uint32_t count = 99;
  FD_ASSERT_OK(fd_decision_ids(d, FD_DECISION_ADMIT, NULL, 0, &count));
  return count;
}

static void test_snapshot_inputs_and_summary(void **state) {
  (void)state;
  fd_scheduler *s = NULL;
  fd_scheduler_config config;
  fd_scheduler_config_init(&config);
  FD_ASSERT_OK(fd_scheduler_create(&config, &s));

  /* fd_snapshot_info from a newer header: refused, no handle. */
  fd_snapshot_info info;
  fd_snapshot_info_init(&info);
  info.struct_size = (uint32_t)sizeof info + 8;
  fd_snapshot *snap = NULL;
  FD_ASSERT_FAILS(fd_snapshot_create(&info, &snap), FD_ERR_INVALID_ARGUMENT, "newer header");
  assert_null(snap);
  info.struct_size = sizeof info;
  FD_ASSERT_OK(fd_snapshot_create(&info, &snap));

  fd_request_spec spec;
  fd_request_spec_init(&spec);
  spec.id = 1;
  spec.submission_order = 1;
  spec.initial_context_tokens = 20;
  FD_ASSERT_OK(fd_snapshot_add_waiting(snap, &spec, 0, 0));

  /* fd_request_spec from a newer header: refused, the snapshot unchanged. */
  spec.id = 2;
  spec.submission_order = 2;
  spec.struct_size = (uint32_t)sizeof spec + 8;
  FD_ASSERT_FAILS(fd_snapshot_add_waiting(snap, &spec, 0, 0), FD_ERR_INVALID_ARGUMENT,
                  "spec->struct_size");
  fd_decision *d = plan(s, snap);
  assert_int_equal(admitted(d), 1);

  fd_decision_summary want;
  want.struct_size = sizeof want;
  FD_ASSERT_OK(fd_decision_get_summary(d, &want));
  assert_int_equal(want.committed_blocks_after, 2); /* ceil(21 / 16) */

  union {
    fd_decision_summary m;
    unsigned char raw[sizeof(fd_decision_summary) + EXTRA];
  } buf;

  /* Newer result struct: every field, the tail untouched. */
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.m.struct_size = (uint32_t)sizeof buf.raw;
  FD_ASSERT_OK(fd_decision_get_summary(d, &buf.m));
  assert_int_equal(buf.m.struct_size, sizeof buf.raw);
  assert_memory_equal(buf.raw + 4, (const unsigned char *)&want + 4, sizeof want - 4);
  assert_bytes(buf.raw, sizeof want, sizeof buf.raw, FILL);

  /* struct_size 12 ends inside the 8-byte step: only has_drain is written. */
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.m.struct_size = 12;
  FD_ASSERT_OK(fd_decision_get_summary(d, &buf.m));
  assert_int_equal(buf.m.struct_size, 12);
  assert_int_equal(buf.m.has_drain, want.has_drain);
  assert_bytes(buf.raw, offsetof(fd_decision_summary, step), sizeof buf.raw, FILL);

  fd_decision_destroy(d);
  fd_snapshot_destroy(snap);
  fd_scheduler_destroy(s);
}

/* fd_engine_submit_request reads fd_request_spec the same way. */
static void test_engine_spec_newer_refused(void **state) {
  (void)state;
  fd_cache_config cc;
  fd_cache_config_init(&cc);
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&cc, &cache));
  fd_engine *e = NULL;
  FD_ASSERT_OK(fd_engine_create(cache, NULL, &e));
  fd_request_spec spec;
  fd_request_spec_init(&spec);
  spec.id = 3;
  spec.struct_size = (uint32_t)sizeof spec + 8;
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &spec), FD_ERR_INVALID_ARGUMENT, "newer header");
  fd_engine_metrics m;
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_engine_metrics_get(e, &m));
  assert_int_equal(m.scheduler_managed, 0);
  assert_int_equal(m.waiting_request_count, 0);
  fd_engine_destroy(e);
  fd_cache_destroy(cache);
}

/* ------------------------------------------------------------------------ */
/* Workload report (output): the minimum runs through the 32-byte case_name,
 * which is never cut. */

static void test_workload_report(void **state) {
  (void)state;
  fd_workload_options o;
  fd_workload_options_init(&o);
  o.kind = FD_WORKLOAD_SYNTHETIC;
  FD_ASSERT_OK(fd_workload_case_name(o.kind, 0, &o.case_name));
  fd_workload_result *r = NULL;
  FD_ASSERT_OK(fd_workload_run(&o, &r));

  union {
    fd_workload_report m;
    unsigned char raw[sizeof(fd_workload_report) + EXTRA];
  } buf;
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.m.struct_size = (uint32_t)offsetof(fd_workload_report, case_name) + 8;
  FD_ASSERT_FAILS(fd_workload_result_report(r, 0, &buf.m), FD_ERR_INVALID_ARGUMENT,
                  "report->struct_size 24 is too small (at least 48 bytes)");
  assert_bytes(buf.raw, 4, sizeof buf.raw, FILL);

  buf.m.struct_size = (uint32_t)offsetof(fd_workload_report, seed);
  FD_ASSERT_OK(fd_workload_result_report(r, 0, &buf.m));
  assert_string_equal(buf.m.case_name, o.case_name);
  assert_int_equal(buf.m.kind, FD_WORKLOAD_SYNTHETIC);
  assert_bytes(buf.raw, offsetof(fd_workload_report, seed), sizeof buf.raw, FILL);

  fd_workload_result_destroy(r);
}

/* ------------------------------------------------------------------------ */
/* Cache structs: field-exact where rounding to the alignment would drop a
 * field (fd_cache_config's device at offset 36 before its 8-byte tail,
 * fd_prefix_info's ref_count at offset 8 of an 8-aligned struct). */

static fd_cache_config small_cache_config(void) {
  fd_cache_config cc;
  fd_cache_config_init(&cc);
  cc.num_kv_heads = 1;
  cc.head_dim = 4;
  cc.block_size = 2;
  cc.max_blocks = 8;
  cc.prefix_cache_capacity_blocks = 4;
  return cc;
}

static void test_cache_config_fields(void **state) {
  (void)state;
  const size_t device_end = offsetof(fd_cache_config, device) + sizeof(fd_device);
  fd_cache_config cc = small_cache_config();
  fd_cache *cache = NULL;

  /* An older caller's struct ending right after `device` (before the 8-byte
   * tail): `device` is read, so an invalid one is refused. */
  cc.device.type = 99;
  cc.struct_size = (uint32_t)device_end;
  FD_ASSERT_FAILS(fd_cache_create(&cc, &cache), FD_ERR_INVALID_ARGUMENT, "device.type 99");
  assert_null(cache);
  /* Ending inside `device`: not read, the CPU default serves. */
  cc.struct_size = (uint32_t)(device_end - 4);
  FD_ASSERT_OK(fd_cache_create(&cc, &cache));

  /* Output: whole fields up to struct_size, the rest untouched. */
  union {
    fd_cache_config c;
    unsigned char raw[sizeof(fd_cache_config) + EXTRA];
  } buf;
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.c.struct_size = (uint32_t)device_end;
  FD_ASSERT_OK(fd_cache_get_config(cache, &buf.c));
  assert_int_equal(buf.c.struct_size, device_end);
  assert_int_equal(buf.c.max_blocks, 8);
  assert_int_equal(buf.c.device.type, FD_DEVICE_CPU);
  assert_int_equal(buf.c.device.ordinal, 0);
  assert_bytes(buf.raw, device_end, sizeof buf.raw, FILL);
  /* Ending inside `device`: it is not written. */
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.c.struct_size = (uint32_t)(device_end - 4);
  FD_ASSERT_OK(fd_cache_get_config(cache, &buf.c));
  assert_int_equal(buf.c.layout, FD_LAYOUT_TOKEN_MAJOR);
  assert_bytes(buf.raw, offsetof(fd_cache_config, device), sizeof buf.raw, FILL);
  /* Newer: every field, the caller's tail untouched. */
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.c.struct_size = (uint32_t)sizeof buf.raw;
  FD_ASSERT_OK(fd_cache_get_config(cache, &buf.c));
  assert_int_equal(buf.c.stride_dim, 0);
  assert_bytes(buf.raw, sizeof(fd_cache_config), sizeof buf.raw, FILL);
  /* Below the minimum (through max_blocks): refused, nothing written. */
  memset(buf.raw, FILL, sizeof buf.raw);
  buf.c.struct_size = (uint32_t)offsetof(fd_cache_config, max_blocks);
  FD_ASSERT_FAILS(fd_cache_get_config(cache, &buf.c), FD_ERR_INVALID_ARGUMENT,
                  "config->struct_size 20 is too small");
  assert_bytes(buf.raw, 4, sizeof buf.raw, FILL);
  fd_cache_destroy(cache);
}

static void test_cache_info_structs(void **state) {
  (void)state;
  fd_cache_config cc = small_cache_config();
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&cc, &cache));
  uint16_t blocks[2 * 2 * 4] = {0}; /* 2 blocks of [1 head, 2 tokens, 4 dims] */
  FD_ASSERT_OK(fd_prefix_register(cache, "p", blocks, blocks, 2, NULL));
  FD_ASSERT_OK(fd_cache_add_request(cache, 1));
  FD_ASSERT_OK(fd_prefix_attach(cache, 1, "p"));

  /* fd_prefix_info: struct_size 12 ends after ref_count (inside the first
   * 8-byte unit past the minimum): both whole fields are written. */
  union {
    fd_prefix_info p;
    unsigned char raw[sizeof(fd_prefix_info) + EXTRA];
  } pi;
  memset(pi.raw, FILL, sizeof pi.raw);
  pi.p.struct_size = 12;
  FD_ASSERT_OK(fd_prefix_get_info(cache, "p", &pi.p));
  assert_int_equal(pi.p.num_blocks, 2);
  assert_int_equal(pi.p.ref_count, 1);
  assert_bytes(pi.raw, 12, sizeof pi.raw, FILL);
  /* 20 ends inside last_use: it is not written. */
  memset(pi.raw, FILL, sizeof pi.raw);
  pi.p.struct_size = 20;
  FD_ASSERT_OK(fd_prefix_get_info(cache, "p", &pi.p));
  assert_int_equal(pi.p.reserved0, 0);
  assert_bytes(pi.raw, offsetof(fd_prefix_info, last_use), sizeof pi.raw, FILL);
  memset(pi.raw, FILL, sizeof pi.raw);
  pi.p.struct_size = 7;
  FD_ASSERT_FAILS(fd_prefix_get_info(cache, "p", &pi.p), FD_ERR_INVALID_ARGUMENT,
                  "info->struct_size 7 is too small");
  assert_bytes(pi.raw, 4, sizeof pi.raw, FILL);

  /* fd_tx_info: 4-byte fields; 14 ends inside `state`. */
  fd_tx tx;
  const uint64_t ids[1] = {1};
  FD_ASSERT_OK(fd_tx_begin(cache, ids, 1, &tx));
  union {
    fd_tx_info t;
    unsigned char raw[sizeof(fd_tx_info) + EXTRA];
  } ti;
  memset(ti.raw, FILL, sizeof ti.raw);
  ti.t.struct_size = 14;
  FD_ASSERT_OK(fd_tx_get_info(cache, tx, &ti.t));
  assert_int_equal(ti.t.batch, 1);
  assert_int_equal(ti.t.next_layer, 0);
  assert_bytes(ti.raw, offsetof(fd_tx_info, state), sizeof ti.raw, FILL);
  FD_ASSERT_OK(fd_tx_abort(cache, tx));

  /* fd_cache_metrics: 20 ends inside used_blocks. */
  union {
    fd_cache_metrics m;
    unsigned char raw[sizeof(fd_cache_metrics) + EXTRA];
  } cm;
  memset(cm.raw, FILL, sizeof cm.raw);
  cm.m.struct_size = 20;
  FD_ASSERT_OK(fd_cache_metrics_get(cache, &cm.m));
  assert_int_equal(cm.m.reserved0, 0);
  assert_int_equal(cm.m.max_blocks, 8);
  assert_bytes(cm.raw, offsetof(fd_cache_metrics, used_blocks), sizeof cm.raw, FILL);
  fd_cache_destroy(cache);
}

/* fd_kv_append_params (input): ending inside `device` leaves the default. */
static void test_kv_append_params(void **state) {
  (void)state;
  uint16_t k[4] = {1, 2, 3, 4}, cache_k[8] = {0}, cache_v[8] = {0};
  int32_t block_ids[1] = {1}, offsets[1] = {1};
  fd_kv_append_params p;
  fd_kv_append_params_init(&p);
  p.num_tokens = 1;
  p.num_kv_heads = 1;
  p.head_dim = 4;
  p.block_size = 2;
  p.num_blocks = 1;
  p.k = k;
  p.v = k;
  p.k_cache = cache_k;
  p.v_cache = cache_v;
  p.block_ids = block_ids;
  p.offsets = offsets;
  /* block 1 is out of range [0, 1): proves the call got that far. */
  p.device.type = 99;
  p.struct_size = (uint32_t)(offsetof(fd_kv_append_params, device) + sizeof(int32_t));
  FD_ASSERT_FAILS(fd_kv_append(&p), FD_ERR_INVALID_ARGUMENT, "block_ids[0] = 1");
  p.struct_size = (uint32_t)(offsetof(fd_kv_append_params, device) + sizeof(fd_device));
  FD_ASSERT_FAILS(fd_kv_append(&p), FD_ERR_INVALID_ARGUMENT, "device.type 99");
  p.struct_size = (uint32_t)sizeof p + 8;
  FD_ASSERT_FAILS(fd_kv_append(&p), FD_ERR_INVALID_ARGUMENT, "newer header");
  p.struct_size = (uint32_t)offsetof(fd_kv_append_params, positions);
  FD_ASSERT_FAILS(fd_kv_append(&p), FD_ERR_INVALID_ARGUMENT, "is too small");
  block_ids[0] = 0;
  p.struct_size = (uint32_t)offsetof(fd_kv_append_params, device);
  FD_ASSERT_OK(fd_kv_append(&p));
  assert_memory_equal(cache_k + 4, k, sizeof k);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_metrics),
      cmocka_unit_test(test_engine_config_newer_refused),
      cmocka_unit_test(test_decode_params),
      cmocka_unit_test(test_scheduler_config),
      cmocka_unit_test(test_snapshot_inputs_and_summary),
      cmocka_unit_test(test_engine_spec_newer_refused),
      cmocka_unit_test(test_workload_report),
      cmocka_unit_test(test_cache_config_fields),
      cmocka_unit_test(test_cache_info_structs),
      cmocka_unit_test(test_kv_append_params),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
