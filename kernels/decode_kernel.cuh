// Paged decode attention on tensor cores (sm_80+ mma.sync, built for sm_90).
//
// One CTA of 4 warps serves one (row, KV head, split-KV range). All q heads of
// the GQA group live in the rows of a 16-row mma tile (two tiles for groups of
// 17..32), so each K/V element is fetched from memory once and used by every
// head of its group. The CTA streams 64-token tiles of K and V through a
// 2-stage (head_dim 128) or 3-stage (64) cp.async ring in shared memory
// (16-byte copies, block-table entries fetched one tile ahead; 3 or 4 CTAs
// per SM keep the memory busy while one starts or ends); each warp owns
// 16-token slices of every tile and keeps its own FP32 online-softmax state;
// the warps merge in a fixed order at the end. A split writes an unnormalised
// partial (O, max, sum) that decode_merge_kernel combines in a fixed order,
// so results are bit-identical from run to run.
//
// FP8 E4M3 K/V (decode_fp8.cu): the same CTA, 64-token tiles of half the
// bytes with twice the stages, ldmatrix on the FP8 bytes and an exact
// cvt.rn.f16x2.e4m3x2 per pair of elements in registers before f16 mma's
// (the K scale is in the logit scale, the V scale one multiply on the
// output); see the kFp8 branches and docs/kernel-design.md.
//
// Layouts: token-major tiles are staged as [token][dim] (rows XOR-swizzled in
// 16-byte chunks), dim-major tiles keep each block's [dim][block_size] slab
// in memory order (see dm_offset); the only difference in the math is which
// ldmatrix (plain or transposing) feeds the mma, and ldmatrix reads are free
// of bank conflicts in both. Both kernels use programmatic dependent launch
// (pdl_wait).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "decode_launch.hpp"
#include "flashdec.h"

