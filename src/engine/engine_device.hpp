// Device scratch of an engine on a CUDA cache: rotated Q, block tables,
// effective seq_lens, query-token offsets, split-KV workspace and a dummy Q
// for prefill. Sized at creation from the cache geometry and grown (doubling)
// only when a step has more rows, tokens or a larger table than any before; replaced buffers are
// kept until the engine is destroyed, because queued work may still read them and freeing would
// synchronise the host. Memory comes through the backend seam (backend::cuda_alloc and friends): in
// builds without CUDA creating one fails with FD_ERR_NO_DEVICE (no CUDA cache can exist there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fd {

struct DeviceScratchSizes {
  int32_t ordinal = 0;
  size_t q_row_bytes = 0;      // per token: num_q_heads * head_dim * element size
  size_t prefill_q_bytes = 0;  // per token: num_kv_heads * head_dim * element size
  uint32_t max_rows = 0;       // hard bound on rows: the cache's max_blocks
  uint64_t max_tokens = 0;     // hard bound on a step's tokens: max_blocks * block_size
  uint64_t max_table_entries = 0;
  uint32_t initial_rows = 0;
  uint64_t initial_table_entries = 0;
};

class DeviceScratch {
 public:
  explicit DeviceScratch(const DeviceScratchSizes &sizes);
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch &) = delete;
  DeviceScratch &operator=(const DeviceScratch &) = delete;

  // Makes room for `rows` rows, `tokens` query tokens and `table_entries`
  // table entries (grows to max(need, 2 * current), within the hard bounds).
  // Throws FD_ERR_OUT_OF_MEMORY / FD_ERR_DEVICE; on failure the buffers in
  // use stay valid (a capacity may have grown, which nothing observes).
  void reserve(uint32_t rows, uint64_t tokens, uint64_t table_entries);
  // Allocates the split-KV workspace (once, at creation).
  void allocate_workspace(size_t bytes);

  void *q_rotated() const { return q_rotated_; }
  int32_t *tables() const { return tables_; }
  int32_t *lens() const { return lens_; }
  int32_t *indptr() const { return indptr_; }  // [rows + 1]
  // A zeroed dummy Q of `tokens` tokens for prefill's RoPE append, grown
  // (and cleared, synchronously: prefill is off the step path) on demand.
  void *prefill_q(uint32_t tokens);
  void *workspace() const { return workspace_; }
  size_t workspace_size() const { return workspace_size_; }
  uint32_t row_capacity() const { return rows_; }
  uint64_t table_capacity() const { return table_entries_; }

  // Throws FD_ERR_INVALID_ARGUMENT naming `what` unless `p` is device (or
  // managed) memory of `ordinal` (cudaPointerGetAttributes: no host sync).
  static void require_device_pointer(const void *p, int32_t ordinal, const char *what);
  // Waits for the legacy default stream of `ordinal` (FD_ERR_DEVICE on an
  // error of the work queued there).
  static void synchronize_default_stream(int32_t ordinal);

 private:
  void *allocate(size_t bytes, const char *what);

  DeviceScratchSizes sizes_;
  uint32_t rows_ = 0;
  uint64_t tokens_ = 0;
  uint64_t table_entries_ = 0;
  uint32_t prefill_tokens_ = 0;
  void *q_rotated_ = nullptr;
  int32_t *tables_ = nullptr;
  int32_t *lens_ = nullptr;
  int32_t *indptr_ = nullptr;
  void *prefill_q_ = nullptr;
  void *workspace_ = nullptr;
  size_t workspace_size_ = 0;
  std::vector<void *> owned_;  // every allocation, current and replaced
};

}  // namespace fd
