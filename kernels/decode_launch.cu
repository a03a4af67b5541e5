// Dispatch of the paged decode kernels on the (q, K/V) element-type pair.
// Only the pairs the host serves are instantiated (decode_<dtype>.cu: bf16 /
// bf16, f16 / f16, and f16 or bf16 q over FP8 E4M3 or E5M2 K/V); the host refuses
// every other pair before it gets here.
#include "decode_dispatch.cuh"

#include "flashdec.h"

namespace fd {
namespace cuda {

cudaError_t launch_decode(const DecodeLaunch &launch) {
  // FP8 K/V: one set of kernels for f16 and bf16 q (q's type is a kernel
  // parameter; the mma runs in f16).
  const bool q16 = launch.q_dtype == FD_DTYPE_F16 || launch.q_dtype == FD_DTYPE_BF16;
  if (launch.kv_dtype == FD_DTYPE_FP8_E4M3 && q16)
    return launch_decode_typed<__half, __nv_fp8_e4m3>(launch);
  if (launch.kv_dtype == FD_DTYPE_FP8_E5M2 && q16)
    return launch_decode_typed<__half, __nv_fp8_e5m2>(launch);
  if (launch.q_dtype == FD_DTYPE_F16 && launch.kv_dtype == FD_DTYPE_F16)
    return launch_decode_typed<__half, __half>(launch);
  if (launch.q_dtype == FD_DTYPE_BF16 && launch.kv_dtype == FD_DTYPE_BF16)
    return launch_decode_typed<__nv_bfloat16, __nv_bfloat16>(launch);
  return cudaErrorInvalidValue;
}

cudaError_t prepare_decode(const DecodeLaunch &launch) {
  const bool q16 = launch.q_dtype == FD_DTYPE_F16 || launch.q_dtype == FD_DTYPE_BF16;
  if (launch.kv_dtype == FD_DTYPE_FP8_E4M3 && q16)
    return prepare_decode_typed<__half, __nv_fp8_e4m3>(
        launch.head_dim, launch.dim_major, launch.work.max_q_len > 1, launch.work.sm90_device);
  if (launch.kv_dtype == FD_DTYPE_FP8_E5M2 && q16)
    return prepare_decode_typed<__half, __nv_fp8_e5m2>(
        launch.head_dim, launch.dim_major, launch.work.max_q_len > 1, launch.work.sm90_device);
  if (launch.q_dtype == FD_DTYPE_F16 && launch.kv_dtype == FD_DTYPE_F16)
    return prepare_decode_typed<__half, __half>(launch.head_dim, launch.dim_major,
                                                launch.work.max_q_len > 1, launch.work.sm90_device);
  if (launch.q_dtype == FD_DTYPE_BF16 && launch.kv_dtype == FD_DTYPE_BF16)
    return prepare_decode_typed<__nv_bfloat16, __nv_bfloat16>(
        launch.head_dim, launch.dim_major, launch.work.max_q_len > 1, launch.work.sm90_device);
  return cudaErrorInvalidValue;
}

int decode_ctas_per_sm(int32_t head_dim, bool sm90) {
  if (sm90) return sm90::ctas_per_sm(head_dim);
  switch (head_dim) {
    case 64: return detail::Config<64>::kCtasPerSm;
    case 96: return detail::Config<96>::kCtasPerSm;
    case 256: return detail::Config<256>::kCtasPerSm;
    default: return detail::Config<128>::kCtasPerSm;
  }
}

int decode_deep_ctas_per_sm() {
  return detail::Config<128, 2, true>::kCtasPerSm;
}

int decode_swap_ctas_per_sm(int32_t head_dim, bool deep) {
  if (deep)
    return head_dim == 64 ? detail::Config<64, 1, true, true>::kCtasPerSm
                          : detail::Config<128, 1, true, true>::kCtasPerSm;
  return head_dim == 64 ? detail::Config<64, 1, false, true>::kCtasPerSm
                        : detail::Config<128, 1, false, true>::kCtasPerSm;
}

}  // namespace cuda
}  // namespace fd
