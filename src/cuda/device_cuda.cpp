// The CUDA backend's device queries and device buffers (backend/backend.hpp).
// cudart is linked statically: loading the library needs no driver, and
// without one the queries report zero devices.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "cuda/cuda_util.hpp"

namespace fd {
namespace backend {

/* Device queries ----------------------------------------------------------- */

int32_t cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

void require_cuda_device(int32_t ordinal) {
  const int32_t n = cuda_device_count();
  if (n == 0)
    fail(FD_ERR_NO_DEVICE, "CUDA device %d requested, but no CUDA device is usable", ordinal);
  if (ordinal < 0 || ordinal >= n)
    fail(FD_ERR_NO_DEVICE, "CUDA device %d requested, but only %d device(s) are visible", ordinal,
         n);
}

bool is_cuda_device_memory(const void *p, int32_t ordinal) noexcept {
  cudaPointerAttributes attr;
  std::memset(&attr, 0, sizeof attr);
  // Callers may run inside a stream capture: relax this thread's capture mode
  // around the query so that no capture mode counts it as a prohibited call,
  // then restore the caller's mode.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const bool exchanged = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (exchanged) (void)cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  return device && attr.device == ordinal;
}

/* Device buffers ----------------------------------------------------------- */

void *cuda_alloc(int32_t ordinal, size_t bytes, const char *what) {
  CudaDeviceScope scope(ordinal);
  void *p = nullptr;
  cuda_check(cudaMalloc(&p, std::max<size_t>(bytes, 16)), what);
  return p;
}

void cuda_free(int32_t ordinal, void *p) noexcept {
  if (p == nullptr) return;
  // Freed with `ordinal` current, as it was allocated; errors are dropped
  // (this runs in destructors).
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != ordinal;
  if (restore) (void)cudaSetDevice(ordinal);
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
  if (restore) (void)cudaSetDevice(previous);
}

void cuda_zero_fill_sync(int32_t ordinal, void *p, size_t bytes, const char *what) {
  CudaDeviceScope scope(ordinal);
  fd::cuda_zero_fill_sync(p, bytes, what);
}

void cuda_sync_default_stream(int32_t ordinal, const char *what) {
  CudaDeviceScope scope(ordinal);
  cuda_check(cudaStreamSynchronize(nullptr), what);
}

}  // namespace backend
}  // namespace fd
