/* Workload drivers (S10): the scheduler comparison cases with their fixed
 * outcomes, the integrated trajectory hash, a synthetic run, determinism and
 * the API's error paths. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <vector>

#include "fd_test.h"

namespace {

/* Fixed reference of the integrated case "prefix_mix", seed 0. */
const uint64_t kIntegratedHash = 0x7116855edca8c05bull;

fd_workload_result *run(int32_t kind, const char *name, uint64_t seed = 0) {
  fd_workload_options o;
  fd_workload_options_init(&o);
  o.kind = kind;
  o.case_name = name;
  o.seed = seed;
  fd_workload_result *r = NULL;
  FD_ASSERT_OK(fd_workload_run(&o, &r));
  return r;
}

fd_workload_report report(const fd_workload_result *r, uint32_t i) {
  fd_workload_report rep;
  rep.struct_size = sizeof rep;
  FD_ASSERT_OK(fd_workload_result_report(r, i, &rep));
  return rep;
}

void test_case_names(void **) {
  const char *name = NULL;
  FD_ASSERT_OK(fd_workload_case_name(FD_WORKLOAD_SCHEDULER, 0, &name));
  assert_string_equal(name, "boundary_deadlock");
  FD_ASSERT_OK(fd_workload_case_name(FD_WORKLOAD_SYNTHETIC, 2, &name));
  assert_string_equal(name, "long_pressure");
  FD_ASSERT_FAILS(fd_workload_case_name(FD_WORKLOAD_SYNTHETIC, 3, &name), FD_ERR_NOT_FOUND,
                  "index 3");
  FD_ASSERT_FAILS(fd_workload_case_name(9, 0, &name), FD_ERR_INVALID_ARGUMENT, "kind 9");
  assert_string_equal(name, "long_pressure");
}

void test_boundary_deadlock(void **) {
  fd_workload_result *r = run(FD_WORKLOAD_SCHEDULER, "boundary_deadlock");
  uint32_t n = 0;
  FD_ASSERT_OK(fd_workload_result_count(r, &n));
  assert_int_equal(n, 3);
  const fd_workload_report life = report(r, 0), greedy = report(r, 1), cancel = report(r, 2);
  assert_int_equal(life.policy, FD_POLICY_LIFETIME);
  assert_int_equal(life.requests_completed, 2);
  assert_int_equal(life.deadlocks, 0);
  assert_int_equal(life.backpressure_steps, 0);
  assert_int_equal(life.useful_tokens, 128);
  assert_int_equal(greedy.policy, FD_POLICY_GREEDY);
  assert_int_equal(greedy.requests_completed, 0);
  assert_int_equal(greedy.deadlocks, 1);
  assert_true(greedy.stalled_steps >= 8);
  assert_int_equal(cancel.policy, FD_POLICY_CANCEL_ON_BACKPRESSURE);
  assert_int_equal(cancel.requests_completed, 1);
  assert_int_equal(cancel.forced_cancellations, 1);
  assert_int_equal(cancel.deadlocks, 0);
  assert_true(life.completion_rate == 1.0);
  assert_true(cancel.completion_rate == 0.5);
  fd_workload_result_destroy(r);
}

void test_finite_queue(void **) {
  fd_workload_result *r = run(FD_WORKLOAD_SCHEDULER, "finite_queue");
  for (uint32_t i = 0; i < 3; ++i) {
    const fd_workload_report rep = report(r, i);
    assert_int_equal(rep.requests_submitted, 6);
    assert_int_equal(rep.requests_completed, 6);
    assert_int_equal(rep.deadlocks, 0);
    assert_int_equal(rep.forced_cancellations, 0);
    assert_true(rep.peak_used_blocks <= 16);
    assert_true(rep.fairness > 0 && rep.fairness <= 1.0);
  }
  fd_workload_result_destroy(r);
}

void test_random_pressure_rejects_oversized(void **) {
  fd_workload_result *r = run(FD_WORKLOAD_SCHEDULER, "random_pressure", 3);
  for (uint32_t i = 0; i < 3; ++i) assert_int_equal(report(r, i).rejected_requests, 1);
  const fd_workload_report life = report(r, 0);
  assert_int_equal(life.deadlocks, 0);
  assert_int_equal(life.backpressure_steps, 0);
  assert_int_equal(life.requests_completed, life.requests_submitted - 1);
  fd_workload_result_destroy(r);
}

