// CUDA runtime queries that the rest of the library needs without including
// CUDA headers. Implemented in src/cuda (CUDA builds) or src/nocuda.
#pragma once

#include <cstdint>

namespace fd {

// Usable CUDA devices; 0 without a driver or a device (never throws).
int32_t cuda_device_count() noexcept;

// Throws FD_ERR_NO_DEVICE unless `ordinal` names a usable device.
void require_cuda_device(int32_t ordinal);

// True when `p` points to device (or managed) memory of CUDA device
// `ordinal`. A pure query (no host sync) that is legal inside any stream
// capture; always false in builds without CUDA.
bool is_cuda_device_memory(const void *p, int32_t ordinal) noexcept;

}  // namespace fd
