// CUDA runtime queries that the rest of the library needs without including
// CUDA headers. Implemented in src/cuda (CUDA builds) or src/nocuda.
#pragma once

#include <cstdint>

namespace fd {

// Usable CUDA devices; 0 without a driver or a device (never throws).
int32_t cuda_device_count() noexcept;

// Throws FD_ERR_NO_DEVICE unless `ordinal` names a usable device.
void require_cuda_device(int32_t ordinal);

}  // namespace fd