namespace fd {
namespace cuda {
namespace detail {

// Warps of a CTA that own m-tiles and token slices (head_dim 256 runs each
// of them as a pair of warps, Config::kDimSplit).
constexpr int kWarps = 4;
constexpr int kTile = kDecodeTileTokens;
constexpr int kStepTokens = 16;  // tokens per warp step (the PV mma's k)
constexpr int kStepsPerTile = kTile / kStepTokens;

// Bytes per element of the 16-bit K/V types; FP8 K/V (one byte) has its
// own staging and fragment code (the kFp8 branches of decode_kernel).
constexpr int kKvElemBytes = 2;

// K/V element types: FP8 E4M3 is stored K/V only and is dequantised to f16
// in registers (decode_kernel's kFp8 path); the 16-bit types feed the mma as
// they are.
template <class TKV>
struct KvType {
  static constexpr bool kFp8 = false;
  using MmaT = TKV;  // the mma operand type
};
template <>
struct KvType<__nv_fp8_e4m3> {
  static constexpr bool kFp8 = true;
  using MmaT = __half;
};

template <int D, int kElemBytes = 2>
struct Config {
  // Staged row width of a token-major tile (elements): D (tile_offset keeps
  // D = 96's swizzle inside its 12-chunk rows).
  static constexpr int kRowElems = D;
  static constexpr int kTileElems = kTile * kRowElems;  // of K (or V) per stage
  // Fewer stages, more CTAs per SM: a CTA's start (seq_len, table, first
  // tile) and end (merges, writes) then overlap other CTAs' streaming. H200,
  // bf16: D = 128 with 2 stages x 3 CTAs/SM instead of 3 x 2: A ragged 0.94 ->
  // 0.98, C ragged 0.76 -> 0.86 of copy; D = 64 with 3 x 4 instead of 4 x 3:
  // D 128x2048 0.79 -> 0.95, D ragged 0.76 -> 0.80 (docs/kernel-design.md).
  // FP8 tiles are half the bytes: twice the stages in the same shared memory
  // keep as many bytes in flight per CTA with the same 64-token tiles (so the
  // split layout is unchanged).
  // D = 96: 3 stages of its 12 KB tiles at 3 CTAs/SM (216 KB). With D =
  // 128's shape (2 stages of tiles padded to 128 dims) it read 0.93-0.94 of
  // copy at 32/32 heads, and ran faster the shorter its CTAs (8-12 splits):
  // too few bytes in flight per SM.
  // D = 256: a 64-token stage is 64 KB, so one CTA per SM with 3 stages
  // (192 KB; O alone is 128 registers per thread).
  static constexpr int kStages = kElemBytes == 2 ? (D == 128 ? 2 : 3) : (D == 128 ? 4 : 6);
  // D = 256 runs 8 warps: each of the kWarps (m-tile, token slice) roles is
  // a pair of warps that compute the same scores and each accumulate half of
  // O's dims (64 O registers per thread instead of 128, so no spill and two
  // warps per SM sub-partition instead of one). Other dims: one warp a role.
  static constexpr int kDimSplit = D == 256 ? 2 : 1;
  static constexpr int kThreads = kWarps * 32 * kDimSplit;
  static constexpr int kChunksPerThread = kTile * D * kElemBytes / 16 / kThreads;  // 16-byte copies
  static constexpr int kSmemBytes = kStages * 2 * kTileElems * kElemBytes;
  static constexpr int kCtasPerSm = D == 64 ? 4 : (D == 256 ? 1 : 3);
};

// Row stride (floats) of the warp-merge buffer; see decode_kernel. FP8
// token-major tiles leave each thread 4 consecutive dims of O per row (stored
// as float4): 16 floats of padding keep a quarter warp's rows apart.
template <int D, bool kWide = false>
constexpr int kRedStride = D + (kWide ? 16 : 8);
// Query rows one CTA serves at most: four 16-row m-tiles, one per warp.
constexpr int kMaxQueryRows = kWarps * 16;
static_assert(kDecodeMaxQueryRows == kMaxQueryRows, "decode_launch.hpp's bound");
// The warp merge at the end reuses the pipeline's shared memory: per warp
// 16 rows of O, max, sum and weight, then (max, sum) per query row.
static_assert(kWarps * 16 * kRedStride<128> * 4 + 3 * kWarps * 16 * 4 + 2 * kMaxQueryRows * 4 <=
                  Config<128>::kSmemBytes,
              "merge buffer");
static_assert(kWarps * 16 * kRedStride<64> * 4 + 3 * kWarps * 16 * 4 + 2 * kMaxQueryRows * 4 <=
                  Config<64>::kSmemBytes,
              "merge buffer");
static_assert(kWarps * 16 * kRedStride<96> * 4 + 3 * kWarps * 16 * 4 + 2 * kMaxQueryRows * 4 <=
                  Config<96>::kSmemBytes,
              "merge buffer");
static_assert(kWarps * 16 * kRedStride<256> * 4 + 3 * kWarps * 16 * 4 + 2 * kMaxQueryRows * 4 <=
                  Config<256>::kSmemBytes,
              "merge buffer");
static_assert(kWarps * 16 * kRedStride<128, true> * 4 + 3 * kWarps * 16 * 4 +
                      2 * kMaxQueryRows * 4 <=
                  Config<128, 1>::kSmemBytes,
              "merge buffer");
static_assert(kWarps * 16 * kRedStride<64, true> * 4 + 3 * kWarps * 16 * 4 +
                      2 * kMaxQueryRows * 4 <=
                  Config<64, 1>::kSmemBytes,
              "merge buffer");

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

// How far (base 2) a score may pass a row's reference max before the
// attention loop moves the reference and rescales O (decode_kernel), by the
// type of P. f16 P (f16 and FP8 K/V): 8, so weights stay below 2^8 and after
// the first steps the rescale, most of a step's multiplies, is skipped. bf16
// P: 0, the reference is the exact running max (the largest weight is then
// exactly 1; with 8 bits of precision, rounding it too moved bf16 errors
// from below to just above 5e-3 in gpu_decode's sweep).
template <class TQ>
constexpr float kMaxSlack = std::is_same<TQ, __half>::value ? 8.f : 0.f;

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

// FP8 E4M3 -> f16, exact (every E4M3 value, NaN included, is an f16 value):
// the low and the high two bytes of x as f16 pairs (the lower byte in the
// lower half), one cvt each.
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

// Two f16 mma's from two ldmatrix registers of FP8 2 x 2 blocks (w0: the
// b0 halves, w1: the b1 halves): the blocks' first column into c0, their
// second into c1.
__device__ __forceinline__ void mma_f8_pairs(float c0[4], float c1[4], const uint32_t a[4],
                                             uint32_t w0, uint32_t w1) {
  const F16x2x2 x0 = e4m3x4(pair_bytes(w0)), x1 = e4m3x4(pair_bytes(w1));
  Mma<__half>::run(c0, a, x0.lo, x1.lo);
  Mma<__half>::run(c1, a, x0.hi, x1.hi);
}

// FP8 token-major staging: rows of D bytes in 16-byte chunks; a 128-byte
// line holds 128 / D rows, and a chunk's slot in its line is XOR-swizzled so
// that the 8 consecutive rows of one ldmatrix 8x8 matrix (fixed chunk) and
// the 8 chunks of one quarter-warp copy fall into 8 distinct 16-byte bank
// groups. Byte offset of chunk c of row r.
template <int D>
__device__ __forceinline__ int f8_tm_offset(int r, int c) {
  if (D == 128) return (r * 8 + (c ^ (r & 7))) * 16;
  const int line = r >> 1;  // D == 64: two rows per line
  return (line * 8 + ((((r & 1) << 2) | c) ^ (line & 3))) * 16;
}
// FP8 dim-major staging: per 16-token group of the tile, D rows of 16 bytes
// (the group's tokens of one dim), so one ldmatrix row is 16 tokens of one
// dim for every block size. Odd groups swap the dims' 64-byte halves (bs 32
// copies write two groups' rows at once). Byte offset of (group, dim).
template <int D>
__device__ __forceinline__ int f8_dm_offset(int q16, int d) {
  return (q16 * D + (d ^ ((q16 & 1) << 2))) * 16;
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

// Element offset of 16-byte chunk c of row r in a staged tile whose rows hold
// `chunks` chunks. 8, 16 or 32 chunks: XOR-swizzled by the row's low 3 bits.
// 12 (D = 96): each group of 4 chunks is swizzled by bits 1-2 of the row, so
// a chunk stays in its group and row. Either way the 8 rows an ldmatrix 8x8
// matrix reads at one chunk (rows r..r+7, r a multiple of 8) fall into 8
// distinct 16-byte bank groups: with 12 chunks (192 bytes) a row's bank group
// is 4 x ((r + c / 4) & 1) + the swizzled low 2 bits.
__device__ __forceinline__ int tile_offset(int r, int c, int chunks) {
  if (chunks == 12) return (r * 12 + ((c & ~3) | ((c ^ (r >> 1)) & 3))) * 8;
  return (r * chunks + (c ^ (r & 7))) * 8;
}

template <bool kDimMajor, int D>
struct TileShape {
  // Token-major: rows are tokens, D/8 chunks of dims, staged in rows of
  // kRowChunks chunks (tile_offset). Dim-major tiles use
  // dm_offset instead.
  static constexpr int kChunks = D / 8;
  static constexpr int kRowChunks = Config<D>::kRowElems / 8;
};

// Dim-major tiles keep every block's [dim][block_size] slab in its memory
// order: 16-byte chunk (dim r, token chunk c) of the tile sits at chunk index
// ((c / cpb) * D + r) * cpb + (c % cpb), cpb = block_size / 8 chunks per dim,
// with c % cpb XOR-swizzled by bits of r. So a warp's 512 contiguous bytes of
// K or V land in 512 contiguous bytes of shared memory (the copy writes whole
// lines, as token-major copies do), and the 8 consecutive dims that one
// ldmatrix 8x8 matrix reads at a fixed token chunk fall into 8 distinct
// 16-byte bank groups for cpb = 1, 2 and 4.
__device__ __forceinline__ int dm_swizzle(int r, int cpb_log2) {
  return (r >> (3 - cpb_log2)) & ((1 << cpb_log2) - 1);
}
template <int D>
__device__ __forceinline__ int dm_offset(int r, int c, int cpb_log2) {
  const int k = c & ((1 << cpb_log2) - 1);
  return (((((c >> cpb_log2) * D + r) << cpb_log2) | (k ^ dm_swizzle(r, cpb_log2)))) * 8;
}

// Where the thread's i-th 16-byte copy of a tile comes from and goes to.
// Consecutive lanes take consecutive 16-byte pieces of memory: whole
// 256/128-byte token rows (token-major), or a block's [dim][block_size] slab
// in memory order (dim-major, `cpb_log2` = log2(block_size / 8) chunks per
// dim row), so every warp-wide copy reads 512 contiguous bytes of packed
// storage. `row` is the token (token-major) or dim (dim-major), `chunk` the
// dim chunk or token chunk, `token` the first token relative to the tile and
// `smem` the element offset in the staged tile.
struct CopyCoords {
  int row, chunk, token, smem;
};
template <bool kDimMajor, int D>
__device__ __forceinline__ CopyCoords copy_coords(int tid, int i, int cpb_log2) {
  constexpr int kChunks = TileShape<kDimMajor, D>::kChunks;
  const int q = tid + Config<D>::kThreads * i;
  CopyCoords cc;
  if (kDimMajor) {
    // A block holds D << cpb_log2 chunks: block q_dim / D of the tile, dim
    // q_dim % D (D is a constant: shifts for powers of two).
    const int q_dim = q >> cpb_log2;
    const int blk = q_dim / D;
    cc.row = q_dim - blk * D;
    cc.chunk = (blk << cpb_log2) + (q & ((1 << cpb_log2) - 1));
    cc.token = cc.chunk * 8;
    cc.smem = (q ^ dm_swizzle(cc.row, cpb_log2)) * 8;  // == dm_offset<D>(row, chunk)
  } else {
    cc.row = q / kChunks;
    cc.chunk = q % kChunks;
    cc.token = cc.row;
    cc.smem = tile_offset(cc.row, cc.chunk, TileShape<kDimMajor, D>::kRowChunks);
  }
  return cc;
}

// FP8 tiles (bytes): token-major as above with D/16 chunks per token;
// dim-major in pieces of 16 tokens of one dim (bs 16, 32: `pcb_log2` =
// log2(bs / 16) pieces per dim row of a block) or 8 tokens (bs 8, 8-byte
// copies: `pcb_log2` = 0), consecutive lanes taking consecutive pieces of a
// block's [dim][block_size] slab. `smem` is the byte offset.
template <bool kDimMajor, int D>
__device__ __forceinline__ CopyCoords copy_coords_f8(int tid, int i, int bs_log2) {
  const int q = tid + Config<D, 1>::kThreads * i;
  CopyCoords cc;
  if (kDimMajor) {
    const int pcb_log2 = bs_log2 > 4 ? bs_log2 - 4 : 0;
    const int per_block_log2 = pcb_log2 + (D == 128 ? 7 : 6);
    const int within = q & ((1 << per_block_log2) - 1);
    cc.row = within >> pcb_log2;
    cc.chunk = within & ((1 << pcb_log2) - 1);
    cc.token = ((q >> per_block_log2) << bs_log2) + cc.chunk * 16;
    cc.smem = f8_dm_offset<D>(cc.token >> 4, cc.row) + (cc.token & 8);
  } else {
    constexpr int kChunks = D / 16;
    cc.row = q / kChunks;
    cc.chunk = q % kChunks;
    cc.token = cc.row;
    cc.smem = f8_tm_offset<D>(cc.row, cc.chunk);
  }
  return cc;
}

struct Params {
  const void *q;
  const void *k;
  const void *v;
  void *out;
  const int32_t *block_tables;
  const int32_t *seq_lens;
  const int32_t *q_indptr;  // [batch + 1] query-token offsets, or null (one per row)
  int64_t stride_block, stride_head, stride_token, stride_dim;
  // Copies address in bytes: a block's, a token's and a dim's step (the
  // strides times the element size, so kernels read them from the constant
  // bank instead of forming 64-bit element products per copy).
  uint64_t block_bytes, token_bytes, dim_bytes;
  int32_t block_size_log2, num_blocks, max_blocks_per_seq, m_tiles;
  DecodeWorkList work;    // which (row, KV head, split) each CTA serves
  VariantPolicy variant;  // logits, soft-cap and window (attention/variant.hpp)
  const float *sinks;     // [num_q_heads] natural sink logits, or null
  float *partial_o;
  float *partial_ml;
  float v_scale;  // V dequantisation scale, applied once to the output (K's is in variant)
  bool q_bf16;    // FP8 K/V: q and out are bf16 (else f16)
};

// TQ: element type of q and out; TKV: of K and V. 16-bit K/V: TQ == TKV (the
// host serves no other pair). FP8 K/V (KvType<TKV>::kFp8): TQ is __half, the
// mma type, and q / out are f16 or bf16 by p.q_bf16 (a bf16 q row is scaled
// by a power of two into f16's range, folded into its logit scale).
// kMulti: several query tokens per row (q_indptr, work.max_q_len > 1); the
// one-token instantiation keeps plain decode's code unchanged. kVariant: the
// call has a soft-cap, a sliding window or sinks (p.variant, p.sinks; each a
// uniform branch in this instantiation); the plain instantiation compiles
// none of their code (their registers cost the D = 128 kernels 2-3% on the
// H200 when they were runtime branches only; even the sinks' epilogue branch
// alone, never taken, made small plain calls 0.2-0.4 us slower).
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti, bool kVariant>
__global__ void __launch_bounds__(Config<D>::kThreads, Config<D>::kCtasPerSm)
    decode_kernel(const Params p) {
  constexpr bool kFp8 = KvType<TKV>::kFp8;
  static_assert(sizeof(TQ) == 2 && sizeof(TKV) == (kFp8 ? 1 : kKvElemBytes),
                "the tensor-core path reads 16-bit q and 16-bit or FP8 K/V elements");
  static_assert(std::is_same<TQ, typename KvType<TKV>::MmaT>::value, "one mma type for q and K/V");
  using Cfg = Config<D, sizeof(TKV)>;
  using M = Mma<TQ>;
  constexpr int kThreads = Cfg::kThreads;
  // Warps per role and the O dims each accumulates (D = 256: pairs, half
  // the dims each; see Config::kDimSplit).
  constexpr int kDimSplit = Cfg::kDimSplit;
  constexpr int kODims = D / kDimSplit;
  static_assert(!kFp8 || kDimSplit == 1, "FP8 K/V serves head_dim 64 and 128");
  constexpr int kChunks = TileShape<kDimMajor, D>::kRowChunks;  // per staged token-major row
  constexpr int kNch = Cfg::kChunksPerThread;
  // FP8 dim-major tiles of 8-token blocks take 8-byte pieces: twice as many.
  constexpr int kNmax = kFp8 && kDimMajor ? 2 * kNch : kNch;
  constexpr int kS = Cfg::kStages;
  // Token-major copies: chunks per token row in memory, rows one pass of the
  // CTA's threads covers, and whether every copy of a thread is whole
  // passes from its first (all but head_dim 96); kTmStagedRow: elements of
  // a staged row (the swizzle repeats every 8 rows, so a pass of a multiple
  // of 8 rows keeps the thread's chunk slot).
  constexpr int kTmChunks = D * static_cast<int>(sizeof(TKV)) / 16;
  constexpr bool kTmUniformRows = kThreads % kTmChunks == 0;
  constexpr int kTmRowsPerPass = kTmUniformRows ? kThreads / kTmChunks : 1;
  constexpr int kTmStagedRow = kFp8 ? D : Cfg::kRowElems;
  static_assert(
      !kTmUniformRows || (kTmRowsPerPass % 8 == 0 && (kTmRowsPerPass & (kTmRowsPerPass - 1)) == 0),
      "a pass of rows keeps the swizzle phase and is a power of two");
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  TKV *smem = reinterpret_cast<TKV *>(smem_bytes);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  // The warp's role (m-tile and token slices) and, D = 256, which half of
  // O's dims it accumulates (both warps of a role compute the same scores).
  const int warp = kDimSplit > 1 ? (tid >> 5) % kWarps : tid >> 5;
  const int half = kDimSplit > 1 ? (tid >> 5) / kWarps : 0;
  const DecodeWorkItem item = p.work.template item<kMulti>(static_cast<int32_t>(blockIdx.x));
  const int split = item.split;
  const int kvh = item.kv_head;
  const int row = item.row;
  const int bs_log2 = p.block_size_log2;
  const int bs_mask = (1 << bs_log2) - 1;
  const int cpb_log2 = bs_log2 - 3;
  const int max_len = p.max_blocks_per_seq << bs_log2;
  // Copies per thread and tile (FP8 dim-major, block size 8: 8-byte pieces).
  const int n_pieces = kFp8 && kDimMajor && bs_log2 == 3 ? kNmax : kNch;
  auto coords = [&](int i) {
    if constexpr (kFp8)
      return copy_coords_f8<kDimMajor, D>(tid, i, bs_log2);
    else
      return copy_coords<kDimMajor, D>(tid, i, cpb_log2);
  };

  // Wait for the previous kernel in the stream (everything below may read
  // what it wrote), then let the next one be scheduled: it waits for this
  // grid to complete, and the merge kernel may read seq_lens before that
  // because this point is past everything written before this kernel.
  FD_TRACE(fd_trace_attn, 8, 0, 0);
  pdl_wait();
  pdl_launch_dependents();
  FD_TRACE(fd_trace_attn, 8, 1, 0);

  const int32_t *table = p.block_tables + static_cast<int64_t>(row) * p.max_blocks_per_seq;
  // First tile of the item: its split's first tile of the key span, which
  // starts at tile 0, or with a sliding window at the tile holding the first
  // position the CTA's earliest query token sees (set once seq_len is known).
  int tile_begin = item.tile_begin;

  // Raw block-table entries of the blocks holding this thread's copies of
  // tile j (-1 past the table row). They do not depend on seq_len, so the
  // first tiles' entries load together with seq_len instead of one memory
  // round trip after it; `issue` uses an entry only for tokens below
  // seq_len (the table row's unused slots are never trusted).
  auto fetch_ids = [&](int j, int ids[kNmax]) {
    const int tok0 = (tile_begin + j) * kTile;
#pragma unroll
    for (int i = 0; i < kNmax; ++i) {
      const int b = (tok0 + coords(i).token) >> bs_log2;
      ids[i] = i < n_pieces && b < p.max_blocks_per_seq ? __ldg(table + b) : -1;
    }
  };
  int seq_len = p.seq_lens[row];
  // Query tokens of the row (several with q_indptr: its last q_len
  // positions, attended causally), loaded beside seq_len. A row of no query
  // token (bad input) has nothing to write.
  int q_first = row, q_len = 1;
  if constexpr (kMulti) {
    if (p.q_indptr != nullptr) {
      q_first = p.q_indptr[row];
      q_len = p.q_indptr[row + 1] - q_first;
      q_len = q_len > p.work.max_q_len ? p.work.max_q_len : q_len;
    }
  }
  // Without a window the first tiles' entries load beside seq_len; with one
  // the first tile depends on seq_len, so they load after it (one round
  // trip more, once per CTA).
  int pre[kS][kNmax];
  if (!kVariant || p.variant.window == 0) {
#pragma unroll
    for (int s = 0; s < kS; ++s) fetch_ids(s, pre[s]);
  }

  seq_len = seq_len < 0 ? 0 : (seq_len > max_len ? max_len : seq_len);
  FD_TRACE(fd_trace_attn, 8, 2, seq_len);
  // This CTA's query tokens [j0, j1) of the row (its query tile) and the
  // keys they see, positions below kv_end (the tile's last token's causal
  // limit): only those are copied and walked. One token per row: the row.
  int j0 = 0, j1 = 1, kv_end = seq_len;
  if constexpr (kMulti) {
    j1 = p.work.q_tile_end(q_len, item.q_tile);
    if (j1 <= 0) return;  // a tile past the row's query tokens: nothing to write
    j0 = j1 - p.work.q_tile_tokens < 0 ? 0 : j1 - p.work.q_tile_tokens;
    kv_end = p.work.q_tile_keys(seq_len, item.q_tile);
  }
  // Sliding window: the CTA's earliest query token (j0, at seq_len - q_len +
  // j0) sees positions from kv_begin on; its items count tiles from the one
  // holding kv_begin, and blocks wholly before kv_begin are never copied.
  int kv_begin = 0, first_tile = 0;
  if (kVariant && p.variant.window > 0) {
    kv_begin = static_cast<int>(p.variant.first_visible(int64_t{seq_len} - q_len + j0));
    first_tile = kv_begin / kTile;
    tile_begin += first_tile;
#pragma unroll
    for (int s = 0; s < kS; ++s) fetch_ids(s, pre[s]);
  }
  const int row_tiles = (kv_end + kTile - 1) / kTile - first_tile;
  // The last partition takes every remaining tile, so a seq_len above the
  // planned length costs speed, never tokens.
  const int n_tiles = p.work.item_tiles(item, row_tiles);
  // An empty partition writes nothing: the merge reads only partitions that
  // hold tokens. Unsplit rows always write (zeros for an empty row).
  if (n_tiles <= 0 && p.work.item_has_partial(static_cast<int32_t>(blockIdx.x))) return;

  // Copies of tile j into its stage. Tokens past the row's end and ids
  // outside the cache are zero-filled, so a corrupt table cannot make the
  // kernel read outside the cache (a zero-filled copy points into block 0).
  // `from`: blocks with no token at or past it are zero-filled too (the
  // window's start; only the first tile has such blocks, so the loop passes
  // 0 and keeps no register for it).
  //
  // Token-major tiles address in bytes with unsigned 32 x 64-bit products.
  // Blocks hold 8, 16 or 32 tokens (the host serves no other size), so a
  // 64-token tile starts at a block boundary and token t of the tile sits at
  // row t & bs_mask of its block. When the thread's copies are whole passes
  // apart (kTmRowsPerPass rows; every head_dim but 96), copy i is row r0 +
  // i * kTmRowsPerPass at the thread's one chunk, and as the pass and the
  // block size are powers of two its row in the block is (r0 & bs_mask) +
  // ((i * kTmRowsPerPass) & bs_mask): the first term goes into the base
  // pointers once, the second is the same for every thread of the CTA.
  // Dim-major copies: block id x block_bytes + dim x dim_bytes + the
  // token's byte in the dim row, unsigned too.
  const uint32_t num_blocks = static_cast<uint32_t>(p.num_blocks);
  const CopyCoords c0 = coords(0);  // the thread's first copy
  uint64_t first = static_cast<uint64_t>(kvh) * p.stride_head * sizeof(TKV);
  if constexpr (!kDimMajor && kTmUniformRows)
    first += static_cast<uint32_t>(c0.chunk * 16) +
             static_cast<uint32_t>(c0.token & bs_mask) * p.token_bytes;
  const char *kbytes = static_cast<const char *>(p.k) + first;
  const char *vbytes = static_cast<const char *>(p.v) + first;
  auto issue = [&](int j, const int ids[kNmax], int from) {
    const int tok0 = (tile_begin + j) * kTile;
    TKV *sk = smem + (j % kS) * 2 * Cfg::kTileElems;
    TKV *sv = sk + Cfg::kTileElems;
    if constexpr (!kDimMajor) {
#pragma unroll
      for (int i = 0; i < kNch; ++i) {
        const CopyCoords cc = kTmUniformRows ? c0 : coords(i);
        const int t = tok0 + (kTmUniformRows ? c0.token + i * kTmRowsPerPass : cc.token);
        const uint32_t id = static_cast<uint32_t>(ids[i]);  // -1: past every block
        const bool valid = t < kv_end && (!kVariant || (t | bs_mask) >= from) && id < num_blocks;
        uint64_t off = static_cast<uint64_t>(valid ? id : 0u) * p.block_bytes;
        if constexpr (kTmUniformRows)
          off += static_cast<uint32_t>((i * kTmRowsPerPass) & bs_mask) * p.token_bytes;
        else
          off += static_cast<uint32_t>(cc.token & bs_mask) * p.token_bytes +
                 static_cast<uint32_t>(cc.chunk * 16);
        const int soff = kTmUniformRows ? c0.smem + i * kTmRowsPerPass * kTmStagedRow : cc.smem;
        cp_async16(smem_u32(sk + soff), kbytes + off, valid);
        cp_async16(smem_u32(sv + soff), vbytes + off, valid);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kNmax; ++i) {
        if (i >= n_pieces) break;
        const CopyCoords cc = coords(i);
        const int t = tok0 + cc.token;
        // (t | bs_mask): the last token of t's block; a block with no token
        // at or past `from` lies wholly before the window (maybe freed).
        const uint32_t id = static_cast<uint32_t>(ids[i]);
        const bool valid = t < kv_end && (!kVariant || (t | bs_mask) >= from) && id < num_blocks;
        const uint64_t off = static_cast<uint64_t>(valid ? id : 0u) * p.block_bytes +
                             static_cast<uint32_t>(cc.row) * p.dim_bytes +
                             static_cast<uint32_t>((t & bs_mask) * sizeof(TKV));
        if (kFp8 && n_pieces > kNch) {
          cp_async8(smem_u32(sk + cc.smem), kbytes + off, valid);
          cp_async8(smem_u32(sv + cc.smem), vbytes + off, valid);
        } else {
          cp_async16(smem_u32(sk + cc.smem), kbytes + off, valid);
          cp_async16(smem_u32(sv + cc.smem), vbytes + off, valid);
        }
      }
    }
  };

  // Start the pipeline before anything else so memory is busy early.
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < n_tiles) issue(s, pre[s], s == 0 ? kv_begin : 0);
    cp_async_commit();
  }
  int ids[kNmax];
#pragma unroll
  for (int i = 0; i < kNmax; ++i) ids[i] = pre[kS - 1][i];

