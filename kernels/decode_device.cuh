// Device primitives of the paged decode kernels: the mma.sync wrappers,
// cp.async copies, ldmatrix loads, FP8 (E4M3, E5M2) -> f16 conversions, programmatic
// dependent launch and the FD_DECODE_TRACE timing probe.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace fd {
namespace cuda {
namespace detail {

template <class T>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // A pair rounded to bf16, the first in the low half (one cvt).
  static __device__ __forceinline__ uint32_t pack_rn(float x, float y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t *>(&h);
  }
  // The same, and the rounded values back in x and y, so the softmax sum
  // uses exactly what the mma sees.
  static __device__ __forceinline__ uint32_t pack(float &x, float &y) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    x = __low2float(h);
    y = __high2float(h);
    return *reinterpret_cast<const uint32_t *>(&h);
  }
  static __device__ __forceinline__ float to_float(uint16_t bits) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  }
  static __device__ __forceinline__ uint16_t from_float(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
};

template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack_rn(float x, float y) {
    const __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<const uint32_t *>(&h);
  }
  static __device__ __forceinline__ uint32_t pack(float &x, float &y) {
    const __half2 h = __floats2half2_rn(x, y);
    x = __low2float(h);
    y = __high2float(h);
    return *reinterpret_cast<const uint32_t *>(&h);
  }
  static __device__ __forceinline__ float to_float(uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
  }
  static __device__ __forceinline__ uint16_t from_float(float x) {
    return __half_as_ushort(__float2half_rn(x));
  }
};

__device__ __forceinline__ float neg_inf() {
  return __int_as_float(0xff800000u);
}

// 2^x for softmax weights: the SFU's ex2.approx.ftz alone (relative error
// about 2^-22, results below 2^-126 flushed to zero, 2^-inf = 0). exp2f adds
// a range check and two predicated multiplies per call to keep denormal
// results, which softmax weights never need.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; a false `valid` writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t r[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t r[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 8-byte async copy (FP8 dim-major tiles of 8-token blocks); a false
// `valid` writes zeros and reads nothing.
__device__ __forceinline__ void cp_async8(uint32_t dst, const void *src, bool valid) {
  const int bytes = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

// FP8 -> f16, exact (every E4M3 and E5M2 value, NaN and E5M2's infinities
// included, is an f16 value): the low and the high two bytes of x as f16
// pairs (the lower byte in the lower half). E4M3: one cvt each. E5M2 is the
// upper byte of the f16 of the same value (the same sign, exponent field
// and bias, 2 of f16's 10 mantissa bits), so one byte permute each.
struct F16x2x2 {
  uint32_t lo, hi;
};
__device__ __forceinline__ F16x2x2 e4m3x4(uint32_t x) {
  F16x2x2 r;
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\t"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
      : "=r"(r.lo), "=r"(r.hi)
      : "r"(x));
  return r;
}
// Bytes [a, b, c, d] -> [a, c, b, d]: an ldmatrix register of FP8 data holds
// a 2 x 2 block (two 16-bit elements of two bytes); this pairs the bytes
// along the mma's k index.
__device__ __forceinline__ uint32_t pair_bytes(uint32_t x) {
  return __byte_perm(x, 0u, 0x3120);
}

// FP8 bytes [a, b, c, d] of K/V type TKV (E4M3 or E5M2) as f16 pairs: lo =
// (a, b), hi = (c, d) (f8x4), or paired along the mma's k index first, lo =
// (a, c), hi = (b, d) (f8x4_paired, that is f8x4(pair_bytes(x))). For E5M2
// each half is one permute placing the two bytes above zero bytes.
template <class TKV>
__device__ __forceinline__ F16x2x2 f8x4(uint32_t x) {
  if constexpr (std::is_same<TKV, __nv_fp8_e5m2>::value)
    return {__byte_perm(x, 0u, 0x1404), __byte_perm(x, 0u, 0x3424)};
  else
    return e4m3x4(x);
}
template <class TKV>
__device__ __forceinline__ F16x2x2 f8x4_paired(uint32_t x) {
  if constexpr (std::is_same<TKV, __nv_fp8_e5m2>::value)
    return {__byte_perm(x, 0u, 0x2404), __byte_perm(x, 0u, 0x3414)};
  else
    return e4m3x4(pair_bytes(x));
}

