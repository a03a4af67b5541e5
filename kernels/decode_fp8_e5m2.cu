// FP8 E5M2 K/V instantiations of the paged decode kernels: the E4M3 set of
// decode_fp8.cu with E5M2's conversion to f16 (f8x4 in decode_device.cuh: a
// byte permute instead of a cvt), in its own translation unit so the two
// compile in parallel.
#include "decode_dispatch.cuh"

namespace fd {
namespace cuda {

template <>
cudaError_t launch_decode_typed<__half, __nv_fp8_e5m2>(const DecodeLaunch &launch) {
  return launch_decode_dispatch<__half, __nv_fp8_e5m2>(launch);
}

template <>
cudaError_t prepare_decode_typed<__half, __nv_fp8_e5m2>(int32_t head_dim, bool dim_major,
                                                        bool multi, bool sm90) {
  return prepare_decode_dispatch<__half, __nv_fp8_e5m2>(head_dim, dim_major, multi, sm90);
}

}  // namespace cuda
}  // namespace fd
