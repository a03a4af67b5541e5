// The seam between fd_decode's front end (argument checks, defaults) and its
// backends. fd_decode turns the public fd_decode_params into a DecodeProblem
// with every default resolved, then hands it to the CPU or the CUDA backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashdec.h"

namespace fd {

struct DecodeProblem {
  int32_t dtype = FD_DTYPE_BF16;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  uint32_t batch = 0;
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_size = 0;
  uint32_t num_blocks = 0;
  uint32_t max_blocks_per_seq = 0;
  uint32_t group_size = 0;  // num_q_heads / num_kv_heads
  float sm_scale = 0.f;     // resolved: never 0
  const void *q = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  // Element strides of (block, kv head, token, dim), resolved from the layout
  // when the caller passed all zeros.
  int64_t stride_block = 0;
  int64_t stride_head = 0;
  int64_t stride_token = 0;
  int64_t stride_dim = 0;
  const int32_t *block_tables = nullptr;
  const int32_t *seq_lens = nullptr;
  void *out = nullptr;
  int32_t max_seq_len = 0;  // resolved hint: in (0, max_blocks_per_seq * block_size]
  int32_t num_splits = 0;   // as requested: 0 automatic, 1 none, n > 1 fixed
  void *workspace = nullptr;
  size_t workspace_size = 0;
  int32_t device_type = FD_DEVICE_CPU;
  int32_t device_ordinal = 0;
  fd_stream stream = nullptr;
  uint32_t cpu_threads = 0;
  uint32_t flags = 0;
};

// Checks every host-known parameter and resolves defaults. Throws fd::Error
// (FD_ERR_INVALID_ARGUMENT / FD_ERR_UNSUPPORTED) naming the parameter.
DecodeProblem resolve_decode_params(const fd_decode_params *params);

// CPU backend (src/ops): synchronous, multi-threaded.
void decode_cpu(const DecodeProblem &problem);

// CUDA backend (src/cuda; src/nocuda when built without CUDA, where these
// throw FD_ERR_NO_DEVICE). Enqueue on problem.stream; never synchronise,
// allocate or read device memory on the host (unless FD_DECODE_CHECK_INDICES).
void decode_cuda(const DecodeProblem &problem);
size_t decode_cuda_workspace_size(const DecodeProblem &problem);

}  // namespace fd
