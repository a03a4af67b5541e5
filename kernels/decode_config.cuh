// Shapes shared by the paged decode kernels (decode_kernel.cuh, the merge in
// decode_merge.cuh, the Hopper kernel in decode_sm90.cu) and their host
// dispatch (decode_dispatch.cuh): warps and tiles of a CTA, the per-head_dim
// pipeline (Config), the K/V element types, and the kernels' parameters.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "decode_launch.hpp"

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

// K/V element types: FP8 (E4M3, E5M2) is stored K/V only and is dequantised
// to f16 in registers (decode_kernel's kFp8 path, f8x4 of decode_device.cuh);
// the 16-bit types feed the mma as they are.
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
template <>
struct KvType<__nv_fp8_e5m2> {
  static constexpr bool kFp8 = true;
  using MmaT = __half;
};

// kDeep: the deeper-pipelined shape of head_dim 128 over 16-bit K/V (3
// stages x 2 CTAs/SM), which the plan picks for grids of at most 2 CTAs per
// SM whose CTAs each walk several tiles (DecodeWorkList::deep_stages).
// kSwap: the swapped-operand FP8 kernel (decode_swapped.cuh), whose fewer
// registers (110 at head_dim 128 under its 4-CTA bound, 72 at 64, against
// the m-tile FP8 kernel's 164 and 101) leave room for more CTAs per SM with
// fewer stages each. kDeep with kSwap: the swapped kernel in the m-tile FP8
// kernel's shape (more stages, fewer CTAs per SM), which the plan picks for
// lists that fill exactly one wave of it (DecodeWorkList::deep_stages).
// kPair (the head_dim 64 FP8 swapped kernel over token-major K/V, cp.async
// staging; decode_kernel decides): stages of two 64-token tiles, half as
// many stages of the same bytes, so a CTA waits, synchronises and issues
// copies once per 16 KB of K/V instead of 8 (H200: the D shape's FP8 calls
// 4-11% faster; docs/kernel-design.md, FP8). Shared memory and CTAs per SM
// are the one-tile shape's.
template <int D, int kElemBytes = 2, bool kDeep = false, bool kSwap = false, bool kPair = false>
struct Config {
  static_assert(!kDeep || (D == 128 && kElemBytes == 2) || kSwap,
                "the deep shape is head_dim 128, 16-bit, or the swapped kernel's");
  static_assert(!kSwap || (kElemBytes == 1 && (D == 64 || D == 128)), "the swapped kernel is FP8");
  // Staged row width of a token-major tile (elements): D (tile_offset keeps
  // D = 96's swizzle inside its 12-chunk rows).
  static constexpr int kRowElems = D;
  static constexpr int kStageTokens = kPair ? 2 * kTile : kTile;
  static constexpr int kTileElems = kStageTokens * kRowElems;  // of K (or V) per stage
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
  // Deep (D = 128): for grids of at most 2 CTAs per SM, a third stage
  // doubles the tiles in flight per CTA (one stage is being read); at 3
  // CTAs/SM a third stage does not fit (H200, bf16: C 1 x 32768 4.3%
  // faster, 256 CTAs of 64 tiles 1.3x).
  // Swapped FP8: 4 CTAs per SM of 3 stages (head_dim 128), 6 of 4 (64):
  // the same 192 KB per SM as 3 x 4 and 4 x 6, in more, shorter CTAs; its
  // deep shape is the m-tile kernel's 3 x 4 and 4 x 6.
  static constexpr bool kSwapWide = kSwap && !kDeep;
  static constexpr int kStages1 =
      kDeep && !kSwap ? 3
                      : (kSwapWide ? (D == 128 ? 3 : 4)
                                   : (kElemBytes == 2 ? (D == 128 ? 2 : 3) : (D == 128 ? 4 : 6)));
  static constexpr int kStages = kPair ? kStages1 / 2 : kStages1;
  // D = 256 runs 8 warps: each of the kWarps (m-tile, token slice) roles is
  // a pair of warps that compute the same scores and each accumulate half of
  // O's dims (64 O registers per thread instead of 128, so no spill and two
  // warps per SM sub-partition instead of one). Other dims: one warp a role.
  static constexpr int kDimSplit = D == 256 ? 2 : 1;
  static constexpr int kThreads = kWarps * 32 * kDimSplit;
  static constexpr int kChunksPerThread =
      kStageTokens * D * kElemBytes / 16 / kThreads;  // 16-byte copies
  static constexpr int kSmemBytes = kStages * 2 * kTileElems * kElemBytes;
  static constexpr int kCtasPerSm =
      kDeep && !kSwap ? 2 : (kSwapWide ? (D == 64 ? 6 : 4) : (D == 64 ? 4 : (D == 256 ? 1 : 3)));
};

// Row stride (floats) of the warp-merge buffer; see decode_kernel. FP8
// token-major tiles leave each thread 4 consecutive dims of O per row (stored
// as float4): 16 floats of padding keep a quarter warp's rows apart.
template <int D, bool kWide = false>
constexpr int kRedStride = D + (kWide ? 16 : 8);
// Query rows one CTA serves at most: four 16-row m-tiles, one per warp.
constexpr int kMaxQueryRows = kWarps * 16;
static_assert(kDecodeMaxQueryRows == kMaxQueryRows, "decode_limits.hpp's bound");
// The warp merge at the end reuses the pipeline's shared memory: per warp
// 16 rows of O, max, sum and weight, then (max, sum) per query row
// (decode_kernel checks that its configuration holds it).
template <int D, bool kWide = false>
constexpr int kMergeBytes =
    kWarps * 16 * kRedStride<D, kWide> * 4 + 3 * kWarps * 16 * 4 + 2 * kMaxQueryRows * 4;

// The parameters of one launch of decode_kernel (and of the Hopper kernel of
// decode_sm90.cu), filled on the host by launch_decode_variant.
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
  // The swapped FP8 kernel's TMA views of K and V (decode_dispatch.cuh,
  // encode_kv_maps): bytes [block][KV head][token in block][dim], one
  // block of one head per box, and which tensor dim (1-3) holds the token
  // in block, the KV head and the block. Unused by the other kernels.
  CUtensorMap tma_k, tma_v;
  int8_t tma_pos[3];
};

}  // namespace detail
}  // namespace cuda
}  // namespace fd
