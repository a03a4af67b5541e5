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
  p.dtype = FD_DTYPE_F32;
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_metrics),
      cmocka_unit_test(test_engine_config_newer_refused),
      cmocka_unit_test(test_decode_params),
      cmocka_unit_test(test_scheduler_config),
      cmocka_unit_test(test_snapshot_inputs_and_summary),
      cmocka_unit_test(test_engine_spec_newer_refused),
      cmocka_unit_test(test_workload_report),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
