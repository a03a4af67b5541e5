// Device helpers of the split-half RoPE (semantics.md S3.1) shared by the
// append kernels. The rotation mirrors src/ops/rope.cpp operation by
// operation (out = x1*cos - x2*sin, x2*cos + x1*sin) with explicit
// round-to-nearest intrinsics so that nvcc does not contract the products
// into FMAs the CPU does not use. The cos/sin table is built in
// append_kernel.cu (inv_freq as the CPU's powf, FP32 sincosf).
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
};

template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float load(uint16_t bits) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  }
  static __device__ __forceinline__ uint16_t store(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
};

// The rotated pair (x1 at dim i, x2 at dim i + R/2).
__device__ __forceinline__ float rope_first(float x1, float x2, float c, float s) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}
__device__ __forceinline__ float rope_second(float x1, float x2, float c, float s) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

}  // namespace cuda
}  // namespace fd
