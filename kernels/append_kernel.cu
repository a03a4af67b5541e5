// KV append and fused RoPE + append kernels (semantics.md S3).
//
// One CTA per token. The CTA first computes the token's cos/sin table (one
// powf + sincosf per rotation pair, shared by every head), then its threads
// walk a flat list of work units:
//   Q heads (fused form): rotation units then pass-through units -> q_out;
//   K heads: the same units (fused) or plain copy units -> the K cache;
//   V heads: plain copy units -> the V cache.
// A rotation unit takes up to 8 pairs (dims i..i+7 and R/2+i..R/2+i+7), so
// the thread that reads a pair also writes it: an in-place q_out is safe. A
// copy unit moves up to 8 consecutive dims. Loads and stores are 16-byte
// vectors when the address is aligned and the run is contiguous, else
// element-wise (dim-major caches store one element per dim).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "append_launch.hpp"
#include "flashdec.h"
#include "rope_rotate.cuh"

namespace fd {
namespace cuda {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kVec = 8;  // elements per unit (16 bytes)

__device__ __forceinline__ bool aligned16(const void *p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

__device__ __forceinline__ void load_run(const uint16_t *p, int n, uint16_t (&x)[kVec]) {
  if (n == kVec && aligned16(p)) {
    const uint4 w = *reinterpret_cast<const uint4 *>(p);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      x[2 * t] = static_cast<uint16_t>(words[t] & 0xffffu);
      x[2 * t + 1] = static_cast<uint16_t>(words[t] >> 16);
    }
    return;
  }
#pragma unroll
  for (int t = 0; t < kVec; ++t) x[t] = t < n ? p[t] : uint16_t{0};
}

__device__ __forceinline__ void store_run(uint16_t *p, int64_t stride, int n,
                                          const uint16_t (&x)[kVec]) {
  if (stride == 1 && n == kVec && aligned16(p)) {
    uint4 w;
    w.x = x[0] | (static_cast<uint32_t>(x[1]) << 16);
    w.y = x[2] | (static_cast<uint32_t>(x[3]) << 16);
    w.z = x[4] | (static_cast<uint32_t>(x[5]) << 16);
    w.w = x[6] | (static_cast<uint32_t>(x[7]) << 16);
    *reinterpret_cast<uint4 *>(p) = w;
    return;
  }
#pragma unroll
  for (int t = 0; t < kVec; ++t)
    if (t < n) p[t * stride] = x[t];
}

// Copies dims [d0, d0 + n) of one head.
__device__ __forceinline__ void copy_unit(const uint16_t *src, uint16_t *dst, int64_t sd, int d0,
                                          int n) {
  uint16_t x[kVec];
  load_run(src + d0, n, x);
  store_run(dst + d0 * sd, sd, n, x);
}

// Unit j of a rotated head: rotation pairs first, then the dims past R.
template <class T>
__device__ __forceinline__ void rotate_unit(const uint16_t *src, uint16_t *dst, int64_t sd, int j,
                                            int D, int R, const float *cos_s, const float *sin_s) {
  const int half = R / 2;
  const int pair_units = (half + kVec - 1) / kVec;
  if (j >= pair_units) {
    const int d0 = R + (j - pair_units) * kVec;
    copy_unit(src, dst, sd, d0, min(kVec, D - d0));
    return;
  }
  const int i0 = j * kVec, n = min(kVec, half - i0);
  uint16_t a[kVec], b[kVec];
  load_run(src + i0, n, a);
  load_run(src + half + i0, n, b);
#pragma unroll
  for (int t = 0; t < kVec; ++t) {
    if (t < n) {
      const float x1 = Elem<T>::load(a[t]), x2 = Elem<T>::load(b[t]);
      const float c = cos_s[i0 + t], s = sin_s[i0 + t];
      a[t] = Elem<T>::store(rope_first(x1, x2, c, s));
      b[t] = Elem<T>::store(rope_second(x1, x2, c, s));
    }
  }
  store_run(dst + i0 * sd, sd, n, a);
  store_run(dst + (half + i0) * sd, sd, n, b);
}

template <class T>
__global__ void __launch_bounds__(kMaxThreads) append_kernel(const AppendLaunch a) {
  __shared__ float cos_s[kAppendMaxHeadDim / 2];
  __shared__ float sin_s[kAppendMaxHeadDim / 2];
  const int r = blockIdx.x;
  const int D = a.head_dim, R = a.rotary_dim;
  const int hq = a.num_q_heads, hkv = a.num_kv_heads;
  if (R > 0) {
    const int32_t p = a.positions[r];
    for (int i = threadIdx.x; i < R / 2; i += blockDim.x)
      rope_cos_sin(p, i, R, a.rope_base, &cos_s[i], &sin_s[i]);
    __syncthreads();
  }
  // Element offset of (head 0, dim 0) of this token in k_dst / v_dst.
  int64_t at, sh, sd;
  if (a.block_ids != nullptr) {
    at = int64_t{a.block_ids[r]} * a.stride_block + int64_t{a.offsets[r]} * a.stride_token;
    sh = a.stride_head;
    sd = a.stride_dim;
  } else {
    at = int64_t{r} * hkv * D;
    sh = D;
    sd = 1;
  }
  const int plain_units = (D + kVec - 1) / kVec;
  const int rot_units = R > 0 ? (R / 2 + kVec - 1) / kVec + (D - R + kVec - 1) / kVec : 0;
  const int q_units = a.q != nullptr ? hq * rot_units : 0;
  const int k_per_head = R > 0 ? rot_units : plain_units;
  const int k_units = hkv * k_per_head;
  const int v_units = a.v != nullptr ? hkv * plain_units : 0;
  const int total = q_units + k_units + v_units;
  const auto *q = static_cast<const uint16_t *>(a.q);
  const auto *k = static_cast<const uint16_t *>(a.k);
  const auto *v = static_cast<const uint16_t *>(a.v);
  auto *q_out = static_cast<uint16_t *>(a.q_out);
  auto *k_dst = static_cast<uint16_t *>(a.k_dst);
  auto *v_dst = static_cast<uint16_t *>(a.v_dst);
  for (int u = threadIdx.x; u < total; u += blockDim.x) {
    if (u < q_units) {
      const int h = u / rot_units, j = u - h * rot_units;
      const int64_t row = (int64_t{r} * hq + h) * D;
      rotate_unit<T>(q + row, q_out + row, 1, j, D, R, cos_s, sin_s);
    } else if (u < q_units + k_units) {
      const int w = u - q_units, h = w / k_per_head, j = w - h * k_per_head;
      const uint16_t *src = k + (int64_t{r} * hkv + h) * D;
      uint16_t *dst = k_dst + at + h * sh;
      if (R > 0)
        rotate_unit<T>(src, dst, sd, j, D, R, cos_s, sin_s);
      else
        copy_unit(src, dst, sd, j * kVec, min(kVec, D - j * kVec));
    } else {
      const int w = u - q_units - k_units, h = w / plain_units, j = w - h * plain_units;
      copy_unit(v + (int64_t{r} * hkv + h) * D, v_dst + at + h * sh, sd, j * kVec,
                min(kVec, D - j * kVec));
    }
  }
}

}  // namespace

cudaError_t launch_append(const AppendLaunch &a) {
  if (a.num_tokens <= 0) return cudaSuccess;
  const int D = a.head_dim, R = a.rotary_dim;
  const int plain_units = (D + kVec - 1) / kVec;
  const int rot_units = R > 0 ? (R / 2 + kVec - 1) / kVec + (D - R + kVec - 1) / kVec : 0;
  const int total = (a.q != nullptr ? a.num_q_heads * rot_units : 0) +
                    a.num_kv_heads * (R > 0 ? rot_units : plain_units) +
                    (a.v != nullptr ? a.num_kv_heads * plain_units : 0);
  int threads = (total + 31) / 32 * 32;
  if (threads > kMaxThreads) threads = kMaxThreads;
  if (threads < 32) threads = 32;
  const dim3 grid(static_cast<unsigned>(a.num_tokens));
  if (a.dtype == FD_DTYPE_F16)
    append_kernel<__half><<<grid, threads, 0, a.stream>>>(a);
  else
    append_kernel<__nv_bfloat16><<<grid, threads, 0, a.stream>>>(a);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace fd
