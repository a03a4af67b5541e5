// Scheduler (docs/semantics.md S9): every rule and reason of plan(), snapshot
// validation and the decision accessors, through the public C API.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <string>
#include <vector>

#include "fd_test.h"

namespace {

fd_request_spec spec(uint64_t id, uint32_t context, uint32_t new_tokens, uint64_t order = 0,
                     const char *prefix = nullptr, uint32_t prefix_blocks = 0) {
  fd_request_spec s;
  fd_request_spec_init(&s);
  s.id = id;
  s.initial_context_tokens = context;
  s.max_new_tokens = new_tokens;
  s.submission_order = order == 0 ? id : order;
  s.prefix_id = prefix;
  s.prefix_blocks = prefix_blocks;
  return s;
}

fd_snapshot *make_snapshot(uint32_t block_size, uint32_t max_blocks, uint32_t free_blocks,
                           uint32_t resident = 0, uint64_t step = 0) {
  fd_snapshot_info info;
  fd_snapshot_info_init(&info);
  info.block_size = block_size;
  info.max_blocks = max_blocks;
  info.free_blocks = free_blocks;
  info.resident_prefix_blocks = resident;
  info.step = step;
  fd_snapshot *s = nullptr;
  FD_ASSERT_OK(fd_snapshot_create(&info, &s));
  return s;
}

// Adds an active request whose derived fields follow the rules.
void add_active(fd_snapshot *s, const fd_request_spec &sp, int32_t seq_len, uint32_t bs,
                uint32_t service_wait = 0) {
  const uint32_t physical = (uint32_t)((seq_len + (int32_t)bs - 1) / (int32_t)bs);
  const uint32_t lifetime = (sp.initial_context_tokens + sp.max_new_tokens + bs - 1) / bs;
  FD_ASSERT_OK(fd_snapshot_add_active(s, &sp, seq_len, physical, sp.prefix_blocks,
                                      lifetime - sp.prefix_blocks, service_wait));
}

fd_scheduler *make_scheduler(uint32_t max_active, uint32_t max_batch, uint32_t reserve = 0,
                             uint32_t aging = 8) {
  fd_scheduler_config c;
  fd_scheduler_config_init(&c);
  c.max_active_requests = max_active;
  c.max_batch_requests = max_batch;
  c.reserve_blocks = reserve;
  c.aging_threshold_steps = aging;
  fd_scheduler *s = nullptr;
  FD_ASSERT_OK(fd_scheduler_create(&c, &s));
  return s;
}

std::vector<uint64_t> ids(const fd_decision *d, int32_t list) {
  uint32_t n = 0;
  FD_ASSERT_OK(fd_decision_ids(d, list, nullptr, 0, &n));
  std::vector<uint64_t> v(n);
  if (n) FD_ASSERT_OK(fd_decision_ids(d, list, v.data(), n, &n));
  return v;
}

std::vector<int32_t> reasons(const fd_decision *d) {
  int32_t r[8];
  uint32_t n = 0;
  FD_ASSERT_OK(fd_decision_reasons(d, r, 8, &n));
  return std::vector<int32_t>(r, r + n);
}

fd_decision_summary summary(const fd_decision *d) {
  fd_decision_summary s;
  s.struct_size = sizeof s;
  FD_ASSERT_OK(fd_decision_get_summary(d, &s));
  return s;
}

using U = std::vector<uint64_t>;
using R = std::vector<int32_t>;

fd_decision *plan(fd_scheduler *sch, fd_snapshot *snap) {
  fd_decision *d = nullptr;
  FD_ASSERT_OK(fd_scheduler_plan(sch, snap, &d));
  return d;
}

void test_config_validation(void **) {
  fd_scheduler_config c;
  fd_scheduler_config_init(&c);
  assert_int_equal(c.aging_threshold_steps, 8);
  fd_scheduler *s = (fd_scheduler *)0x1;
  c.max_active_requests = 0;
  FD_ASSERT_FAILS(fd_scheduler_create(&c, &s), FD_ERR_INVALID_ARGUMENT, "max_active_requests");
  c.max_active_requests = 4;
  c.max_batch_requests = 5;
  FD_ASSERT_FAILS(fd_scheduler_create(&c, &s), FD_ERR_INVALID_ARGUMENT, "max_batch_requests");
  c.max_batch_requests = 0;
  FD_ASSERT_FAILS(fd_scheduler_create(&c, &s), FD_ERR_INVALID_ARGUMENT, "max_batch_requests");
  c.max_batch_requests = 4;
  c.aging_threshold_steps = 0;
  FD_ASSERT_FAILS(fd_scheduler_create(&c, &s), FD_ERR_INVALID_ARGUMENT, "aging_threshold_steps");
  c.aging_threshold_steps = 3;
  c.struct_size = 4;
  FD_ASSERT_FAILS(fd_scheduler_create(&c, &s), FD_ERR_INVALID_ARGUMENT, "struct_size");
  FD_ASSERT_FAILS(fd_scheduler_create(nullptr, &s), FD_ERR_INVALID_ARGUMENT, "config");
  assert_ptr_equal(s, (fd_scheduler *)0x1);  // untouched on failure
  // An older, shorter struct keeps defaults for the missing tail.
  c.struct_size = offsetof(fd_scheduler_config, reserve_blocks);
  c.reserve_blocks = 77;
  FD_ASSERT_OK(fd_scheduler_create(&c, &s));
  fd_scheduler_config back;
  back.struct_size = sizeof back;
  FD_ASSERT_OK(fd_scheduler_get_config(s, &back));
  assert_int_equal(back.max_active_requests, 4);
  assert_int_equal(back.reserve_blocks, 0);
  assert_int_equal(back.aging_threshold_steps, 8);
  fd_scheduler_destroy(s);
  fd_scheduler_destroy(nullptr);
}

void test_snapshot_validation(void **) {
  fd_snapshot_info info;
  fd_snapshot_info_init(&info);
  fd_snapshot *s = (fd_snapshot *)0x1;
  info.free_blocks = 2000;
  FD_ASSERT_FAILS(fd_snapshot_create(&info, &s), FD_ERR_INVALID_ARGUMENT, "free_blocks 2000");
  info.free_blocks = 1000;
  info.resident_prefix_blocks = 30;
  FD_ASSERT_FAILS(fd_snapshot_create(&info, &s), FD_ERR_INVALID_ARGUMENT,
                  "resident_prefix_blocks 30");
  info.resident_prefix_blocks = 0;
  info.block_size = 0;
  FD_ASSERT_FAILS(fd_snapshot_create(&info, &s), FD_ERR_INVALID_ARGUMENT, "block_size");
  assert_ptr_equal(s, (fd_snapshot *)0x1);

  fd_snapshot *snap = make_snapshot(16, 64, 62);
  fd_request_spec a = spec(1, 10, 30);  // lifetime ceil(40/16) = 3
  FD_ASSERT_FAILS(fd_snapshot_add_active(snap, &a, 20, 1, 0, 3, 0), FD_ERR_INVALID_ARGUMENT,
                  "physical_blocks must be ceil(seq_len / block_size) = 2, got 1");
  FD_ASSERT_FAILS(fd_snapshot_add_active(snap, &a, 20, 2, 0, 2, 0), FD_ERR_INVALID_ARGUMENT,
                  "committed_blocks must be lifetime - shared = 3, got 2");
  FD_ASSERT_FAILS(fd_snapshot_add_active(snap, &a, 20, 2, 1, 3, 0), FD_ERR_INVALID_ARGUMENT,
                  "shared_blocks");
  FD_ASSERT_FAILS(fd_snapshot_add_active(snap, &a, 40, 3, 0, 3, 0), FD_ERR_INVALID_ARGUMENT,
                  "seq_len must be in [0, 40)");
  FD_ASSERT_FAILS(fd_snapshot_add_active(snap, &a, -1, 0, 0, 3, 0), FD_ERR_INVALID_ARGUMENT,
                  "seq_len");
  FD_ASSERT_OK(fd_snapshot_add_active(snap, &a, 20, 2, 0, 3, 0));
  fd_request_spec dup = spec(1, 0, 5, 9);
  FD_ASSERT_FAILS(fd_snapshot_add_waiting(snap, &dup, 0, 0), FD_ERR_ALREADY_EXISTS, "request id 1");
  fd_request_spec dup_order = spec(2, 0, 5, 1);
  FD_ASSERT_FAILS(fd_snapshot_add_waiting(snap, &dup_order, 0, 0), FD_ERR_ALREADY_EXISTS,
                  "submission_order 1");
  fd_request_spec zero_new = spec(3, 0, 0);
  FD_ASSERT_FAILS(fd_snapshot_add_waiting(snap, &zero_new, 0, 0), FD_ERR_INVALID_ARGUMENT,
                  "max_new_tokens");
  fd_request_spec bad_prefix = spec(4, 20, 5, 0, "sys", 1);
  FD_ASSERT_FAILS(fd_snapshot_add_waiting(snap, &bad_prefix, 0, 0), FD_ERR_INVALID_ARGUMENT,
                  "must cover the whole initial context");
  fd_request_spec blocks_no_id = spec(5, 16, 5, 0, nullptr, 1);
  FD_ASSERT_FAILS(fd_snapshot_add_waiting(snap, &blocks_no_id, 0, 0), FD_ERR_INVALID_ARGUMENT,
                  "prefix_id is not set");
  fd_request_spec huge = spec(6, 0x7fffffff, 5);
  FD_ASSERT_FAILS(fd_snapshot_add_waiting(snap, &huge, 0, 0), FD_ERR_INVALID_ARGUMENT, "INT32_MAX");
  // Failed adds changed nothing: the snapshot plans as one active request.
  fd_scheduler *sch = make_scheduler(4, 4);
  fd_decision *d = plan(sch, snap);
  assert_true(ids(d, FD_DECISION_RUNNABLE) == U{1});
  assert_true(ids(d, FD_DECISION_WAITING).empty());
  fd_decision_destroy(d);

  // Pool equation checked at plan time: 2 blocks held but 3 used.
  fd_snapshot *bad = make_snapshot(16, 64, 61);
  add_active(bad, a, 20, 16);
  FD_ASSERT_FAILS(fd_scheduler_plan(sch, bad, &d), FD_ERR_INVALID_ARGUMENT,
                  "resident prefix blocks + active private blocks = 2, but max_blocks - "
                  "free_blocks = 3");
  fd_snapshot_destroy(bad);
  fd_snapshot_destroy(snap);
  fd_scheduler_destroy(sch);
}

void test_plan_limits_refused(void **) {
  fd_scheduler *sch = make_scheduler(1, 1, 8);
  fd_decision *d = (fd_decision *)0x1;
  fd_snapshot *small = make_snapshot(16, 8, 8);
  FD_ASSERT_FAILS(fd_scheduler_plan(sch, small, &d), FD_ERR_INVALID_ARGUMENT,
                  "reserve_blocks 8 must be below max_blocks 8");
  fd_snapshot_destroy(small);
  fd_scheduler_destroy(sch);

  sch = make_scheduler(1, 1, 4);
  fd_snapshot *s = make_snapshot(16, 10, 10);
  fd_request_spec a = spec(1, 0, 16 * 7), b = spec(2, 0, 5);  // a commits 7 > 6 schedulable
  add_active(s, a, 0, 16);
  FD_ASSERT_FAILS(fd_scheduler_plan(sch, s, &d), FD_ERR_INVALID_ARGUMENT, "committed blocks 7");
  fd_snapshot_destroy(s);
  s = make_snapshot(16, 10, 10);
  a = spec(1, 0, 5);
  add_active(s, a, 0, 16);
  add_active(s, b, 0, 16);
  FD_ASSERT_FAILS(fd_scheduler_plan(sch, s, &d), FD_ERR_INVALID_ARGUMENT,
                  "2 active requests exceed max_active_requests 1");
  fd_snapshot_destroy(s);
  s = make_snapshot(16, 10, 3, 7);
  FD_ASSERT_FAILS(fd_scheduler_plan(sch, s, &d), FD_ERR_INVALID_ARGUMENT,
                  "resident prefix blocks 7 exceed the schedulable blocks 6");
  assert_ptr_equal(d, (fd_decision *)0x1);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_idle(void **) {
  fd_scheduler *sch = make_scheduler(4, 4);
  fd_snapshot *s = make_snapshot(16, 16, 16);
  fd_decision *d = plan(sch, s);
  assert_true(reasons(d) == R{FD_REASON_IDLE});
  assert_true(ids(d, FD_DECISION_RUNNABLE).empty());
  fd_decision_summary sm = summary(d);
  assert_int_equal(sm.committed_blocks_before, 0);
  assert_int_equal(sm.committed_blocks_after, 0);
  assert_int_equal(sm.needed_physical_blocks_now, 0);
  assert_int_equal(sm.free_blocks_before, 16);
  assert_int_equal(sm.schedulable_blocks, 16);
  assert_int_equal(sm.has_drain, 0);
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_admit_fifo_and_needed(void **) {
  fd_scheduler *sch = make_scheduler(8, 8);
  fd_snapshot *s = make_snapshot(16, 16, 16);
  fd_request_spec a = spec(10, 20, 12, 1);             // lifetime 2, context 2 blocks, 20 % 16 != 0
  fd_request_spec b = spec(11, 0, 16, 2);              // lifetime 1, context 0 -> boundary row
  fd_request_spec c = spec(12, 32, 1, 3);              // lifetime 3, context 2 blocks, boundary row
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &c, 0, 0));  // insertion order does not matter
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &a, 0, 0));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &b, 0, 0));
  fd_decision *d = plan(sch, s);
  assert_true(ids(d, FD_DECISION_ADMIT) == (U{10, 11, 12}));
  assert_true(ids(d, FD_DECISION_RUNNABLE) == (U{10, 11, 12}));
  assert_true(reasons(d) == R{FD_REASON_ADMITTED});
  fd_decision_summary sm = summary(d);
  assert_int_equal(sm.committed_blocks_after, 6);
  // context blocks 2 + 0 + 2, boundary rows b (0) and c (32).
  assert_int_equal(sm.needed_physical_blocks_now, 6);
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_rejection(void **) {
  // 10 blocks, reserve 2, 2 resident prefix blocks: private capacity 6.
  fd_scheduler *sch = make_scheduler(8, 8, 2);
  fd_snapshot *s = make_snapshot(16, 10, 8, 2);
  fd_request_spec big = spec(1, 0, 16 * 6 + 1);                 // 7 blocks
  fd_request_spec fits = spec(2, 0, 16 * 6);                    // 6 blocks
  fd_request_spec prefixed = spec(3, 32, 16 * 6, 0, "sys", 2);  // lifetime 8, private 6
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &big, 0, 0));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &fits, 0, 0));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &prefixed, 0, 0));
  fd_decision *d = plan(sch, s);
  assert_true(ids(d, FD_DECISION_REJECTED) == U{1});
  assert_true(ids(d, FD_DECISION_ADMIT) == U{2});
  assert_true(ids(d, FD_DECISION_WAITING) == U{3});
  assert_true(reasons(d) == (R{FD_REASON_REQUEST_EXCEEDS_CAPACITY, FD_REASON_CAPACITY_DEFERRED,
                               FD_REASON_ADMITTED}));
  fd_decision_summary sm = summary(d);
  assert_int_equal(sm.schedulable_blocks, 8);
  assert_int_equal(sm.committed_blocks_before, 2);
  assert_int_equal(sm.committed_blocks_after, 8);
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_capacity_skip_lets_smaller_go(void **) {
  fd_scheduler *sch = make_scheduler(8, 8);
  fd_snapshot *s = make_snapshot(16, 8, 6);
  fd_request_spec act = spec(1, 20, 40);  // lifetime 4, holds 2
  add_active(s, act, 20, 16);
  fd_request_spec big = spec(2, 0, 16 * 5);    // 5 > remaining 4: skipped
  fd_request_spec small = spec(3, 0, 16 * 3);  // 3: admitted
  fd_request_spec tiny = spec(4, 0, 16 * 2);   // 2 > remaining 1: skipped
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &big, 0, 0));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &small, 0, 0));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &tiny, 0, 0));
  fd_decision *d = plan(sch, s);
  assert_true(ids(d, FD_DECISION_ADMIT) == U{3});
  assert_true(ids(d, FD_DECISION_WAITING) == (U{2, 4}));
  assert_true(reasons(d) == (R{FD_REASON_CAPACITY_DEFERRED, FD_REASON_ADMITTED}));
  assert_int_equal(summary(d).committed_blocks_after, 7);
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_active_limit(void **) {
  fd_scheduler *sch = make_scheduler(2, 2);
  fd_snapshot *s = make_snapshot(16, 64, 64);
  fd_request_spec a = spec(1, 0, 4), b = spec(2, 0, 4), c = spec(3, 0, 4);
  add_active(s, a, 0, 16);
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &b, 0, 0));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &c, 0, 0));
  fd_decision *d = plan(sch, s);
  assert_true(ids(d, FD_DECISION_ADMIT) == U{2});
  assert_true(ids(d, FD_DECISION_WAITING) == U{3});
  assert_true(reasons(d) == (R{FD_REASON_ACTIVE_LIMIT, FD_REASON_ADMITTED}));
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_aging_admits_aged_first(void **) {
  fd_scheduler *sch = make_scheduler(2, 2, 0, 3);
  fd_snapshot *s = make_snapshot(16, 4, 4);
  fd_request_spec young = spec(1, 0, 16);     // 1 block
  fd_request_spec aged = spec(2, 0, 16 * 3);  // 3 blocks, waited 3 steps
  fd_request_spec later = spec(3, 0, 16);     // would fit after aged, but no slot
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &young, 0, 0));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &aged, 3, 1));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &later, 0, 0));
  fd_decision *d = plan(sch, s);
  assert_true(ids(d, FD_DECISION_ADMIT) == (U{2, 1}));
  assert_true(ids(d, FD_DECISION_WAITING) == U{3});
  assert_true(ids(d, FD_DECISION_RUNNABLE) == (U{1, 2}));  // by order among equal waits
  assert_true(reasons(d) == (R{FD_REASON_ACTIVE_LIMIT, FD_REASON_ADMITTED}));
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_aging_drain_capacity_and_slots(void **) {
  // Capacity: the aged request does not fit; a small later one would, but
  // nothing is admitted while draining.
  fd_scheduler *sch = make_scheduler(4, 4, 0, 2);
  fd_snapshot *s = make_snapshot(16, 4, 2);
  fd_request_spec act = spec(1, 20, 10);  // lifetime 2, holds 2
  add_active(s, act, 20, 16);
  fd_request_spec aged = spec(2, 0, 16 * 3);
  fd_request_spec small = spec(3, 0, 1);
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &aged, 2, 0));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &small, 0, 0));
  fd_decision *d = plan(sch, s);
  assert_true(ids(d, FD_DECISION_ADMIT).empty());
  assert_true(ids(d, FD_DECISION_WAITING) == (U{2, 3}));
  assert_true(ids(d, FD_DECISION_RUNNABLE) == U{1});
  assert_true(reasons(d) == R{FD_REASON_AGING_DRAIN});
  fd_decision_summary sm = summary(d);
  assert_int_equal(sm.has_drain, 1);
  assert_int_equal(sm.drain_for_request_id, 2);
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);

  // Slots: the aged request fits but max_active is reached.
  sch = make_scheduler(1, 1, 0, 2);
  s = make_snapshot(16, 8, 6);
  add_active(s, act, 20, 16);
  fd_request_spec aged_small = spec(4, 0, 1);
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &aged_small, 5, 0));
  d = plan(sch, s);
  assert_true(reasons(d) == R{FD_REASON_AGING_DRAIN});
  assert_int_equal(summary(d).drain_for_request_id, 4);
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_runnable_order_and_batch_limit(void **) {
  fd_scheduler *sch = make_scheduler(4, 2);
  fd_snapshot *s = make_snapshot(16, 64, 61);
  fd_request_spec a = spec(1, 0, 50), b = spec(2, 0, 50), c = spec(3, 0, 50);
  add_active(s, a, 10, 16, 0);
  add_active(s, b, 16, 16, 2);  // waited longest: first; boundary row
  add_active(s, c, 5, 16, 1);
  fd_request_spec w = spec(4, 0, 3);
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &w, 0, 0));
  fd_decision *d = plan(sch, s);
  assert_true(ids(d, FD_DECISION_ADMIT) == U{4});
  assert_true(ids(d, FD_DECISION_RUNNABLE) == (U{2, 3}));
  assert_true(ids(d, FD_DECISION_DEFERRED) == (U{1, 4}));
  assert_true(reasons(d) == (R{FD_REASON_ADMITTED, FD_REASON_BATCH_LIMIT}));
  assert_int_equal(summary(d).needed_physical_blocks_now, 1);  // row 2 at seq_len 16
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_reserve_blocks(void **) {
  fd_request_spec a = spec(1, 0, 16 * 3);
  for (uint32_t reserve = 0; reserve <= 2; ++reserve) {
    fd_scheduler *sch = make_scheduler(4, 4, reserve);
    fd_snapshot *s = make_snapshot(16, 4, 4);
    FD_ASSERT_OK(fd_snapshot_add_waiting(s, &a, 0, 0));
    fd_decision *d = plan(sch, s);
    if (reserve <= 1) {
      assert_true(ids(d, FD_DECISION_ADMIT) == U{1});
    } else {
      assert_true(ids(d, FD_DECISION_REJECTED) == U{1});  // 3 > 4 - 2
    }
    assert_int_equal(summary(d).schedulable_blocks, 4 - reserve);
    fd_decision_destroy(d);
    fd_snapshot_destroy(s);
    fd_scheduler_destroy(sch);
  }
}

