// The swapped-operand warp step of the FP8 decode kernel (decode_kernel's
// kSwap instantiations): FP8 K/V in either layout, one query token per row,
// groups of at most 8 query heads, no attention variant.
//
// The plain kernel computes S = Q K^T with the group's heads as the mma's 16
// rows, so for groups of at most 8 half of every mma, of the softmax and of
// O is padding. Swapped, the tokens are the rows and the (at most 8) heads
// the columns:
//   S^T = K q^T   (A: 16 tokens x 16 dims of K from shared memory, B: q^T)
//   O^T = V^T P^T (A: 16 dims x 16 tokens of V, transposed by ldmatrix; B: P^T)
// Per 16-token step at head_dim 128 that is 8 + 8 mma instead of 16 + 16, 4
// exponentials per thread instead of 8, and O is 32 floats per thread.
//
// Fragments (g = lane / 4, tig = lane % 4):
// * K (non-transposed ldmatrix on FP8 bytes): a thread gets dims 4 tig ..
//   4 tig + 3 of its token in a 16-dim chunk; the mma's k order is permuted
//   to match, which q's fragments already are (decode_kernel loads q's dims
//   4 tig, +1 and 4 tig + 2, +3 per 16-dim k-step over token-major FP8), so
//   q's row-g A fragments of the plain path are exactly the B fragments here.
// * S^T accumulator: tokens g and g + 8, heads 2 tig and 2 tig + 1.
// * P^T as B fragment needs tokens 2 tig, +1 of head g: the transpose of the
//   accumulator's 8 x 8 blocks, one movmatrix each.
// * V (transposing ldmatrix on FP8 bytes, then one prmt): a thread gets dims
//   2 g and 2 g + 1 of tokens 2 tig, +1; m-tile c (16 dims of chunk c) maps
//   its row g to dim 16 c + 2 g and row g + 8 to dim 16 c + 2 g + 1.
// * O^T accumulator of m-tile c: o[c][0] (dim 16 c + 2 g, head 2 tig),
//   o[c][1] (same dim, head 2 tig + 1), o[c][2], o[c][3] (dim 16 c + 2 g + 1).
//
// Dim-major K/V (kDimMajor; a staged step is 16-byte rows of 16 tokens per
// dim, f8_dm_offset) give the same fragments the m-tile path's B operands
// are, rearranged:
// * K (transposing ldmatrix, then pair_bytes): a thread gets dims 2 tig, +1
//   of tokens 2 g and 2 g + 1, so the mma's row g is token 2 g and row g + 8
//   token 2 g + 1, with the natural k order (q's dim-major fragments).
// * P^T: movmatrix of the accumulator's blocks gives head g's tokens 4 tig,
//   4 tig + 2 (block of tokens 2 g) and 4 tig + 1, 4 tig + 3 (2 g + 1): the
//   k order of V's fragments below, with no other step.
// * V (non-transposing ldmatrix, then pair_bytes): a thread gets tokens
//   4 tig .. 4 tig + 3 of one dim, k = 2 tig, +1 (tokens 4 tig, +2) and
//   2 tig + 8, +9 (4 tig + 1, +3); O^T m-tile c holds dims 16 c + g
//   (o[c][0], o[c][1]) and 16 c + g + 8 (o[c][2], o[c][3]).
#pragma once

#include <cstdint>

#include "decode_config.cuh"
#include "decode_device.cuh"
#include "decode_tiles.cuh"

