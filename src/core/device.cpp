// fd_cuda_device_count: the public face of backend::cuda_device_count.
#include "backend/backend.hpp"
#include "core/error.hpp"

extern "C" FD_API fd_status fd_cuda_device_count(int32_t *count) {
  return fd::guard([&] {
    fd::require_non_null(count, "count");
    *count = fd::backend::cuda_device_count();
    return FD_OK;
  });
}