void test_integrated_trajectory(void **) {
  fd_workload_result *a = run(FD_WORKLOAD_INTEGRATED, "prefix_mix");
  fd_workload_result *b = run(FD_WORKLOAD_INTEGRATED, "prefix_mix");
  const fd_workload_report ra = report(a, 0), rb = report(b, 0);
  print_message("integrated hash 0x%016llx\n", (unsigned long long)ra.trajectory_hash);
  assert_int_equal(ra.trajectory_hash, rb.trajectory_hash);  // deterministic
  assert_int_equal(ra.trajectory_hash, kIntegratedHash);     // fixed reference
  assert_int_equal(ra.aborted_steps, 1);
  assert_int_equal(ra.user_cancellations, 1);
  assert_true(ra.prefix_hits > 0);
  assert_true(ra.prefix_misses > 0);
  assert_true(ra.peak_saved_prefix_blocks > 0);
  assert_int_equal(ra.requests_completed + ra.user_cancellations + ra.rejected_requests,
                   ra.requests_submitted);
  fd_workload_result *c = run(FD_WORKLOAD_INTEGRATED, "prefix_mix", 1);
  assert_true(report(c, 0).trajectory_hash != ra.trajectory_hash);  // the seed matters
  fd_workload_result_destroy(a);
  fd_workload_result_destroy(b);
  fd_workload_result_destroy(c);
}

void test_synthetic_short_churn(void **) {
  fd_workload_result *r = run(FD_WORKLOAD_SYNTHETIC, "short_churn");
  const fd_workload_report rep = report(r, 0);
  assert_int_equal(rep.policy, FD_POLICY_UNSCHEDULED);
  assert_true(rep.executed_steps > 0);
  assert_true(rep.step_latency_p50_us <= rep.step_latency_p90_us);
  assert_true(rep.step_latency_p90_us <= rep.step_latency_p99_us);
  assert_true(rep.tokens_per_second > 0);
  assert_int_equal(rep.requests_completed + rep.user_cancellations + rep.forced_cancellations +
                       rep.rejected_requests,
                   rep.requests_submitted);
  uint32_t n = 0;
  FD_ASSERT_OK(fd_workload_result_trace(r, 0, NULL, 0, &n));
  assert_int_equal(n, rep.steps);
  std::vector<fd_workload_trace_point> pts(n);
  FD_ASSERT_OK(fd_workload_result_trace(r, 0, pts.data(), n, &n));
  for (const fd_workload_trace_point &p : pts) assert_true(p.used_blocks <= rep.max_blocks);
  FD_ASSERT_FAILS(fd_workload_result_trace(r, 0, pts.data(), n - 1, &n), FD_ERR_INVALID_ARGUMENT,
                  "capacity");
  FD_ASSERT_FAILS(fd_workload_result_trace(r, 1, pts.data(), n, &n), FD_ERR_INVALID_ARGUMENT,
                  "index 1");
  fd_workload_result_destroy(r);
}

void test_run_errors(void **) {
  fd_workload_options o;
  fd_workload_options_init(&o);
  fd_workload_result *r = (fd_workload_result *)0x1;
  FD_ASSERT_FAILS(fd_workload_run(&o, &r), FD_ERR_INVALID_ARGUMENT, "case_name");
  o.case_name = "nope";
  FD_ASSERT_FAILS(fd_workload_run(&o, &r), FD_ERR_NOT_FOUND, "'nope'");
  o.kind = 7;
  FD_ASSERT_FAILS(fd_workload_run(&o, &r), FD_ERR_INVALID_ARGUMENT, "kind 7");
  FD_ASSERT_FAILS(fd_workload_run(NULL, &r), FD_ERR_INVALID_ARGUMENT, "options");
  assert_ptr_equal(r, (fd_workload_result *)0x1);
  fd_workload_result_destroy(NULL);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_case_names),
      cmocka_unit_test(test_boundary_deadlock),
      cmocka_unit_test(test_finite_queue),
      cmocka_unit_test(test_random_pressure_rejects_oversized),
      cmocka_unit_test(test_integrated_trajectory),
      cmocka_unit_test(test_synthetic_short_churn),
      cmocka_unit_test(test_run_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
