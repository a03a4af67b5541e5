// Hopper attention kernel for several query tokens per row (prefill chunks,
// speculative verification): the same work list, split layout, partials and
// merge as decode_kernel.cuh's multi-token kernel, with the two products of
// each 64-token tile on warpgroup tensor-core instructions (wgmma,
// wgmma_sm90.cuh) instead of per-warp mma.sync.
//
// One CTA is one warpgroup (128 threads) and serves one work item: a query
// tile of at most 64 query rows (query tokens x GQA group, row h = token
// h / group, head h % group) of one (row, KV head), over its split's key
// tiles. Per tile:
//   S = Q K^T   8 (D = 128) or 4 (D = 64) wgmma m64n64k16, q from registers
//   softmax     online, per query row, on the accumulators (base 2); only
//               the last tiles of a row test keys against its causal limit
//   O += P V    4 wgmma m64n{D}k16, P from registers (bf16 / f16)
// K and V tiles stream through a 3-stage cp.async ring in the 128-byte
// swizzled layout wgmma reads (wgmma_sm90.cuh). Served: 16-bit q = K/V
// (bf16, f16), head_dim 64 and 128, token-major cache, no attention
// variant; the host (decode_dispatch.cuh, launch_decode_variant) sends every
// other call to the mma.sync kernel. Compiled for sm_90a only (CMake builds
// this file alone with that target); the host launches it only on a device
// of compute capability 9.0.
#include "decode_dispatch.cuh"
#include "wgmma_sm90.cuh"

