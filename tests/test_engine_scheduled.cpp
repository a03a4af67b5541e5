/* Decode engine, scheduler-managed mode (S8, S9): submission, snapshots,
 * applying decisions (and refusing stale, mismatched or non-canonical ones),
 * the runnable-ids rule, prefixes, detection of changes made behind the
 * engine's back, and complete runs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <vector>

#include "fd_test.h"
#include "test_engine_support.h"

namespace {

fd_scheduler *sched(uint32_t max_active, uint32_t max_batch, uint32_t reserve = 0) {
  fd_scheduler_config c;
  fd_scheduler_config_init(&c);
  c.max_active_requests = max_active;
  c.max_batch_requests = max_batch;
  c.reserve_blocks = reserve;
  fd_scheduler *s = NULL;
  FD_ASSERT_OK(fd_scheduler_create(&c, &s));
  return s;
}

fd_decision *plan_now(fd_engine *e, fd_scheduler *s, uint64_t step = 0) {
  fd_snapshot *snap = NULL;
  FD_ASSERT_OK(fd_engine_snapshot(e, step, NULL, 0, &snap));
  fd_decision *d = NULL;
  FD_ASSERT_OK(fd_scheduler_plan(s, snap, &d));
  fd_snapshot_destroy(snap);
  return d;
}

// Plans, applies, prefills admitted contexts and runs the runnable rows.
// Returns the runnable ids.
std::vector<uint64_t> iterate(fd_engine *e, fd_cache *c, fd_scheduler *s, uint32_t q_heads) {
  fd_decision *d = plan_now(e, s);
  FD_ASSERT_OK(fd_engine_apply_decision(e, s, d));
  for (uint64_t id : es_decision_ids(d, FD_DECISION_ADMIT)) {
    // Prefill until the context is complete (the engine refuses beyond it).
    while (fd_engine_prefill_request_layers(e, id, std::vector<float>(1024, 0.f).data(),
                                            std::vector<float>(1024, 0.f).data()) == FD_OK) {
    }
  }
  std::vector<uint64_t> run = es_decision_ids(d, FD_DECISION_RUNNABLE);
  if (!run.empty()) assert_int_equal(es_step(e, c, run, q_heads), FD_STEP_OPENED);
  fd_decision_destroy(d);
  FD_ASSERT_OK(fd_engine_validate(e));
  return run;
}

void test_submit_rules(void **) {
  fd_cache *c = es_cache(1, 1, 4, 4, 16);
  fd_engine *e = es_engine(c);
  // Not scheduler-managed yet.
  fd_snapshot *snap = (fd_snapshot *)0x1;
  FD_ASSERT_FAILS(fd_engine_snapshot(e, 0, NULL, 0, &snap), FD_ERR_INVALID_STATE,
                  "not scheduler-managed");
  fd_request_spec a = es_spec(1, 0, 4);
  a.max_new_tokens = 0;
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &a), FD_ERR_INVALID_ARGUMENT, "max_new_tokens");
  assert_int_equal(es_metrics(e).scheduler_managed, 0);  // a refused first submit switches nothing
  a.max_new_tokens = 4;
  fd_request_spec p = es_spec(2, 4, 4, "missing");
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &p), FD_ERR_NOT_FOUND, "prefix 'missing'");
  FD_ASSERT_OK(fd_engine_submit_request(e, &a));
  assert_int_equal(es_metrics(e).scheduler_managed, 1);
  assert_int_equal(es_state(e, 1), FD_ENGINE_REQUEST_WAITING);
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &a), FD_ERR_ALREADY_EXISTS, "request 1");
  fd_request_spec same_order = es_spec(3, 0, 4);
  same_order.submission_order = 1;
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &same_order), FD_ERR_ALREADY_EXISTS,
                  "submission_order 1");
  FD_ASSERT_FAILS(fd_engine_add_request(e, 9), FD_ERR_INVALID_STATE, "scheduler-managed");
  FD_ASSERT_FAILS(fd_engine_admit(e, 1), FD_ERR_INVALID_STATE, "scheduler-managed");
  float blocks[64] = {0};
  FD_ASSERT_FAILS(fd_engine_register_prefix(e, "late", blocks, blocks, 1, NULL),
                  FD_ERR_INVALID_STATE, "before the first submission");
  assert_int_equal(es_metrics(e).waiting_request_count, 1);
  fd_engine_destroy(e);
  fd_cache_destroy(c);

  // Needs an empty cache, and cannot follow unscheduled requests.
  c = es_cache(1, 1, 4, 4, 16);
  FD_ASSERT_OK(fd_cache_add_request(c, 40));
  e = es_engine(c);
  fd_request_spec b = es_spec(5, 0, 4);
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &b), FD_ERR_INVALID_STATE, "empty cache");
  fd_engine_destroy(e);
  FD_ASSERT_OK(fd_cache_finish_request(c, 40));
  e = es_engine(c);
  FD_ASSERT_OK(fd_engine_add_request(e, 6));
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &b), FD_ERR_INVALID_STATE, "cannot be mixed");
  fd_engine_destroy(e);
  e = es_engine(c);
  fd_request_spec reuse = es_spec(40, 0, 4);
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &reuse), FD_ERR_ALREADY_EXISTS,
                  "already used in the cache");
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_full_run_and_auto_finish(void **) {
  fd_cache *c = es_cache(2, 1, 4, 4, 6);
  fd_engine *e = es_engine(c, 2);
  fd_scheduler *s = sched(4, 4);
  fd_request_spec r1 = es_spec(1, 5, 3);  // lifetime 2
  fd_request_spec r2 = es_spec(2, 0, 8);  // lifetime 2
  fd_request_spec r3 = es_spec(3, 0, 9);  // lifetime 3: waits for room
  FD_ASSERT_OK(fd_engine_submit_request(e, &r1));
  FD_ASSERT_OK(fd_engine_submit_request(e, &r2));
  FD_ASSERT_OK(fd_engine_submit_request(e, &r3));
  std::vector<uint64_t> run = iterate(e, c, s, 2);
  assert_true(run == (std::vector<uint64_t>{1, 2}));
  assert_int_equal(es_state(e, 3), FD_ENGINE_REQUEST_WAITING);
  fd_engine_metrics m = es_metrics(e);
  assert_int_equal(m.committed_blocks, 4);
  assert_int_equal(m.prefill_token_count, 5);
  assert_int_equal(es_seq_len(c, 1), 6);
  int guard = 0;
  while (es_metrics(e).finished_request_count < 3 && guard++ < 100) iterate(e, c, s, 2);
  m = es_metrics(e);
  assert_int_equal(m.finished_request_count, 3);
  assert_int_equal(m.active_request_count, 0);
  assert_int_equal(m.appended_token_count, 3 + 8 + 9);
  assert_int_equal(m.committed_blocks, 0);
  assert_int_equal(es_cache_metrics(c).free_blocks, 6);
  fd_scheduler_destroy(s);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_boundary_deadlock_case_completes(void **) {
  // docs/semantics.md S10: 2 requests, context 0, 64 new tokens, 2 blocks of 32.
  fd_cache *c = es_cache(1, 1, 4, 32, 2);
  fd_engine *e = es_engine(c);
  fd_scheduler *s = sched(2, 2);
  fd_request_spec a = es_spec(1, 0, 64), b = es_spec(2, 0, 64);
  FD_ASSERT_OK(fd_engine_submit_request(e, &a));
  FD_ASSERT_OK(fd_engine_submit_request(e, &b));
  int steps = 0;
  while (es_metrics(e).finished_request_count < 2 && steps < 200) {
    iterate(e, c, s, 1);
    ++steps;
  }
  assert_int_equal(es_metrics(e).finished_request_count, 2);
  assert_int_equal(steps, 128);
  assert_int_equal(es_metrics(e).backpressure_count, 0);
  fd_scheduler_destroy(s);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_rejection_never_owns_blocks(void **) {
  fd_cache *c = es_cache(1, 1, 4, 4, 4);
  fd_engine *e = es_engine(c);
  fd_scheduler *s = sched(2, 2, 1);
  fd_request_spec big = es_spec(1, 0, 13);  // 4 blocks > 3 schedulable
  FD_ASSERT_OK(fd_engine_submit_request(e, &big));
  iterate(e, c, s, 1);
  assert_int_equal(es_state(e, 1), FD_ENGINE_REQUEST_REJECTED);
  int32_t cs = -1;
  FD_ASSERT_OK(fd_cache_request_state(c, 1, &cs));
  assert_int_equal(cs, FD_REQUEST_UNKNOWN);
  assert_int_equal(es_metrics(e).rejected_request_count, 1);
  FD_ASSERT_FAILS(fd_engine_cancel(e, 1), FD_ERR_INVALID_STATE, "already rejected");
  fd_scheduler_destroy(s);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_apply_refusals(void **) {
  fd_cache *c = es_cache(1, 1, 4, 4, 8);
  fd_engine *e = es_engine(c);
  fd_scheduler *s = sched(4, 4);
  fd_request_spec a = es_spec(1, 0, 4), b = es_spec(2, 0, 4), x = es_spec(3, 0, 4);
  FD_ASSERT_OK(fd_engine_submit_request(e, &a));
  FD_ASSERT_OK(fd_engine_submit_request(e, &b));

  auto expect_refused = [&](fd_scheduler *sch, fd_decision *d, const char *text) {
    const fd_engine_metrics before = es_metrics(e);
    FD_ASSERT_FAILS(fd_engine_apply_decision(e, sch, d), FD_ERR_STALE_HANDLE, text);
    const fd_engine_metrics after = es_metrics(e);
    assert_int_equal(after.stale_decision_count, before.stale_decision_count + 1);
    assert_int_equal(after.state_version, before.state_version);
    assert_int_equal(after.applied_decision_count, before.applied_decision_count);
    assert_int_equal(after.waiting_request_count, before.waiting_request_count);
    assert_int_equal(after.active_request_count, before.active_request_count);
  };

  // Stale: the engine changed after the snapshot.
  fd_decision *old = plan_now(e, s);
  FD_ASSERT_OK(fd_engine_submit_request(e, &x));
  expect_refused(s, old, "planned from engine state version");
  fd_decision_destroy(old);

  // Mismatched config.
  fd_scheduler *other = sched(3, 3);
  fd_decision *d = plan_now(e, s);
  expect_refused(other, d, "configuration differs");

  // Edited snapshot (same version, other numbers) and non-canonical order.
  fd_snapshot_info info;
  info.struct_size = sizeof info;
  fd_snapshot *truth = NULL;
  FD_ASSERT_OK(fd_decision_copy_snapshot(d, &truth));
  FD_ASSERT_OK(fd_snapshot_get_info(truth, &info));
  fd_snapshot_destroy(truth);
  for (int variant = 0; variant < 2; ++variant) {
    fd_snapshot_info edited = info;
    if (variant == 0) edited.free_blocks -= 1, edited.max_blocks -= 1;
    fd_snapshot *snap = NULL;
    FD_ASSERT_OK(fd_snapshot_create(&edited, &snap));
    std::vector<fd_request_spec> order = {a, b, x};
    if (variant == 1) order = {b, a, x};
    for (const fd_request_spec &sp : order) FD_ASSERT_OK(fd_snapshot_add_waiting(snap, &sp, 0, 0));
    fd_decision *forged = NULL;
    FD_ASSERT_OK(fd_scheduler_plan(s, snap, &forged));
    expect_refused(s, forged,
                   variant == 0 ? "max_blocks 7 differs from 8" : "waiting entry 0 (request 2)");
    fd_decision_destroy(forged);
    fd_snapshot_destroy(snap);
  }
  // Fairness counters are the caller's and are kept: a decision made with
  // counters applies.
  fd_request_fairness f[2] = {{1, 9, 1, 0, 0}, {3, 2, 0, 0, 0}};
  fd_snapshot *snap = NULL;
  FD_ASSERT_OK(fd_engine_snapshot(e, 17, f, 2, &snap));
  fd_decision *fair = NULL;
  FD_ASSERT_OK(fd_scheduler_plan(s, snap, &fair));
  FD_ASSERT_OK(fd_engine_apply_decision(e, s, fair));
  assert_int_equal(es_metrics(e).applied_decision_count, 1);
  assert_int_equal(es_metrics(e).active_request_count, 3);
  // The same decision cannot be applied twice.
  expect_refused(s, fair, "state version");
  fd_decision_destroy(fair);
  fd_snapshot_destroy(snap);
  fd_decision_destroy(d);
  fd_scheduler_destroy(other);
  fd_scheduler_destroy(s);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_snapshot_errors(void **) {
  fd_cache *c = es_cache(1, 1, 4, 4, 8);
  fd_engine *e = es_engine(c);
  fd_request_spec a = es_spec(1, 0, 4);
  FD_ASSERT_OK(fd_engine_submit_request(e, &a));
  fd_snapshot *snap = (fd_snapshot *)0x1;
  fd_request_fairness f[2] = {{1, 0, 0, 0, 0}, {1, 0, 0, 0, 0}};
  FD_ASSERT_FAILS(fd_engine_snapshot(e, 0, f, 2, &snap), FD_ERR_INVALID_ARGUMENT, "twice");
  f[1].id = 77;
  FD_ASSERT_FAILS(fd_engine_snapshot(e, 0, f, 2, &snap), FD_ERR_NOT_FOUND, "request 77");
  f[1].id = 1;
  f[0].reserved0 = 1;
  FD_ASSERT_FAILS(fd_engine_snapshot(e, 0, f, 1, &snap), FD_ERR_INVALID_ARGUMENT, "reserved0");
  FD_ASSERT_FAILS(fd_engine_snapshot(e, 0, NULL, 1, &snap), FD_ERR_INVALID_ARGUMENT, "fairness");
  assert_ptr_equal(snap, (fd_snapshot *)0x1);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_step_must_follow_decision(void **) {
  fd_cache *c = es_cache(1, 1, 4, 4, 8);
  fd_engine *e = es_engine(c);
  fd_scheduler *s = sched(4, 4);
  fd_request_spec a = es_spec(1, 2, 4), b = es_spec(2, 0, 4);
  FD_ASSERT_OK(fd_engine_submit_request(e, &a));
  FD_ASSERT_OK(fd_engine_submit_request(e, &b));
  fd_engine_step st;
  st.struct_size = sizeof st;
  uint64_t ids[2] = {1, 2}, swapped[2] = {2, 1};
  FD_ASSERT_FAILS(fd_engine_begin_step(e, ids, 2, &st), FD_ERR_INVALID_STATE, "is waiting");
  fd_decision *d = plan_now(e, s);
  FD_ASSERT_OK(fd_engine_apply_decision(e, s, d));
  FD_ASSERT_FAILS(fd_engine_begin_step(e, swapped, 2, &st), FD_ERR_INVALID_ARGUMENT,
                  "row 0 must be request 1");
  FD_ASSERT_FAILS(fd_engine_begin_step(e, ids, 1, &st), FD_ERR_INVALID_ARGUMENT, "2 runnable ids");
  FD_ASSERT_FAILS(fd_engine_begin_step(e, ids, 2, &st), FD_ERR_INVALID_STATE,
                  "holds 0 of its 2 context tokens");
  es_prefill(e, c, 1);
  es_prefill(e, c, 1);
  float buf[16] = {0};
  FD_ASSERT_FAILS(fd_engine_prefill_request_layers(e, 1, buf, buf), FD_ERR_INVALID_STATE,
                  "already holds its 2 context tokens");
  assert_int_equal(es_step(e, c, {1, 2}, 1), FD_STEP_OPENED);
  // One decision authorises one step.
  FD_ASSERT_FAILS(fd_engine_begin_step(e, ids, 2, &st), FD_ERR_INVALID_STATE,
                  "no applied decision");
  fd_decision_destroy(d);
  // Cancelling an active request voids the decision too.
  d = plan_now(e, s);
  FD_ASSERT_OK(fd_engine_apply_decision(e, s, d));
  FD_ASSERT_OK(fd_engine_cancel(e, 2));
  FD_ASSERT_FAILS(fd_engine_begin_step(e, ids, 1, &st), FD_ERR_INVALID_STATE,
                  "no applied decision");
  fd_decision_destroy(d);
  FD_ASSERT_OK(fd_engine_validate(e));
  fd_scheduler_destroy(s);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

void test_changes_behind_the_engine_are_refused(void **) {
  fd_cache *c = es_cache(1, 1, 4, 4, 8);
  fd_engine *e = es_engine(c);
  fd_scheduler *s = sched(4, 4);
  fd_request_spec a = es_spec(1, 0, 4), b = es_spec(2, 0, 4);
  FD_ASSERT_OK(fd_engine_submit_request(e, &a));
  fd_decision *d = plan_now(e, s);
  FD_ASSERT_OK(fd_cache_add_request(c, 500));  // behind the engine's back
  const fd_engine_metrics before = es_metrics(e);
  FD_ASSERT_FAILS(fd_engine_apply_decision(e, s, d), FD_ERR_INVALID_STATE,
                  "changed outside the engine");
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &b), FD_ERR_INVALID_STATE,
                  "changed outside the engine");
  fd_snapshot *snap = NULL;
  FD_ASSERT_FAILS(fd_engine_snapshot(e, 0, NULL, 0, &snap), FD_ERR_INVALID_STATE,
                  "changed outside the engine");
  FD_ASSERT_FAILS(fd_engine_cancel(e, 1), FD_ERR_INVALID_STATE, "changed outside the engine");
  const fd_engine_metrics after = es_metrics(e);
  assert_int_equal(after.state_version, before.state_version);
  assert_int_equal(after.waiting_request_count, 1);
  fd_decision_destroy(d);
  fd_scheduler_destroy(s);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

// Every refusal of fd_engine_apply_decision counts in stale_decision_count
// and changes nothing else (issue 11, bug 5): a decision planned before an
// outside cache change, a step that is open, an engine that is not
// scheduler-managed. NULL arguments are not refusals of a decision.
void test_every_refusal_counts_as_stale(void **) {
  fd_cache *c = es_cache(1, 1, 4, 4, 8);
  fd_engine *e = es_engine(c);
  fd_scheduler *s = sched(4, 4);
  fd_request_spec a = es_spec(1, 0, 4), b = es_spec(2, 0, 4);
  FD_ASSERT_OK(fd_engine_submit_request(e, &a));
  FD_ASSERT_OK(fd_engine_submit_request(e, &b));

  auto expect_refused = [&](fd_engine *eng, fd_cache *cache, fd_decision *d, fd_status status,
                            const char *text, uint64_t counted) {
    const fd_engine_metrics before = es_metrics(eng);
    const fd_cache_metrics cache_before = es_cache_metrics(cache);
    FD_ASSERT_FAILS(fd_engine_apply_decision(eng, s, d), status, text);
    fd_engine_metrics after = es_metrics(eng);
    assert_int_equal(after.stale_decision_count, before.stale_decision_count + counted);
    after.stale_decision_count = before.stale_decision_count;
    assert_memory_equal(&after, &before, sizeof before);
    const fd_cache_metrics cache_after = es_cache_metrics(cache);
    assert_memory_equal(&cache_after, &cache_before, sizeof cache_before);
  };

  // Planned, then the cache changes behind the engine: refused, counted.
  fd_decision *d = plan_now(e, s);
  FD_ASSERT_OK(fd_cache_add_request(c, 500));
  expect_refused(e, c, d, FD_ERR_INVALID_STATE, "changed outside the engine", 1);
  expect_refused(e, c, d, FD_ERR_INVALID_STATE, "changed outside the engine", 1);
  assert_int_equal(es_state(e, 1), FD_ENGINE_REQUEST_WAITING);
  assert_int_equal(es_state(e, 2), FD_ENGINE_REQUEST_WAITING);
  // NULL arguments: not a refusal of a decision.
  expect_refused(e, c, NULL, FD_ERR_INVALID_ARGUMENT, "decision", 0);
  FD_ASSERT_FAILS(fd_engine_apply_decision(NULL, s, d), FD_ERR_INVALID_ARGUMENT, "engine");
  fd_decision_destroy(d);
  fd_engine_destroy(e);
  fd_cache_destroy(c);

  // A step is open: refused, counted.
  c = es_cache(1, 1, 4, 4, 8);
  e = es_engine(c);
  FD_ASSERT_OK(fd_engine_submit_request(e, &a));
  d = plan_now(e, s);
  FD_ASSERT_OK(fd_engine_apply_decision(e, s, d));
  fd_decision_destroy(d);
  FD_ASSERT_OK(fd_engine_submit_request(e, &b));
  d = plan_now(e, s);
  fd_engine_step st;
  st.struct_size = sizeof st;
  const uint64_t one = 1;
  FD_ASSERT_OK(fd_engine_begin_step(e, &one, 1, &st));
  expect_refused(e, c, d, FD_ERR_INVALID_STATE, "step", 1);
  FD_ASSERT_OK(fd_engine_abort_step(e, st.tx));
  fd_decision_destroy(d);
  fd_engine_destroy(e);
  fd_cache_destroy(c);

  // Not scheduler-managed (a decision planned by another engine): counted.
  fd_cache *c2 = es_cache(1, 1, 4, 4, 8);
  fd_engine *e2 = es_engine(c2);
  FD_ASSERT_OK(fd_engine_submit_request(e2, &a));
  d = plan_now(e2, s);
  c = es_cache(1, 1, 4, 4, 8);
  e = es_engine(c);
  expect_refused(e, c, d, FD_ERR_INVALID_STATE, "not scheduler-managed", 1);
  fd_decision_destroy(d);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
  fd_engine_destroy(e2);
  fd_cache_destroy(c2);
  fd_scheduler_destroy(s);
}

void test_prefixes(void **) {
  const uint32_t bs = 4, kv = 1, d = 4;
  fd_cache *c = es_cache(1, kv, d, bs, 8, 4);
  fd_engine *e = es_engine(c);
  fd_scheduler *s = sched(4, 4);
  std::vector<float> blocks(2 * kv * bs * d, 0.5f);
  FD_ASSERT_OK(fd_engine_register_prefix(e, "sys", blocks.data(), blocks.data(), 2, NULL));
  FD_ASSERT_FAILS(fd_engine_register_prefix(e, "sys", blocks.data(), blocks.data(), 2, NULL),
                  FD_ERR_ALREADY_EXISTS, "");
  fd_request_spec p1 = es_spec(1, 8, 4, "sys"), p2 = es_spec(2, 8, 4, "sys");
  fd_request_spec wrong = es_spec(3, 8, 4, "sys");
  wrong.prefix_blocks = 3;
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &wrong), FD_ERR_INVALID_ARGUMENT,
                  "prefix 'sys' has 2 blocks");
  fd_request_spec short_ctx = es_spec(4, 5, 4, "sys");
  FD_ASSERT_FAILS(fd_engine_submit_request(e, &short_ctx), FD_ERR_INVALID_ARGUMENT,
                  "must cover the whole initial context");
  FD_ASSERT_OK(fd_engine_submit_request(e, &p1));
  FD_ASSERT_OK(fd_engine_submit_request(e, &p2));
  std::vector<uint64_t> run = iterate(e, c, s, 1);
  assert_true(run == (std::vector<uint64_t>{1, 2}));
  assert_int_equal(es_seq_len(c, 1), 9);
  const fd_cache_metrics cm = es_cache_metrics(c);
  assert_int_equal(cm.prefix_hit_count, 2);
  assert_int_equal(cm.saved_prefix_blocks, 2);
  // Committed: 2 resident + (3 - 2) private for each request.
  assert_int_equal(es_metrics(e).committed_blocks, 4);
  FD_ASSERT_FAILS(fd_engine_evict_prefix(e, "sys"), FD_ERR_INVALID_STATE,
                  "2 requests are waiting or active");
  while (es_metrics(e).finished_request_count < 2) iterate(e, c, s, 1);
  FD_ASSERT_FAILS(fd_engine_evict_prefix(e, "nope"), FD_ERR_NOT_FOUND, "");
  FD_ASSERT_OK(fd_engine_evict_prefix(e, "sys"));
  assert_int_equal(es_cache_metrics(c).free_blocks, 8);
  FD_ASSERT_OK(fd_engine_validate(e));
  fd_scheduler_destroy(s);
  fd_engine_destroy(e);
  fd_cache_destroy(c);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_submit_rules),
      cmocka_unit_test(test_full_run_and_auto_finish),
      cmocka_unit_test(test_boundary_deadlock_case_completes),
      cmocka_unit_test(test_rejection_never_owns_blocks),
      cmocka_unit_test(test_apply_refusals),
      cmocka_unit_test(test_snapshot_errors),
      cmocka_unit_test(test_step_must_follow_decision),
      cmocka_unit_test(test_changes_behind_the_engine_are_refused),
      cmocka_unit_test(test_every_refusal_counts_as_stale),
      cmocka_unit_test(test_prefixes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
