// Pinned staging of the CUDA backend's cache storage (kv_storage_cuda.cpp,
// whose factory is backend::make_cuda_kv_storage in backend/backend.hpp).
// The CUDA helpers (cuda_check, CudaDeviceScope, cuda_zero_fill_sync) are in
// cuda/cuda_util.hpp, included here for the files that use both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/cuda_util.hpp"

namespace fd {

// Pinned host staging (and optionally a device twin) reused in stream order.
// A slot is handed out again only when the CUDA event recorded behind its
// last use has completed; a slot used inside stream capture is retired (a
// graph may read it at every replay) and recycled, least recently used first,
// only once the ring has kMaxSlots slots. Acquiring never synchronises the
// host unless every slot is busy and the ring is full.
class StagingRing {
 public:
  static constexpr size_t kMaxSlots = 64;

  struct Slot {
    void *host = nullptr;    // pinned
    void *device = nullptr;  // device twin (device_bytes > 0 only)
    size_t capacity = 0;     // bytes of each
    cudaEvent_t event = nullptr;
    bool recorded = false;
    bool retired = false;
    uint64_t last_use = 0;
  };

  explicit StagingRing(bool with_device) : with_device_(with_device) {}
  ~StagingRing();
  StagingRing(const StagingRing &) = delete;
  StagingRing &operator=(const StagingRing &) = delete;

  // Creates `count` idle slots of `bytes` each up front, so that the first
  // transactions and exports (often inside stream capture) allocate nothing.
  void preallocate(size_t count, size_t bytes);
  // A slot of at least `bytes` that no pending work reads. May allocate
  // (not capture-safe); throws FD_ERR_OUT_OF_MEMORY / FD_ERR_DEVICE.
  Slot &acquire(size_t bytes);
  // Marks the slot as read by work just enqueued on `stream`.
  void used_on(Slot &slot, cudaStream_t stream);
  // First error (other than not-ready) reported by a recorded event, or
  // cudaSuccess. Never blocks.
  cudaError_t query_errors() const;

 private:
  bool idle(Slot &slot);
  void resize(Slot &slot, size_t bytes);

  bool with_device_;
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t next_ = 0;  // where acquire starts looking: after the last slot handed out
  uint64_t clock_ = 0;
};

}  // namespace fd
