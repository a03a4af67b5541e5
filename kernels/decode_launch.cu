// Dispatch of the paged decode kernels on element type.
#include "decode_kernel.cuh"

#include "flashdec.h"

namespace fd {
namespace cuda {

cudaError_t launch_decode(const DecodeLaunch &launch) {
  if (launch.dtype == FD_DTYPE_F16) return launch_decode_typed<__half>(launch);
  return launch_decode_typed<__nv_bfloat16>(launch);
}

int decode_ctas_per_sm(int32_t head_dim) {
  return head_dim == 128 ? detail::Config<128>::kCtasPerSm : detail::Config<64>::kCtasPerSm;
}

}  // namespace cuda
}  // namespace fd