  // This warp's m-tile (16 q heads of the group) and token slices.
  const int mt = warp % p.m_tiles;
  const int slice0 = warp / p.m_tiles;
  const int slice_step = kWarps / p.m_tiles;
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int group = p.work.group_size;
  const int num_q_heads = p.work.num_kv_heads * group;
  // The m-tile rows are the tile's query rows: query token j0 + h / group,
  // head kvh * group + h % group (one token per row: the group's heads).
  const int rows = kMulti ? (j1 - j0) * group : group;
  const int64_t q_row0 = (static_cast<int64_t>(row) * num_q_heads + kvh * group) * D;
  // Element offset in q / out of query row h.
  auto q_offset = [&](int h) -> int64_t {
    if constexpr (kMulti)
      return (static_cast<int64_t>(q_first + j0 + h / group) * num_q_heads + kvh * group +
              h % group) *
             D;
    else
      return q_row0 + static_cast<int64_t>(h) * D;
  };
  const TQ *qbase = static_cast<const TQ *>(p.q);
  const int h0 = mt * 16 + g;
  const int h1 = h0 + 8;
  // Causal limits (exclusive) of this thread's two rows: query token j of the
  // row sees positions < seq_len - q_len + 1 + j, so row h of the tile sees
  // positions < mask_from + h / group. The warp masks from its first row's
  // limit on and stops after its last row's (warp_end; a warp with no row
  // walks nothing). One token per row: seq_len, as plain decode.
  const int mask_from = kMulti ? kv_end - (j1 - j0) + 1 : seq_len;
  const int lim0 = kMulti ? mask_from + h0 / group : seq_len;
  const int lim1 = kMulti ? mask_from + h1 / group : seq_len;
  const int warp_mask_from = kMulti ? mask_from + (mt * 16) / group : seq_len;
  const int warp_last = (mt * 16 + 15 < rows ? mt * 16 + 15 : rows - 1);
  const int warp_end = kMulti ? (mt * 16 < rows ? mask_from + warp_last / group : 0) : seq_len;
  // Sliding window: the row of causal limit lim sees positions from lim -
  // window on. The warp skips steps wholly before its first row's window
  // (limit warp_mask_from) and masks positions up to its last row's start
  // (limit warp_end). Written with p.variant.window (a constant-bank
  // operand; differences, which cannot overflow), so no register stays
  // live for it in the loop.

