// The split-KV merge of the paged decode kernels: decode_merge_kernel
// combines the partial (O, max, sum) of a row's splits in a fixed order, and
// merge_shape sizes its launch.
#pragma once

#include <cstdint>

#include "decode_config.cuh"
#include "decode_device.cuh"

namespace fd {
namespace cuda {
namespace detail {

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

}  // namespace detail
}  // namespace cuda
}  // namespace fd
