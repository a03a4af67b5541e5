// Stand-ins for the CUDA backend in builds without CUDA: every CUDA request is
// answered with FD_ERR_NO_DEVICE.
#include "core/device.hpp"
#include "core/error.hpp"
#include "ops/decode_problem.hpp"

namespace fd {

int32_t cuda_device_count() noexcept {
  return 0;
}

void require_cuda_device(int32_t ordinal) {
  fail(FD_ERR_NO_DEVICE, "CUDA device %d requested, but libflashdec was built without CUDA",
       ordinal);
}

bool is_cuda_device_memory(const void *, int32_t) noexcept {
  return false;
}

void decode_cuda(const DecodeProblem &problem) {
  require_cuda_device(problem.device_ordinal);
}

size_t decode_cuda_workspace_size(const DecodeProblem &problem) {
  require_cuda_device(problem.device_ordinal);
  return 0;
}

}  // namespace fd