  // Q as mma A fragments: rows g and g+8 of the m-tile, k = 2*tig.. of each
  // 16-dim k-step. Rows past the query rows are zero. FP8 token-major tiles
  // give each thread dims 4 tig .. 4 tig + 3 of a k-step's 16 (see the QK
  // step), so q's k order is permuted the same way (a0/a1: dims 4 tig, +1;
  // a2/a3: dims 4 tig + 2, +3); dim-major and 16-bit tiles keep dims 2 tig,
  // +1 and 2 tig + 8, +9.
  uint32_t qa[D / 16][4];
  // Base-2 logit scale of the thread's two rows: sm_scale * log2(e) times
  // the K scale (folded on the host) and, for a bf16 q over FP8 K/V, the
  // row's power-of-two factor.
  float lsc0 = p.variant.log2_scale, lsc1 = p.variant.log2_scale;
  {
    constexpr bool kPermuted = kFp8 && !kDimMajor;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      auto pair = [&](int h, int dd) -> uint32_t {
        if (h >= rows) return 0u;
        // One 4-byte load per pair (the host requires q 4-byte aligned).
        return __ldg(reinterpret_cast<const uint32_t *>(qbase + q_offset(h) + dd));
      };
      const int d0 = ks * 16 + (kPermuted ? 4 : 2) * tig;
      const int d1 = d0 + (kPermuted ? 2 : 8);
      qa[ks][0] = pair(h0, d0);
      qa[ks][1] = pair(h1, d0);
      qa[ks][2] = pair(h0, d1);
      qa[ks][3] = pair(h1, d1);
    }
    if constexpr (kFp8) {
      if (p.q_bf16) {
        // bf16 q over FP8 K/V: the mma runs in f16. A row whose largest |q|
        // is in [2^-2, 2^15) converts as it is (f16 then holds bf16's 8
        // mantissa bits for every element down to 2^-12 of the maximum, and
        // smaller ones matter below f32 rounding of the dot product); any
        // other row is scaled by 2^-e (exact) to put its maximum in [2^14,
        // 2^15), and 2^e goes into the row's logit scale. The maximum is
        // taken on the bits (bf16 magnitudes order as integers). A row with
        // an infinity or NaN, or of zeros, keeps e = 0 (its output is NaN
        // or uniform either way).
        uint32_t bits0 = 0, bits1 = 0;  // per 16-bit half
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            uint32_t &m = (e & 1) ? bits1 : bits0;
            m = __vmaxu2(m, qa[ks][e] & 0x7fff7fffu);
          }
        bits0 = max(bits0 & 0xffffu, bits0 >> 16);
        bits1 = max(bits1 & 0xffffu, bits1 >> 16);
        bits0 = max(bits0, __shfl_xor_sync(0xffffffffu, bits0, 1));
        bits0 = max(bits0, __shfl_xor_sync(0xffffffffu, bits0, 2));
        bits1 = max(bits1, __shfl_xor_sync(0xffffffffu, bits1, 1));
        bits1 = max(bits1, __shfl_xor_sync(0xffffffffu, bits1, 2));
        auto exponent = [](uint32_t b) {
          if (b == 0 || b >= 0x7f80u || (b >= 0x3e80u && b < 0x4700u)) return 0;
          const int biased = static_cast<int>(b >> 7);
          const int e = (biased == 0 ? -126 : biased - 127) - 14;
          return e < -112 ? -112 : (e > 112 ? 112 : e);  // 2^+-e stay normal floats
        };
        const int e0 = exponent(bits0), e1 = exponent(bits1);
        auto bf = [](uint32_t w, int half) {
          return __uint_as_float(half ? (w & 0xffff0000u) : (w << 16));
        };
        auto convert = [&](float f0, float f1) {
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float f = (e & 1) ? f1 : f0;
              const __half2 h2 = __floats2half2_rn(bf(qa[ks][e], 0) * f, bf(qa[ks][e], 1) * f);
              qa[ks][e] = *reinterpret_cast<const uint32_t *>(&h2);
            }
        };
        if (e0 == 0 && e1 == 0) {
          convert(1.f, 1.f);  // (the compiler drops the multiplies)
        } else {
          convert(__int_as_float((127 - e0) << 23), __int_as_float((127 - e1) << 23));
          lsc0 *= __int_as_float((127 + e0) << 23);
          lsc1 *= __int_as_float((127 + e1) << 23);
        }
      }
    }
  }

  float o[kODims / 8][4];  // this warp's dims: half * kODims + 8 n + ..
