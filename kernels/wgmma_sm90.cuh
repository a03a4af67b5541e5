// Hopper (sm_90a) warpgroup matrix multiply: the PTX wrappers the sm90
// attention kernel (decode_sm90.cu) uses, kept apart so a probe can test
// exactly these. Every function here is issued by all 128 threads of a
// warpgroup (4 consecutive warps starting at a warp index divisible by 4).
//
// Shared-memory operands are described by a 64-bit matrix descriptor (PTX
// ISA, "Matrix Descriptor Format"): start address, leading and stride byte
// offsets (all in 16-byte units) and the swizzle mode. The kernel stages
// every K and V tile the same way: rows of one token, each row's head_dim
// elements cut into 64-element (128-byte) halves stored as separate
// [64 tokens][128 bytes] blocks, and the 16-byte chunks of each 128-byte row
// XOR-swizzled by the row's index mod 8 (the 128-byte swizzle, applied by
// the hardware to address bits [4, 7) from bits [7, 10), so every block
// starts on a 1024-byte boundary).
//  * K as B of S = Q K^T (K-major: the 16-element k-slices lie along a row):
//    8-row groups 1024 bytes apart (stride offset); a k-step of 16 elements
//    advances the start address by 32 bytes inside the 128-byte row, the
//    second half of head_dim starts at the next block.
//  * V as B of O = P V (N-major, transposed B: head_dim is contiguous):
//    64-element halves of N one block apart (leading offset), 8-token groups
//    of the k-step 1024 bytes apart (stride offset); a k-step of 16 tokens
//    advances the start address by 16 rows.
// A comes from registers in the mma.sync m16n8k16 A-fragment layout (warp w
// of the warpgroup holds rows 16 w .. 16 w + 15); the f32 accumulators are
// the m16n8 C fragments of warp w's rows, one per 8 columns.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fd {
namespace cuda {
namespace sm90 {

// Swizzle mode field (bits 62-63) of a descriptor: 1 = 128-byte swizzle.
constexpr uint64_t kSwizzle128 = 1;

__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lead_bytes,
                                              uint32_t stride_bytes) {
  return static_cast<uint64_t>((addr & 0x3ffffu) >> 4) |
         (static_cast<uint64_t>((lead_bytes >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3fffu) << 32) | (kSwizzle128 << 62);
}

// Orders register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes generic-proxy writes to shared memory (cp.async, st.shared) visible
// to the async proxy that wgmma reads shared memory through.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across a
// wgmma wait (the asm statements above only order memory).
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// One wgmma with A from registers and f32 accumulators, the element type
// spelled TY ("bf16" or "f16"): operands d[0..N/2), a[0..3], desc,
// accumulate, kTransB.
#define FD_WGMMA_M64N64K16(TY)                                                                     \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                      \
      " {"                                                                                         \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                     \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"             \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                           \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                         \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kTransB))

#define FD_WGMMA_M64N128K16(TY)                                                                    \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                                     \
      " {"                                                                                         \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                     \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"             \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                                           \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
        "+f"(d[63])                                                                                \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate), "n"(kTransB))

// D[64 x 64] (+)= A[64 x 16] (registers) * B[16 x 64] (shared memory, `desc`),
// T = __nv_bfloat16 or __half; kTransB: B is N-major (V tiles), else K-major
// (K tiles); `accumulate` 0 overwrites D.
template <class T, int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4],
                                                uint64_t desc, int accumulate) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    FD_WGMMA_M64N64K16("bf16");
  else
    FD_WGMMA_M64N64K16("f16");
}

// D[64 x 128] (+)= A[64 x 16] (registers) * B[16 x 128] (shared memory, `desc`),
// T = __nv_bfloat16 or __half; kTransB: B is N-major (V tiles), else K-major
// (K tiles); `accumulate` 0 overwrites D.
template <class T, int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], const uint32_t (&a)[4],
                                                 uint64_t desc, int accumulate) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    FD_WGMMA_M64N128K16("bf16");
  else
    FD_WGMMA_M64N128K16("f16");
}

#undef FD_WGMMA_M64N64K16
#undef FD_WGMMA_M64N128K16

}  // namespace sm90
}  // namespace cuda
}  // namespace fd
