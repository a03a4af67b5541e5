// The one set of CUDA runtime helpers of the CUDA backend (src/cuda only:
// nothing outside src/cuda includes a CUDA header; the rest of the library
// reaches CUDA through backend/backend.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace fd {

// Throws unless err is cudaSuccess: FD_ERR_OUT_OF_MEMORY for
// cudaErrorMemoryAllocation (whose non-sticky last-error state is cleared, so
// later calls start clean), else FD_ERR_DEVICE naming `what` and the CUDA
// error's string and name.
void cuda_check(cudaError_t err, const char *what);

// Makes `ordinal` the calling thread's current device for the scope and
// restores the previous one afterwards. Cheap when `ordinal` is already
// current: one cudaGetDevice, no cudaSetDevice either way.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int32_t ordinal);
  ~CudaDeviceScope();
  CudaDeviceScope(const CudaDeviceScope &) = delete;
  CudaDeviceScope &operator=(const CudaDeviceScope &) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;  // the constructor switched devices: restore
};

// Zero-fills `bytes` of device memory of the current device and waits until
// the fill is done, on a private non-blocking stream: on return the memory is
// ready for work on any stream, without waiting for unrelated work the caller
// has queued elsewhere. (A cudaMemset on the legacy default stream returns
// before it runs, and nothing orders it before later work on a non-blocking
// stream: such work could be overwritten by the late fill.
// docs/cuda-streams.md lists every place the library touches a stream it
// does not own.) Not capture-safe; for creation paths only. Throws
// FD_ERR_OUT_OF_MEMORY / FD_ERR_DEVICE.
void cuda_zero_fill_sync(void *p, size_t bytes, const char *what);

}  // namespace fd