namespace fd {
namespace cuda {
namespace sm90 {
namespace {

constexpr int kThreads = 128;             // one warpgroup
constexpr int kTile = kDecodeTileTokens;  // 64 tokens per stage (the work list's tile)
constexpr int kStages = 3;
static_assert(kTile == 64, "the S accumulators and swizzle blocks assume 64-token tiles");

template <int D>
struct Shape {
  static constexpr int kHalves = D / 64;                    // 128-byte blocks per token row
  static constexpr int kBlockBytes = kTile * 128;           // one [64 tokens][128 bytes] block
  static constexpr int kTileBytes = kHalves * kBlockBytes;  // K (or V) of one stage
  static constexpr int kStageBytes = 2 * kTileBytes;        // K then V
  static constexpr int kChunks = kTile * D / 8 / kThreads;  // 16-byte copies per thread, K or V
  // Dynamic shared memory: the ring plus slack to align it to 1024 bytes.
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;
  // CTAs per SM the host plans splits with (ctas_per_sm): head_dim 128 is
  // held to 2 by its shared memory, 64 to 3 by its registers (the launch
  // bound below keeps them at or under 168 per thread).
  static constexpr int kCtasPerSm = D == 64 ? 3 : 2;
  static_assert(kCtasPerSm * (kSmemBytes + 1024) <= 228 * 1024,
                "the planned CTAs fit in shared memory");
};

// S (+)= A * K-tile^T, one k-step (16 dims) of D.
template <class T>
__device__ __forceinline__ void mma_qk(float (&s)[32], const uint32_t (&a)[4], uint64_t desc,
                                       int accumulate) {
  wgmma_m64n64k16<T, 0>(s, a, desc, accumulate);
}
// O += P * V-tile, one k-step (16 tokens).
template <class T, int D>
__device__ __forceinline__ void mma_pv(float (&o)[D / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (D == 128)
    wgmma_m64n128k16<T, 1>(o, a, desc, 1);
  else
    wgmma_m64n64k16<T, 1>(o, a, desc, 1);
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, Shape<D>::kCtasPerSm)
    attention_kernel(const detail::Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Shape<D>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem0 = (detail::smem_u32(smem_raw) + 1023u) & ~1023u;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int tig = lane & 3;
  const DecodeWorkItem item = p.work.template item<true>(static_cast<int32_t>(blockIdx.x));
  const int row = item.row;
  const int kvh = item.kv_head;
  const int bs_log2 = p.block_size_log2;
  const int bs_mask = (1 << bs_log2) - 1;
  const int max_len = p.max_blocks_per_seq << bs_log2;

  // Nothing before this may read memory an earlier kernel in the stream
  // could have written (decode_device.cuh, pdl_wait).
  detail::pdl_wait();
  detail::pdl_launch_dependents();

  int seq_len = p.seq_lens[row];
  seq_len = seq_len < 0 ? 0 : (seq_len > max_len ? max_len : seq_len);
  int q_first = row, q_len = 1;
  if (p.q_indptr != nullptr) {
    q_first = p.q_indptr[row];
    q_len = p.q_indptr[row + 1] - q_first;
    q_len = q_len > p.work.max_q_len ? p.work.max_q_len : q_len;
  }
  const int j1 = p.work.q_tile_end(q_len, item.q_tile);
  if (j1 <= 0) return;  // a query tile past the row's tokens: nothing to write
  const int j0 = j1 - p.work.q_tile_tokens < 0 ? 0 : j1 - p.work.q_tile_tokens;
  const int kv_end = p.work.q_tile_keys(seq_len, item.q_tile);
  const int row_tiles = (kv_end + kTile - 1) / kTile;
  const int n_tiles = p.work.item_tiles(item, row_tiles);
  const bool partial = p.work.item_has_partial(static_cast<int32_t>(blockIdx.x));
  if (n_tiles <= 0 && partial) return;  // the merge reads only splits holding tokens

  const int group = p.work.group_size;
  const int num_q_heads = p.work.num_kv_heads * group;
  const int rows = (j1 - j0) * group;
  auto q_offset = [&](int h) -> int64_t {
    return (static_cast<int64_t>(q_first + j0 + h / group) * num_q_heads + kvh * group +
            h % group) *
           D;
  };

  // Copies: thread tid takes 16-byte chunk (tid % (D / 8)) of token rows
  // r0 + i * kRowsPerPass (r0 = tid / (D / 8)) of a tile, for K and for V.
  // A tile starts at a multiple of 64 tokens, so row r's offset within its
  // cache block is (tok0 & bs_mask) + (r & bs_mask): one term per tile
  // (`tile_off`), one per row, computed once (`row_off`). Byte offsets,
  // 64-bit: a pool may pass 4 GB.
  constexpr int kRowChunks = D / 8;
  constexpr int kRowsPerPass = kThreads / kRowChunks;
  static_assert(kRowsPerPass % 8 == 0, "a thread's rows share their swizzle phase");
  const int chunk = tid % kRowChunks;
  const int r0 = tid / kRowChunks;
  const int64_t head_off =
      (static_cast<int64_t>(kvh) * p.stride_head + chunk * 8) * static_cast<int64_t>(sizeof(T));
  const char *kbase = static_cast<const char *>(p.k) + head_off;
  const char *vbase = static_cast<const char *>(p.v) + head_off;
  const uint64_t block_bytes = p.block_bytes, token_bytes = p.token_bytes;
  const uint32_t num_blocks = static_cast<uint32_t>(p.num_blocks);
  uint64_t row_off[S::kChunks];
#pragma unroll
  for (int i = 0; i < S::kChunks; ++i)
    row_off[i] = static_cast<uint32_t>((r0 + i * kRowsPerPass) & bs_mask) * token_bytes;
  // The thread's 16 bytes within a stage's K (V: + kTileBytes), row r0;
  // row r0 + i * kRowsPerPass is i * kRowsPerPass * 128 bytes further.
  const uint32_t dst0 = (chunk >> 3) * S::kBlockBytes + r0 * 128 + (((chunk & 7) ^ (r0 & 7)) << 4);
  const int32_t *table = p.block_tables + static_cast<int64_t>(row) * p.max_blocks_per_seq;
  // Block-table entries of this thread's copies of tile j (-1: a token at or
  // past kv_end, zero-filled). Loaded one tile before `issue` needs them, so
  // the table's round trip is not on the loop's path.
  auto fetch_ids = [&](int j, int(&ids)[S::kChunks]) {
    const int tok0 = (item.tile_begin + j) * kTile;
#pragma unroll
    for (int i = 0; i < S::kChunks; ++i) {
      const int t = tok0 + r0 + i * kRowsPerPass;
      ids[i] = t < kv_end ? __ldg(table + (t >> bs_log2)) : -1;
    }
  };
  auto issue = [&](int j, const int(&ids)[S::kChunks]) {
    const int tok0 = (item.tile_begin + j) * kTile;
    const uint32_t dst = smem0 + (j % kStages) * S::kStageBytes + dst0;
    const uint64_t tile_off = static_cast<uint32_t>(tok0 & bs_mask) * token_bytes;
    const char *kt = kbase + tile_off;
    const char *vt = vbase + tile_off;
#pragma unroll
    for (int i = 0; i < S::kChunks; ++i) {
      const uint32_t id = static_cast<uint32_t>(ids[i]);  // -1: past every block
      const bool valid = id < num_blocks;
      const uint64_t off = (valid ? id : 0u) * block_bytes + row_off[i];
      const uint32_t d = dst + i * kRowsPerPass * 128;
      detail::cp_async16(d, kt + off, valid);
      detail::cp_async16(d + S::kTileBytes, vt + off, valid);
    }
  };
  int ids[S::kChunks];
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_tiles) {
      fetch_ids(st, ids);
      issue(st, ids);
    }
    detail::cp_async_commit();
  }
  if (kStages - 1 < n_tiles) fetch_ids(kStages - 1, ids);

