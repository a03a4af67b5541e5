// Host-side element types: sizes and exact FP16/BF16/FP8 <-> FP32
// conversion (round to nearest even, NaN kept quiet; FP8 saturates, S1.1).
// Header-only so the CPU backend, tests and tools share one definition.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "flashdec.h"

namespace fd {

inline bool dtype_valid(int32_t dtype) {
  return dtype == FD_DTYPE_F32 || dtype == FD_DTYPE_F16 || dtype == FD_DTYPE_BF16;
}

// FP8 types: stored K/V only (S1.1).
inline bool dtype_is_fp8(int32_t dtype) {
  return dtype == FD_DTYPE_FP8_E4M3 || dtype == FD_DTYPE_FP8_E5M2;
}

// A type K/V may be stored in: the compute types and FP8.
inline bool kv_dtype_valid(int32_t dtype) {
  return dtype_valid(dtype) || dtype_is_fp8(dtype);
}

inline const char *dtype_name(int32_t dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return "f32";
    case FD_DTYPE_F16: return "f16";
    case FD_DTYPE_BF16: return "bf16";
    case FD_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case FD_DTYPE_FP8_E5M2: return "fp8_e5m2";
    default: return "unknown";
  }
}

// Bytes per element; 0 for an unknown dtype.
inline size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return 4;
    case FD_DTYPE_F16:
    case FD_DTYPE_BF16: return 2;
    case FD_DTYPE_FP8_E4M3:
    case FD_DTYPE_FP8_E5M2: return 1;
    default: return 0;
  }
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_to_f32(uint16_t h) {
  return bits_f32(static_cast<uint32_t>(h) << 16);
}

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return bits_f32(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | mant << 13);
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | mant << 13);
  return bits_f32(sign | (exp + 127 - 15) << 23 | mant << 13);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: add the magic number to round at the right bit.
    const float magic = bits_f32(0x3f000000u);  // 0.5f: aligns bit 0 of a half subnormal
    const float r = bits_f32(abs) + magic;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(f32_bits(r) - f32_bits(magic)));
  }
  const uint32_t mant_odd = (abs >> 13) & 1u;
  const uint32_t rounded = abs + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded >> 13));
}

// --- FP8 (OCP 8-bit floating point; stored K/V only, S1.1) ------------------
//
// E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; largest finite 448
// (0x7e), no infinity, NaN 0x7f / 0xff. E5M2: 1 sign, 5 exponent (bias 15),
// 2 mantissa bits; largest finite 57344 (0x7b), infinity 0x7c, NaN 0x7d..0x7f.
// Encoding rounds to nearest even and saturates: a finite value beyond the
// largest finite one, and an infinity, store the largest finite value of
// that sign (E5M2's infinity codes are never produced). NaN stores the
// canonical NaN 0x7f (either sign of input).

namespace fp8_detail {

// f32 -> FP8 with kMant mantissa bits, exponent bias kBias, largest finite
// code kMaxCode (sign excluded).
template <int kMant, int kBias, uint32_t kMaxCode>
inline uint8_t encode(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN
  uint32_t code;
  // Smallest normal of the target: 2^(1 - kBias), as f32 bits.
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 + 1 - kBias) << 23;
  if (a >= kMinNormal) {
    // Normal: keep kMant mantissa bits of the f32 exponent-and-mantissa
    // field, round to nearest even (a carry moves into the exponent), then
    // re-bias. Infinity lands far above kMaxCode and saturates below.
    constexpr int kShift = 23 - kMant;
    const uint32_t rounded = a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u);
    code = (rounded >> kShift) - (static_cast<uint32_t>(127 - kBias) << kMant);
    if (code > kMaxCode) code = kMaxCode;
  } else {
    // Subnormal or zero: count units of 2^(1 - kBias - kMant). The scaling
    // by a power of two is exact, and adding and removing 2^23 rounds the
    // (< 2^kMant) value to an integer, nearest even (the default rounding
    // mode, which the library never changes). 2^kMant units is the smallest
    // normal, whose code is exactly 2^kMant.
    constexpr float kUnits = static_cast<float>(1u << (kBias + kMant - 1));
    const float units = bits_f32(a) * kUnits;
    code = static_cast<uint32_t>((units + 8388608.0f) - 8388608.0f);
  }
  return static_cast<uint8_t>(sign | code);
}

