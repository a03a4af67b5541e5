// The FP8 quantisation of a K/V store, saturate(v / scale) rounded to nearest
// even, at a multiply's cost and bit-equal to dividing. Shared by the CUDA
// append kernels and the unit test that checks the rule on the host (with the
// host encoder of core/dtype.hpp in place of the device's cvt instruction).
//
// Why it is exact: with rcp = RN(1 / scale) a normal float, q = RN(v * rcp)
// lies within 2^-22 |q| of the rounded quotient RN(v / scale) (each of the
// two roundings moves it by at most 2^-24 relative, and RN(v / scale) by
// 2^-24 more). RN(q (1 - 2^-21)) and RN(q (1 + 2^-21)) then lie on either
// side of RN(v / scale) with room to spare, and rounding to FP8 is monotonic
// (saturation and the sign included), so when both convert to the same code,
// the quotient does too. Only a quotient within a few FP32 ulps of an FP8
// rounding boundary (about one in 10^5 values) takes the IEEE division. A NaN
// v converts to NaN either way; +-inf and +-0 keep their codes.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace fd {

// The reciprocal of an FP8 scale for fp8_quantise2, or 0 when 1 / scale is
// not a normal float (a subnormal or huge scale): then every value divides.
FD_HD float fp8_quantise_rcp(float scale) {
  const float r = 1.f / scale;
  return r >= 1.17549435e-38f && r <= 3.40282347e38f ? r : 0.f;
}

// The multiply step of fp8_quantise2: the codes of RN(v0 / scale) and
// RN(v1 / scale) when `sure` comes back true (it is and-ed, so one flag can
// collect a whole run of pairs); when it comes back false (about one pair in
// 10^5, or rcp = 0) the codes are unspecified and the caller divides. Kept
// apart so that a kernel can quantise a run by multiplies alone and take the
// divisions on a separate, rarely taken path (their slow-path calls then
// stay out of the hot loop's registers).
template <class Cvt2>
FD_HD uint32_t fp8_quantise2_multiply(float v0, float v1, float rcp, Cvt2 cvt2, bool &sure) {
  constexpr float kDown = 1.f - 0x1p-21f, kUp = 1.f + 0x1p-21f;
#if defined(__CUDA_ARCH__)
  // (Explicit roundings: no product may be contracted with another.)
  const float q0 = __fmul_rn(v0, rcp), q1 = __fmul_rn(v1, rcp);
  const uint32_t lo = cvt2(__fmul_rn(q0, kDown), __fmul_rn(q1, kDown));
  sure = sure && rcp != 0.f && lo == cvt2(__fmul_rn(q0, kUp), __fmul_rn(q1, kUp));
#else
  const float q0 = v0 * rcp, q1 = v1 * rcp;
  const uint32_t lo = cvt2(q0 * kDown, q1 * kDown);
  sure = sure && rcp != 0.f && lo == cvt2(q0 * kUp, q1 * kUp);
#endif
  return lo;
}

// Two values quantised: cvt2(RN(v0 / scale), RN(v1 / scale)), where cvt2
// converts two floats to their FP8 codes (any monotonic round-to-nearest
// conversion; its result is compared as a whole).
template <class Cvt2>
FD_HD uint32_t fp8_quantise2(float v0, float v1, float scale, float rcp, Cvt2 cvt2) {
  if (rcp != 0.f) {
    bool sure = true;
    const uint32_t lo = fp8_quantise2_multiply(v0, v1, rcp, cvt2, sure);
    if (sure) return lo;
  }
  return cvt2(v0 / scale, v1 / scale);
}

}  // namespace fd
