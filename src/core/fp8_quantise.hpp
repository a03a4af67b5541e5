// The FP8 quantisation of a K/V store, saturate(v / scale) rounded to nearest
// even, at a multiply's cost and bit-equal to dividing. Shared by the CUDA
// append kernels and the unit test that checks the rule on the host (with the
// host encoder of core/dtype.hpp in place of the device's cvt instruction).
//
// Why it is exact: with r = RN(1 / scale), down = RN(r (1 - 2^-21)) and up =
// RN(r (1 + 2^-21)) normal floats, RN(v * down) and RN(v * up) lie within
// 2^-21 (1 -+ 3 * 2^-24) of v / scale relative, three roundings of at most
// 2^-24 each, so on either side of the rounded quotient RN(v / scale), which
// is within 2^-24 of v / scale, with room to spare. Rounding to FP8 is
// monotonic (saturation and the sign included), so when both products
// convert to the same code, the quotient does too. Only a quotient within a
// few FP32 ulps of an FP8 rounding boundary (about one in 10^5 values) takes
// the IEEE division. A NaN v converts to NaN either way; +-inf and +-0 keep
// their codes.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace fd {

// The two factors of fp8_quantise2's bracket for one scale; both 0 when they
// are not normal floats (a subnormal or huge scale): then every value divides.
struct Fp8Bracket {
  float down = 0.f, up = 0.f;
};

FD_HD Fp8Bracket fp8_quantise_bracket(float scale) {
  constexpr float kMin = 1.17549435e-38f, kMax = 3.40282347e38f;
  const float r = 1.f / scale;
  Fp8Bracket b;
  if (!(r >= kMin && r <= kMax)) return b;
  const float down = r * (1.f - 0x1p-21f), up = r * (1.f + 0x1p-21f);
  if (down >= kMin && up <= kMax) b.down = down, b.up = up;
  return b;
}

// The multiply step of fp8_quantise2: the codes of RN(v0 / scale) and
// RN(v1 / scale) when `sure` comes back true (it is and-ed, so one flag can
// collect a whole run of pairs); when it comes back false (about one pair in
// 10^5, or no bracket) the codes are unspecified and the caller divides.
// Kept apart so that a kernel can quantise a run by multiplies alone and
// take the divisions on a separate, rarely taken path (their slow-path calls
// then stay out of the hot loop's registers). Four multiplies and two
// conversions per pair.
template <class Cvt2>
FD_HD uint32_t fp8_quantise2_multiply(float v0, float v1, Fp8Bracket b, Cvt2 cvt2, bool &sure) {
#if defined(__CUDA_ARCH__)
  // (Explicit roundings: no product may be contracted with another.)
  // (And-ed without short-circuits: no branch per pair.)
  const uint32_t lo = cvt2(__fmul_rn(v0, b.down), __fmul_rn(v1, b.down));
  sure = sure & (b.down != 0.f) & (lo == cvt2(__fmul_rn(v0, b.up), __fmul_rn(v1, b.up)));
#else
  const uint32_t lo = cvt2(v0 * b.down, v1 * b.down);
  sure = sure & (b.down != 0.f) & (lo == cvt2(v0 * b.up, v1 * b.up));
#endif
  return lo;
}

// Two values quantised: cvt2(RN(v0 / scale), RN(v1 / scale)), where cvt2
// converts two floats to their FP8 codes (any monotonic round-to-nearest
// conversion; its result is compared as a whole). b: fp8_quantise_bracket
// of scale.
template <class Cvt2>
FD_HD uint32_t fp8_quantise2(float v0, float v1, float scale, Fp8Bracket b, Cvt2 cvt2) {
  if (b.down != 0.f) {
    bool sure = true;
    const uint32_t lo = fp8_quantise2_multiply(v0, v1, b, cvt2, sure);
    if (sure) return lo;
  }
  return cvt2(v0 / scale, v1 / scale);
}

}  // namespace fd
