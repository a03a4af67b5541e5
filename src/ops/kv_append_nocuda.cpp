// Without CUDA the append primitives' CUDA path answers FD_ERR_NO_DEVICE.
#include "core/device.hpp"
#include "ops/kv_append.hpp"

#if !FLASHDEC_HAVE_CUDA

namespace fd {

void kv_append_cuda(const AppendProblem &p) {
  require_cuda_device(p.device_ordinal);
}

}  // namespace fd

#endif