#pragma unroll
  for (int n = 0; n < kODims / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = neg_inf(), m1 = neg_inf();  // running max (base 2) of heads g, g+8
  float l0 = 0.f, l1 = 0.f;              // this thread's part of the running sums
  const int mi = lane >> 3;              // ldmatrix: which 8x8 matrix this lane addresses
  const int rr = lane & 7;               // ... and which of its rows

  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<kS - 2>();
    __syncthreads();
    if (j == 0) FD_TRACE(fd_trace_attn, 8, 3, 0);
    if (j + kS - 1 < n_tiles) {
      issue(j + kS - 1, ids, 0);
      if (j + kS < n_tiles) fetch_ids(j + kS, ids);  // consumed next iteration
    }
    cp_async_commit();

    const int tok0 = (tile_begin + j) * kTile;
    TKV *sk = smem + (j % kS) * 2 * Cfg::kTileElems;
    TKV *sv = sk + Cfg::kTileElems;
    if (kDimMajor && tok0 + kTile > kv_end) {
      // A dim-major copy brings 8 or 16 tokens at once, so the last tile can
      // hold tokens past the row's end (or the tile's causal end): stale
      // cache contents (maybe NaN) that a zero probability would still turn
      // into NaN. Zero them in V.
      const int first = kv_end - tok0 < 0 ? 0 : kv_end - tok0;
      for (int e = tid; e < D * kTile; e += kThreads) {
        const int d = e / kTile, t = e % kTile;
        if (t < first) continue;
        if constexpr (kFp8)
          reinterpret_cast<unsigned char *>(sv)[f8_dm_offset<D>(t >> 4, d) + (t & 15)] = 0;
        else
          sv[dm_offset<D>(d, t / 8, cpb_log2) + (t & 7)] = TKV(0.f);
      }
      __syncthreads();
    }
    const uint32_t sk_u = smem_u32(sk);
    const uint32_t sv_u = smem_u32(sv);

    for (int step = slice0; step < kStepsPerTile; step += slice_step) {
      const int t0 = step * kStepTokens;
      if (tok0 + t0 >= warp_end) break;  // warp-uniform
      if (kVariant && p.variant.window > 0 &&
          tok0 + t0 + kStepTokens <= warp_mask_from - p.variant.window)
        continue;  // before the window of every row of the warp

      // S = Q K^T for 16 tokens: two n-tiles of 8 tokens.
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      if constexpr (kFp8 && !kDimMajor) {
        // Matrix mi of an ldmatrix.x4: tokens t0 + 8 nt .. +7 (rows), 16
        // dims of chunk 4 c4 + mi; the thread gets its token's dims 4 tig ..
        // 4 tig + 3 of each chunk: b0 = the first two, b1 = the last two.
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c4 = 0; c4 < D / 64; ++c4) {
            uint32_t b[4];
            ldsm_x4(sk_u + f8_tm_offset<D>(t0 + nt * 8 + rr, c4 * 4 + mi), b);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const F16x2x2 x = e4m3x4(b[i]);
              M::run(s[nt], qa[c4 * 4 + i], x.lo, x.hi);
            }
          }
      } else if constexpr (kFp8) {
        // Matrix mi: dims 32 kp + 8 mi .. +7 (rows) of the step's 16 tokens
        // (16 bytes), transposed: the thread gets dims 2 tig, +1 of tokens
        // 2 g and 2 g + 1, so n-tile nt's column g is token t0 + 2 g + nt.
#pragma unroll
        for (int kp = 0; kp < D / 32; ++kp) {
          uint32_t b[4];
          ldsm_x4_t(sk_u + f8_dm_offset<D>(step, kp * 32 + mi * 8 + rr), b);
          mma_f8_pairs(s[0], s[1], qa[2 * kp], b[0], b[1]);
          mma_f8_pairs(s[0], s[1], qa[2 * kp + 1], b[2], b[3]);
        }
      } else {
        // Dim-major: the offsets of dims r + 16 ks are the ks = 0 offset
        // plus a multiple of the dim stride (the swizzle term repeats every
        // 16 / cpb dims).
        const int kd_base =
            kDimMajor ? dm_offset<D>((mi & 1) * 8 + rr, t0 / 8 + (mi >> 1), cpb_log2) : 0;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t b[4];
          if (kDimMajor) {
            ldsm_x4_t(sk_u + 2 * (kd_base + ks * (128 << cpb_log2)), b);
          } else {
            const int r = t0 + (mi >> 1) * 8 + rr;
            const int c = ks * 2 + (mi & 1);
            ldsm_x4(sk_u + 2 * tile_offset(r, c, kChunks), b);
          }
          M::run(s[0], qa[ks], b[0], b[1]);
          M::run(s[1], qa[ks], b[2], b[3]);
        }
      }

      // Online softmax in base 2 (the logit scales include log2(e)). Token
      // of score s[n][e] relative to the step: column 2 tig + (e & 1) of
      // n-tile n (FP8 dim-major: token 2 column + n).
      // The soft-cap (a uniform branch) squashes the scaled scores; then
      // the causal end and the window's start mask them.
      const bool tail = tok0 + t0 + kStepTokens > warp_mask_from;
      const bool head = kVariant && p.variant.window > 0 && tok0 + t0 < warp_end - p.variant.window;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= (e & 2) ? lsc1 : lsc0;
      if (kVariant && p.variant.softcap > 0.f) {
        // Rows g + 8 of the m-tile are padding when the tile has at most 8
        // query rows (groups <= 8 with one token): skip their two MUFU ops
        // per score (warp-uniform; padding scores stay finite).
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) s[n][e] = p.variant.softcap_log2(s[n][e]);
        if (mt * 16 + 8 < rows) {
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 2; e < 4; ++e) s[n][e] = p.variant.softcap_log2(s[n][e]);
        }
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok =
              tok0 + t0 +
              (kFp8 && kDimMajor ? 4 * tig + 2 * (e & 1) + n : n * 8 + 2 * tig + (e & 1));
          const int lim = (e & 2) ? lim1 : lim0;
          if ((tail && tok >= lim) || (head && tok < lim - p.variant.window)) s[n][e] = neg_inf();
        }
      float mx0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
      float mx1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // Lazy rescaling: a row's reference max moves only when a score
      // passes it by more than kMaxSlack (base 2; 0 for bf16 P: whenever
      // the max grows), so the warp skips O's rescale (64 multiplies per
      // thread at head_dim 128) and the two exponentials of the correction
      // on every step where no row's reference moves. Weights stay below
      // 2^kMaxSlack, and O / l is the same for any reference at or above the
      // scores' max minus the slack. Warp-uniform: the vote covers every row.
      if (__any_sync(0xffffffffu, mx0 > m0 + kMaxSlack<TQ> || mx1 > m1 + kMaxSlack<TQ>)) {
        const float new0 = fmaxf(m0, mx0), new1 = fmaxf(m1, mx1);
        // A row with every score so far masked keeps -inf: its correction
        // is then exp2(-inf) = 0 against 0 instead of NaN.
        const float corr0 = exp2_approx(m0 - (new0 == neg_inf() ? 0.f : new0));
        const float corr1 = exp2_approx(m1 - (new1 == neg_inf() ? 0.f : new1));
        m0 = new0;
        m1 = new1;
        l0 *= corr0;
        l1 *= corr1;
#pragma unroll
        for (int n = 0; n < kODims / 8; ++n) {
          o[n][0] *= corr0;
          o[n][1] *= corr0;
          o[n][2] *= corr1;
          o[n][3] *= corr1;
        }
      }
      // With every score so far masked the max is -inf: use 0 so that
      // exp2(-inf - 0) = 0 instead of NaN.
      const float use0 = m0 == neg_inf() ? 0.f : m0;
      const float use1 = m1 == neg_inf() ? 0.f : m1;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][0] = exp2_approx(s[n][0] - use0);
        s[n][1] = exp2_approx(s[n][1] - use0);
        s[n][2] = exp2_approx(s[n][2] - use1);
        s[n][3] = exp2_approx(s[n][3] - use1);
      }
      // P as the A fragment of the PV mma (k = the 16 tokens).
      uint32_t pa[4];
      pa[0] = M::pack(s[0][0], s[0][1]);
      pa[1] = M::pack(s[0][2], s[0][3]);
      pa[2] = M::pack(s[1][0], s[1][1]);
      pa[3] = M::pack(s[1][2], s[1][3]);
      l0 += (s[0][0] + s[0][1]) + (s[1][0] + s[1][1]);
      l1 += (s[0][2] + s[0][3]) + (s[1][2] + s[1][3]);

      // O += P V.
      if constexpr (kFp8 && !kDimMajor) {
        // Matrix mi: tokens t0 + 8 (mi & 1) .. +7 (rows), 16 dims of chunk
        // 2 c2 + (mi >> 1), transposed: the thread gets dims 2 g, 2 g + 1 of
        // tokens 2 tig, 2 tig + 1; so n-tile 2 c holds dims 16 c + 2 g and
        // n-tile 2 c + 1 dims 16 c + 2 g + 1 (the epilogue undoes it).
#pragma unroll
        for (int c2 = 0; c2 < D / 32; ++c2) {
          uint32_t b[4];
          ldsm_x4_t(sv_u + f8_tm_offset<D>(t0 + (mi & 1) * 8 + rr, c2 * 2 + (mi >> 1)), b);
          mma_f8_pairs(o[4 * c2], o[4 * c2 + 1], pa, b[0], b[1]);
          mma_f8_pairs(o[4 * c2 + 2], o[4 * c2 + 3], pa, b[2], b[3]);
        }
      } else if constexpr (kFp8) {
        // Matrix mi: dims 32 n4 + 8 mi .. +7 (rows) of the step's tokens;
        // the thread gets tokens 4 tig .. 4 tig + 3 of its dim, which are
        // P's k = 2 tig, 2 tig + 1 (tokens 4 tig, +2) and 2 tig + 8, +9
        // (tokens 4 tig + 1, +3).
#pragma unroll
        for (int n4 = 0; n4 < D / 32; ++n4) {
          uint32_t b[4];
          ldsm_x4(sv_u + f8_dm_offset<D>(step, n4 * 32 + mi * 8 + rr), b);
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            const F16x2x2 x = e4m3x4(pair_bytes(b[m]));
            M::run(o[n4 * 4 + m], pa, x.lo, x.hi);
          }
        }
      } else {
        // The warp's dims start at chunk n_half (a multiple of 8 for D =
        // 256, so the row's XOR swizzle leaves it in place).
        const int n_half = half * (kODims / 8);
        const int vd_base =
            kDimMajor ? dm_offset<D>((mi >> 1) * 8 + rr, t0 / 8 + (mi & 1), cpb_log2) : 0;
        // Two 8-dim n-tiles per ldmatrix.x4.
#pragma unroll
        for (int n = 0; n < kODims / 8; n += 2) {
          uint32_t b[4];
          if (kDimMajor) {
            ldsm_x4(sv_u + 2 * (vd_base + (n_half + n) * (64 << cpb_log2)), b);
          } else {
            const int r = t0 + (mi & 1) * 8 + rr;
            const int c = n + (mi >> 1);
            ldsm_x4_t(sv_u + 2 * (tile_offset(r, c, kChunks) + n_half * 8), b);
          }
          M::run(o[n], pa, b[0], b[1]);
          M::run(o[n + 1], pa, b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  FD_TRACE(fd_trace_attn, 8, 4, 0);

  // Merge the warps (fixed order) through shared memory.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // Rows are padded to D + 8 floats: the 8-byte stores of a half-warp (rows
  // g = 0..3, dims 2 tig) then hit 16 distinct bank pairs (unpadded rows put
  // all 8 rows of a warp in one bank: an 8-way conflict that cost ~2 us per
  // CTA, measured by bench/trace_probe). Rows past the group are not stored.
  // FP8 token-major: 4 consecutive dims per thread and row (float4 stores,
  // rows padded to D + 16).
  constexpr bool kWide = kFp8 && !kDimMajor;
  constexpr int Dp = kRedStride<D, kWide>;
  float *red_o = reinterpret_cast<float *>(smem);  // [warp][16][Dp]
  float *red_m = red_o + kWarps * 16 * Dp;         // [warp][16]
  float *red_l = red_m + kWarps * 16;              // [warp][16]
  {
    float *wo = red_o + warp * 16 * Dp;
    const bool row0 = h0 < rows, row1 = h1 < rows;
    if constexpr (kWide) {
#pragma unroll
      for (int c = 0; c < D / 16; ++c) {
        const int d = c * 16 + 4 * tig;
        const float *a = o[2 * c], *b = o[2 * c + 1];
        if (row0)
          *reinterpret_cast<float4 *>(wo + g * Dp + d) = make_float4(a[0], b[0], a[1], b[1]);
        if (row1)
          *reinterpret_cast<float4 *>(wo + (g + 8) * Dp + d) = make_float4(a[2], b[2], a[3], b[3]);
      }
    } else {
#pragma unroll
      for (int n = 0; n < kODims / 8; ++n) {
        const int d = half * kODims + n * 8 + 2 * tig;
        if (row0) *reinterpret_cast<float2 *>(wo + g * Dp + d) = make_float2(o[n][0], o[n][1]);
        if (row1)
          *reinterpret_cast<float2 *>(wo + (g + 8) * Dp + d) = make_float2(o[n][2], o[n][3]);
      }
    }
    if (tig == 0 && half == 0) {  // (both warps of a role hold the same max and sum)
      red_m[warp * 16 + g] = m0;
      red_m[warp * 16 + g + 8] = m1;
      red_l[warp * 16 + g] = l0;
      red_l[warp * 16 + g + 8] = l1;
    }
  }
  __syncthreads();
  FD_TRACE(fd_trace_attn, 8, 6, 0);

  // Per head: the max over the warps' running maxima, each warp's weight
  // exp2(m_w - max) and the weighted sum (one thread per head, fixed order).
  float *red_f = red_l + kWarps * 16;  // [warp][16] weights
  float *red_h = red_f + kWarps * 16;  // [head]: max, sum
  if (tid < rows) {
    const int hm = tid % 16, w0 = tid / 16;
    float mx = neg_inf();
    for (int w = w0; w < kWarps; w += p.m_tiles) mx = fmaxf(mx, red_m[w * 16 + hm]);
    const float use = mx == neg_inf() ? 0.f : mx;
    float sum = 0.f;
    for (int w = w0; w < kWarps; w += p.m_tiles) {
      const float f = exp2_approx(red_m[w * 16 + hm] - use);
      red_f[w * 16 + hm] = f;
      sum += f * red_l[w * 16 + hm];
    }
    red_h[2 * tid] = mx;
    red_h[2 * tid + 1] = sum;
  }
  __syncthreads();
  FD_TRACE(fd_trace_attn, 8, 7, 0);

  // Each thread combines 4 dims of one head over the warps and writes them:
  // the normalised output (unsplit: times the V scale, one multiply) or the
  // split's unnormalised partial (the merge applies the V scale).
  constexpr int kV = D / 4;
  const bool out8 = (reinterpret_cast<uintptr_t>(p.out) & 7) == 0;
  // FP8 K/V: out is bf16 or f16 by p.q_bf16; else TQ.
  const bool out_bf16 = kFp8 ? p.q_bf16 : std::is_same<TQ, __nv_bfloat16>::value;
  for (int c = tid; c < rows * kV; c += kThreads) {
    const int h = c / kV, v = c % kV;
    const int hm = h % 16, w0 = h / 16;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (w % p.m_tiles != w0) continue;
      const float f = red_f[w * 16 + hm];
      const float4 x = *reinterpret_cast<const float4 *>(red_o + (w * 16 + hm) * Dp + v * 4);
      acc.x += f * x.x;
      acc.y += f * x.y;
      acc.z += f * x.z;
      acc.w += f * x.w;
    }
    if (!p.work.item_has_partial(static_cast<int32_t>(blockIdx.x))) {
      const float sum = red_h[2 * h + 1];
      float inv = sum > 0.f ? p.v_scale / sum : 0.f;
      if (kVariant && p.sinks != nullptr && sum > 0.f) {
        // The head's sink joins the denominator: rescaled to the larger of
        // the two maxima. -inf (no sink) gives keep = 1 and a zero term:
        // the bits of v_scale / sum. The head's index comes from q_row0
        // (live for the output anyway) in one-token calls, so no other
        // register stays live through the main loop for it (kvh did: 32
        // bytes of spill in the D = 128 variant kernel, 2-5% of its time).
        const int head0 = kMulti ? kvh * group : static_cast<int>((q_row0 / D) % num_q_heads);
        const float sink = VariantPolicy::sink_log2(p.sinks[head0 + h % group]);
        const float mx = red_h[2 * h], top = fmaxf(sink, mx);
        const float keep = exp2_approx(mx - top);
        inv = (p.v_scale * keep) / (sum * keep + exp2_approx(sink - top));
      }
      auto cvt = [&](float x) {
        return out_bf16 ? Mma<__nv_bfloat16>::from_float(x) : Mma<__half>::from_float(x);
      };
      const uint16_t e0 = cvt(acc.x * inv), e1 = cvt(acc.y * inv);
      const uint16_t e2 = cvt(acc.z * inv), e3 = cvt(acc.w * inv);
      uint16_t *dst = static_cast<uint16_t *>(p.out) + q_offset(h) + v * 4;
      if (out8) {
        *reinterpret_cast<uint2 *>(dst) = make_uint2(e0 | (static_cast<uint32_t>(e1) << 16),
                                                     e2 | (static_cast<uint32_t>(e3) << 16));
      } else {
        dst[0] = e0, dst[1] = e1, dst[2] = e2, dst[3] = e3;
      }
    } else {
      const int64_t slot = p.work.partial_slot(
          kMulti ? p.work.query_row(row, j0 + h / group, kvh * group + h % group)
                 : static_cast<int64_t>(row) * num_q_heads + kvh * group + h,
          split);
      *reinterpret_cast<float4 *>(p.partial_o + slot * D + v * 4) = acc;
      if (v == 0)
        *reinterpret_cast<float2 *>(p.partial_ml + slot * 2) =
            make_float2(red_h[2 * h], red_h[2 * h + 1]);
    }
  }
  FD_TRACE(fd_trace_attn, 8, 5, 0);
}

// kPer consecutive floats of a partial row (a lane's dims in the merge):
// loaded as float4s, float2s or single floats (D = 96: three per lane).
template <int kPer>
struct Frag {
  float x[kPer];
  __device__ __forceinline__ void load(const float *src) {
    if constexpr (kPer % 4 == 0) {
#pragma unroll
      for (int i = 0; i < kPer; i += 4) {
        const float4 v = *reinterpret_cast<const float4 *>(src + i);
        x[i] = v.x, x[i + 1] = v.y, x[i + 2] = v.z, x[i + 3] = v.w;
      }
    } else if constexpr (kPer % 2 == 0) {
#pragma unroll
      for (int i = 0; i < kPer; i += 2) {
        const float2 v = *reinterpret_cast<const float2 *>(src + i);
        x[i] = v.x, x[i + 1] = v.y;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPer; ++i) x[i] = src[i];
    }
  }
};
template <int kPer>
__device__ __forceinline__ void add_weighted(float acc[kPer], float w, const Frag<kPer> &v) {
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] += w * v.x[i];
}

