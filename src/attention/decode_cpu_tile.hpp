// Reading paged K/V into dense FP32 tiles for the CPU decode backend.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"
#include "attention/decode_cpu_kernels.hpp"
#include "attention/decode_problem.hpp"

namespace fd {

// Storage type of each fd_dtype and its exact conversions to and from FP32.
template <int32_t kDtype>
struct Elem;
template <>
struct Elem<FD_DTYPE_F32> {
  using T = float;
  static float to_f32(float x) { return x; }
  [[gnu::always_inline]] static void to_f32x8(const float *src, float *dst) {
    std::memcpy(dst, src, 8 * sizeof(float));
  }
  static float from_f32(float x) { return x; }
};
template <>
struct Elem<FD_DTYPE_F16> {
  using T = uint16_t;
  // Same results as fd::f16_to_f32, but branch-free so the tile loops
  // vectorise: subnormals are an exact integer-to-float conversion,
  // everything else an exponent re-bias, picked with bit masks.
  static float to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    const uint32_t is_subnormal = 0u - static_cast<uint32_t>(exp == 0);
    const uint32_t is_special = 0u - static_cast<uint32_t>(exp == 31);  // inf or NaN
    const uint32_t normal = (exp + 112u) << 23 | mant << 13;
    const uint32_t special = 0x7f800000u | mant << 13;
    const uint32_t subnormal = f32_bits(static_cast<float>(mant) * 0x1p-24f);
    uint32_t bits = (normal & ~is_special) | (special & is_special);
    bits = (bits & ~is_subnormal) | (subnormal & is_subnormal);
    return bits_f32(bits | sign);
  }
  [[gnu::always_inline]] static void to_f32x8(const uint16_t *src, float *dst) {
    cpu::f16x8_to_f32(src, dst);
  }
  static uint16_t from_f32(float x) { return f32_to_f16(x); }
};
template <>
struct Elem<FD_DTYPE_BF16> {
  using T = uint16_t;
  static float to_f32(uint16_t h) { return bf16_to_f32(h); }
  [[gnu::always_inline]] static void to_f32x8(const uint16_t *src, float *dst) {
    cpu::bf16x8_to_f32(src, dst);
  }
  static uint16_t from_f32(float x) { return f32_to_bf16(x); }
};
// FP8 (stored K/V only, S1.1): the stored value, read through the type's
// 256-entry table (exact); the dequantisation scale is applied by the
// caller (decode folds it into the query scale and the output).
template <int32_t kFp8>
struct Fp8Elem {
  using T = uint8_t;
  static float to_f32(uint8_t c) { return fp8_table(kFp8)[c]; }
  [[gnu::always_inline]] static void to_f32x8(const uint8_t *src, float *dst) {
    const float *table = fp8_table(kFp8);
    for (int i = 0; i < 8; ++i) dst[i] = table[src[i]];
  }
};
template <>
struct Elem<FD_DTYPE_FP8_E4M3> : Fp8Elem<FD_DTYPE_FP8_E4M3> {};
template <>
struct Elem<FD_DTYPE_FP8_E5M2> : Fp8Elem<FD_DTYPE_FP8_E5M2> {};

