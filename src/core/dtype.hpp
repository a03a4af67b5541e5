// Host-side element types: sizes and exact FP16/BF16 <-> FP32 conversion
// (round to nearest even, NaN kept quiet). Header-only so the CPU backend,
// tests and tools share one definition.
#pragma once

#include <cstdint>
#include <cstring>

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

// Reads element i of a buffer of `dtype` as FP32. Every dtype is handled
// explicitly (no element size is assumed): callers pass a valid dtype
// (dtype_valid), and any other reads nothing and gives a quiet NaN.
inline float load_as_f32(const void *base, size_t i, int32_t dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return static_cast<const float *>(base)[i];
    case FD_DTYPE_F16: return f16_to_f32(static_cast<const uint16_t *>(base)[i]);
    case FD_DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t *>(base)[i]);
    default: return bits_f32(0x7fc00000u);
  }
}

// Writes FP32 value x as element i of a buffer of `dtype` (rounded to nearest
// even). A dtype that is not valid writes nothing (see load_as_f32).
inline void store_from_f32(void *base, size_t i, int32_t dtype, float x) {
  switch (dtype) {
    case FD_DTYPE_F32: static_cast<float *>(base)[i] = x; break;
    case FD_DTYPE_F16: static_cast<uint16_t *>(base)[i] = f32_to_f16(x); break;
    case FD_DTYPE_BF16: static_cast<uint16_t *>(base)[i] = f32_to_bf16(x); break;
    default: break;
  }
}

}  // namespace fd
