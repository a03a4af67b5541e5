// Device helpers of the RoPE (docs/semantics.md S3.1, split-half and
// interleaved pairs) shared by the append kernels. The rotation mirrors src/ops/rope.cpp operation
// by operation (out = x1*cos - x2*sin, x2*cos + x1*sin) with explicit round-to-nearest intrinsics
// so that nvcc does not contract the products into FMAs the CPU does not use. The cos/sin table is
// built in append_kernel.cu (inv_freq as the CPU's powf, FP32 sincosf).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fd {
namespace cuda {

// Element conversions between storage bits and FP32 (round to nearest even).
template <class T>
struct Elem;

template <>
struct Elem<__half> {
  static __device__ __forceinline__ float load(uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
  }
  static __device__ __forceinline__ uint16_t store(float x) {
    return __half_as_ushort(__float2half_rn(x));
  }
  // Two elements packed in a word (the first in the low half).
  static __device__ __forceinline__ float2 load2(uint32_t w) {
    return __half22float2(__halves2half2(__ushort_as_half(static_cast<uint16_t>(w)),
                                         __ushort_as_half(static_cast<uint16_t>(w >> 16))));
  }
  static __device__ __forceinline__ uint32_t store2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return static_cast<uint32_t>(__half_as_ushort(__low2half(h))) |
           (static_cast<uint32_t>(__half_as_ushort(__high2half(h))) << 16);
  }
};

template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float load(uint16_t bits) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  }
  static __device__ __forceinline__ uint16_t store(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  // Two elements packed in a word (the first in the low half): the bf16 bits
  // are the high half of the FP32 bits.
  static __device__ __forceinline__ float2 load2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  }
  static __device__ __forceinline__ uint32_t store2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return static_cast<uint32_t>(__bfloat16_as_ushort(__low2bfloat16(h))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__high2bfloat16(h))) << 16);
  }
};

// The rotated pair (x1 at dim i, x2 at dim i + R/2 split-half; x1 at dim 2i,
// x2 at dim 2i + 1 interleaved).
__device__ __forceinline__ float rope_first(float x1, float x2, float c, float s) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}
__device__ __forceinline__ float rope_second(float x1, float x2, float c, float s) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

}  // namespace cuda
}  // namespace fd
