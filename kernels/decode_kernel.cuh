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
// output); see the kFp8 branches and docs/kernel-design.md. Token-major
// one-token plain FP8 calls with groups of at most 8 heads take the
// swapped-operand step of decode_swapped.cuh (tokens as the mma rows), and
// one-wave lists of short items stage it by TMA (decode_kernel_tma); at
// head_dim 64 its cp.async stages hold two tiles each (kPair).
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

#include "decode_config.cuh"
#include "decode_device.cuh"
#include "decode_swapped.cuh"
#include "decode_tiles.cuh"

namespace fd {
namespace cuda {
namespace detail {

// How far (base 2) a score may pass a row's reference max before the
// attention loop moves the reference and rescales O (decode_kernel), by the
// type of P. f16 P (f16 and FP8 K/V): 8, so weights stay below 2^8 and after
// the first steps the rescale, most of a step's multiplies, is skipped. bf16
// P: 0, the reference is the exact running max (the largest weight is then
// exactly 1; with 8 bits of precision, rounding it too moved bf16 errors
// from below to just above 5e-3 in gpu_decode's sweep).
template <class TQ>
constexpr float kMaxSlack = std::is_same<TQ, __half>::value ? 8.f : 0.f;

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
// alone, never taken, made small plain calls 0.2-0.4 us slower). kDeep:
// Config's deeper-pipelined shape (head_dim 128, 16-bit K/V, one query
// token, plain, token-major; or, with kSwap, the swapped kernel in the
// m-tile FP8 kernel's stages and CTAs per SM). kSwap: the
// swapped-operand step of decode_swapped.cuh (FP8 K/V, either layout, one
// query token, plain; the host takes it for groups of at most 8 heads). kTma
// (with kSwap, token-major): K/V tiles staged by TMA block copies on
// mbarriers instead of per-thread cp.async (the plan's
// DecodeWorkList::tma_stages; sm_90).
// The body is decode_attention; decode_kernel and decode_kernel_tma (below)
// are its entry points.
template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti, bool kVariant, bool kDeep,
          bool kSwap, bool kTma>
__device__ __forceinline__ void decode_attention(const Params &p) {
  constexpr bool kFp8 = KvType<TKV>::kFp8;
  static_assert(sizeof(TQ) == 2 && sizeof(TKV) == (kFp8 ? 1 : kKvElemBytes),
                "the tensor-core path reads 16-bit q and 16-bit or FP8 K/V elements");
  static_assert(std::is_same<TQ, typename KvType<TKV>::MmaT>::value, "one mma type for q and K/V");
  static_assert(!kSwap || (kFp8 && !kMulti && !kVariant),
                "the swapped step serves plain one-token FP8 calls");
  static_assert(!kTma || (kSwap && !kDimMajor), "TMA staging is the token-major swapped kernel's");
  // kPair: the head_dim 64 FP8 swapped kernel staged by cp.async over
  // token-major K/V fills each pipeline stage with two 64-token tiles (8 KB
  // each), so the wait, barrier, table entries and copy issue of a stage
  // serve 16 KB (Config's kPair). An item of an odd tile count stops
  // halfway through its last stage (item_end below).
  constexpr bool kPair = kSwap && kFp8 && D == 64 && !kDimMajor && !kTma;
  using Cfg = Config<D, sizeof(TKV), kDeep, kSwap, kPair>;
  static_assert(Cfg::kSmemBytes == Config<D, sizeof(TKV), kDeep, kSwap>::kSmemBytes,
                "the host sizes shared memory by the one-tile shape");
  constexpr int kTileT = Cfg::kStageTokens;  // tokens per pipeline stage
  constexpr int kStepsT = kTileT / kStepTokens;
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
  // Block-table entries load two tiles ahead of their copies instead of
  // one in the 16-bit deep shape (its registers allow it; at 3 CTAs per SM
  // the regular kernel spilled): with 1-2 CTAs per SM and data arriving
  // early, the entries' round trip was on every tile's path (H200, bf16:
  // C 256 x 1024 69.1 -> 67.9 us, C 1 x 32768 at 64 splits -2%).
  constexpr bool kIdsAhead2 = kDeep && !kSwap;
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
  // 1024-byte aligned: TMA's 128-byte swizzle (the swapped kernel's
  // staging) follows address bits 7-9, which f8_tm_offset reproduces
  // relative to a stage's start.
  extern __shared__ __align__(1024) unsigned char smem_bytes[];
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
    const int tok0 = tile_begin * kTile + j * kTileT;
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
  if (!kTma && (!kVariant || p.variant.window == 0)) {
#pragma unroll
    for (int s = 0; s < kS; ++s) fetch_ids(s, pre[s]);
  }
  // TMA: lane i of warp 0 stages block i of each tile (see
  // tma_issue); its raw table entries of the first tiles load here.
  const int tile_blocks = kTile >> bs_log2;
  const bool stager = kTma && tid < tile_blocks;
  auto tma_id = [&](int j) {
    const int b = (((tile_begin + j) * kTile) >> bs_log2) + lane;
    return b < p.max_blocks_per_seq ? __ldg(table + b) : -1;
  };
  int tma_ids[kS];
  if (stager) {
#pragma unroll
    for (int s = 0; s < kS; ++s) tma_ids[s] = tma_id(s);
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
  // Pipeline stages of the item, and (kPair) the end of its tokens: the
  // last stage of an odd tile count would reach into the next item's first
  // tile, so its copies stop at item_end (zero-filled past it) and its warps
  // step no further.
  const int n_st = kPair ? (n_tiles + 1) >> 1 : n_tiles;
  const int item_end = (tile_begin + n_tiles) * kTile;
  const int kv_lim = kPair ? min(kv_end, item_end) : kv_end;

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
    const int tok0 = tile_begin * kTile + j * kTileT;
    TKV *sk = smem + (j % kS) * 2 * Cfg::kTileElems;
    TKV *sv = sk + Cfg::kTileElems;
    if constexpr (!kDimMajor) {
#pragma unroll
      for (int i = 0; i < kNch; ++i) {
        const CopyCoords cc = kTmUniformRows ? c0 : coords(i);
        const int t = tok0 + (kTmUniformRows ? c0.token + i * kTmRowsPerPass : cc.token);
        const uint32_t id = static_cast<uint32_t>(ids[i]);  // -1: past every block
        const bool valid = t < kv_lim && (!kVariant || (t | bs_mask) >= from) && id < num_blocks;
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
        const bool valid = t < kv_lim && (!kVariant || (t | bs_mask) >= from) && id < num_blocks;
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

  // TMA: one mbarrier per stage (after the stages), completed by warp
  // 0 lane 0's arrival and the bytes of the tile's TMA copies. Lane i
  // copies block i of tile j (K and V: a box of block_size rows of D bytes
  // each, swizzled as f8_tm_offset) when it holds a token below kv_end;
  // blocks past the row's end are not copied, and a table entry outside the
  // cache reads nothing (TMA fills zeros). Rows past kv_end in a copied or
  // skipped block hold stale bytes: their scores are masked and the warp
  // that reads them zeroes their V rows (swapped_step).
  const uint32_t bars = smem_u32(smem_bytes + Cfg::kSmemBytes);
  auto tma_issue = [&](int j, int id) {
    const int t = (tile_begin + j) * kTile + (lane << bs_log2);
    const bool valid = lane < tile_blocks && t < kv_end;
    const uint32_t n = __popc(__ballot_sync(0xffffffffu, valid));
    const uint32_t bar = bars + (j % kS) * 8;
    if (lane == 0) mbar_arrive_expect_tx(bar, n * 2 * (static_cast<uint32_t>(D) << bs_log2));
    if (valid) {
      const uint32_t dst =
          smem_u32(smem + (j % kS) * 2 * Cfg::kTileElems) + ((lane * D) << bs_log2);
      // Coordinates (dim, then token 0, head kvh and block id in the map's
      // order).
      auto at = [&](int dim) { return p.tma_pos[1] == dim ? kvh : (p.tma_pos[2] == dim ? id : 0); };
      const int c1 = at(1), c2 = at(2), c3 = at(3);
      tma_load_4d(dst, &p.tma_k, 0, c1, c2, c3, bar);
      tma_load_4d(dst + Cfg::kTileElems, &p.tma_v, 0, c1, c2, c3, bar);
    }
  };

  // Start the pipeline before anything else so memory is busy early.
  int ids[kNmax];
  // kIdsAhead2: the entries of the tile after ids'.
  int ids_next[kIdsAhead2 ? kNmax : 1];
  int next_id = 0;  // TMA: the stager's entry of the next tile to issue
  if constexpr (kTma) {
    if (warp == 0) {
      if (lane == 0) {
#pragma unroll
        for (int s = 0; s < kS; ++s) mbar_init(bars + 8 * s, 1);
        mbar_fence_init();
      }
      __syncwarp();
#pragma unroll
      for (int s = 0; s < kS - 1; ++s)
        if (s < n_tiles) tma_issue(s, stager ? tma_ids[s] : -1);
      next_id = stager ? tma_ids[kS - 1] : -1;
    }
  } else {
#pragma unroll
    for (int s = 0; s < kS - 1; ++s) {
      if (s < n_st) issue(s, pre[s], s == 0 ? kv_begin : 0);
      cp_async_commit();
    }
#pragma unroll
    for (int i = 0; i < kNmax; ++i) ids[i] = pre[kS - 1][i];
    if constexpr (kIdsAhead2) fetch_ids(kS, ids_next);
  }

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

  // O: this warp's dims half * kODims + 8 n + .. of rows g, g + 8 (swapped:
  // the O^T m-tiles of decode_swapped.cuh, 16 dims each).
  constexpr int kOTiles = kSwap ? D / 16 : kODims / 8;
  float o[kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = neg_inf(), m1 = neg_inf();  // running max (base 2) of heads g, g+8
  float l0 = 0.f, l1 = 0.f;              // this thread's part of the running sums
  // Swapped: the state of heads 2 tig, 2 tig + 1 and their logit scales
  // (row g's scale is lsc0 on the lanes of that g).
  SwapState sw = {neg_inf(), neg_inf(), 0.f, 0.f};
  float lsa = 0.f, lsb = 0.f;
  if constexpr (kSwap) {
    lsa = __shfl_sync(0xffffffffu, lsc0, 8 * (lane & 3));
    lsb = __shfl_sync(0xffffffffu, lsc0, 8 * (lane & 3) + 4);
  }
  const int mi = lane >> 3;  // ldmatrix: which 8x8 matrix this lane addresses
  const int rr = lane & 7;   // ... and which of its rows

  for (int j = 0; j < n_st; ++j) {
    if constexpr (kTma) {
      // Every warp is past tile j - 1, so its stage may be refilled (and,
      // at j = 0, the barriers' initialisation is visible to all).
      __syncthreads();
      if (warp == 0 && j + kS - 1 < n_tiles) {
        tma_issue(j + kS - 1, next_id);
        if (stager && j + kS < n_tiles) next_id = tma_id(j + kS);
      }
      mbar_wait(bars + (j % kS) * 8, static_cast<uint32_t>(j / kS) & 1u);
    } else {
      cp_async_wait<kS - 2>();
      __syncthreads();
      if (j + kS - 1 < n_st) {
        issue(j + kS - 1, ids, 0);
        if constexpr (kIdsAhead2) {
#pragma unroll
          for (int i = 0; i < kNmax; ++i) ids[i] = ids_next[i];
          if (j + kS + 1 < n_st) fetch_ids(j + kS + 1, ids_next);  // consumed in two
        } else if (j + kS < n_st) {
          fetch_ids(j + kS, ids);  // consumed next iteration
        }
      }
      cp_async_commit();
    }
    if (j == 0) FD_TRACE(fd_trace_attn, 8, 3, 0);

    const int tok0 = tile_begin * kTile + j * kTileT;
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

    for (int step = slice0; step < kStepsT; step += slice_step) {
      const int t0 = step * kStepTokens;
      if (tok0 + t0 >= warp_end) break;  // warp-uniform
      if (kPair && tok0 + t0 >= item_end) break;
      if (kVariant && p.variant.window > 0 &&
          tok0 + t0 + kStepTokens <= warp_mask_from - p.variant.window)
        continue;  // before the window of every row of the warp
      if constexpr (kSwap) {
        swapped_step<TKV, D, kDimMajor, kTma>(sk_u, reinterpret_cast<unsigned char *>(sv), t0,
                                              tok0 + t0, seq_len, qa, lsa, lsb, kMaxSlack<TQ>, sw,
                                              o, lane);
      } else {
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
                const F16x2x2 x = f8x4<TKV>(b[i]);
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
            mma_f8_pairs<TKV>(s[0], s[1], qa[2 * kp], b[0], b[1]);
            mma_f8_pairs<TKV>(s[0], s[1], qa[2 * kp + 1], b[2], b[3]);
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
        const bool head =
            kVariant && p.variant.window > 0 && tok0 + t0 < warp_end - p.variant.window;
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
            mma_f8_pairs<TKV>(o[4 * c2], o[4 * c2 + 1], pa, b[0], b[1]);
            mma_f8_pairs<TKV>(o[4 * c2 + 2], o[4 * c2 + 3], pa, b[2], b[3]);
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
              const F16x2x2 x = f8x4_paired<TKV>(b[m]);
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
      }  // !kSwap
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  FD_TRACE(fd_trace_attn, 8, 4, 0);

  // Merge the warps (fixed order) through shared memory. The sums: over the
  // 4 lanes of a row (swapped: over the 8 lanes of a head pair's tokens).
  if constexpr (kSwap) {
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) {
      sw.la += __shfl_xor_sync(0xffffffffu, sw.la, x);
      sw.lb += __shfl_xor_sync(0xffffffffu, sw.lb, x);
    }
  } else {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  }
  // Rows are padded to D + 8 floats: the 8-byte stores of a half-warp (rows
  // g = 0..3, dims 2 tig) then hit 16 distinct bank pairs (unpadded rows put
  // all 8 rows of a warp in one bank: an 8-way conflict that cost ~2 us per
  // CTA, measured by bench/trace_probe). Rows past the group are not stored.
  // FP8 token-major: 4 consecutive dims per thread and row (float4 stores,
  // rows padded to D + 16). Swapped: a half-warp stores float2 at dims
  // 16 c + 2 g of heads 2 tig; rows D + 4 floats apart put its four heads
  // 8 banks apart.
  constexpr bool kWide = kFp8 && !kDimMajor;
  constexpr int Dp = kSwap ? D + 4 : kRedStride<D, kWide>;
  static_assert(Dp <= kRedStride<D, kWide> && Dp % 4 == 0, "kMergeBytes bounds the buffer");
  static_assert(kMergeBytes<D, kWide> <= Cfg::kSmemBytes, "the merge buffer fits the stages");
  float *red_o = reinterpret_cast<float *>(smem);  // [warp][16][Dp]
  float *red_m = red_o + kWarps * 16 * Dp;         // [warp][16]
  float *red_l = red_m + kWarps * 16;              // [warp][16]
  {
    float *wo = red_o + warp * 16 * Dp;
    const bool row0 = h0 < rows, row1 = h1 < rows;
    if constexpr (kSwap) {
      const int ha = 2 * tig, hb = ha + 1;
      if constexpr (kDimMajor) {
        // Dims 16 c + g and 16 c + g + 8: 4-byte stores, a warp's 32 at
        // banks 8 tig + g (rows D + 4 floats apart).
#pragma unroll
        for (int c = 0; c < D / 16; ++c) {
          const int d = c * 16 + g;
          if (ha < rows) wo[ha * Dp + d] = o[c][0], wo[ha * Dp + d + 8] = o[c][2];
          if (hb < rows) wo[hb * Dp + d] = o[c][1], wo[hb * Dp + d + 8] = o[c][3];
        }
      } else {
#pragma unroll
        for (int c = 0; c < D / 16; ++c) {
          const int d = c * 16 + 2 * g;
          if (ha < rows)
            *reinterpret_cast<float2 *>(wo + ha * Dp + d) = make_float2(o[c][0], o[c][2]);
          if (hb < rows)
            *reinterpret_cast<float2 *>(wo + hb * Dp + d) = make_float2(o[c][1], o[c][3]);
        }
      }
      if (g == 0) {  // (every g holds the same maxima and, now, sums)
        if (ha < rows) red_m[warp * 16 + ha] = sw.ma, red_l[warp * 16 + ha] = sw.la;
        if (hb < rows) red_m[warp * 16 + hb] = sw.mb, red_l[warp * 16 + hb] = sw.lb;
      }
    } else if constexpr (kWide) {
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
    if (!kSwap && tig == 0 && half == 0) {  // (both warps of a role hold the same max and sum)
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

template <class TQ, class TKV, int D, bool kDimMajor, bool kMulti, bool kVariant,
          bool kDeep = false, bool kSwap = false>
__global__ void __launch_bounds__(Config<D>::kThreads,
                                  Config<D, sizeof(TKV), kDeep, kSwap>::kCtasPerSm)
    decode_kernel(const Params p) {
  decode_attention<TQ, TKV, D, kDimMajor, kMulti, kVariant, kDeep, kSwap, false>(p);
}

// The TMA-staged swapped kernel: its TMA copies name the tensor maps in its
// parameter space, so the parameter is __grid_constant__ (taking it so in
// decode_kernel changed every other kernel's code).
// kDeep: in the swapped kernel's deep shape (Config).
template <class TQ, class TKV, int D, bool kDeep>
__global__ void __launch_bounds__(Config<D>::kThreads, Config<D, 1, kDeep, true>::kCtasPerSm)
    decode_kernel_tma(const __grid_constant__ Params p) {
  decode_attention<TQ, TKV, D, false, false, false, kDeep, true, true>(p);
}

}  // namespace detail
}  // namespace cuda
}  // namespace fd
