// Plan / run for decode attention and its public entry points: fd_decode,
// fd_decode_workspace_size and the fd_decode_plan functions.
#include "attention/decode_plan.hpp"

#include <algorithm>
#include <cstdint>
#include <new>

#include "attention/decode_cpu_indices.hpp"
#include "backend/backend.hpp"
#include "core/arg_checks.hpp"
#include "core/error.hpp"

// The public handle is the internal plan itself.
struct fd_decode_plan {
  fd::DecodePlan plan;
};

namespace fd {
namespace {

void check_host_lens(const DecodeProblem &pb, const int32_t *lens) {
  for (uint32_t r = 0; r < pb.batch; ++r)
    if (lens[r] < 0 || lens[r] > pb.max_seq_len)
      fail(FD_ERR_INVALID_ARGUMENT,
           "host_seq_lens[%u] = %d is out of range [0, max_seq_len_hint = %d] (row %u)", r,
           static_cast<int>(lens[r]), static_cast<int>(pb.max_seq_len), r);
}

// The fields a plan is made for: the work list's shape and the kernel it
// prepares (element types, head_dim, layout, device). Everything else a run
// takes from its own params (buffers, stream, strides, the variant).
void check_matches(const DecodePlan &plan, const DecodeProblem &pb) {
  const struct {
    const char *name;
    int64_t planned, given;
  } fields[] = {{"batch", plan.batch, pb.batch},
                {"num_q_heads", plan.num_q_heads, pb.num_q_heads},
                {"num_kv_heads", plan.num_kv_heads, pb.num_kv_heads},
                {"head_dim", plan.head_dim, pb.head_dim},
                {"q_dtype", plan.q_dtype, pb.q_dtype},
                {"kv_dtype", plan.kv_dtype, pb.kv.dtype},
                {"out_dtype", plan.out_dtype, pb.out_dtype},
                {"layout", plan.layout, pb.kv.layout},
                {"max_q_len_hint", plan.max_q_len, pb.max_q_len},
                {"device.type", plan.device_type, pb.device_type},
                {"device.ordinal", plan.device_ordinal, pb.device_ordinal}};
  for (const auto &f : fields)
    if (f.planned != f.given)
      fail(FD_ERR_INVALID_ARGUMENT, "params %s %lld differs from the plan's %lld", f.name,
           static_cast<long long>(f.given), static_cast<long long>(f.planned));
}

void check_workspace(const DecodePlan &plan, const DecodeProblem &pb) {
  if (plan.workspace_bytes == 0) return;
  if (pb.workspace == nullptr || pb.workspace_size < plan.workspace_bytes)
    fail(FD_ERR_INVALID_ARGUMENT,
         "workspace_size %zu is too small: num_splits %d needs %zu bytes "
         "(see fd_decode_workspace_size)",
         pb.workspace == nullptr ? size_t{0} : pb.workspace_size, plan.work.num_splits,
         plan.workspace_bytes);
  if (!is_aligned(pb.workspace, 16))
    fail(FD_ERR_UNSUPPORTED, "workspace must be 16-byte aligned on CUDA");
}

}  // namespace

DecodePlan plan_decode(const DecodeProblem &problem, const int32_t *host_seq_lens,
                       bool limit_by_workspace) {
  DecodePlan plan;
  plan.batch = problem.batch;
  plan.num_q_heads = problem.num_q_heads;
  plan.num_kv_heads = problem.num_kv_heads;
  plan.head_dim = problem.head_dim;
  plan.q_dtype = problem.q_dtype;
  plan.kv_dtype = problem.kv.dtype;
  plan.out_dtype = problem.out_dtype;
  plan.layout = problem.kv.layout;
  plan.max_q_len = problem.max_q_len;
  plan.device_type = problem.device_type;
  plan.device_ordinal = problem.device_ordinal;
  if (host_seq_lens != nullptr) check_host_lens(problem, host_seq_lens);
  if (problem.device_type == FD_DEVICE_CPU) {
    // The CPU backend's chunks depend only on each row's length, never on a
    // plan (its partial results live in per-thread host scratch).
    plan.work.batch = static_cast<int32_t>(problem.batch);
    plan.work.num_kv_heads = static_cast<int32_t>(problem.num_kv_heads);
    plan.work.group_size = static_cast<int32_t>(problem.group_size);
    return plan;
  }
  plan.work = backend::cuda_plan_decode(problem, host_seq_lens, limit_by_workspace);
  plan.workspace_bytes = backend::cuda_decode_workspace_bytes(problem, plan.work);
  return plan;
}

void run_decode(const DecodePlan &plan, const DecodeProblem &problem) {
  check_matches(plan, problem);
  check_workspace(plan, problem);
  if (problem.device_type == FD_DEVICE_CPU) {
    // Host pointers: the indices are cheap to check, so they always are.
    check_decode_indices(problem, problem.seq_lens, problem.block_tables, problem.q_indptr);
    decode_cpu(problem);
  } else {
    backend::cuda_run_decode(problem, plan.work);
  }
}

}  // namespace fd