// The 256 values of an FP8 type, built from the encoding's fields.
template <int kMant, int kBias, bool kHasInf>
constexpr std::array<float, 256> decode_table() {
  std::array<float, 256> t{};
  constexpr int kExpMax = (1 << (7 - kMant)) - 1;
  for (int c = 0; c < 256; ++c) {
    const int e = (c & 0x7f) >> kMant;
    const int m = c & ((1 << kMant) - 1);
    float v = 0.f;
    if (e == kExpMax && (kHasInf || m == (1 << kMant) - 1)) {
      v = kHasInf && m == 0 ? std::numeric_limits<float>::infinity()
                            : std::numeric_limits<float>::quiet_NaN();
    } else {
      // (e == 0: subnormal, m units of 2^(1 - bias - mant); otherwise
      // (2^mant + m) units of 2^(e - bias - mant).) Exact in FP32.
      v = static_cast<float>(e == 0 ? m : (1 << kMant) + m);
      const int exp2 = (e == 0 ? 1 : e) - kBias - kMant;
      for (int i = 0; i < exp2; ++i) v *= 2.f;
      for (int i = 0; i > exp2; --i) v *= 0.5f;
    }
    t[static_cast<size_t>(c)] = (c & 0x80) != 0 ? -v : v;
  }
  return t;
}

constexpr std::array<float, 256> kE4m3 = decode_table<3, 7, false>();
constexpr std::array<float, 256> kE5m2 = decode_table<2, 15, true>();

}  // namespace fp8_detail

inline uint8_t f32_to_fp8_e4m3(float x) {
  return fp8_detail::encode<3, 7, 0x7eu>(x);
}
inline uint8_t f32_to_fp8_e5m2(float x) {
  return fp8_detail::encode<2, 15, 0x7bu>(x);
}
inline float fp8_e4m3_to_f32(uint8_t c) {
  return fp8_detail::kE4m3[c];
}
inline float fp8_e5m2_to_f32(uint8_t c) {
  return fp8_detail::kE5m2[c];
}
// The decoded values of every code, for table lookups in hot loops.
inline const float *fp8_table(int32_t dtype) {
  return dtype == FD_DTYPE_FP8_E5M2 ? fp8_detail::kE5m2.data() : fp8_detail::kE4m3.data();
}

// Reads element i of a buffer of `dtype` as FP32 (FP8: the stored value,
// without a scale). Every dtype is handled explicitly (no element size is
// assumed): callers pass a valid dtype (kv_dtype_valid), and any other reads
// nothing and gives a quiet NaN.
inline float load_as_f32(const void *base, size_t i, int32_t dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return static_cast<const float *>(base)[i];
    case FD_DTYPE_F16: return f16_to_f32(static_cast<const uint16_t *>(base)[i]);
    case FD_DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t *>(base)[i]);
    case FD_DTYPE_FP8_E4M3: return fp8_e4m3_to_f32(static_cast<const uint8_t *>(base)[i]);
    case FD_DTYPE_FP8_E5M2: return fp8_e5m2_to_f32(static_cast<const uint8_t *>(base)[i]);
    default: return bits_f32(0x7fc00000u);
  }
}

// Writes FP32 value x as element i of a buffer of `dtype` (rounded to nearest
// even; FP8 saturates, S1.1). A dtype that is not valid writes nothing (see
// load_as_f32).
inline void store_from_f32(void *base, size_t i, int32_t dtype, float x) {
  switch (dtype) {
    case FD_DTYPE_F32: static_cast<float *>(base)[i] = x; break;
    case FD_DTYPE_F16: static_cast<uint16_t *>(base)[i] = f32_to_f16(x); break;
    case FD_DTYPE_BF16: static_cast<uint16_t *>(base)[i] = f32_to_bf16(x); break;
    case FD_DTYPE_FP8_E4M3: static_cast<uint8_t *>(base)[i] = f32_to_fp8_e4m3(x); break;
    case FD_DTYPE_FP8_E5M2: static_cast<uint8_t *>(base)[i] = f32_to_fp8_e5m2(x); break;
    default: break;
  }
}

// Converts n elements of `src` (src_dtype) into `dst` (dst_dtype), element i
// at dst element i * dst_stride (> 0). Every value is divided by `scale`
// first (in FP32), so an FP8 destination stores saturate(x / scale) (S1.1).
// Equal types with scale 1 copy the bytes.
inline void convert_elements(const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype,
                             size_t n, int64_t dst_stride, float scale) {
  const size_t stride = static_cast<size_t>(dst_stride);
  if (src_dtype == dst_dtype && scale == 1.f) {
    const size_t e = dtype_size(dst_dtype);
    if (stride == 1) {
      std::memcpy(dst, src, n * e);
    } else {
      for (size_t i = 0; i < n; ++i)
        std::memcpy(static_cast<unsigned char *>(dst) + i * stride * e,
                    static_cast<const unsigned char *>(src) + i * e, e);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i)
    store_from_f32(dst, i * stride, dst_dtype, load_as_f32(src, i, src_dtype) / scale);
}

}  // namespace fd
