// Which calls the Hopper multi-token kernel (kernels/decode_sm90.cu) serves:
// the rule the CUDA backend's launch (kernels/decode_dispatch.cuh) and its
// split planning (src/attention/decode_splits.cpp) share. Plain C++ with no CUDA
// header, so the CPU unit suite tests/unit_sm90_choice.cpp checks it.
#pragma once

#include <cstdint>

#include "flashdec.h"

namespace fd {
namespace cuda {

// Whether the Hopper kernel (decode_sm90.cu) serves a call on a compute
// capability 9.0 device: several query tokens per row, q and K/V of one
// 16-bit type, token-major, head_dim 64 or 128, no attention variant
// (`plain`), and enough query rows per query tile (`query_rows`: query
// tokens per tile x GQA group) to pay for its 64-row tensor-core tiles: at
// least 16 for head_dim 128, 32 for head_dim 64. With fewer the mma.sync
// kernel, which splits each tile's tokens among its warps, streams K/V
// faster (H200, 64 x 4096: docs/perf/h200-sm90-447e4d8-2026-12-02.md).
// decode_dispatch.cuh launches it exactly then (kHasSm90 and
// DecodeWorkList::sm90_device); the host plans its splits by its CTAs per SM.
inline bool sm90_serves(int32_t q_dtype, int32_t kv_dtype, bool dim_major, int32_t head_dim,
                        int32_t max_q_len, int64_t query_rows, bool plain) {
  const bool t16 = q_dtype == kv_dtype && (q_dtype == FD_DTYPE_F16 || q_dtype == FD_DTYPE_BF16);
  const int64_t min_rows = head_dim == 64 ? 32 : 16;
  return t16 && !dim_major && (head_dim == 64 || head_dim == 128) && max_q_len > 1 &&
         query_rows >= min_rows && plain;
}

}  // namespace cuda
}  // namespace fd