  // q as A fragments (rows past the tile's query rows are zero).
  const int h0 = warp * 16 + g, h1 = h0 + 8;
  const T *qbase = static_cast<const T *>(p.q);
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    auto pair = [&](int h, int d) -> uint32_t {
      if (h >= rows) return 0u;
      return __ldg(reinterpret_cast<const uint32_t *>(qbase + q_offset(h) + d));
    };
    const int d0 = ks * 16 + 2 * tig;
    qa[ks][0] = pair(h0, d0);
    qa[ks][1] = pair(h1, d0);
    qa[ks][2] = pair(h0, d0 + 8);
    qa[ks][3] = pair(h1, d0 + 8);
  }
  // Causal limits (exclusive) of the thread's two rows: query token j of the
  // row sees positions below seq_len - q_len + 1 + j; never past kv_end
  // (padding rows past `rows` included).
  const int mask_from = kv_end - (j1 - j0) + 1;
  const int lim0 = min(mask_from + h0 / group, kv_end);
  const int lim1 = min(mask_from + h1 / group, kv_end);
  const float lsc = p.variant.log2_scale;

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  // Running max (scaled, base 2) and sum of the thread's two rows.
  float m0 = detail::neg_inf(), m1 = detail::neg_inf();
  float l0 = 0.f, l1 = 0.f;
  float s[32];  // S of the tile (each tile's first wgmma overwrites it)
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;

  // One tile. Tiles wholly below every row's causal limit (all but the last
  // one or two of a row) take kMasked = false: no per-score key test, and
  // the logit scale rides in the exponent's fma (max(s) * scale is the
  // scaled max: the scale is positive). Masked tiles scale first, so that a
  // masked score is -inf whatever the scale.
  auto step = [&](int j, auto masked_tag) {
    constexpr bool kMasked = decltype(masked_tag)::value;
    // Tile j has landed, and every warp is past tile j - 1 (its stage is
    // free for tile j + kStages - 1).
    detail::cp_async_wait<kStages - 2>();
    fence_proxy_async();
    __syncthreads();

    const uint32_t ks_base = smem0 + (j % kStages) * S::kStageBytes;
    const uint32_t vs_base = ks_base + S::kTileBytes;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const uint32_t a = ks_base + (ks >> 2) * S::kBlockBytes + (ks & 3) * 32;
      mma_qk<T>(s, qa[ks], smem_desc(a, 16, 1024), ks > 0);
    }
    wgmma_commit();
    // While the tensor cores compute S: the copies of tile j + kStages - 1
    // (entries fetched last iteration) and the entries of the tile after.
    if (j + kStages - 1 < n_tiles) {
      issue(j + kStages - 1, ids);
      if (j + kStages < n_tiles) fetch_ids(j + kStages, ids);
    }
    detail::cp_async_commit();
    wgmma_wait<0>();
    fence_regs(s);