extern "C" {

FD_API fd_status fd_decode_workspace_size(const fd_decode_params *params, size_t *bytes) {
  return fd::guard([&] {
    const fd::DecodeProblem problem = fd::resolve_decode_params(params, fd::DecodeUse::plan);
    fd::require_non_null(bytes, "bytes");
    *bytes = fd::plan_decode(problem, nullptr, false).workspace_bytes;
    return FD_OK;
  });
}

FD_API fd_status fd_decode(const fd_decode_params *params) {
  return fd::guard([&] {
    const fd::DecodeProblem problem = fd::resolve_decode_params(params);
    // Automatic splitting fits the workspace the caller gave.
    const fd::DecodePlan plan = fd::plan_decode(problem, nullptr, problem.num_splits == 0);
    fd::run_decode(plan, problem);
    return FD_OK;
  });
}

FD_API fd_status fd_decode_plan_create(const fd_decode_params *params, const int32_t *host_seq_lens,
                                       fd_decode_plan **out) {
  return fd::guard([&] {
    const fd::DecodeProblem problem = fd::resolve_decode_params(params, fd::DecodeUse::plan);
    fd::require_non_null(out, "out");
    fd::require_aligned(host_seq_lens, sizeof(int32_t), "host_seq_lens");
    // Automatic splitting fits the caller's workspace when one is named;
    // otherwise the plan says how much every run needs.
    const bool limit = problem.num_splits == 0 && problem.workspace != nullptr;
    const fd::DecodePlan plan = fd::plan_decode(problem, host_seq_lens, limit);
    // Plain new (its nothrow form is another operator an allocator may
    // replace separately from delete): a failure is this call's out of memory.
    fd_decode_plan *handle = nullptr;
    try {
      handle = new fd_decode_plan{plan};
    } catch (const std::bad_alloc &) {
      fd::fail(FD_ERR_OUT_OF_MEMORY, "allocating an fd_decode_plan");
    }
    *out = handle;
    return FD_OK;
  });
}

FD_API void fd_decode_plan_destroy(fd_decode_plan *plan) {
  delete plan;
}

FD_API fd_status fd_decode_plan_workspace_size(const fd_decode_plan *plan, size_t *bytes) {
  return fd::guard([&] {
    fd::require_non_null(plan, "plan");
    fd::require_non_null(bytes, "bytes");
    *bytes = plan->plan.workspace_bytes;
    return FD_OK;
  });
}

FD_API fd_status fd_decode_run(const fd_decode_plan *plan, const fd_decode_params *params) {
  return fd::guard([&] {
    fd::require_non_null(plan, "plan");
    const fd::DecodeProblem problem = fd::resolve_decode_params(params);
    fd::run_decode(plan->plan, problem);
    return FD_OK;
  });
}

}  // extern "C"
