// bf16 instantiations of the paged decode kernels (q, K/V and out bf16; head_dim
// 64/96/128/256 x both layouts x one or several query tokens per row x plain /
// with attention variants: 32 attention kernels).
#include "decode_dispatch.cuh"

namespace fd {
namespace cuda {

template <>
cudaError_t launch_decode_typed<__nv_bfloat16, __nv_bfloat16>(const DecodeLaunch &launch) {
  return launch_decode_dispatch<__nv_bfloat16, __nv_bfloat16>(launch);
}

template <>
cudaError_t prepare_decode_typed<__nv_bfloat16, __nv_bfloat16>(int32_t head_dim, bool dim_major,
                                                               bool multi, bool sm90) {
  return prepare_decode_dispatch<__nv_bfloat16, __nv_bfloat16>(head_dim, dim_major, multi, sm90);
}

}  // namespace cuda
}  // namespace fd