// Two f16 mma's from two ldmatrix registers of FP8 2 x 2 blocks (w0: the
// b0 halves, w1: the b1 halves): the blocks' first column into c0, their
// second into c1.
template <class TKV>
__device__ __forceinline__ void mma_f8_pairs(float c0[4], float c1[4], const uint32_t a[4],
                                             uint32_t w0, uint32_t w1) {
  const F16x2x2 x0 = f8x4_paired<TKV>(w0), x1 = f8x4_paired<TKV>(w1);
  Mma<__half>::run(c0, a, x0.lo, x1.lo);
  Mma<__half>::run(c1, a, x0.hi, x1.hi);
}

// Tensor-memory-access (TMA) copies completing on shared-memory mbarriers
// (sm_90): the swapped FP8 kernel's staging (decode_swapped.cuh). An
// mbarrier phase completes when its pending arrivals reach zero and every
// byte announced by arrive_expect_tx has landed.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals));
}
// Makes initialised mbarriers visible to the async proxy (the TMA unit);
// the CTA's threads see them after the next __syncthreads.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` more bytes to land on the barrier.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Orders this thread's generic-proxy shared-memory writes before later
// async-proxy (TMA) accesses of the same memory.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Loads the box at coordinates (c0, c1, c2, c3) of the 4-d tensor map at
// generic address `map` (a __grid_constant__ kernel parameter) into shared
// memory at `dst`; its bytes complete on mbarrier `bar`. Coordinates outside
// the tensor read nothing and fill zeros.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, int c0, int c1, int c2,
                                            int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Programmatic dependent launch (sm_90). The kernels are launched with the
// programmatic-stream-serialization attribute, so a kernel may be scheduled
// while the previous one in the stream is still running: `pdl_wait` blocks
// until that grid has completed and its memory is visible (it returns at once
// for a normal launch), so nothing before it may read memory an earlier
// kernel could have written. `pdl_launch_dependents` lets the next kernel's
// CTAs be scheduled now (they still wait for this grid to complete), which
// hides the launch latency between consecutive kernels.
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Timing probe (bench/trace_probe.cu defines FD_DECODE_TRACE; the library
// never does): thread 0 of every CTA stamps %globaltimer at fixed points into
// fd_trace_attn[cta * 8 + point] / fd_trace_merge[cta * 4 + point]. `dep` is a
// register the stamp waits for, so a stamp after a load marks its arrival.
// Attention points: 0 entry, 1 after griddepcontrol.wait, 2 seq_len arrived,
// 3 first K/V tile in shared memory, 4 after the main loop, 6 warp partials in
// shared memory, 7 per-head weights done, 5 after the output/partial writes.
// Merge points: 0 entry (after its seq_lens load), 1 after the wait, 2 before
// its output stores.
#ifdef FD_DECODE_TRACE
__device__ unsigned long long *fd_trace_attn;
__device__ unsigned long long *fd_trace_merge;
__device__ __forceinline__ void trace_stamp(unsigned long long *buf, int point, uint32_t dep) {
  unsigned long long t;
  asm volatile("{\n\t.reg .u32 d;\n\tmov.u32 d, %1;\n\tmov.u64 %0, %%globaltimer;\n\t}"
               : "=l"(t)
               : "r"(dep)
               : "memory");
  buf[point] = t;
}
#define FD_TRACE(buf, stride, point, dep)                                 \
  do {                                                                    \
    if (threadIdx.x == 0 && buf != nullptr)                               \
      trace_stamp(buf + static_cast<int64_t>(blockIdx.x) * stride, point, \
                  static_cast<uint32_t>(dep));                            \
  } while (0)
#else
#define FD_TRACE(buf, stride, point, dep) \
  do {                                    \
  } while (0)
#endif

}  // namespace detail
}  // namespace cuda
}  // namespace fd
