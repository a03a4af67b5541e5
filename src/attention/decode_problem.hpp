// The seam between the decode front end (argument checks, defaults) and its
// backends. The front end (attention/decode_params.cpp) turns the public
// fd_decode_params into a DecodeProblem with every default resolved; the CPU
// backend (attention/decode_cpu.cpp) or the CUDA backend (backend/backend.hpp)
// runs it, with the work list of a plan (attention/decode_plan.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/paged_kv.hpp"
#include "attention/variant.hpp"
#include "flashdec.h"

namespace fd {

struct DecodeProblem {
  // Shape.
  uint32_t batch = 0;
  uint32_t num_q_heads = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t group_size = 0;  // num_q_heads / num_kv_heads
  // Element types (kv.dtype is the K/V type).
  int32_t q_dtype = FD_DTYPE_BF16;
  int32_t out_dtype = FD_DTYPE_BF16;
  // Paged K/V: the resolved view, its memory and the per-row indices.
  PagedKv kv;
  const void *k = nullptr;
  const void *v = nullptr;
  uint32_t max_blocks_per_seq = 0;
  const int32_t *block_tables = nullptr;
  const int32_t *seq_lens = nullptr;
  // Queries and output: row r's query tokens are q_first(r) ..
  // q_first(r) + q_len(r) - 1 of q and out, the last one at K/V position
  // seq_lens[r] - 1 (causal: query j of the row sees positions
  // <= seq_lens[r] - q_len(r) + j). Without q_indptr every row has one.
  const void *q = nullptr;
  void *out = nullptr;
  const int32_t *q_indptr = nullptr;  // [batch + 1] offsets, or null
  int32_t max_q_len = 1;              // max_q_len_hint resolved (1 when not given)
  bool max_q_len_given = false;       // max_q_len_hint > 0: rows longer are refused
  int64_t q_tokens = 0;               // query tokens in all (q and out hold as many)
  int32_t q_first(uint32_t row) const {
    return q_indptr != nullptr ? q_indptr[row] : static_cast<int32_t>(row);
  }
  int32_t q_len(uint32_t row) const {
    return q_indptr != nullptr ? q_indptr[row + 1] - q_indptr[row] : 1;
  }
  // Dequantisation scales of the stored K and V (S1.1): attention reads
  // K as stored x k_scale and V as stored x v_scale (1 unless FP8).
  float k_scale = 1.f;
  float v_scale = 1.f;
  // Variant.
  Variant variant;
  // Execution.
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

// What the resolved parameters are for: a run needs every buffer (non-null,
// out not overlapping the inputs); a plan or a workspace query reads none of
// them, so they may be NULL there (given ones must still be aligned).
enum class DecodeUse { run, plan };

// Checks every host-known parameter and resolves defaults. Throws fd::Error
// (FD_ERR_INVALID_ARGUMENT / FD_ERR_UNSUPPORTED) naming the parameter.
DecodeProblem resolve_decode_params(const fd_decode_params *params, DecodeUse use = DecodeUse::run);

// CPU backend: synchronous, multi-threaded; indices already checked.
void decode_cpu(const DecodeProblem &problem);

}  // namespace fd
