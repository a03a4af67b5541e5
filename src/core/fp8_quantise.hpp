// The FP8 quantisation of a K/V store, code(RN(v / scale)): the value
// divided by the scale and rounded to FP32, then to FP8 (E4M3 or E5M2) with
// round-to-nearest even and saturation (what the CPU backend computes,
// dividing). The CUDA append kernels get the same codes from multiplies and
// comparisons only, with no division and no call; the unit test checks the
// rule on the host for both formats (with the host encoders of core/dtype.hpp
// in place of the device's cvt).
//
// The formats (the Fmt argument below): E4M3 has 3 mantissa bits, largest
// finite 448 and smallest subnormal 2^-9; E5M2 has 2, 57344 and 2^-16. A
// saturating conversion gives every larger magnitude, infinity included, the
// largest finite code, so no rounding boundary lies past it.
//
// 1. Range. The host plans each scale once (fp8_quant_plan): a scale outside
//    [2^-100, 2^100] is brought inside by a power of two `pre` (2^64 or
//    2^-64), and every value is multiplied by the same `pre`. Both products
//    are exact, or the quotient is so large or so small that its code is the
//    same either way (the largest finite code or a signed zero): v * 2^64
//    overflows only for |v| >= 2^64, a quotient past 2^164, and v * 2^-64
//    loses bits only for |v| < 2^-62, a quotient below 2^-162, in either
//    format far outside the codes (2^-17 is E5M2's first rounding boundary).
// 2. Bracket. With r = RN(1 / s), down = RN(r (1 - 2^-21)) and up =
//    RN(r (1 + 2^-21)) (normal floats for s in that range), v * down and
//    v * up lie strictly on either side of v / s (three roundings of at most
//    2^-24 each against the 2^-21 margin), so their rounded products bracket
//    RN(v / s). Conversion to FP8 is monotonic, so when both products give
//    the same code (all but about one value in 10^5 for E4M3, fewer for
//    E5M2, whose boundaries are half as dense), it is the code.
// 3. Resolution. Otherwise the two codes are neighbours (the bracket is
//    2^-20 wide, FP8 boundaries are at least 2^-4 apart, 2^-3 in E5M2, both
//    relative) and RN(v / s) lies near their midpoint m, a float with at
//    most 5 significant bits (4 in E5M2: the codes have 4 and 3). Which side
//    it rounds to is decided exactly: w = |v| - m s is computed without
//    error (p = RN(m s), e = fma(m, s, -p) exact: m and s are multiples of
//    2^-17 and 2^-123, so e is a multiple of 2^-140, an FP32 value even when
//    subnormal; |v| - p exact by Sterbenz's lemma; their difference has at
//    most 11 significant bits), and RN(v / s) is above m exactly when
//    v / s - m exceeds half an FP32 ulp of m, i.e. when w 2^(24 - e_m) > s
//    (e_m: m's exponent, -17 .. 15 over both formats), below it when
//    w 2^(24 - e_m) < -s; otherwise RN(v / s) is m itself and FP8 rounding
//    breaks that tie to the neighbour with the even code. (The only power of
//    two among the midpoints is the one between codes 0 and 1, 2^-10 in
//    E4M3 and 2^-17 in E5M2; its lower ulp is half the upper one, so a
//    quotient between the two thresholds may round to m's lower neighbour,
//    whose code, 0, is the even one anyway. A quotient is never exactly
//    halfway between two floats: that needs 25 significant bits from v / s.)
// NaN stays NaN, +-inf and values past the largest finite value give it
// (+-448, +-57344), and +-0 keeps its sign (the kernels then store every NaN
// as 0x7f). Every step assumes no FTZ.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.hpp"

