// Limits of the CUDA paged decode kernels (kernels/decode_*.cuh) that the
// host planning needs too: plain C++ with no CUDA header, so the split
// choice (decode_splits.cpp) and its CPU unit suite can read them.
#pragma once

namespace fd {
namespace cuda {

// Tokens of K and V that one CTA stages in shared memory per pipeline step.
// Split-KV ranges are whole tiles, so every block size in {8, 16, 32} divides it.
constexpr int kDecodeTileTokens = 64;
// Upper bound on split-KV partitions per row (the merge kernel keeps one
// weight per split in shared memory).
constexpr int kDecodeMaxSplits = 128;
// Largest GQA group (q heads sharing one KV head) the kernel serves: two
// 16-row tensor-core tiles.
constexpr int kDecodeMaxGroup = 32;
// Query rows (query tokens x GQA group) one CTA serves: four 16-row tiles,
// one per warp. A (row, KV head) with more query rows (max_q_len x group) is
// cut into query tiles of whole tokens, one CTA each (work.q_tiles).
constexpr int kDecodeMaxQueryRows = 64;
// Largest GQA group the swapped-operand FP8 step serves (kernels/
// decode_swapped.cuh): the heads are the n = 8 columns of its mma.
constexpr int kDecodeSwapMaxGroup = 8;
// One-wave lists whose items walk at most this many tiles stage by TMA in
// the swapped FP8 kernel (DecodeWorkList::tma_stages).
constexpr int kDecodeTmaMaxTiles = 4;

}  // namespace cuda
}  // namespace fd
