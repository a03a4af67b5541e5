// FP8 E4M3 K/V instantiations of the paged decode kernels: q and out f16 or
// bf16 (a kernel parameter, the mma runs in f16), head_dim 64/128 x both
// layouts x one or several query tokens per row x plain / with attention
// variants: 16 attention kernels, plus the merge kernels of both output types.
#include "decode_dispatch.cuh"

namespace fd {
namespace cuda {

template <>
cudaError_t launch_decode_typed<__half, __nv_fp8_e4m3>(const DecodeLaunch &launch) {
  return launch_decode_dispatch<__half, __nv_fp8_e4m3>(launch);
}

template <>
cudaError_t prepare_decode_typed<__half, __nv_fp8_e4m3>(int32_t head_dim, bool dim_major,
                                                        bool multi, bool sm90) {
  return prepare_decode_dispatch<__half, __nv_fp8_e4m3>(head_dim, dim_major, multi, sm90);
}

}  // namespace cuda
}  // namespace fd