// Element `offset` .. offset + n - 1 of a q-like buffer of a compute type
// (f32, f16, bf16: the query and output types, chosen at run time; decode
// is templated on the K/V type only) as FP32, and the inverse scaled by
// `mul`. The same conversions as Elem's, so the same bits.
template <int32_t kDtype>
[[gnu::always_inline]] inline void row_to_f32(const void *base, size_t offset, float *dst,
                                              size_t n) {
  const auto *src = static_cast<const typename Elem<kDtype>::T *>(base) + offset;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) Elem<kDtype>::to_f32x8(src + i, dst + i);
  for (; i < n; ++i) dst[i] = Elem<kDtype>::to_f32(src[i]);
}
[[gnu::always_inline]] inline void load_row_f32(const void *base, int32_t dtype, size_t offset,
                                                float *dst, size_t n) {
  switch (dtype) {
    case FD_DTYPE_F32: return row_to_f32<FD_DTYPE_F32>(base, offset, dst, n);
    case FD_DTYPE_F16: return row_to_f32<FD_DTYPE_F16>(base, offset, dst, n);
    default: return row_to_f32<FD_DTYPE_BF16>(base, offset, dst, n);
  }
}
template <int32_t kDtype>
[[gnu::always_inline]] inline void row_from_f32(void *base, size_t offset, const float *src,
                                                float mul, size_t n) {
  auto *dst = static_cast<typename Elem<kDtype>::T *>(base) + offset;
  for (size_t i = 0; i < n; ++i) dst[i] = Elem<kDtype>::from_f32(src[i] * mul);
}
[[gnu::always_inline]] inline void store_row_f32(void *base, int32_t dtype, size_t offset,
                                                 const float *src, float mul, size_t n) {
  switch (dtype) {
    case FD_DTYPE_F32: return row_from_f32<FD_DTYPE_F32>(base, offset, src, mul, n);
    case FD_DTYPE_F16: return row_from_f32<FD_DTYPE_F16>(base, offset, src, mul, n);
    default: return row_from_f32<FD_DTYPE_BF16>(base, offset, src, mul, n);
  }
}

// The K or V tokens of one (row, kv head), addressed through the block table
// and the resolved strides.
template <int32_t kDtype>
class TileSource {
 public:
  using T = typename Elem<kDtype>::T;

  TileSource(const DecodeProblem &pb, const void *cache, uint32_t row, uint32_t kv_head)
      : head_(static_cast<const T *>(cache) + kv_head * pb.kv.stride_head),
        table_(pb.block_tables + static_cast<size_t>(row) * pb.max_blocks_per_seq),
        block_size_(pb.kv.block_size),
        dim_(pb.head_dim),
        stride_block_(pb.kv.stride_block),
        stride_token_(pb.kv.stride_token),
        stride_dim_(pb.kv.stride_dim),
        token_major_(!pb.kv.dim_major()) {}

  // Writes tokens [t0, t0 + n) as FP32 rows of head_dim into dst ([n, head_dim]).
  [[gnu::always_inline]] void gather(size_t t0, size_t n, float *dst) const {
    for (size_t j = 0; j < n;) {
      const size_t t = t0 + j;
      const size_t offset = t % block_size_;
      const size_t run = std::min(block_size_ - offset, n - j);  // tokens left in this block
      const T *src = head_ + table_[t / block_size_] * stride_block_ +
                     static_cast<int64_t>(offset) * stride_token_;
      float *out = dst + j * dim_;
      if (token_major_) {
        // Each token's dims are contiguous (stride_dim == 1).
        for (size_t i = 0; i < run; ++i) {
          const T *tok = src + static_cast<int64_t>(i) * stride_token_;
          float *o = out + i * dim_;
          size_t d = 0;
          for (; d + 8 <= dim_; d += 8) Elem<kDtype>::to_f32x8(tok + d, o + d);
          for (; d < dim_; ++d) o[d] = Elem<kDtype>::to_f32(tok[d]);
        }
      } else {
        // Each dim's tokens are contiguous (stride_token == 1): transpose.
        for (size_t d = 0; d < dim_; ++d) {
          const T *col = src + static_cast<int64_t>(d) * stride_dim_;
          for (size_t i = 0; i < run; ++i) out[i * dim_ + d] = Elem<kDtype>::to_f32(col[i]);
        }
      }
      j += run;
    }
  }

 private:
  const T *head_;
  const int32_t *table_;
  size_t block_size_;
  size_t dim_;
  int64_t stride_block_;
  int64_t stride_token_;
  int64_t stride_dim_;
  bool token_major_;
};

}  // namespace fd
