// Host-visible interface of the KV append kernels (kernels/append_*.cu): raw
// append and fused RoPE + append. Plain C++ (runtime API header only), so
// src/cuda can call it from ordinary .cpp files. Every value here is already
// validated by the caller; the kernels trust it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fd {
namespace cuda {

// Largest head_dim the kernels serve (the cos/sin tables of a CTA's tokens
// live in shared memory).
constexpr int kAppendMaxHeadDim = 1024;

struct AppendLaunch {
  int32_t dtype = 0;  // FD_DTYPE_F16 or FD_DTYPE_BF16: q, q_out, k, v (and the caches unless FP8)
  // The caches' type: 0 (or dtype) for dtype, or FD_DTYPE_FP8_E4M3 /
  // FD_DTYPE_FP8_E5M2, which store saturate(x / k_scale) (K) and
  // saturate(x / v_scale) (V).
  int32_t cache_dtype = 0;
  float k_scale = 1.f;
  float v_scale = 1.f;
  int32_t num_tokens = 0;
  int32_t num_q_heads = 0;  // heads of q / q_out (0: no Q)
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t rotary_dim = 0;  // 0: no rotation (raw append)
  float rope_base = 0.f;
  // FD_ROPE_SPLIT_HALF (pairs i, i + R/2) or FD_ROPE_INTERLEAVED (pairs 2i,
  // 2i + 1): a runtime argument, uniform across the launch.
  int32_t rope_style = 0;
  const void *q = nullptr;  // [tokens, num_q_heads, head_dim]; rotated into q_out
  void *q_out = nullptr;    // may equal q
  const void *k = nullptr;  // [tokens, num_kv_heads, head_dim]
  const void *v = nullptr;  // same shape; null: no V
  // Destinations. With block_ids set, element (token i, head h, dim d) goes
  // to k_dst + block_ids[i]*stride_block + h*stride_head +
  // offsets[i]*stride_token + d*stride_dim (same for v_dst). With block_ids
  // null, k_dst / v_dst are contiguous [tokens, num_kv_heads, head_dim] (the
  // rotation-only pass the benchmark compares the fused kernel with).
  void *k_dst = nullptr;
  void *v_dst = nullptr;
  int64_t stride_block = 0;  // elements
  int64_t stride_head = 0;
  int64_t stride_token = 0;
  int64_t stride_dim = 0;
  const int32_t *block_ids = nullptr;  // device memory, [tokens]
  const int32_t *offsets = nullptr;    // device memory, [tokens]
  const int32_t *positions = nullptr;  // device memory, [tokens]; needed when rotating
  cudaStream_t stream = nullptr;
  // Tokens per CTA (1, 2 or 4), for the benchmark's comparison of launch
  // shapes only: the library leaves it 0 (chosen from num_tokens).
  int32_t tokens_per_group = 0;
};

// Enqueues one kernel on launch.stream (no host sync, no allocation:
// graph-capturable). Returns the launch error, if any.
cudaError_t launch_append(const AppendLaunch &launch);

}  // namespace cuda
}  // namespace fd
