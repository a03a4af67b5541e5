// f16 instantiations of the paged decode kernels (q, K/V and out f16; head_dim
// 64/96/128/256 x both layouts x one or several query tokens per row x plain /
// with attention variants: 32 attention kernels).
#include "decode_dispatch.cuh"

namespace fd {
namespace cuda {

template <>
cudaError_t launch_decode_typed<__half, __half>(const DecodeLaunch &launch) {
  return launch_decode_dispatch<__half, __half>(launch);
}

template <>
cudaError_t prepare_decode_typed<__half, __half>(int32_t head_dim, bool dim_major, bool multi,
                                                 bool sm90) {
  return prepare_decode_dispatch<__half, __half>(head_dim, dim_major, multi, sm90);
}

}  // namespace cuda
}  // namespace fd
