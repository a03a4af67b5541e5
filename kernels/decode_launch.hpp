// Host-visible interface of the CUDA paged decode kernels (kernels/*.cu).
// Plain C++: includes no CUDA header beyond the runtime API, so src/cuda can
// call it from ordinary .cpp files. Every value here is already validated by
// src/cuda/decode_cuda.cpp; the kernels trust it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "attention/decode_limits.hpp"
#include "attention/decode_work.hpp"
#include "attention/sm90_choice.hpp"
#include "attention/swap_choice.hpp"
#include "attention/variant.hpp"

namespace fd {
namespace cuda {

struct DecodeLaunch {
  int32_t q_dtype = 0;     // FD_DTYPE_F16 or FD_DTYPE_BF16 (q and out)
  int32_t kv_dtype = 0;    // FD_DTYPE_F16, FD_DTYPE_BF16 (== q_dtype) or FD_DTYPE_FP8_E4M3
  float k_scale = 1.f;     // K dequantisation scale (folded into the logit scale)
  float v_scale = 1.f;     // V dequantisation scale (one multiply on the output)
  bool dim_major = false;  // FD_LAYOUT_DIM_MAJOR
  int32_t head_dim = 0;    // 64, 96, 128 or 256 (96 and 256: 16-bit K/V only)
  const void *q = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  void *out = nullptr;
  const int32_t *block_tables = nullptr;
  const int32_t *seq_lens = nullptr;
  const int32_t *q_indptr = nullptr;  // [batch + 1] query-token offsets, or null
  int64_t stride_block = 0;           // elements
  int64_t stride_head = 0;
  int64_t stride_token = 0;     // 1 for dim-major
  int64_t stride_dim = 0;       // 1 for token-major
  int32_t block_size_log2 = 0;  // block size 8, 16 or 32
  int32_t num_blocks = 0;
  int32_t max_blocks_per_seq = 0;
  Variant variant;              // the softmax variant (attention/variant.hpp)
  DecodeWorkList work;          // the plan's work list (attention/decode_work.hpp)
  float *partial_o = nullptr;   // [partial slots, head_dim]
  float *partial_ml = nullptr;  // [partial slots, 2]: max, sum
  cudaStream_t stream = nullptr;
};

// Makes the attention kernel that `launch` names (element types, head_dim,
// layout, one or several query tokens per row: work.max_q_len) launchable
// on the current device: raises its dynamic shared memory
// limit, a per-device setting. A plan calls it once; launch_decode relies on
// it for every launch of that kernel on that device.
cudaError_t prepare_decode(const DecodeLaunch &launch);

// Enqueues the attention kernel over launch.work (and, when the work list
// has partials, the merge kernel) on launch.stream. Returns the first CUDA error (launch or
// configuration).
cudaError_t launch_decode(const DecodeLaunch &launch);

// CTAs of the attention kernel that fit on one multiprocessor (by its shared
// memory use; `sm90`: of the Hopper kernel); the host uses it to size
// split-KV so the grid fills the GPU.
int decode_ctas_per_sm(int32_t head_dim, bool sm90 = false);

// CTAs per SM of the deep shape of head_dim 128 over 16-bit K/V (3 stages
// instead of 2; DecodeWorkList::deep_stages).
int decode_deep_ctas_per_sm();

// CTAs per SM of the swapped-operand FP8 kernel at head_dim 64 or 128 (the
// calls takes_swapped serves, attention/decode_splits.hpp), in its regular
// or (`deep`) its deep shape.
int decode_swap_ctas_per_sm(int32_t head_dim, bool deep = false);

namespace sm90 {
// CTAs of the Hopper kernel (decode_sm90.cu) per SM at head_dim 64 or 128.
int ctas_per_sm(int32_t head_dim);
}  // namespace sm90

}  // namespace cuda
}  // namespace fd
