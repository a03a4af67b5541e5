// C API of the workload drivers (flashdec.h, S10).
#include <cstring>
#include <memory>

#include "core/arg_checks.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"
#include "engine/workloads.hpp"

using fd::guard;

namespace {

// A report is useful only with its case name, and the 32-byte name must not
// be cut by the helper's rounding: the minimum runs through case_name.
constexpr size_t kMinReportSize = offsetof(fd_workload_report, seed);
static_assert(offsetof(fd_workload_report, case_name) + sizeof(fd_workload_report::case_name) ==
                  kMinReportSize,
              "case_name ends where the minimum report ends");

const fd::WorkloadRun &run_at(const fd_workload_result *result, uint32_t index) {
  fd::require_non_null(result, "result");
  if (index >= result->runs.size()) {
    fd::fail(FD_ERR_INVALID_ARGUMENT, "index %u is out of range (%zu runs)", index,
             result->runs.size());
  }
  return result->runs[index];
}
}  // namespace

extern "C" {

FD_API void fd_workload_options_init(fd_workload_options *options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof *options);
  options->struct_size = sizeof *options;
  options->kind = FD_WORKLOAD_SCHEDULER;
  options->cpu_threads = 1;
}

FD_API fd_status fd_workload_case_name(int32_t kind, uint32_t index, const char **name) {
  return guard([&] {
    fd::require_non_null(name, "name");
    const std::vector<const char *> &names = fd::workload_case_names(kind);
    if (index >= names.size()) {
      fd::fail(FD_ERR_NOT_FOUND, "workload kind %d has %zu cases; index %u is past the last", kind,
               names.size(), index);
    }
    *name = names[index];
    return FD_OK;
  });
}

FD_API fd_status fd_workload_run(const fd_workload_options *options, fd_workload_result **out) {
  return guard([&] {
    fd::require_non_null(out, "out");
    fd_workload_options defaults;
    fd_workload_options_init(&defaults);
    const fd_workload_options o =
        fd::read_versioned<offsetof(fd_workload_options, seed)>(options, defaults, "options");
    fd::require_non_null(o.case_name, "options->case_name");
    if (o.reserved0 != 0) fd::fail(FD_ERR_INVALID_ARGUMENT, "options->reserved0 must be 0");
    const fd::WorkloadCase c = fd::make_workload_case(o.kind, o.case_name, o.seed);
    auto result = std::make_unique<fd_workload_result>();
    const uint64_t total = c.max_iterations * c.policies.size();
    uint64_t base = 0;
    for (int32_t policy : c.policies) {
      result->runs.push_back(fd::run_workload(c, policy, o.seed, o.cpu_threads, o.progress,
                                              o.progress_user_data, base, total));
      base += c.max_iterations;
    }
    if (o.progress != nullptr) o.progress(o.progress_user_data, total, total);
    *out = result.release();
    return FD_OK;
  });
}

FD_API void fd_workload_result_destroy(fd_workload_result *result) {
  delete result;
}

FD_API fd_status fd_workload_result_count(const fd_workload_result *result, uint32_t *count) {
  return guard([&] {
    fd::require_non_null(result, "result");
    fd::require_non_null(count, "count");
    *count = static_cast<uint32_t>(result->runs.size());
    return FD_OK;
  });
}

FD_API fd_status fd_workload_result_report(const fd_workload_result *result, uint32_t index,
                                           fd_workload_report *report) {
  return guard([&] {
    const fd::WorkloadRun &r = run_at(result, index);
    fd::write_versioned<kMinReportSize>(report, r.report, "report");
    return FD_OK;
  });
}

FD_API fd_status fd_workload_result_trace(const fd_workload_result *result, uint32_t index,
                                          fd_workload_trace_point *points, uint32_t capacity,
                                          uint32_t *count) {
  return guard([&] {
    const fd::WorkloadRun &r = run_at(result, index);
    fd::require_non_null(count, "count");
    fd::require_aligned(points, alignof(fd_workload_trace_point), "points");
    const size_t n = r.trace.size();
    if (capacity < n) {
      if (capacity != 0 || points != nullptr) {
        fd::fail(FD_ERR_INVALID_ARGUMENT, "capacity %u is below the trace length %zu", capacity, n);
      }
    } else if (n != 0) {
      fd::require_non_null(points, "points");
      std::memcpy(points, r.trace.data(), n * sizeof(fd_workload_trace_point));
    }
    *count = static_cast<uint32_t>(n);
    return FD_OK;
  });
}

}  // extern "C"
