// The block-aware lifetime-commitment scheduler (docs/semantics.md S9) as plain
// C++ values. plan() is a pure function of its inputs; the C API in
// scheduler_api.cpp wraps these types in opaque handles.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "flashdec.h"

namespace fd {

struct SchedulerConfig {
  uint32_t max_active_requests = 64;
  uint32_t max_batch_requests = 64;
  uint32_t reserve_blocks = 0;
  uint32_t aging_threshold_steps = 8;
  bool operator==(const SchedulerConfig &o) const {
    return max_active_requests == o.max_active_requests &&
           max_batch_requests == o.max_batch_requests && reserve_blocks == o.reserve_blocks &&
           aging_threshold_steps == o.aging_threshold_steps;
  }
};

// Checks the S9 limits; throws FD_ERR_INVALID_ARGUMENT naming the field.
void validate_scheduler_config(const SchedulerConfig &config);

struct RequestSpec {
  uint64_t id = 0;
  uint64_t submission_order = 0;
  uint32_t initial_context_tokens = 0;
  uint32_t max_new_tokens = 1;
  uint32_t prefix_blocks = 0;
  std::string prefix_id;  // empty: no prefix
  bool operator==(const RequestSpec &o) const {
    return id == o.id && submission_order == o.submission_order &&
           initial_context_tokens == o.initial_context_tokens &&
           max_new_tokens == o.max_new_tokens && prefix_blocks == o.prefix_blocks &&
           prefix_id == o.prefix_id;
  }
};

// Reads a caller's fd_request_spec (struct_size policy of core/versioned.hpp;
// every field is required). Throws FD_ERR_INVALID_ARGUMENT.
fd_request_spec read_request_spec(const fd_request_spec *spec);

// Converts and checks a public spec (block_size decides the prefix rule).
// Throws FD_ERR_INVALID_ARGUMENT naming the field.
RequestSpec spec_from_public(const fd_request_spec *spec, uint32_t block_size);
// Checks a spec's own rules against block_size.
void validate_spec(const RequestSpec &spec, uint32_t block_size);

inline uint32_t ceil_div(uint64_t a, uint64_t b) {
  return static_cast<uint32_t>((a + b - 1) / b);
}

inline uint32_t lifetime_blocks(const RequestSpec &s, uint32_t block_size) {
  return ceil_div(uint64_t{s.initial_context_tokens} + s.max_new_tokens, block_size);
}
inline uint32_t private_commitment(const RequestSpec &s, uint32_t block_size) {
  return lifetime_blocks(s, block_size) - s.prefix_blocks;
}
// Private blocks the prompt occupies once prefilled (0 for prefixed requests,
// whose whole context is the shared prefix).
inline uint32_t private_context_blocks(const RequestSpec &s, uint32_t block_size) {
  return ceil_div(s.initial_context_tokens, block_size) - s.prefix_blocks;
}

struct WaitingEntry {
  RequestSpec spec;
  uint32_t wait_steps = 0;
  uint32_t skip_count = 0;
  bool operator==(const WaitingEntry &o) const {
    return spec == o.spec && wait_steps == o.wait_steps && skip_count == o.skip_count;
  }
};

struct ActiveEntry {
  RequestSpec spec;
  int32_t seq_len = 0;
  uint32_t physical_blocks = 0;
  uint32_t shared_blocks = 0;
  uint32_t committed_blocks = 0;
  uint32_t service_wait_steps = 0;
  bool operator==(const ActiveEntry &o) const {
    return spec == o.spec && seq_len == o.seq_len && physical_blocks == o.physical_blocks &&
           shared_blocks == o.shared_blocks && committed_blocks == o.committed_blocks &&
           service_wait_steps == o.service_wait_steps;
  }
};

struct Snapshot {
  uint32_t block_size = 16;
  uint32_t max_blocks = 1024;
  uint32_t free_blocks = 1024;
  uint32_t resident_prefix_blocks = 0;
  uint64_t step = 0;
  uint64_t version = 0;
  std::vector<WaitingEntry> waiting;  // insertion order
  std::vector<ActiveEntry> active;    // insertion order
  // Uniqueness indexes (derived from the entries).
  std::unordered_set<uint64_t> ids;
  std::unordered_set<uint64_t> orders;

  // Validated builders: throw (and change nothing) on a violation.
  void add_waiting(const RequestSpec &spec, uint32_t wait_steps, uint32_t skip_count);
  void add_active(const RequestSpec &spec, int32_t seq_len, uint32_t physical, uint32_t shared,
                  uint32_t committed, uint32_t service_wait);
  // The pool-wide equation of S9: resident + sum(physical - shared) ==
  // max_blocks - free_blocks. Throws FD_ERR_INVALID_ARGUMENT.
  void validate_pool() const;
};

// Finds the first difference between two snapshots ("" when equal, entry
// order included).
std::string snapshot_difference(const Snapshot &a, const Snapshot &b);

struct Decision {
  SchedulerConfig config;
  std::shared_ptr<const Snapshot> snapshot;
  std::vector<uint64_t> admit, runnable, deferred, waiting, rejected;
  uint32_t committed_before = 0;
  uint32_t committed_after = 0;
  uint32_t needed_physical_now = 0;
  uint32_t free_before = 0;
  uint32_t schedulable = 0;
  bool has_drain = false;
  uint64_t drain_for_request_id = 0;
  std::vector<int32_t> reasons;  // fd_schedule_reason values, fixed order
};

// Plans one step (S9). Pure and deterministic. Throws FD_ERR_INVALID_ARGUMENT
// for an inconsistent snapshot and FD_ERR_INTERNAL if the result would break
// the plan's own guarantees.
Decision plan(const SchedulerConfig &config, std::shared_ptr<const Snapshot> snapshot);

// Names the first difference between the outcomes of two decisions ("" when
// equal). Snapshots and configs are not compared here.
std::string decision_outcome_difference(const Decision &a, const Decision &b);

}  // namespace fd
