// Device helpers of the split-half RoPE (semantics.md S3.1) shared by the
// append kernels. The arithmetic mirrors src/ops/rope.cpp operation by
// operation (inv_freq = powf(base, -2i/R) computed as (-2*i)/R, angle =
// p * inv_freq, out = x1*cos - x2*sin, x2*cos + x1*sin) with explicit
// round-to-nearest intrinsics so that nvcc does not contract the products
// into FMAs the CPU does not use.
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

// cos and sin of position p for rotation pair i of rotary_dim R. The FP32
// exponent and angle are formed exactly as on the CPU; pow and sincos run in
// FP64 and are rounded once to FP32, i.e. to the correctly rounded
// powf/cosf/sinf that the CPU's libm returns. A last-bit difference in
// inv_freq would otherwise move the angle of a large position by whole FP32
// ulps of the angle (0.008 rad at p = 131071). Runs once per rotation pair
// and token, shared by every head, so FP64 costs nothing measurable.
__device__ __forceinline__ void rope_cos_sin(int32_t p, int i, int R, float base, float *c,
                                             float *s) {
  const float exponent = __fdiv_rn(-2.0f * static_cast<float>(i), static_cast<float>(R));
  const float inv_freq =
      static_cast<float>(pow(static_cast<double>(base), static_cast<double>(exponent)));
  const float angle = __fmul_rn(static_cast<float>(p), inv_freq);
  double sd, cd;
  sincos(static_cast<double>(angle), &sd, &cd);
  *c = static_cast<float>(cd);
  *s = static_cast<float>(sd);
}

// The rotated pair (x1 at dim i, x2 at dim i + R/2).
__device__ __forceinline__ float rope_first(float x1, float x2, float c, float s) {
  return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}
__device__ __forceinline__ float rope_second(float x1, float x2, float c, float s) {
  return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

}  // namespace cuda
}  // namespace fd