namespace fd {

// The quantisation of one scale, planned on the host: v's code is the code of
// RN((v * pre) / scale). `scale` is the caller's scale times `pre`; down and
// up are its bracket factors. down_v and up_v are pre * down and pre * up,
// the bracket of the unscaled value (the same products as (v * pre) * down
// while v * pre is exact), or 0 and +inf when those are not normal floats:
// then the bracket of every nonzero value is open.
struct Fp8Quant {
  float pre = 1.f;
  float scale = 1.f;
  float down = 0.f, up = 0.f;
  float down_v = 0.f, up_v = 0.f;
};

// The plan of a positive finite scale (the API refuses others; for them the
// bracket stays empty and fp8_quantise2 is not to be called).
inline Fp8Quant fp8_quant_plan(float scale) {
  Fp8Quant q;
  if (!(scale > 0.f) || !std::isfinite(scale)) return q;
  if (scale < 0x1p-100f) q.pre = 0x1p64f;
  if (scale > 0x1p100f) q.pre = 0x1p-64f;
  q.scale = scale * q.pre;  // exact: a power of two, no overflow or underflow
  const float r = 1.f / q.scale;
  q.down = r * (1.f - 0x1p-21f);
  q.up = r * (1.f + 0x1p-21f);
  constexpr float kMin = 1.17549435e-38f, kMax = 3.40282347e38f;
  const float dv = q.down * q.pre, uv = q.up * q.pre;
  const bool normal = dv >= kMin && uv <= kMax;
  q.down_v = normal ? dv : 0.f;
  q.up_v = normal ? uv : INFINITY;
  return q;
}

// The float with bit pattern `bits`.
FD_HD float fp8_bits_float(uint32_t bits) {
  float f;
#if defined(__CUDA_ARCH__)
  f = __uint_as_float(bits);
#else
  std::memcpy(&f, &bits, sizeof f);
#endif
  return f;
}

// The value of an E4M3 magnitude code 0 .. 0x7e.
FD_HD float fp8_e4m3_magnitude(uint32_t c) {
  const uint32_t e = c >> 3, m = c & 7u;
  if (e == 0) return static_cast<float>(m) * 0x1p-9f;
  return fp8_bits_float(((e + 120u) << 23) | (m << 20));
}

// The value of an E5M2 magnitude code 0 .. 0x7b (exponent bias 15: FP32's
// 127 less 112).
FD_HD float fp8_e5m2_magnitude(uint32_t c) {
  const uint32_t e = c >> 2, m = c & 3u;
  if (e == 0) return static_cast<float>(m) * 0x1p-16f;
  return fp8_bits_float(((e + 112u) << 23) | (m << 21));
}

// The formats, the Fmt argument of the functions below: the value of a
// magnitude code up to the largest finite one.
struct Fp8E4m3 {
  static FD_HD float magnitude(uint32_t c) { return fp8_e4m3_magnitude(c); }
};
struct Fp8E5m2 {
  static FD_HD float magnitude(uint32_t c) { return fp8_e5m2_magnitude(c); }
};

// Step 3 for one value: cd, cu the codes (sign in bit 7) of RN(v * down) and
// RN(v * up), v already multiplied by pre, s the planned scale; Fmt the
// format (Fp8E4m3, Fp8E5m2).
template <class Fmt>
FD_HD uint32_t fp8_resolve(float v, uint32_t cd, uint32_t cu, float s) {
  if (cd == cu) return cd;
  // |v| * down <= |v| * up: lo is the lower magnitude.
  const uint32_t lo = cd & 0x7fu, hi = cu & 0x7fu;
  const float m = (Fmt::magnitude(lo) + Fmt::magnitude(hi)) * 0.5f;  // exact
#if defined(__CUDA_ARCH__)
  const float a = fabsf(v), p = __fmul_rn(m, s), e = __fmaf_rn(m, s, -p);
  const float w = __fsub_rn(__fsub_rn(a, p), e);
  const uint32_t mb = __float_as_uint(m);
#else
  const float a = std::fabs(v), p = m * s, e = std::fma(m, s, -p);
  const float w = (a - p) - e;
  uint32_t mb;
  std::memcpy(&mb, &m, sizeof mb);
#endif
  // 2^(24 - e_m): biased exponent 127 + 24 - e_m = 278 - (mb >> 23).
  const uint32_t fb = (278u - (mb >> 23)) << 23;
  float f;
#if defined(__CUDA_ARCH__)
  f = __uint_as_float(fb);
  const float W = __fmul_rn(w, f);
#else
  std::memcpy(&f, &fb, sizeof f);
  const float W = w * f;
#endif
  const uint32_t mag = W > s ? hi : W < -s ? lo : ((lo & 1u) == 0 ? lo : hi);
  return mag | (cd & 0x80u);
}

// Step 2 alone, on the unscaled values: the codes of v0 * down_v and
// v1 * down_v, with the bits in which they differ from the up_v products
// or-ed into `open`. Where `open` stays 0 over a run, its codes are the
// quotients'; otherwise the run is redone with fp8_quantise2. Four
// multiplies, two conversions and one or per pair.
template <class Cvt2>
FD_HD uint32_t fp8_bracket2(float v0, float v1, const Fp8Quant &q, Cvt2 cvt2, uint32_t &open) {
#if defined(__CUDA_ARCH__)
  const uint32_t lo = cvt2(__fmul_rn(v0, q.down_v), __fmul_rn(v1, q.down_v));
  open |= lo ^ cvt2(__fmul_rn(v0, q.up_v), __fmul_rn(v1, q.up_v));
#else
  const uint32_t lo = cvt2(v0 * q.down_v, v1 * q.down_v);
  open |= lo ^ cvt2(v0 * q.up_v, v1 * q.up_v);
#endif
  return lo;
}

// Step 1 and 3 for a pair whose bracket (step 2 on the unscaled values) was
// open: the codes of RN(v0 / scale) and RN(v1 / scale).
template <class Fmt, class Cvt2>
FD_HD uint32_t fp8_quantise2_open(float v0, float v1, const Fp8Quant &q, Cvt2 cvt2) {
#if defined(__CUDA_ARCH__)
  // (Explicit roundings: no product may be contracted with another.)
  v0 = __fmul_rn(v0, q.pre), v1 = __fmul_rn(v1, q.pre);
  const uint32_t lo = cvt2(__fmul_rn(v0, q.down), __fmul_rn(v1, q.down));
  const uint32_t hi = cvt2(__fmul_rn(v0, q.up), __fmul_rn(v1, q.up));
#else
  v0 *= q.pre, v1 *= q.pre;
  const uint32_t lo = cvt2(v0 * q.down, v1 * q.down);
  const uint32_t hi = cvt2(v0 * q.up, v1 * q.up);
#endif
  return fp8_resolve<Fmt>(v0, lo & 0xffu, hi & 0xffu, q.scale) |
         (fp8_resolve<Fmt>(v1, lo >> 8, hi >> 8, q.scale) << 8);
}

// Two values quantised: the codes of RN(v0 / scale) and RN(v1 / scale) (the
// first in the low byte), q = fp8_quant_plan(scale), in format Fmt. cvt2
// converts two floats to their Fmt codes with round-to-nearest even and
// saturation (the device's cvt.rn.satfinite.e4m3x2.f32 / .e5m2x2.f32, or the
// host encoder). Step 2 on the unscaled values first; where that bracket is
// open, steps 1 to 3.
template <class Fmt, class Cvt2>
FD_HD uint32_t fp8_quantise2(float v0, float v1, const Fp8Quant &q, Cvt2 cvt2) {
  uint32_t open = 0;
  const uint32_t codes = fp8_bracket2(v0, v1, q, cvt2, open);
  return open == 0 ? codes : fp8_quantise2_open<Fmt>(v0, v1, q, cvt2);
}

// Four values quantised into one word (v[0] in the low byte), with one test
// of the two pairs' brackets.
template <class Fmt, class Cvt2>
FD_HD uint32_t fp8_quantise4(const float (&v)[4], const Fp8Quant &q, Cvt2 cvt2) {
  uint32_t open = 0;
  const uint32_t a = fp8_bracket2(v[0], v[1], q, cvt2, open);
  const uint32_t b = fp8_bracket2(v[2], v[3], q, cvt2, open);
  if (open == 0) return a | (b << 16);
  return fp8_quantise2_open<Fmt>(v[0], v[1], q, cvt2) |
         (fp8_quantise2_open<Fmt>(v[2], v[3], q, cvt2) << 16);
}

}  // namespace fd
