// f16 instantiations of the paged decode kernels (head_dim 64/128 x both layouts).
#include "decode_kernel.cuh"

namespace fd {
namespace cuda {

template <>
cudaError_t launch_decode_typed<__half>(const DecodeLaunch &launch) {
  return launch_decode_dispatch<__half>(launch);
}

}  // namespace cuda
}  // namespace fd