// Partial rows a merge warp loads at once (head_dim 256: 3, so that its
// registers stay within 64).
constexpr int merge_rows(int head_dim) {
  return head_dim == 256 ? 3 : 4;
}

// Combines the split-KV partials. `wph` warps (1 to 32, a power of two)
// serve one (row, q head): each computes the max and the weights
// exp2(m_s - max) of all splits from registers and shuffles, accumulates D/32
// dims per lane over its share of the splits (s = part, part + wph, ...), at
// most merge_rows(D) of them in one memory round trip, and the shares are added
// through shared memory (dynamic: wph x heads_per_cta x D floats when wph >
// 1) in a fixed order. Only partitions that hold tokens are read; an empty
// row gives zeros. Few registers (at most 64: up to 1024 threads), so that
// many warps per SM keep loads in flight when there are many rows (a verify
// batch: 8192 rows of 2 splits), and enough warps per head when there are
// many splits. With a sliding window the splits cover the key span from the
// query tile's first key tile (DecodeWorkList::q_tile_span, as the attention
// kernel); attention sinks join the denominator here when the row is split.
template <class TOut, int D, bool kMulti>
__global__ void __launch_bounds__(1024, 1)
    decode_merge_kernel(const float *__restrict__ partial_o, const float *__restrict__ partial_ml,
                        const int32_t *__restrict__ seq_lens, const int32_t *__restrict__ q_indptr,
                        void *out, const DecodeWorkList work, int max_len, int wph,
                        int heads_per_cta, float v_scale, const VariantPolicy variant,
                        const float *__restrict__ sinks) {
  constexpr int kPer = D / 32;
  static_assert(kDecodeMaxSplits == 128, "four split slots per lane");
  extern __shared__ float share[];  // [warps][D] when wph > 1
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int part = warp % wph;
  // qh: a query row of the partial slots (row, query token, q head).
  const int num_q_heads = work.num_kv_heads * work.group_size;
  const int rows_heads = static_cast<int>(work.query_rows());
  const int qh = blockIdx.x * heads_per_cta + warp / wph;
  int64_t out_row = qh;  // index of the output row (query token x q heads + head)
  bool active = qh < rows_heads;
  int64_t unit = 0;  // the (query tile, row, KV head) of the work list
  int nv = 0;
  if (active) {
    int len;
    if constexpr (kMulti) {
      const int row = qh / (work.max_q_len * num_q_heads);
      const int token = (qh / num_q_heads) % work.max_q_len;
      len = seq_lens[row];
      int first = row, q_len = 1;
      if (q_indptr != nullptr) {
        first = q_indptr[row];
        q_len = q_indptr[row + 1] - first;
        q_len = q_len > work.max_q_len ? work.max_q_len : q_len;  // as the attention kernel
      }
      active = token < q_len;  // past the row's query tokens: nothing to merge
      out_row = static_cast<int64_t>(first + token) * num_q_heads + qh % num_q_heads;
      len = len < 0 ? 0 : (len > max_len ? max_len : len);
      // The splits of the token's query tile that hold its keys.
      // (Without a window the span is the causal one: no 64-bit division.)
      const int k = work.q_tile_of(q_len, token);
      unit = (static_cast<int64_t>(k) * work.batch + row) * work.num_kv_heads +
             (qh % num_q_heads) / work.group_size;
      if (active)
        len = variant.window > 0 ? work.q_tile_span(variant, len, q_len, k)
                                 : work.q_tile_keys(len, k);
    } else {
      len = seq_lens[qh / num_q_heads];
      len = len < 0 ? 0 : (len > max_len ? max_len : len);
      if (variant.window > 0) len -= work.first_key_tile(variant, len, 1, 0) * work.tile_tokens;
      unit = static_cast<int64_t>(qh / num_q_heads) * work.num_kv_heads +
             (qh % num_q_heads) / work.group_size;
    }
    // A unit of one split wrote its output itself: nothing to merge.
    if (work.unit_splits(unit) < 2) active = false;
    nv = active ? work.splits_holding(len, unit) : 0;
  }
  // This kernel follows the attention kernel directly and is scheduled only
  // once all its CTAs are past their own wait, so seq_lens (written before
  // that kernel) is safe to read above; the partials need it to complete.
  FD_TRACE(fd_trace_merge, 4, 0, nv);
  pdl_wait();
  pdl_launch_dependents();
  FD_TRACE(fd_trace_merge, 4, 1, 0);
  float acc[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) acc[e] = 0.f;
  float total = 0.f;
  float keep = 1.f, sink_term = 0.f;  // attention sinks (see below)
  if (nv > 0) {
    // Every load is issued before the first use (one memory round trip, not
    // one per batch of splits): the (max, sum) pairs and this warp's share of
    // partial rows, at most kRows of them (the host picks wph so that each
    // warp gets at most kRows splits; the tail loop is a safety net).
    constexpr int kRows = merge_rows(D);
    using Vec = Frag<kPer>;
    const float *ml = partial_ml + work.partial_slot(qh, 0) * 2;
    const float *po = partial_o + work.partial_slot(qh, 0) * D + lane * kPer;
    float m[4], l[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int s = lane + 32 * k;
      m[k] = s < nv ? ml[2 * s] : neg_inf();
      l[k] = s < nv ? ml[2 * s + 1] : 0.f;
    }
    Vec rows[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int s = part + r * wph;
      if (s < nv) rows[r].load(po + static_cast<int64_t>(s) * D);
    }
    float mx = neg_inf();
#pragma unroll
    for (int k = 0; k < 4; ++k) mx = fmaxf(mx, m[k]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    // A query token that sees no key (several query tokens per row, a row
    // shorter than its tokens) has only empty partials (max -inf): weights
    // exp2(-inf - 0) = 0 and a zero output, not exp2(-inf + inf) = NaN.
    const float use = mx == neg_inf() ? 0.f : mx;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      m[k] = exp2_approx(m[k] - use);  // now the weight of split lane + 32k
      total += m[k] * l[k];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    // Weight of split s (warp-uniform s < nv), from the lane that holds it.
    auto weight = [&](int s) {
      const int k = s >> 5;
      const float src = k == 0 ? m[0] : (k == 1 ? m[1] : (k == 2 ? m[2] : m[3]));
      return __shfl_sync(0xffffffffu, src, s & 31);
    };
    // Splits are added in increasing order per warp, as before.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int s = part + r * wph;
      if (s < nv) add_weighted(acc, weight(s), rows[r]);
    }
    for (int s = part + kRows * wph; s < nv; s += wph) {
      Vec row;
      row.load(po + static_cast<int64_t>(s) * D);
      add_weighted(acc, weight(s), row);
    }
    if (sinks != nullptr) {
      // The head's sink joins the denominator, rescaled to the larger of the
      // two maxima (-inf: keep = 1 and a zero term, the bits of no sink).
      const float sink = VariantPolicy::sink_log2(sinks[qh % num_q_heads]);
      const float top = fmaxf(sink, mx);
      keep = exp2_approx(mx - top);
      sink_term = exp2_approx(sink - top);
    }
  }
  if (wph > 1) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) share[warp * D + lane * kPer + e] = acc[e];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      float sum = 0.f;
      for (int w = 0; w < wph; ++w) sum += share[(warp + w) * D + lane * kPer + e];
      acc[e] = sum;
    }
  }
  FD_TRACE(fd_trace_merge, 4, 2, acc[0] != 0.f);
  if (!active) return;
  uint16_t *dst = static_cast<uint16_t *>(out) + out_row * D + lane * kPer;
  // The V scale: one multiply.
  const float inv = total > 0.f ? (v_scale * keep) / (total * keep + sink_term) : 0.f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) dst[e] = Mma<TOut>::from_float(acc[e] * inv);
}

