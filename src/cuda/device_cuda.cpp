// CUDA runtime queries (statically linked cudart: loading the library needs no
// driver; without one these report zero devices).
#include <cuda_runtime_api.h>

#include <cstring>

#include "core/device.hpp"
#include "core/error.hpp"

namespace fd {

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

}  // namespace fd
