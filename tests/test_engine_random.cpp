/* Seeded random interleavings of submissions, cancellations, plans, applies,
 * prefills and steps (with failures injected mid-step), in both engine modes.
 * After every operation the engine and cache invariants must hold. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <map>
#include <vector>

#include "fd_test.h"
#include "test_engine_support.h"

namespace {

void valid(const fd_engine *e, const fd_cache *c) {
  FD_ASSERT_OK(fd_engine_validate(e));
  FD_ASSERT_OK(fd_cache_validate(c));
}

// Runs a step over `ids`; with `fail_at_layer` >= 0 the step fails there.
void step(fd_engine *e, const fd_cache *c, const std::vector<uint64_t> &ids, int fail_at_layer,
          bool *ran) {
  *ran = false;
  fd_engine_step st;
  st.struct_size = sizeof st;
  FD_ASSERT_OK(fd_engine_begin_step(e, ids.data(), (uint32_t)ids.size(), &st));
  if (st.outcome != FD_STEP_OPENED) return;
  std::vector<float> buf(ids.size() * 2 * 8, 0.3f), out(ids.size() * 2 * 8);
  for (uint32_t l = 0; l < 3; ++l) {
    valid(e, c);
    if ((int)l == fail_at_layer) {
      FD_ASSERT_FAILS(
          fd_engine_step_layer(e, st.tx, l, buf.data(), NULL, buf.data(), out.data(), NULL),
          FD_ERR_INVALID_ARGUMENT, "step aborted");
      assert_int_equal(es_metrics(e).open_step_transaction_count, 0);
      return;
    }
    FD_ASSERT_OK(
        fd_engine_step_layer(e, st.tx, l, buf.data(), buf.data(), buf.data(), out.data(), NULL));
  }
  FD_ASSERT_OK(fd_engine_commit_step(e, st.tx));
  *ran = true;
}

void test_random_scheduled(void **) {
  uint64_t steps = 0, aborts = 0, finished = 0, stale = 0, rejected = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    fd_test_rng rng = {seed};
    fd_cache *c = es_cache(3, 1, 8, 4, 24, 4);
    fd_engine *e = es_engine(c, 2);
    std::vector<float> pblocks(3 * 2 * 4 * 8, 0.2f);
    FD_ASSERT_OK(fd_engine_register_prefix(e, "p", pblocks.data(), pblocks.data(), 2, NULL));
    fd_scheduler_config sc;
    fd_scheduler_config_init(&sc);
    sc.max_active_requests = (uint32_t)fd_test_range(&rng, 1, 6);
    sc.max_batch_requests = (uint32_t)fd_test_range(&rng, 1, sc.max_active_requests);
    sc.reserve_blocks = (uint32_t)fd_test_range(&rng, 0, 3);
    sc.aging_threshold_steps = (uint32_t)fd_test_range(&rng, 1, 6);
    fd_scheduler *s = NULL;
    FD_ASSERT_OK(fd_scheduler_create(&sc, &s));
    std::map<uint64_t, fd_request_fairness> fair;
    uint64_t next_id = 1;
    for (int op = 0; op < 300; ++op) {
      // The first operation submits: it switches the engine to scheduler mode.
      const int64_t pick = op == 0 ? 0 : fd_test_range(&rng, 0, 9);
      if (pick <= 2) {  // submit
        const bool prefixed = fd_test_range(&rng, 0, 3) == 0;
        fd_request_spec sp = es_spec(next_id++, prefixed ? 8 : (uint32_t)fd_test_range(&rng, 0, 9),
                                     (uint32_t)fd_test_range(&rng, 1, 30), prefixed ? "p" : NULL);
        if (fd_test_range(&rng, 0, 15) == 0) sp.max_new_tokens = 200;  // never fits: rejected
        FD_ASSERT_OK(fd_engine_submit_request(e, &sp));
        fair[sp.id] = {sp.id, 0, 0, 0, 0};
      } else if (pick == 3 && !fair.empty()) {  // cancel a random live request
        auto it = fair.begin();
        std::advance(it, (long)fd_test_range(&rng, 0, (int64_t)fair.size() - 1));
        FD_ASSERT_OK(fd_engine_cancel(e, it->first));
        fair.erase(it);
      } else {  // plan, apply, prefill, step
        std::vector<fd_request_fairness> f;
        for (auto &kv : fair) f.push_back(kv.second);
        fd_snapshot *snap = NULL;
        FD_ASSERT_OK(fd_engine_snapshot(e, (uint64_t)op, f.data(), (uint32_t)f.size(), &snap));
        fd_decision *d = NULL;
        FD_ASSERT_OK(fd_scheduler_plan(s, snap, &d));
        if (fd_test_range(&rng, 0, 7) == 0) {  // a stale decision is refused
          fd_request_spec sp = es_spec(next_id++, 0, 3);
          FD_ASSERT_OK(fd_engine_submit_request(e, &sp));
          fair[sp.id] = {sp.id, 0, 0, 0, 0};
          FD_ASSERT_FAILS(fd_engine_apply_decision(e, s, d), FD_ERR_STALE_HANDLE, "refused");
          fd_decision_destroy(d);
          fd_snapshot_destroy(snap);
          valid(e, c);
          continue;
        }
        FD_ASSERT_OK(fd_engine_apply_decision(e, s, d));
        valid(e, c);
        auto list = [&](int32_t which) {
          uint32_t n = 0;
          FD_ASSERT_OK(fd_decision_ids(d, which, NULL, 0, &n));
          std::vector<uint64_t> v(n);
          if (n) FD_ASSERT_OK(fd_decision_ids(d, which, v.data(), n, &n));
          return v;
        };
        for (uint64_t id : list(FD_DECISION_REJECTED)) {
          assert_int_equal(es_state(e, id), FD_ENGINE_REQUEST_REJECTED);
          fair.erase(id);
        }
        for (uint64_t id : list(FD_DECISION_ADMIT)) {
          while (true) {
            float kv[3 * 8];
            for (float &x : kv) x = 0.1f;
            if (fd_engine_prefill_request_layers(e, id, kv, kv) != FD_OK) break;
            valid(e, c);
          }
        }
        for (uint64_t id : list(FD_DECISION_WAITING)) fair[id].wait_steps++, fair[id].skip_count++;
        std::vector<uint64_t> run = list(FD_DECISION_RUNNABLE);
        if (!run.empty()) {
          const int fail_layer =
              fd_test_range(&rng, 0, 9) == 0 ? (int)fd_test_range(&rng, 0, 2) : -1;
          bool ran = false;
          step(e, c, run, fail_layer, &ran);
          if (ran) {
            for (uint64_t id : run) fair[id].service_wait_steps = 0;
            for (uint64_t id : list(FD_DECISION_DEFERRED)) fair[id].service_wait_steps++;
            for (uint64_t id : run) {
              if (es_state(e, id) == FD_ENGINE_REQUEST_FINISHED) fair.erase(id);
            }
          } else {
            for (auto &kv : fair) {
              if (es_state(e, kv.first) == FD_ENGINE_REQUEST_ACTIVE) kv.second.service_wait_steps++;
            }
          }
        }
        fd_decision_destroy(d);
        fd_snapshot_destroy(snap);
      }
      valid(e, c);
      const fd_engine_metrics m = es_metrics(e);
      assert_true(m.committed_blocks <= 24 - sc.reserve_blocks);
      assert_int_equal(m.backpressure_count, 0);
    }
    const fd_engine_metrics m = es_metrics(e);
    steps += m.completed_step_count;
    aborts += m.transaction_abort_count;
    finished += m.finished_request_count;
    stale += m.stale_decision_count;
    rejected += m.rejected_request_count;
    fd_scheduler_destroy(s);
    fd_engine_destroy(e);
    fd_cache_destroy(c);
  }
  // The interleavings really exercised every path.
  assert_true(steps > 100);
  assert_true(aborts > 0);
  assert_true(finished > 10);
  assert_true(stale > 0);
  assert_true(rejected > 0);
}

void test_random_unscheduled(void **) {
  for (uint64_t seed = 11; seed <= 16; ++seed) {
    fd_test_rng rng = {seed};
    fd_cache *c = es_cache(3, 1, 8, 2, 10);
    fd_engine *e = es_engine(c, 2);
    std::vector<uint64_t> waiting, active;
    uint64_t next_id = 1;
    for (int op = 0; op < 300; ++op) {
      const int64_t pick = fd_test_range(&rng, 0, 9);
      if (pick <= 1) {
        FD_ASSERT_OK(fd_engine_add_request(e, next_id));
        waiting.push_back(next_id++);
      } else if (pick == 2 && !waiting.empty()) {
        FD_ASSERT_OK(fd_engine_admit(e, waiting.front()));
        active.push_back(waiting.front());
        waiting.erase(waiting.begin());
      } else if (pick == 3 && !active.empty()) {
        const size_t i = (size_t)fd_test_range(&rng, 0, (int64_t)active.size() - 1);
        FD_ASSERT_OK(fd_test_range(&rng, 0, 1) ? fd_engine_finish(e, active[i])
                                               : fd_engine_cancel(e, active[i]));
        active.erase(active.begin() + (long)i);
      } else if (pick == 4 && !active.empty()) {
        float kv[3 * 8] = {0};
        const fd_status st = fd_engine_prefill_request_layers(e, active[0], kv, kv);
        assert_true(st == FD_OK || st == FD_ERR_OUT_OF_BLOCKS);
      } else if (!active.empty()) {
        const fd_engine_metrics before = es_metrics(e);
        const int fail_layer = fd_test_range(&rng, 0, 7) == 0 ? (int)fd_test_range(&rng, 0, 2) : -1;
        bool ran = false;
        step(e, c, active, fail_layer, &ran);
        const fd_engine_metrics after = es_metrics(e);
        if (!ran && fail_layer < 0) {
          assert_int_equal(after.backpressure_count, before.backpressure_count + 1);
        }
      }
      valid(e, c);
    }
    fd_engine_destroy(e);
    fd_cache_destroy(c);
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_scheduled),
      cmocka_unit_test(test_random_unscheduled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
