// Workload drivers (docs/semantics.md S10): deterministic, seeded scenarios that
// run the engine under one admission policy and report comparable numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashdec.h"

namespace fd {

struct PlannedRequest {
  uint64_t id = 0;
  uint64_t arrival = 0;  // iteration at which it is submitted
  uint32_t context = 0;
  uint32_t new_tokens = 1;
  std::string prefix;      // requested prefix ("" for none)
  int64_t cancel_at = -1;  // iteration of a scripted cancellation
};

struct WorkloadCase {
  std::string name;
  int32_t kind = FD_WORKLOAD_SCHEDULER;
  uint32_t layers = 1, kv_heads = 1, q_heads = 1, head_dim = 8, block_size = 16;
  uint32_t max_blocks = 16, prefix_capacity = 0;
  int32_t dtype = FD_DTYPE_F32;
  uint32_t max_active = 8, max_batch = 8, reserve = 0;
  uint32_t deadlock_after = 8;  // consecutive stalled iterations
  uint64_t max_iterations = 4000;
  int64_t inject_failure_at = -1;                          // iteration whose step fails mid-way
  std::vector<std::pair<std::string, uint32_t>> prefixes;  // registered: id, blocks
  std::vector<PlannedRequest> requests;
  std::vector<int32_t> policies;
};

struct WorkloadRun {
  fd_workload_report report{};
  std::vector<fd_workload_trace_point> trace;
};

// Names of the cases of a kind (static strings).
const std::vector<const char *> &workload_case_names(int32_t kind);
// Builds a case from its name and seed; throws FD_ERR_NOT_FOUND.
WorkloadCase make_workload_case(int32_t kind, const std::string &name, uint64_t seed);
// Runs one policy on a case. Throws FD_ERR_INVARIANT when an engine or cache
// invariant breaks.
WorkloadRun run_workload(const WorkloadCase &c, int32_t policy, uint64_t seed, uint32_t cpu_threads,
                         fd_workload_progress_fn progress, void *user, uint64_t progress_base,
                         uint64_t progress_total);

}  // namespace fd

struct fd_workload_result {
  std::vector<fd::WorkloadRun> runs;
};
