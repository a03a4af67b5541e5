// Plan / run for decode attention. A plan is made once per step on the host
// (from exact per-row lengths when the caller has them, else from the
// max_seq_len hint) and holds the work list (decode_work.hpp) that every
// layer's run launches. fd_decode is plan + run in one call, with the plan
// on the stack; the engine plans in begin_step and runs in step_layer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/decode_problem.hpp"
#include "attention/decode_work.hpp"

namespace fd {

struct DecodePlan {
  // What the plan was made for; a run must match these (plan_matches).
  uint32_t batch = 0;
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  int32_t q_dtype = FD_DTYPE_BF16;
  int32_t kv_dtype = FD_DTYPE_BF16;
  int32_t out_dtype = FD_DTYPE_BF16;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  int32_t max_q_len = 1;  // query tokens per row the work list has room for
  int32_t device_type = FD_DEVICE_CPU;
  int32_t device_ordinal = 0;
  // The split layout (CUDA); the CPU backend cuts rows into its own fixed
  // chunks at run time and ignores it (num_splits 1).
  DecodeWorkList work;
  // Workspace every run needs (0: none).
  size_t workspace_bytes = 0;
};

// Plans `problem` (already resolved). `host_seq_lens` (problem.batch host
// values, may be null) are checked against [0, max_seq_len]; with them the
// split layout is chosen from their maximum instead of the hint. With
// `limit_by_workspace`, automatic splitting is limited to what the problem's
// workspace holds (fd_decode); without, the plan asks for what it wants.
DecodePlan plan_decode(const DecodeProblem &problem, const int32_t *host_seq_lens,
                       bool limit_by_workspace);

// Runs `problem` with `plan`: checks that the problem matches the plan and
// that its workspace is large enough, then dispatches to the CPU backend
// (which checks the host indices first) or the CUDA backend (launch only).
void run_decode(const DecodePlan &plan, const DecodeProblem &problem);

}  // namespace fd
