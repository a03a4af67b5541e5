// The checked append primitives fd_kv_append / fd_rope_kv_append (S3.2):
// the front end (kv_append_api.cpp) checks every host-known value and
// resolves defaults into an AppendProblem; the CPU backend
// (kv_append_cpu.cpp) or the CUDA backend (backend::cuda_kv_append,
// backend/backend.hpp) runs it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/paged_kv.hpp"
#include "flashdec.h"

namespace fd {

struct AppendProblem {
  // The caches' view (kv.dtype is the stored element type).
  PagedKv kv;
  // Element type of q, k, v and q_out: kv.dtype, or f16/bf16/f32 over an
  // FP8 cache, which quantises K as saturate(k / k_scale) and V likewise
  // (S1.1).
  int32_t src_dtype = FD_DTYPE_BF16;
  float k_scale = 1.f;
  float v_scale = 1.f;
  uint32_t num_tokens = 0;
  uint32_t num_q_heads = 0;  // 0 for the plain append
  uint32_t rotary_dim = 0;   // 0: no rotation (plain append)
  float rope_base = 0.f;
  int32_t rope_style = FD_ROPE_SPLIT_HALF;  // fd_rope_style of the rotation
  const void *q = nullptr;
  void *q_out = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  void *k_cache = nullptr;
  void *v_cache = nullptr;
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

}  // namespace fd