    // Online softmax in base 2 on the accumulators: s[4 n + e] is row g
    // (e < 2) or g + 8 of this warp, key 8 n + 2 tig + (e & 1) of the tile.
    if constexpr (kMasked) {
      const int tok0 = (item.tile_begin + j) * kTile;
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = tok0 + 8 * n + 2 * tig + (e & 1);
          const float x = s[4 * n + e] * lsc;
          s[4 * n + e] = key >= (e < 2 ? lim0 : lim1) ? detail::neg_inf() : x;
        }
    }
    float mx0 = s[0], mx1 = s[2];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      mx0 = fmaxf(mx0, fmaxf(s[4 * n], s[4 * n + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if constexpr (!kMasked) mx0 *= lsc, mx1 *= lsc;
    mx0 = fmaxf(m0, mx0), mx1 = fmaxf(m1, mx1);
    // A row with no visible key yet keeps max -inf: use 0 so that every
    // weight is exp2(-inf) = 0 and nothing becomes NaN.
    const float use0 = mx0 == detail::neg_inf() ? 0.f : mx0;
    const float use1 = mx1 == detail::neg_inf() ? 0.f : mx1;
    const float a0 = detail::exp2_approx(m0 - use0), a1 = detail::exp2_approx(m1 - use1);
    m0 = mx0, m1 = mx1;
    l0 *= a0, l1 *= a1;
    auto weight = [&](float x, float use) {
      return detail::exp2_approx(kMasked ? x - use : fmaf(x, lsc, -use));
    };
    uint32_t pa[4][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float p0 = weight(s[4 * n], use0), p1 = weight(s[4 * n + 1], use0);
      const float p2 = weight(s[4 * n + 2], use1), p3 = weight(s[4 * n + 3], use1);
      l0 += p0 + p1;
      l1 += p2 + p3;
      // n-tile n is keys 8 n .. 8 n + 7: k-step n / 2, A registers 0/1
      // (keys 2 tig) for even n, 2/3 (keys 8 + 2 tig) for odd n.
      pa[n >> 1][(n & 1) * 2] = detail::Mma<T>::pack_rn(p0, p1);
      pa[n >> 1][(n & 1) * 2 + 1] = detail::Mma<T>::pack_rn(p2, p3);
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[4 * n] *= a0, o[4 * n + 1] *= a0;
      o[4 * n + 2] *= a1, o[4 * n + 3] *= a1;
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      mma_pv<T, D>(o, pa[kk], smem_desc(vs_base + kk * 16 * 128, S::kBlockBytes, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
  };
  // The leading tiles below mask_from take the unmasked step.
  const int plain_tiles = (mask_from > 0 ? mask_from / kTile : 0) - item.tile_begin;
  const int n_plain = plain_tiles < 0 ? 0 : (plain_tiles > n_tiles ? n_tiles : plain_tiles);
  int j = 0;
#pragma unroll 1
  for (; j < n_plain; ++j) step(j, std::false_type{});
#pragma unroll 1
  for (; j < n_tiles; ++j) step(j, std::true_type{});
  detail::cp_async_wait<0>();

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

  // Pairs of dims as one 4-byte store when out is 4-byte aligned (q's rows
  // are: the host requires it), else two 2-byte stores.
  const bool out4 = (reinterpret_cast<uintptr_t>(p.out) & 3) == 0;
  // The thread's dims of each 8-column n-tile: 8 n + 2 tig, + 1.
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int h = hh ? h1 : h0;
    if (h >= rows) continue;
    const float m = hh ? m1 : m0, l = hh ? l1 : l0;
    if (!partial) {
      const float inv = l > 0.f ? p.v_scale / l : 0.f;
      T *dst = static_cast<T *>(p.out) + q_offset(h);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const uint32_t v =
            detail::Mma<T>::pack_rn(o[4 * n + 2 * hh] * inv, o[4 * n + 2 * hh + 1] * inv);
        uint16_t *e = reinterpret_cast<uint16_t *>(dst + n * 8 + 2 * tig);
        if (out4) {
          *reinterpret_cast<uint32_t *>(e) = v;
        } else {
          e[0] = static_cast<uint16_t>(v);
          e[1] = static_cast<uint16_t>(v >> 16);
        }
      }
    } else {
      const int64_t slot = p.work.partial_slot(
          p.work.query_row(row, j0 + h / group, kvh * group + h % group), item.split);
      float *po = p.partial_o + slot * D;
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
        *reinterpret_cast<float2 *>(po + n * 8 + 2 * tig) =
            make_float2(o[4 * n + 2 * hh], o[4 * n + 2 * hh + 1]);
      if (tig == 0) *reinterpret_cast<float2 *>(p.partial_ml + slot * 2) = make_float2(m, l);
    }
  }
#else
  (void)p;
  __trap();  // built for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace

template <class T, int D>
cudaError_t prepare_attention() {
  return cudaFuncSetAttribute(attention_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              Shape<D>::kSmemBytes);
}

int ctas_per_sm(int32_t head_dim) {
  return head_dim == 64 ? Shape<64>::kCtasPerSm : Shape<128>::kCtasPerSm;
}

template <class T, int D>
cudaError_t launch_attention(const detail::Params &p, cudaStream_t stream) {
  return detail::launch_pdl(attention_kernel<T, D>, static_cast<unsigned>(p.work.size()), kThreads,
                            Shape<D>::kSmemBytes, stream, p);
}

template cudaError_t prepare_attention<__nv_bfloat16, 64>();
template cudaError_t prepare_attention<__nv_bfloat16, 128>();
template cudaError_t prepare_attention<__half, 64>();
template cudaError_t prepare_attention<__half, 128>();
template cudaError_t launch_attention<__nv_bfloat16, 64>(const detail::Params &, cudaStream_t);
template cudaError_t launch_attention<__nv_bfloat16, 128>(const detail::Params &, cudaStream_t);
template cudaError_t launch_attention<__half, 64>(const detail::Params &, cudaStream_t);
template cudaError_t launch_attention<__half, 128>(const detail::Params &, cudaStream_t);

}  // namespace sm90
}  // namespace cuda
}  // namespace fd