void test_all_reasons_in_order(void **) {
  // One plan producing rejection, active limit, capacity skip, admission and
  // batch limit at once.
  fd_scheduler *sch = make_scheduler(3, 1);
  fd_snapshot *s = make_snapshot(16, 6, 5);
  fd_request_spec act = spec(1, 1, 16);  // lifetime 2, holds 1
  add_active(s, act, 1, 16);
  fd_request_spec huge = spec(2, 0, 16 * 7);
  fd_request_spec big = spec(3, 0, 16 * 5);
  fd_request_spec ok = spec(4, 0, 16);
  fd_request_spec late = spec(5, 0, 16);
  fd_request_spec later = spec(6, 0, 16);
  for (fd_request_spec *p : {&huge, &big, &ok, &late, &later}) {
    FD_ASSERT_OK(fd_snapshot_add_waiting(s, p, 0, 0));
  }
  fd_decision *d = plan(sch, s);
  assert_true(ids(d, FD_DECISION_REJECTED) == U{2});
  assert_true(ids(d, FD_DECISION_ADMIT) == (U{4, 5}));
  assert_true(ids(d, FD_DECISION_WAITING) == (U{3, 6}));
  assert_true(ids(d, FD_DECISION_RUNNABLE) == U{1});
  assert_true(ids(d, FD_DECISION_DEFERRED) == (U{4, 5}));
  assert_true(reasons(d) ==
              (R{FD_REASON_REQUEST_EXCEEDS_CAPACITY, FD_REASON_ACTIVE_LIMIT,
                 FD_REASON_CAPACITY_DEFERRED, FD_REASON_ADMITTED, FD_REASON_BATCH_LIMIT}));
  fd_decision_destroy(d);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_pure_and_copy_on_write(void **) {
  fd_scheduler *sch = make_scheduler(4, 4);
  fd_snapshot *s = make_snapshot(16, 8, 8, 0, 42);
  fd_request_spec a = spec(1, 0, 5);
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &a, 0, 0));
  fd_decision *d1 = plan(sch, s);
  fd_request_spec b = spec(2, 0, 5);
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &b, 0, 0));  // after planning
  fd_decision *d2 = plan(sch, s);
  assert_true(ids(d1, FD_DECISION_ADMIT) == U{1});
  assert_true(ids(d2, FD_DECISION_ADMIT) == (U{1, 2}));
  // The decision kept the snapshot it was planned from.
  fd_snapshot *copy = nullptr;
  FD_ASSERT_OK(fd_decision_copy_snapshot(d1, &copy));
  fd_decision *d3 = plan(sch, copy);
  assert_true(ids(d3, FD_DECISION_ADMIT) == U{1});
  assert_int_equal(summary(d3).step, 42);
  fd_scheduler_config cfg;
  cfg.struct_size = sizeof cfg;
  FD_ASSERT_OK(fd_decision_get_config(d3, &cfg));
  assert_int_equal(cfg.max_active_requests, 4);
  for (fd_decision *d : {d1, d2, d3}) fd_decision_destroy(d);
  fd_snapshot_destroy(copy);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

