// Which calls the swapped-operand FP8 decode kernel (kernels/decode_swapped.cuh)
// serves: the rule the CUDA backend's launch (kernels/decode_dispatch.cuh) and
// its split planning (src/attention/decode_splits.cpp, which counts that
// kernel's CTAs per SM for them) share. Plain C++ with no CUDA header.
#pragma once

#include <cstdint>

#include "attention/decode_limits.hpp"
#include "core/dtype.hpp"
#include "flashdec.h"

namespace fd {
namespace cuda {

// FP8 (E4M3 or E5M2) K/V in either layout, one query token per row, a GQA
// group of at most kDecodeSwapMaxGroup heads (the n = 8 columns of its mma),
// no attention variant (`plain`).
inline bool swapped_serves(int32_t kv_dtype, int32_t max_q_len, int64_t group, bool plain) {
  return dtype_is_fp8(kv_dtype) && max_q_len <= 1 && group <= kDecodeSwapMaxGroup && plain;
}

}  // namespace cuda
}  // namespace fd