namespace fd {
namespace cuda {
namespace detail {

// Transposes the 8 x 8 matrix of 16-bit elements a warp holds in the mma
// accumulator layout (lane: row lane / 4, columns 2 (lane % 4), +1).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Per-head online-softmax state of a thread in the swapped step: heads 2 tig
// (a) and 2 tig + 1 (b). The maxima are the same on every lane of a tig;
// the sums are the thread's own tokens' share (decode_kernel adds them over
// g at the end).
struct SwapState {
  float ma, mb;  // reference maxima (base 2)
  float la, lb;  // running sums
};

// One 16-token step (tokens t0 .. t0 + 15 of the staged tile, absolute
// position tok of token t0) of the swapped path: scores, online softmax with
// lazy rescaling (a reference moves when a score passes it by more than
// `slack`, as in decode_kernel), O^T += V^T P^T.
// qa[ks][0], qa[ks][2]: q row g's dims of k-step ks (permuted as above);
// lsa, lsb: the base-2 logit scales of heads 2 tig and 2 tig + 1; positions
// at or past seq_len are masked. sv: the V stage (generic pointer).
// kDimMajor: dim-major stages, whose tail the caller zeroes per tile.
template <class TKV, int D, bool kDimMajor, bool kZeroTail>
__device__ __forceinline__ void swapped_step(uint32_t sk_u, unsigned char *sv, int t0, int tok,
                                             int seq_len, const uint32_t (&qa)[D / 16][4],
                                             float lsa, float lsb, float slack, SwapState &st,
                                             float (&o)[D / 16][4], int lane) {
  static_assert(!(kDimMajor && kZeroTail), "TMA stages token-major tiles only");
  using M = Mma<__half>;
  const int g = lane >> 2;
  const int step = t0 / 16;  // dim-major: the step's 16-byte rows
  const int mi = lane >> 3;  // ldmatrix: which 8x8 matrix this lane addresses
  const int rr = lane & 7;   // ... and which of its rows
  // Matrix mi of each ldmatrix.x4: tokens t0 + 8 (mi & 1) .. +7, chunk 2 c2 +
  // (mi >> 1): registers 0 / 1 are tokens g / g + 8 of chunk 2 c2, 2 / 3 of
  // chunk 2 c2 + 1.
  const int row = t0 + (mi & 1) * 8 + rr;
  if (kZeroTail && tok + 16 > seq_len) {  // warp-uniform
    // kZeroTail (TMA staging): the step's rows at or past seq_len hold stale
    // bytes (TMA stages whole blocks, and skips blocks past the row's end;
    // cp.async staging zero-fills them instead): their scores are masked
    // below, but a weight of 0 times a stale NaN would still be NaN, so zero
    // their V rows (this warp alone reads them), before the next TMA write.
    const int first = seq_len - tok < 0 ? 0 : seq_len - tok;
    constexpr int kRowChunks = D / 16;
#pragma unroll
    for (int e = lane; e < 16 * kRowChunks; e += 32) {
      const int r = e / kRowChunks;
      if (r >= first)
        *reinterpret_cast<uint4 *>(sv + f8_tm_offset<D>(t0 + r, e % kRowChunks)) =
            make_uint4(0u, 0u, 0u, 0u);
    }
    fence_proxy_async_smem();
    __syncwarp();
  }
  const uint32_t sv_u = smem_u32(sv);
  float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int c2 = 0; c2 < D / 32; ++c2) {
    uint32_t b[4];
    if constexpr (kDimMajor) {
      // Matrix mi: dims 32 c2 + 8 mi .. +7 (rows) of the step's 16 tokens;
      // b[2 h] / b[2 h + 1] hold k-step 2 c2 + h's dims 2 tig, +1 / +8, +9.
      ldsm_x4_t(sk_u + f8_dm_offset<D>(step, c2 * 32 + mi * 8 + rr), b);
    } else {
      ldsm_x4(sk_u + f8_tm_offset<D>(row, 2 * c2 + (mi >> 1)), b);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kDimMajor) {
        const F16x2x2 x0 = f8x4_paired<TKV>(b[2 * h]), x1 = f8x4_paired<TKV>(b[2 * h + 1]);
        const uint32_t a[4] = {x0.lo, x0.hi, x1.lo, x1.hi};
        M::run(s, a, qa[2 * c2 + h][0], qa[2 * c2 + h][2]);
      } else {
        const F16x2x2 x0 = f8x4<TKV>(b[2 * h]), x1 = f8x4<TKV>(b[2 * h + 1]);
        const uint32_t a[4] = {x0.lo, x1.lo, x0.hi, x1.hi};
        M::run(s, a, qa[2 * c2 + h][0], qa[2 * c2 + h][2]);
      }
    }
  }
  s[0] *= lsa;
  s[1] *= lsb;
  s[2] *= lsa;
  s[3] *= lsb;
  if (tok + 16 > seq_len) {  // warp-uniform
    // The tokens of the mma's rows g and g + 8.
    const int r0 = kDimMajor ? 2 * g : g, r1 = kDimMajor ? 2 * g + 1 : g + 8;
    if (tok + r0 >= seq_len) s[0] = s[1] = neg_inf();
    if (tok + r1 >= seq_len) s[2] = s[3] = neg_inf();
  }
  float mxa = fmaxf(s[0], s[2]), mxb = fmaxf(s[1], s[3]);
#pragma unroll
  for (int x = 4; x < 32; x <<= 1) {
    mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, x));
    mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, x));
  }
  if (__any_sync(0xffffffffu, mxa > st.ma + slack || mxb > st.mb + slack)) {
    const float na = fmaxf(st.ma, mxa), nb = fmaxf(st.mb, mxb);
    const float ca = exp2_approx(st.ma - (na == neg_inf() ? 0.f : na));
    const float cb = exp2_approx(st.mb - (nb == neg_inf() ? 0.f : nb));
    st.ma = na;
    st.mb = nb;
    st.la *= ca;
    st.lb *= cb;
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      o[c][0] *= ca;
      o[c][1] *= cb;
      o[c][2] *= ca;
      o[c][3] *= cb;
    }
  }
  const float ua = st.ma == neg_inf() ? 0.f : st.ma;
  const float ub = st.mb == neg_inf() ? 0.f : st.mb;
  s[0] = exp2_approx(s[0] - ua);
  s[1] = exp2_approx(s[1] - ub);
  s[2] = exp2_approx(s[2] - ua);
  s[3] = exp2_approx(s[3] - ub);
  // P^T's B fragments: tokens 2 tig, +1 (pb0) and 8 + 2 tig, +1 (pb1) of
  // head g (dim-major: 4 tig, +2 and 4 tig + 1, +3). pack rounds s in
  // place, so the sums are of what the mma sees.
  const uint32_t pb0 = movmatrix_trans(M::pack(s[0], s[1]));
  const uint32_t pb1 = movmatrix_trans(M::pack(s[2], s[3]));
  st.la += s[0] + s[2];
  st.lb += s[1] + s[3];
#pragma unroll
  for (int c2 = 0; c2 < D / 32; ++c2) {
    uint32_t b[4];
    if constexpr (kDimMajor) {
      // Matrix mi: dims 32 c2 + 8 mi .. +7 (rows): m-tile 2 c2 + h's rows g
      // and g + 8 are matrices 2 h and 2 h + 1.
      ldsm_x4(sv_u + f8_dm_offset<D>(step, c2 * 32 + mi * 8 + rr), b);
    } else {
      ldsm_x4_t(sv_u + f8_tm_offset<D>(row, 2 * c2 + (mi >> 1)), b);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const F16x2x2 x0 = f8x4_paired<TKV>(b[2 * h]), x1 = f8x4_paired<TKV>(b[2 * h + 1]);
      if constexpr (kDimMajor) {
        const uint32_t a[4] = {x0.lo, x1.lo, x0.hi, x1.hi};
        M::run(o[2 * c2 + h], a, pb0, pb1);
      } else {
        const uint32_t a[4] = {x0.lo, x0.hi, x1.lo, x1.hi};
        M::run(o[2 * c2 + h], a, pb0, pb1);
      }
    }
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace fd