void test_decision_accessor_errors(void **) {
  fd_scheduler *sch = make_scheduler(4, 4);
  fd_snapshot *s = make_snapshot(16, 8, 8);
  fd_request_spec a = spec(1, 0, 5), b = spec(2, 0, 5);
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &a, 0, 0));
  FD_ASSERT_OK(fd_snapshot_add_waiting(s, &b, 0, 0));
  fd_decision *d = plan(sch, s);
  uint64_t one[1] = {99};
  uint32_t n = 7;
  FD_ASSERT_FAILS(fd_decision_ids(d, FD_DECISION_ADMIT, one, 1, &n), FD_ERR_INVALID_ARGUMENT,
                  "capacity 1 is below the list length 2");
  assert_int_equal(one[0], 99);
  assert_int_equal(n, 7);
  FD_ASSERT_FAILS(fd_decision_ids(d, 9, one, 1, &n), FD_ERR_INVALID_ARGUMENT, "list 9");
  int32_t r[1];
  fd_decision *idle_d = nullptr;
  fd_snapshot *empty = make_snapshot(16, 8, 8);
  FD_ASSERT_OK(fd_scheduler_plan(sch, empty, &idle_d));
  FD_ASSERT_OK(fd_decision_reasons(idle_d, r, 1, &n));
  assert_int_equal(n, 1);
  FD_ASSERT_FAILS(fd_decision_reasons(idle_d, r, 0, &n), FD_ERR_INVALID_ARGUMENT, "capacity 0");
  fd_decision_summary sm;
  sm.struct_size = 4;
  FD_ASSERT_FAILS(fd_decision_get_summary(d, &sm), FD_ERR_INVALID_ARGUMENT, "struct_size");
  FD_ASSERT_FAILS(fd_scheduler_plan(nullptr, s, &d), FD_ERR_INVALID_ARGUMENT, "scheduler");
  fd_decision_destroy(idle_d);
  fd_decision_destroy(d);
  fd_snapshot_destroy(empty);
  fd_snapshot_destroy(s);
  fd_scheduler_destroy(sch);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_validation),
      cmocka_unit_test(test_snapshot_validation),
      cmocka_unit_test(test_plan_limits_refused),
      cmocka_unit_test(test_idle),
      cmocka_unit_test(test_admit_fifo_and_needed),
      cmocka_unit_test(test_rejection),
      cmocka_unit_test(test_capacity_skip_lets_smaller_go),
      cmocka_unit_test(test_active_limit),
      cmocka_unit_test(test_aging_admits_aged_first),
      cmocka_unit_test(test_aging_drain_capacity_and_slots),
      cmocka_unit_test(test_runnable_order_and_batch_limit),
      cmocka_unit_test(test_reserve_blocks),
      cmocka_unit_test(test_all_reasons_in_order),
      cmocka_unit_test(test_pure_and_copy_on_write),
      cmocka_unit_test(test_decision_accessor_errors),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
