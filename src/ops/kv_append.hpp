// The checked append primitives fd_kv_append / fd_rope_kv_append (S3.2):
// the front end (kv_append_api.cpp) checks every host-known value and
// resolves defaults into an AppendProblem; the CPU backend
// (kv_append_cpu.cpp) or the CUDA backend (src/cuda/append_cuda.cpp, or the
// stub in kv_append_nocuda.cpp without CUDA) runs it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashdec.h"

namespace fd {

struct AppendProblem {
  int32_t dtype = FD_DTYPE_BF16;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  uint32_t num_tokens = 0;
  uint32_t num_q_heads = 0;  // 0 for the plain append
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_size = 0;
  uint32_t num_blocks = 0;
  uint32_t rotary_dim = 0;  // 0: no rotation (plain append)
  float rope_base = 0.f;
  const void *q = nullptr;
  void *q_out = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  void *k_cache = nullptr;
  void *v_cache = nullptr;
  int64_t strides[4] = {0, 0, 0, 0};  // block, head, token, dim (resolved)
  const int32_t *block_ids = nullptr;
  const int32_t *offsets = nullptr;
  const int32_t *positions = nullptr;  // null for the plain append
  int32_t device_type = FD_DEVICE_CPU;
  int32_t device_ordinal = 0;
  fd_stream stream = nullptr;
};

// Checks block_ids, offsets and (when rotating) positions, which must be
// host memory here. Throws FD_ERR_INVALID_ARGUMENT naming the first bad entry.
void check_append_indices(const AppendProblem &p, const int32_t *block_ids, const int32_t *offsets,
                          const int32_t *positions);

// CPU backend: synchronous. Arguments are valid.
void kv_append_cpu(const AppendProblem &p);

// CUDA backend: checks what only it limits, copies the index arrays to the
// host and synchronises the stream to check them, then enqueues the kernel.
void kv_append_cuda(const AppendProblem &p);

}  // namespace fd
