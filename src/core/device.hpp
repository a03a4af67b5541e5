// Transitional forwarder, to be deleted once no file includes it: the device
// queries are part of the backend seam, backend/backend.hpp (namespace
// fd::backend). Include that header and call backend::cuda_device_count,
// backend::require_cuda_device and backend::is_cuda_device_memory instead.
#pragma once

#include "backend/backend.hpp"

namespace fd {

using backend::cuda_device_count;
using backend::is_cuda_device_memory;
using backend::require_cuda_device;

}  // namespace fd
