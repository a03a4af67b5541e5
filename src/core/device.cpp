#include "core/device.hpp"

#include "core/error.hpp"

extern "C" FD_API fd_status fd_cuda_device_count(int32_t *count) {
  return fd::guard([&] {
    fd::require_non_null(count, "count");
    *count = fd::cuda_device_count();
    return FD_OK;
  });
}
