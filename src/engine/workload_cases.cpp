// The named workload cases of docs/semantics.md S10, generated from a seed.
#include "core/error.hpp"
#include "engine/workloads.hpp"

namespace fd {

namespace {

// splitmix64: the same generator as the tests, so cases are reproducible.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint32_t range(uint32_t lo, uint32_t hi) {
    return lo + static_cast<uint32_t>(next() % (uint64_t{hi} - lo + 1));
  }
  bool chance(uint32_t percent) { return next() % 100 < percent; }
};

struct RandomShape {
  uint32_t count, ctx_lo, ctx_hi, new_lo, new_hi, gap_max, cancel_percent;
};

void add_random_requests(WorkloadCase &c, Rng &rng, const RandomShape &s) {
  uint64_t t = 0;
  for (uint32_t i = 0; i < s.count; ++i) {
    PlannedRequest r;
    r.id = 1000 + i;
    r.arrival = t;
    r.context = rng.range(s.ctx_lo, s.ctx_hi);
    r.new_tokens = rng.range(s.new_lo, s.new_hi);
    if (rng.chance(s.cancel_percent)) r.cancel_at = static_cast<int64_t>(t + rng.range(1, 40));
    c.requests.push_back(r);
    t += rng.range(0, s.gap_max);
  }
}

WorkloadCase synthetic(const std::string &name, Rng &rng) {
  WorkloadCase c;
  c.name = name;
  c.kind = FD_WORKLOAD_SYNTHETIC;
  c.layers = 1;
  c.q_heads = 32;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.block_size = 32;
  c.dtype = FD_DTYPE_BF16;
  c.policies = {FD_POLICY_UNSCHEDULED};
  if (name == "short_churn") {
    c.max_blocks = 48;
    c.max_active = c.max_batch = 16;
    add_random_requests(c, rng, {64, 8, 64, 4, 24, 2, 15});
  } else if (name == "mixed_steady") {
    c.max_blocks = 96;
    c.max_active = c.max_batch = 12;
    add_random_requests(c, rng, {32, 16, 512, 16, 64, 4, 10});
  } else if (name == "long_pressure") {
    c.max_blocks = 64;
    c.max_active = c.max_batch = 8;
    add_random_requests(c, rng, {10, 512, 1280, 32, 96, 6, 5});
  } else {
    fail(FD_ERR_NOT_FOUND, "unknown synthetic workload case '%s'", name.c_str());
  }
  return c;
}

WorkloadCase scheduler_case(const std::string &name, Rng &rng) {
  WorkloadCase c;
  c.name = name;
  c.kind = FD_WORKLOAD_SCHEDULER;
  c.policies = {FD_POLICY_LIFETIME, FD_POLICY_GREEDY, FD_POLICY_CANCEL_ON_BACKPRESSURE};
  if (name == "boundary_deadlock") {
    // Two requests that each fit alone but not together once both cross a
    // block boundary.
    c.block_size = 32;
    c.max_blocks = 2;
    c.max_active = c.max_batch = 2;
    c.requests = {{1, 0, 0, 64, "", -1}, {2, 0, 0, 64, "", -1}};
  } else if (name == "finite_queue") {
    c.block_size = 16;
    c.max_blocks = 16;
    c.max_active = c.max_batch = 4;
    c.requests = {{1, 0, 10, 20, "", -1}, {2, 0, 0, 30, "", -1},  {3, 1, 20, 10, "", -1},
                  {4, 2, 5, 40, "", -1},  {5, 3, 16, 16, "", -1}, {6, 5, 0, 8, "", -1}};
  } else if (name == "random_pressure") {
    c.block_size = 16;
    c.max_blocks = 12;
    c.max_active = c.max_batch = 6;
    add_random_requests(c, rng, {24, 0, 40, 8, 64, 3, 0});
    c.requests.push_back({2000, 4, 0, 16 * 13, "", -1});  // larger than the pool: rejected
  } else {
    fail(FD_ERR_NOT_FOUND, "unknown scheduler workload case '%s'", name.c_str());
  }
  return c;
}

WorkloadCase integrated(const std::string &name, Rng &rng) {
  if (name != "prefix_mix") {
    fail(FD_ERR_NOT_FOUND, "unknown integrated workload case '%s'", name.c_str());
  }
  WorkloadCase c;
  c.name = name;
  c.kind = FD_WORKLOAD_INTEGRATED;
  c.layers = 4;
  c.kv_heads = 2;
  c.q_heads = 4;
  c.head_dim = 16;
  c.block_size = 8;
  c.max_blocks = 40;
  c.prefix_capacity = 8;
  c.max_active = 6;
  c.max_batch = 4;
  c.reserve = 2;
  c.inject_failure_at = 6;
  c.policies = {FD_POLICY_LIFETIME};
  c.prefixes = {{"system", 2}};
  uint64_t t = 0;
  for (uint32_t i = 0; i < 14; ++i) {
    PlannedRequest r;
    r.id = 100 + i;
    r.arrival = t;
    r.new_tokens = rng.range(4, 24);
    const uint32_t pick = i % 3;
    if (pick == 0) {
      r.prefix = "system";  // hit: the context is the shared prefix
      r.context = 16;
    } else if (pick == 1) {
      r.prefix = "tools";  // miss: never registered, prefilled privately
      r.context = 16;
    } else {
      r.context = rng.range(1, 20);
    }
    if (i == 4) r.cancel_at = static_cast<int64_t>(t + 3);
    c.requests.push_back(r);
    t += rng.range(0, 3);
  }
  return c;
}

}  // namespace

const std::vector<const char *> &workload_case_names(int32_t kind) {
  static const std::vector<const char *> synthetic_names = {"short_churn", "mixed_steady",
                                                            "long_pressure"};
  static const std::vector<const char *> scheduler_names = {"boundary_deadlock", "finite_queue",
                                                            "random_pressure"};
  static const std::vector<const char *> integrated_names = {"prefix_mix"};
  switch (kind) {
    case FD_WORKLOAD_SYNTHETIC: return synthetic_names;
    case FD_WORKLOAD_SCHEDULER: return scheduler_names;
    case FD_WORKLOAD_INTEGRATED: return integrated_names;
    default: fail(FD_ERR_INVALID_ARGUMENT, "kind %d is not an fd_workload_kind value", kind);
  }
}

WorkloadCase make_workload_case(int32_t kind, const std::string &name, uint64_t seed) {
  Rng rng{seed * 0x2545f4914f6cdd1dull + 17};
  switch (kind) {
    case FD_WORKLOAD_SYNTHETIC: return synthetic(name, rng);
    case FD_WORKLOAD_SCHEDULER: return scheduler_case(name, rng);
    case FD_WORKLOAD_INTEGRATED: return integrated(name, rng);
    default: fail(FD_ERR_INVALID_ARGUMENT, "kind %d is not an fd_workload_kind value", kind);
  }
}

}  // namespace fd