// Launch shape of decode_merge_kernel for `rows_heads` (row, q head) pairs:
// warps per head (at most merge_rows(head_dim) splits per warp: up to 32
// warps for 128 splits), heads per CTA (8 / wph when there are many heads, so CTAs have
// 256 threads; else one, which spreads the loads over many SMs), CTAs, and
// the shared memory of the warps' shares.
struct MergeShape {
  int wph, heads_per_cta, ctas;
  size_t smem_bytes(int head_dim) const {
    return wph > 1 ? static_cast<size_t>(wph) * heads_per_cta * head_dim * sizeof(float) : 0;
  }
};
inline MergeShape merge_shape(int rows_heads, int num_splits, int head_dim) {
  MergeShape m;
  m.wph = 1;
  while (m.wph < 32 && m.wph * merge_rows(head_dim) < num_splits) m.wph *= 2;
  m.heads_per_cta = rows_heads >= 1024 && m.wph <= 8 ? 8 / m.wph : 1;
  m.ctas = (rows_heads + m.heads_per_cta - 1) / m.heads_per_cta;
  return m;
}

// Launches `kernel` with programmatic stream serialization (see pdl_wait):
// it may start while the previous kernel in the stream drains. Captured into
// a CUDA graph this becomes a programmatic edge.
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), unsigned grid, unsigned threads, size_t smem,
                       cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace detail

