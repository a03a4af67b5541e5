// Shared-memory staging of the decode kernel's K/V tiles: the swizzled
// layouts of token-major and dim-major tiles (16-bit and FP8) and where each
// thread's 16-byte copies come from and go to.
#pragma once

#include "decode_config.cuh"

namespace fd {
namespace cuda {
namespace detail {

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

}  // namespace detail
}  // namespace cuda
}  // namespace fd
