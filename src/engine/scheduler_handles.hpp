// Definitions of the opaque scheduler handles, shared by the scheduler and
// engine C API files.
#pragma once

#include <memory>

#include "engine/scheduler.hpp"

struct fd_scheduler {
  fd::SchedulerConfig config;
};

// Snapshots are shared copy-on-write: a decision keeps the snapshot it was
// planned from without copying it, and a later add_* on the caller's handle
// clones first.
struct fd_snapshot {
  std::shared_ptr<const fd::Snapshot> value;
  fd::Snapshot &mutable_value() {
    if (value.use_count() != 1) value = std::make_shared<fd::Snapshot>(*value);
    return const_cast<fd::Snapshot &>(*value);
  }
};

struct fd_decision {
  fd::Decision value;
};