// The Hopper kernel for several query tokens per row (decode_sm90.cu,
// compiled for sm_90a only): defined and instantiated there for 16-bit q =
// K/V (T) and head_dim 64 / 128.
namespace sm90 {
template <class T, int D>
cudaError_t prepare_attention();
template <class T, int D>
cudaError_t launch_attention(const detail::Params &p, cudaStream_t stream);
}  // namespace sm90

// Whether an instantiation of decode_kernel has an sm90 twin: several query
// tokens per row, 16-bit K/V of q's type, token-major, head_dim 64 or 128
// (a run takes it on a compute capability 9.0 device without attention
// variants: DecodeWorkList::sm90_device, Variant::is_plain).
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti>
constexpr bool kHasSm90 = kMulti && !kDimMajor && std::is_same<TQ, TKV>::value &&
                          !detail::KvType<TKV>::kFp8 && (D == 64 || D == 128);

// Launches decode_kernel<TQ, TKV, D, layout> and the merge (defined per
// element-type pair in decode_<dtype>.cu so they compile in parallel).
template <class TQ, class TKV>
cudaError_t launch_decode_typed(const DecodeLaunch &launch);

// Raises the attention kernel's dynamic shared memory limit on the current
// device (a per-device, per-function setting that launches then rely on).
// Both instantiations: plain and with attention variants (a run takes the
// variant from its own params).
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti = false>
cudaError_t prepare_decode_variant(bool sm90 = false) {
  if constexpr (kHasSm90<TQ, TKV, D, kDimMajor, kMulti>) {
    if (sm90) {
      const cudaError_t err = sm90::prepare_attention<TQ, D>();
      if (err != cudaSuccess) return err;
    }
  } else {
    (void)sm90;
  }
  const cudaError_t err = cudaFuncSetAttribute(
      detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, false>,
      cudaFuncAttributeMaxDynamicSharedMemorySize, detail::Config<D, sizeof(TKV)>::kSmemBytes);
  if (err != cudaSuccess) return err;
  return cudaFuncSetAttribute(detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, true>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              detail::Config<D, sizeof(TKV)>::kSmemBytes);
}

// Prepares the variant of one element-type pair for `head_dim` and layout
// (defined per pair in decode_<dtype>.cu, beside launch_decode_typed).
template <class TQ, class TKV>
cudaError_t prepare_decode_typed(int32_t head_dim, bool dim_major, bool multi, bool sm90);

// Head dims of the kernels: 64 and 128 for every type pair, 96 and 256 for
// 16-bit K/V only (the host refuses them over FP8).
template <class TKV>
constexpr bool kServesWideDims = !detail::KvType<TKV>::kFp8;

template <class TQ, class TKV, bool kMulti>
cudaError_t prepare_decode_layouts(int32_t head_dim, bool dim_major, bool sm90) {
  if constexpr (kServesWideDims<TKV>) {
    if (head_dim == 96)
      return dim_major ? prepare_decode_variant<TQ, TKV, 96, true, kMulti>(sm90)
                       : prepare_decode_variant<TQ, TKV, 96, false, kMulti>(sm90);
    if (head_dim == 256)
      return dim_major ? prepare_decode_variant<TQ, TKV, 256, true, kMulti>(sm90)
                       : prepare_decode_variant<TQ, TKV, 256, false, kMulti>(sm90);
  }
  if (head_dim == 128)
    return dim_major ? prepare_decode_variant<TQ, TKV, 128, true, kMulti>(sm90)
                     : prepare_decode_variant<TQ, TKV, 128, false, kMulti>(sm90);
  if (head_dim == 64)
    return dim_major ? prepare_decode_variant<TQ, TKV, 64, true, kMulti>(sm90)
                     : prepare_decode_variant<TQ, TKV, 64, false, kMulti>(sm90);
  return cudaErrorInvalidValue;
}

template <class TQ, class TKV>
cudaError_t prepare_decode_dispatch(int32_t head_dim, bool dim_major, bool multi, bool sm90) {
  return multi ? prepare_decode_layouts<TQ, TKV, true>(head_dim, dim_major, sm90)
               : prepare_decode_layouts<TQ, TKV, false>(head_dim, dim_major, sm90);
}

// Launches one variant; prepare_decode_variant must have run on this device.
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti = false>
cudaError_t launch_decode_variant(const DecodeLaunch &l) {
  using Cfg = detail::Config<D, sizeof(TKV)>;
  auto kernel = l.variant.is_plain() ? detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, false>
                                     : detail::decode_kernel<TQ, TKV, D, kDimMajor, kMulti, true>;
  cudaError_t err = cudaSuccess;
  detail::Params p;
  p.q = l.q;
  p.k = l.k;
  p.v = l.v;
  p.out = l.out;
  p.block_tables = l.block_tables;
  p.seq_lens = l.seq_lens;
  p.q_indptr = l.q_indptr;
  p.stride_block = l.stride_block;
  p.stride_head = l.stride_head;
  p.stride_token = l.stride_token;
  p.stride_dim = l.stride_dim;
  p.block_bytes = static_cast<uint64_t>(l.stride_block) * sizeof(TKV);
  p.token_bytes = static_cast<uint64_t>(l.stride_token) * sizeof(TKV);
  p.dim_bytes = static_cast<uint64_t>(l.stride_dim) * sizeof(TKV);
  p.block_size_log2 = l.block_size_log2;
  p.num_blocks = l.num_blocks;
  p.max_blocks_per_seq = l.max_blocks_per_seq;
  // 1, 2 or 4 m-tiles (the warps split evenly among them) for a query tile's
  // rows.
  const int query_rows = (kMulti ? l.work.q_tile_tokens : 1) * l.work.group_size;
  p.m_tiles = query_rows <= 16 ? 1 : (query_rows <= 32 ? 2 : 4);
  p.work = l.work;
  p.variant = VariantPolicy::of(l.variant);
  p.sinks = l.variant.sinks;
  // The K scale multiplies every dot product: folded into the logit scale.
  p.variant.log2_scale *= l.k_scale;
  p.v_scale = l.v_scale;
  p.q_bf16 = l.q_dtype == FD_DTYPE_BF16;
  p.partial_o = l.partial_o;
  p.partial_ml = l.partial_ml;
  const unsigned grid = static_cast<unsigned>(l.work.size());
  bool launched = false;
  if constexpr (kHasSm90<TQ, TKV, D, kDimMajor, kMulti>) {
    const int64_t rows = static_cast<int64_t>(l.work.q_tile_tokens) * l.work.group_size;
    if (l.work.sm90_device && sm90_serves(l.q_dtype, l.kv_dtype, l.dim_major, l.head_dim,
                                          l.work.max_q_len, rows, l.variant.is_plain())) {
      err = sm90::launch_attention<TQ, D>(p, l.stream);
      launched = true;
    }
  }
  if (!launched)
    err = detail::launch_pdl(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, l.stream, p);
  if (err != cudaSuccess || !l.work.has_partials()) return err;
  const int rows_heads = static_cast<int>(l.work.query_rows());
  const detail::MergeShape m = detail::merge_shape(rows_heads, l.work.slot_splits(), D);
  // The output has q's type: TQ, or by q_dtype over FP8 K/V.
  auto merge = detail::decode_merge_kernel<TQ, D, kMulti>;
  if (detail::KvType<TKV>::kFp8 && p.q_bf16)
    merge = detail::decode_merge_kernel<__nv_bfloat16, D, kMulti>;
  return detail::launch_pdl(merge, static_cast<unsigned>(m.ctas), 32 * m.wph * m.heads_per_cta,
                            m.smem_bytes(D), l.stream, l.partial_o, l.partial_ml, l.seq_lens,
                            l.q_indptr, l.out, l.work, l.max_blocks_per_seq << l.block_size_log2,
                            m.wph, m.heads_per_cta, l.v_scale, p.variant, p.sinks);
}

template <class TQ, class TKV, bool kMulti>
cudaError_t launch_decode_layouts(const DecodeLaunch &l) {
  if constexpr (kServesWideDims<TKV>) {
    if (l.head_dim == 96)
      return l.dim_major ? launch_decode_variant<TQ, TKV, 96, true, kMulti>(l)
                         : launch_decode_variant<TQ, TKV, 96, false, kMulti>(l);
    if (l.head_dim == 256)
      return l.dim_major ? launch_decode_variant<TQ, TKV, 256, true, kMulti>(l)
                         : launch_decode_variant<TQ, TKV, 256, false, kMulti>(l);
  }
  if (l.head_dim == 128)
    return l.dim_major ? launch_decode_variant<TQ, TKV, 128, true, kMulti>(l)
                       : launch_decode_variant<TQ, TKV, 128, false, kMulti>(l);
  if (l.head_dim == 64)
    return l.dim_major ? launch_decode_variant<TQ, TKV, 64, true, kMulti>(l)
                       : launch_decode_variant<TQ, TKV, 64, false, kMulti>(l);
  return cudaErrorInvalidValue;
}

// Several query tokens per row (the plan's max_q_len > 1) take their own
// instantiation, so plain decode runs the one-token code unchanged.
template <class TQ, class TKV>
cudaError_t launch_decode_dispatch(const DecodeLaunch &l) {
  return l.work.max_q_len > 1 ? launch_decode_layouts<TQ, TKV, true>(l)
                              : launch_decode_layouts<TQ, TKV, false>(l);
}

}  // namespace cuda
}  // namespace fd
