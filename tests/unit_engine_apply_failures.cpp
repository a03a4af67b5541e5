/* fd_engine_apply_decision is all or nothing (docs/semantics.md S8, docs/abi.md rule
 * 9): a host allocation that fails anywhere inside the call, in particular in
 * the cache calls of the N-th admission (fd_cache_add_request, and
 * fd_prefix_attach for a prefixed request), leaves the engine and the cache
 * as they were: request states, engine metrics and counters (state version,
 * applied and stale decisions), cache metrics (blocks, request counts, prefix
 * references and hits) and the plan a fresh snapshot gives. The status is
 * FD_ERR_OUT_OF_MEMORY and the message names the admission. The same decision
 * then applies once the fault is gone, with the outcome of a run that never
 * failed.
 *
 * Failures are injected by replacing the global operator new of this test
 * binary (tests/common/alloc_failures.h): once armed, the k-th allocation on
 * this thread throws std::bad_alloc, once. Sweeping k from 0
 * until the call succeeds fails every allocation the call makes, one run each.
 */
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "flashdec.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include "alloc_failures.h"
#include "fd_test.h"
#include "test_engine_support.h"

namespace {

void arm(long k) {
  fd_alloc_fail_arm(k);
}
// True when the armed failure has not fired.
bool disarm() {
  return !fd_alloc_fail_disarm();
}

constexpr uint32_t kBs = 4, kKv = 1, kD = 4;
const uint64_t kIds[] = {1, 2, 3, 4};

struct Setup {
  fd_cache *c = nullptr;
  fd_engine *e = nullptr;
  fd_scheduler *s = nullptr;
  fd_decision *d = nullptr;
};

fd_decision *plan_now(fd_engine *e, fd_scheduler *s) {
  fd_snapshot *snap = NULL;
  FD_ASSERT_OK(fd_engine_snapshot(e, 0, NULL, 0, &snap));
  fd_decision *d = NULL;
  FD_ASSERT_OK(fd_scheduler_plan(s, snap, &d));
  fd_snapshot_destroy(snap);
  return d;
}

// A prefix "sys" of 2 blocks; request 1 (empty), 2 (on "sys"), 3 (one block
// of context) fit, request 4 never fits. The decision admits 1, 2, 3 and
// rejects 4.
Setup make_setup() {
  Setup x;
  x.c = es_cache(1, kKv, kD, kBs, 16, 4);
  x.e = es_engine(x.c);
  fd_scheduler_config sc;
  fd_scheduler_config_init(&sc);
  sc.max_active_requests = 4;
  sc.max_batch_requests = 4;
  FD_ASSERT_OK(fd_scheduler_create(&sc, &x.s));
  std::vector<float> blocks(2 * kKv * kBs * kD, 0.5f);
  FD_ASSERT_OK(fd_engine_register_prefix(x.e, "sys", blocks.data(), blocks.data(), 2, NULL));
  fd_request_spec specs[] = {es_spec(1, 0, 4), es_spec(2, 8, 4, "sys"), es_spec(3, 4, 4),
                             es_spec(4, 0, 200)};
  for (const fd_request_spec &sp : specs) FD_ASSERT_OK(fd_engine_submit_request(x.e, &sp));
  x.d = plan_now(x.e, x.s);
  assert_true(es_decision_ids(x.d, FD_DECISION_ADMIT) == (std::vector<uint64_t>{1, 2, 3}));
  assert_true(es_decision_ids(x.d, FD_DECISION_REJECTED) == (std::vector<uint64_t>{4}));
  return x;
}

void destroy(Setup &x) {
  fd_decision_destroy(x.d);
  fd_scheduler_destroy(x.s);
  fd_engine_destroy(x.e);
  fd_cache_destroy(x.c);
}

// Everything observable that a failed apply must leave as it was. The
// cache's state version moves on (an undone admission is a change); the
// engine re-reads it, so the engine's copy of it is compared with the cache
// instead. The prefix's LRU stamp (last_use) is not restored and not compared.
struct Observed {
  fd_engine_metrics em;
  fd_cache_metrics cm;
  std::vector<int32_t> engine_states, cache_states;
  fd_prefix_info prefix;
  std::vector<uint64_t> admit, rejected, runnable;
  fd_decision_summary summary;
};

Observed observe(const Setup &x) {
  Observed o;
  o.em = es_metrics(x.e);
  o.cm = es_cache_metrics(x.c);
  assert_int_equal(o.em.cache_state_version, o.cm.state_version);
  o.em.cache_state_version = 0;
  o.cm.state_version = 0;
  for (uint64_t id : kIds) {
    o.engine_states.push_back(es_state(x.e, id));
    int32_t st = -1;
    FD_ASSERT_OK(fd_cache_request_state(x.c, id, &st));
    o.cache_states.push_back(st);
  }
  std::memset(&o.prefix, 0, sizeof o.prefix);
  o.prefix.struct_size = sizeof o.prefix;
  FD_ASSERT_OK(fd_prefix_get_info(x.c, "sys", &o.prefix));
  o.prefix.last_use = 0;
  // What a scheduler plans now (a failed apply leaves the same plan).
  fd_decision *d = plan_now(x.e, x.s);
  o.admit = es_decision_ids(d, FD_DECISION_ADMIT);
  o.rejected = es_decision_ids(d, FD_DECISION_REJECTED);
  o.runnable = es_decision_ids(d, FD_DECISION_RUNNABLE);
  std::memset(&o.summary, 0, sizeof o.summary);
  o.summary.struct_size = sizeof o.summary;
  FD_ASSERT_OK(fd_decision_get_summary(d, &o.summary));
  fd_decision_destroy(d);
  FD_ASSERT_OK(fd_engine_validate(x.e));
  return o;
}

void assert_same(const Observed &a, const Observed &b) {
  assert_memory_equal(&a.em, &b.em, sizeof a.em);
  assert_memory_equal(&a.cm, &b.cm, sizeof a.cm);
  assert_true(a.engine_states == b.engine_states);
  assert_true(a.cache_states == b.cache_states);
  assert_memory_equal(&a.prefix, &b.prefix, sizeof a.prefix);
  assert_true(a.admit == b.admit);
  assert_true(a.rejected == b.rejected);
  assert_true(a.runnable == b.runnable);
  assert_memory_equal(&a.summary, &b.summary, sizeof a.summary);
}

// Prefills the admitted requests and runs one step of the runnable ones.
void run_one_step(const Setup &x) {
  std::vector<float> kv(kKv * kD, 0.25f);
  for (uint64_t id : es_decision_ids(x.d, FD_DECISION_ADMIT)) {
    while (fd_engine_prefill_request_layers(x.e, id, kv.data(), kv.data()) == FD_OK) {
    }
  }
  const std::vector<uint64_t> run = es_decision_ids(x.d, FD_DECISION_RUNNABLE);
  assert_false(run.empty());
  assert_int_equal(es_step(x.e, x.c, run, kKv), FD_STEP_OPENED);
  FD_ASSERT_OK(fd_engine_validate(x.e));
}

// Every allocation of the call fails once, each on a fresh setup (a failed
// attempt may leave container capacity behind, which would shift the count):
// allocation k fails, the state is checked, then the same decision applies.
void test_every_failed_allocation_changes_nothing(void **) {
  // The outcome of a run that never failed.
  Setup twin = make_setup();
  const Observed twin_before = observe(twin);
  FD_ASSERT_OK(fd_engine_apply_decision(twin.e, twin.s, twin.d));
  const Observed twin_after = observe(twin);
  assert_int_equal(twin_after.em.applied_decision_count, twin_before.em.applied_decision_count + 1);
  assert_int_equal(twin_after.em.active_request_count, 3);
  assert_int_equal(twin_after.em.rejected_request_count, 1);
  assert_int_equal(twin_after.cm.active_request_count, 3);
  assert_int_equal(twin_after.cm.prefix_hit_count, twin_before.cm.prefix_hit_count + 1);
  assert_int_equal(twin_after.prefix.ref_count, 1);
  assert_int_equal(es_seq_len(twin.c, 2), 8);
  run_one_step(twin);
  const Observed twin_stepped = observe(twin);

  // Which admissions failed, as "<n> <call>" (n counts from 1).
  std::set<std::string> failed_admissions;
  long failures = 0;
  for (long k = 0;; ++k) {
    assert_true(k < 10000);
    Setup x = make_setup();
    const Observed before = observe(x);
    assert_same(before, twin_before);
    arm(k);
    const fd_status st = fd_engine_apply_decision(x.e, x.s, x.d);
    const bool fired = !disarm();
    if (st == FD_OK) {
      assert_false(fired);  // an allocation that failed would have failed the call
      destroy(x);
      break;
    }
    assert_true(fired);
    ++failures;
    const std::string msg = fd_last_error_message();
    assert_int_equal(st, FD_ERR_OUT_OF_MEMORY);
    const std::string head = "apply_decision: admission ";
    if (msg.compare(0, head.size(), head) == 0) {
      // "admission <n> of 3 (request <id>) failed in <call>: <cause>; the
      // decision was not applied (nothing changed)"
      unsigned n = 0, of = 0;
      unsigned long long id = 0;
      char call[64] = {0};
      assert_int_equal(sscanf(msg.c_str() + head.size(),
                              "%u of %u (request %llu) failed in %63[a-z_]", &n, &of, &id, call),
                       4);
      assert_int_equal(of, 3);
      assert_true(n >= 1 && n <= 3);
      assert_int_equal(id, n);  // the decision admits 1, 2, 3 in that order
      assert_non_null(strstr(msg.c_str(), ": out of host memory; "));
      assert_non_null(strstr(msg.c_str(), "the decision was not applied (nothing changed)"));
      failed_admissions.insert(std::to_string(n) + " " + call);
    } else {
      // Before any change (snapshot rebuild, re-planning, copies).
      assert_string_equal(msg.c_str(), "out of host memory");
    }
    assert_same(observe(x), before);
    // The same decision (not re-planned) applies once the fault is gone,
    // with the outcome of the run that never failed.
    FD_ASSERT_OK(fd_engine_apply_decision(x.e, x.s, x.d));
    assert_same(observe(x), twin_after);
    // It does not apply twice.
    FD_ASSERT_FAILS(fd_engine_apply_decision(x.e, x.s, x.d), FD_ERR_STALE_HANDLE, "state version");
    run_one_step(x);
    Observed stepped = observe(x);
    stepped.em.stale_decision_count -= 1;  // the refusal just above
    assert_same(stepped, twin_stepped);
    destroy(x);
  }
  // Every admission failed at least once in the cache, the prefixed one in
  // both of its calls.
  const std::set<std::string> expected = {"1 fd_cache_add_request", "2 fd_cache_add_request",
                                          "2 fd_prefix_attach", "3 fd_cache_add_request"};
  for (const std::string &want : expected) {
    if (failed_admissions.count(want) == 0) {
      print_error("admission \"%s\" never failed (%ld failures)\n", want.c_str(), failures);
      fail();
    }
  }
  destroy(twin);
}

// The N-th admission fails (N = 1, 2, 3) in fd_cache_add_request: the first
// failing allocation counted from the start of that admission's cache call.
void test_nth_admission_fails_then_applies(void **) {
  for (unsigned n = 1; n <= 3; ++n) {
    Setup x = make_setup();
    const Observed before = observe(x);
    const std::string want = "apply_decision: admission " + std::to_string(n) + " of 3 (request " +
                             std::to_string(n) + ") failed in fd_cache_add_request";
    bool hit = false;
    for (long k = 0; !hit; ++k) {
      assert_true(k < 100000);
      arm(k);
      const fd_status st = fd_engine_apply_decision(x.e, x.s, x.d);
      disarm();
      assert_int_not_equal(st, FD_OK);  // admission n must fail before the call can succeed
      assert_int_equal(st, FD_ERR_OUT_OF_MEMORY);
      hit = strstr(fd_last_error_message(), want.c_str()) != NULL;
    }
    assert_non_null(
        strstr(fd_last_error_message(), "the decision was not applied (nothing changed)"));
    assert_same(observe(x), before);
    FD_ASSERT_OK(fd_engine_apply_decision(x.e, x.s, x.d));
    for (uint64_t id : {1, 2, 3}) assert_int_equal(es_state(x.e, id), FD_ENGINE_REQUEST_ACTIVE);
    assert_int_equal(es_state(x.e, 4), FD_ENGINE_REQUEST_REJECTED);
    run_one_step(x);
    destroy(x);
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_failed_allocation_changes_nothing),
      cmocka_unit_test(test_nth_admission_fails_then_applies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
