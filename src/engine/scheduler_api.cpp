// C API of the scheduler, snapshots and decisions (flashdec.h, S9).
#include <cstring>
#include <memory>

#include "core/arg_checks.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"
#include "engine/scheduler_handles.hpp"

using fd::guard;

namespace {

fd_scheduler_config public_config(const fd::SchedulerConfig &c) {
  fd_scheduler_config out;
  fd_scheduler_config_init(&out);
  out.max_active_requests = c.max_active_requests;
  out.max_batch_requests = c.max_batch_requests;
  out.reserve_blocks = c.reserve_blocks;
  out.aging_threshold_steps = c.aging_threshold_steps;
  return out;
}

// Through max_active_requests, for reading and for writing.
constexpr size_t kMinConfigSize = offsetof(fd_scheduler_config, max_batch_requests);

}  // namespace

extern "C" {

FD_API void fd_scheduler_config_init(fd_scheduler_config *config) {
  if (config == nullptr) return;
  std::memset(config, 0, sizeof *config);
  config->struct_size = sizeof *config;
  const fd::SchedulerConfig d;
  config->max_active_requests = d.max_active_requests;
  config->max_batch_requests = d.max_batch_requests;
  config->reserve_blocks = d.reserve_blocks;
  config->aging_threshold_steps = d.aging_threshold_steps;
}

FD_API fd_status fd_scheduler_create(const fd_scheduler_config *config, fd_scheduler **out) {
  return guard([&] {
    fd::require_non_null(out, "out");
    fd_scheduler_config defaults;
    fd_scheduler_config_init(&defaults);
    const fd_scheduler_config c = fd::read_versioned<kMinConfigSize>(config, defaults, "config");
    fd::SchedulerConfig sc;
    sc.max_active_requests = c.max_active_requests;
    sc.max_batch_requests = c.max_batch_requests;
    sc.reserve_blocks = c.reserve_blocks;
    sc.aging_threshold_steps = c.aging_threshold_steps;
    fd::validate_scheduler_config(sc);
    *out = new fd_scheduler{sc};
    return FD_OK;
  });
}

FD_API void fd_scheduler_destroy(fd_scheduler *scheduler) {
  delete scheduler;
}

FD_API fd_status fd_scheduler_get_config(const fd_scheduler *scheduler,
                                         fd_scheduler_config *config) {
  return guard([&] {
    fd::require_non_null(scheduler, "scheduler");
    fd::write_versioned<kMinConfigSize>(config, public_config(scheduler->config), "config");
    return FD_OK;
  });
}

FD_API void fd_request_spec_init(fd_request_spec *spec) {
  if (spec == nullptr) return;
  std::memset(spec, 0, sizeof *spec);
  spec->struct_size = sizeof *spec;
  spec->max_new_tokens = 1;
}

FD_API void fd_snapshot_info_init(fd_snapshot_info *info) {
  if (info == nullptr) return;
  std::memset(info, 0, sizeof *info);
  info->struct_size = sizeof *info;
  info->block_size = 16;
  info->max_blocks = 1024;
  info->free_blocks = 1024;
}

FD_API fd_status fd_snapshot_create(const fd_snapshot_info *info, fd_snapshot **out) {
  return guard([&] {
    fd::require_non_null(out, "out");
    fd_snapshot_info defaults;
    fd_snapshot_info_init(&defaults);
    const fd_snapshot_info in =
        fd::read_versioned<sizeof(fd_snapshot_info)>(info, defaults, "info");
    if (in.block_size == 0) fd::fail(FD_ERR_INVALID_ARGUMENT, "info->block_size must be > 0");
    if (in.max_blocks == 0) fd::fail(FD_ERR_INVALID_ARGUMENT, "info->max_blocks must be > 0");
    if (in.free_blocks > in.max_blocks) {
      fd::fail(FD_ERR_INVALID_ARGUMENT, "info->free_blocks %u exceeds max_blocks %u",
               in.free_blocks, in.max_blocks);
    }
    if (in.resident_prefix_blocks > in.max_blocks - in.free_blocks) {
      fd::fail(FD_ERR_INVALID_ARGUMENT,
               "info->resident_prefix_blocks %u exceeds the used blocks %u (max - free)",
               in.resident_prefix_blocks, in.max_blocks - in.free_blocks);
    }
    if (in.reserved0 != 0) fd::fail(FD_ERR_INVALID_ARGUMENT, "info->reserved0 must be 0");
    auto snap = std::make_shared<fd::Snapshot>();
    snap->block_size = in.block_size;
    snap->max_blocks = in.max_blocks;
    snap->free_blocks = in.free_blocks;
    snap->resident_prefix_blocks = in.resident_prefix_blocks;
    snap->step = in.step;
    snap->version = in.version;
    *out = new fd_snapshot{std::move(snap)};
    return FD_OK;
  });
}

FD_API void fd_snapshot_destroy(fd_snapshot *snapshot) {
  delete snapshot;
}

FD_API fd_status fd_snapshot_get_info(const fd_snapshot *snapshot, fd_snapshot_info *info) {
  return guard([&] {
    fd::require_non_null(snapshot, "snapshot");
    const fd::Snapshot &s = *snapshot->value;
    fd_snapshot_info v;
    fd_snapshot_info_init(&v);
    v.block_size = s.block_size;
    v.max_blocks = s.max_blocks;
    v.free_blocks = s.free_blocks;
    v.resident_prefix_blocks = s.resident_prefix_blocks;
    v.step = s.step;
    v.version = s.version;
    fd::write_versioned<offsetof(fd_snapshot_info, max_blocks)>(info, v, "info");
    return FD_OK;
  });
}

FD_API fd_status fd_snapshot_add_waiting(fd_snapshot *snapshot, const fd_request_spec *spec,
                                         uint32_t wait_steps, uint32_t skip_count) {
  return guard([&] {
    fd::require_non_null(snapshot, "snapshot");
    const fd::RequestSpec s = fd::spec_from_public(spec, snapshot->value->block_size);
    snapshot->mutable_value().add_waiting(s, wait_steps, skip_count);
    return FD_OK;
  });
}

FD_API fd_status fd_snapshot_add_active(fd_snapshot *snapshot, const fd_request_spec *spec,
                                        int32_t seq_len, uint32_t physical_blocks,
                                        uint32_t shared_blocks, uint32_t committed_blocks,
                                        uint32_t service_wait_steps) {
  return guard([&] {
    fd::require_non_null(snapshot, "snapshot");
    const fd::RequestSpec s = fd::spec_from_public(spec, snapshot->value->block_size);
    snapshot->mutable_value().add_active(s, seq_len, physical_blocks, shared_blocks,
                                         committed_blocks, service_wait_steps);
    return FD_OK;
  });
}

FD_API fd_status fd_scheduler_plan(const fd_scheduler *scheduler, const fd_snapshot *snapshot,
                                   fd_decision **out) {
  return guard([&] {
    fd::require_non_null(scheduler, "scheduler");
    fd::require_non_null(snapshot, "snapshot");
    fd::require_non_null(out, "out");
    auto d = std::make_unique<fd_decision>();
    d->value = fd::plan(scheduler->config, snapshot->value);
    *out = d.release();
    return FD_OK;
  });
}

FD_API void fd_decision_destroy(fd_decision *decision) {
  delete decision;
}

FD_API fd_status fd_decision_ids(const fd_decision *decision, int32_t list, uint64_t *ids,
                                 uint32_t capacity, uint32_t *count) {
  return guard([&] {
    fd::require_non_null(decision, "decision");
    fd::require_non_null(count, "count");
    fd::require_aligned(ids, alignof(uint64_t), "ids");
    const fd::Decision &d = decision->value;
    const std::vector<uint64_t> *v = nullptr;
    switch (list) {
      case FD_DECISION_ADMIT: v = &d.admit; break;
      case FD_DECISION_RUNNABLE: v = &d.runnable; break;
      case FD_DECISION_DEFERRED: v = &d.deferred; break;
      case FD_DECISION_WAITING: v = &d.waiting; break;
      case FD_DECISION_REJECTED: v = &d.rejected; break;
      default: fd::fail(FD_ERR_INVALID_ARGUMENT, "list %d is not an fd_decision_list value", list);
    }
    if (capacity < v->size()) {
      if (capacity != 0 || ids != nullptr) {
        fd::fail(FD_ERR_INVALID_ARGUMENT, "capacity %u is below the list length %zu", capacity,
                 v->size());
      }
    } else if (!v->empty()) {
      fd::require_non_null(ids, "ids");
      std::memcpy(ids, v->data(), v->size() * sizeof(uint64_t));
    }
    *count = static_cast<uint32_t>(v->size());
    return FD_OK;
  });
}

FD_API fd_status fd_decision_get_summary(const fd_decision *decision,
                                         fd_decision_summary *summary) {
  return guard([&] {
    fd::require_non_null(decision, "decision");
    const fd::Decision &d = decision->value;
    fd_decision_summary s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.has_drain = d.has_drain ? 1u : 0u;
    s.step = d.snapshot->step;
    s.snapshot_version = d.snapshot->version;
    s.drain_for_request_id = d.drain_for_request_id;
    s.committed_blocks_before = d.committed_before;
    s.committed_blocks_after = d.committed_after;
    s.needed_physical_blocks_now = d.needed_physical_now;
    s.free_blocks_before = d.free_before;
    s.schedulable_blocks = d.schedulable;
    s.reason_count = static_cast<uint32_t>(d.reasons.size());
    fd::write_versioned<offsetof(fd_decision_summary, step)>(summary, s, "summary");
    return FD_OK;
  });
}

FD_API fd_status fd_decision_reasons(const fd_decision *decision, int32_t *reasons,
                                     uint32_t capacity, uint32_t *count) {
  return guard([&] {
    fd::require_non_null(decision, "decision");
    fd::require_non_null(count, "count");
    fd::require_aligned(reasons, alignof(int32_t), "reasons");
    const std::vector<int32_t> &r = decision->value.reasons;
    if (capacity < r.size()) {
      fd::fail(FD_ERR_INVALID_ARGUMENT, "capacity %u is below the reason count %zu", capacity,
               r.size());
    }
    if (!r.empty()) {
      fd::require_non_null(reasons, "reasons");
      std::memcpy(reasons, r.data(), r.size() * sizeof(int32_t));
    }
    *count = static_cast<uint32_t>(r.size());
    return FD_OK;
  });
}

FD_API fd_status fd_decision_get_config(const fd_decision *decision, fd_scheduler_config *config) {
  return guard([&] {
    fd::require_non_null(decision, "decision");
    fd::write_versioned<kMinConfigSize>(config, public_config(decision->value.config), "config");
    return FD_OK;
  });
}

FD_API fd_status fd_decision_copy_snapshot(const fd_decision *decision, fd_snapshot **out) {
  return guard([&] {
    fd::require_non_null(decision, "decision");
    fd::require_non_null(out, "out");
    *out = new fd_snapshot{decision->value.snapshot};
    return FD_OK;
  });
}

}  // extern "C"
