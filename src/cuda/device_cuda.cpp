// CUDA runtime queries (statically linked cudart: loading the library needs no
// driver; without one these report zero devices).
#include <cuda_runtime_api.h>

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

}  // namespace fd
