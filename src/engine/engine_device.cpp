// Device scratch of an engine, through the backend seam's device buffers
// (backend/backend.hpp). In a CPU-only build the first allocation throws
// FD_ERR_NO_DEVICE; the engine creates a DeviceScratch only for a CUDA cache,
// which cannot exist there.
#include "engine/engine_device.hpp"

#include <algorithm>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "flashdec.h"

namespace fd {

DeviceScratch::DeviceScratch(const DeviceScratchSizes &sizes) : sizes_(sizes) {
  try {
    prefill_q(1);
    reserve(sizes_.initial_rows, sizes_.initial_rows, sizes_.initial_table_entries);
  } catch (...) {
    for (void *p : owned_) backend::cuda_free(sizes_.ordinal, p);
    throw;
  }
}

DeviceScratch::~DeviceScratch() {
  for (void *p : owned_) backend::cuda_free(sizes_.ordinal, p);
}

void *DeviceScratch::allocate(size_t bytes, const char *what) {
  owned_.reserve(owned_.size() + 1);  // so that recording p cannot throw
  void *p = backend::cuda_alloc(sizes_.ordinal, bytes, what);
  owned_.push_back(p);
  return p;
}

void *DeviceScratch::prefill_q(uint32_t tokens) {
  if (tokens <= prefill_tokens_) return prefill_q_;
  const size_t bytes = size_t{tokens} * sizes_.prefill_q_bytes;
  void *q = allocate(bytes, "cudaMalloc (engine prefill scratch)");
  // RoPE runs over it: keep it finite. Cleared and finished here, like the
  // cache's storage, rather than left queued on the legacy default stream
  // (docs/cuda-streams.md).
  backend::cuda_zero_fill_sync(sizes_.ordinal, q, bytes, "clearing the engine's prefill scratch");
  prefill_q_ = q;
  prefill_tokens_ = tokens;
  return q;
}

void DeviceScratch::reserve(uint32_t rows, uint64_t tokens, uint64_t table_entries) {
  if (rows <= rows_ && tokens <= tokens_ && table_entries <= table_entries_) return;
  if (rows > rows_) {
    const uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(
        std::max<uint64_t>(rows, uint64_t{rows_} * 2), std::max(sizes_.max_rows, rows)));
    void *lens = allocate(size_t{want} * sizeof(int32_t), "cudaMalloc (engine seq_lens scratch)");
    void *indptr =
        allocate((size_t{want} + 1) * sizeof(int32_t), "cudaMalloc (engine q_indptr scratch)");
    lens_ = static_cast<int32_t *>(lens);
    indptr_ = static_cast<int32_t *>(indptr);
    rows_ = want;
  }
  if (tokens > tokens_) {
    const uint64_t want =
        std::min(std::max(tokens, tokens_ * 2), std::max(sizes_.max_tokens, tokens));
    q_rotated_ = allocate(static_cast<size_t>(want) * sizes_.q_row_bytes,
                          "cudaMalloc (engine rotated-q scratch)");
    tokens_ = want;
  }
  if (table_entries > table_entries_) {
    const uint64_t want = std::min(std::max(table_entries, table_entries_ * 2),
                                   std::max(sizes_.max_table_entries, table_entries));
    tables_ = static_cast<int32_t *>(
        allocate(static_cast<size_t>(want) * sizeof(int32_t), "cudaMalloc (engine table scratch)"));
    table_entries_ = want;
  }
}

void DeviceScratch::allocate_workspace(size_t bytes) {
  if (bytes == 0) return;
  workspace_ = allocate(bytes, "cudaMalloc (engine split-KV workspace)");
  workspace_size_ = bytes;
}

void DeviceScratch::require_device_pointer(const void *p, int32_t ordinal, const char *what) {
  if (!backend::is_cuda_device_memory(p, ordinal)) {
    fail(FD_ERR_INVALID_ARGUMENT, "%s is not device memory of CUDA device %d (the cache's device)",
         what, ordinal);
  }
}

void DeviceScratch::synchronize_default_stream(int32_t ordinal) {
  backend::cuda_sync_default_stream(ordinal, "cudaStreamSynchronize (prefill)");
}

}  // namespace fd
