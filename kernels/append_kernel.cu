// KV append and fused RoPE + append kernels (docs/semantics.md S3).
//
// Work is split into units: a unit is one thread's share of one token, the
// same for every token, so a thread decodes its unit once and then serves the
// (up to kMaxTokensPerCta) tokens of its CTA. Per token:
//   Q heads (fused form): rotation units then pass-through units -> q_out;
//   K heads: the same units (fused) or plain copy units -> the K cache;
//   V heads: plain copy units -> the V cache.
// A split-half rotation unit takes up to 8 pairs (dims i..i+7 and
// R/2+i..R/2+i+7); an interleaved one (rope_style FD_ROPE_INTERLEAVED, a
// runtime argument) takes up to 4 pairs in one run of 8 dims (2i..2i+7, pair
// j in word j). Either way the thread that reads a pair also writes it: an
// in-place q_out is safe. A copy unit moves up to 8 consecutive dims
// (dim-major caches store them one element per dim).
//
// Loads are staged in shared memory: a thread issues cp.async copies of its
// unit's runs for all the CTA's tokens at once (16-byte vectors where the
// run is aligned and full), then builds its share of the cos/sin table, so
// the table's latency overlaps the memory latency; no registers hold data in
// flight, which leaves 40 registers a thread and three CTAs per SM.
//
// A full rotation unit reads its cos/sin as float4s and rotates two pairs per
// pair of 32-bit words (split-half) or one pair per word (interleaved),
// unpacked to FP32 and packed back with one paired round-to-nearest
// conversion: the same operations and roundings as one element at a time,
// with a fraction of the instructions.
//
// FP8 caches, E4M3 or E5M2 (kC): K and V units quantise on the store, stored
// = saturate(x / scale) rounded to nearest even (cvt.rn.satfinite: +-inf
// becomes +-448 or +-57344, every NaN is stored as 0x7f), x the FP32 value (a
// rotated K is not rounded to the input type first, as on the CPU); Q units
// are unchanged. The codes come from multiplies and exact comparisons
// (core/fp8_quantise.hpp), bit for bit those of dividing, with no division
// and no call.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "append_launch.hpp"
#include "core/fp8_quantise.hpp"
#include "flashdec.h"
#include "rope_rotate.cuh"

namespace fd {
namespace cuda {
namespace {

// The caches' element: the input type itself (16 bits), or an FP8 format
// that K and V units quantise into.
enum class CacheElem { k16, kE4m3, kE5m2 };

constexpr int kMaxThreads = 512;
constexpr int kMaxTokensPerCta = 4;
constexpr int kVec = 8;  // elements per run (16 bytes)

// Eight 16-bit elements, two per word (element 2t in the low half of w[t]).
struct Run {
  uint32_t w[4];
};

__device__ __forceinline__ bool aligned16(const void *p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

__device__ __forceinline__ uint16_t get(const Run &x, int t) {
  return static_cast<uint16_t>(x.w[t / 2] >> (16 * (t & 1)));
}

__device__ __forceinline__ void set(Run &x, int t, uint16_t v) {
  const int s = 16 * (t & 1);
  x.w[t / 2] = (x.w[t / 2] & ~(0xffffu << s)) | (static_cast<uint32_t>(v) << s);
}

// Elements [0, n) of p (n <= 8); the rest read as zero.
__device__ __forceinline__ Run load_run(const uint16_t *p, int n) {
  Run x;
  if (n == kVec && aligned16(p)) {
    const uint4 v = *reinterpret_cast<const uint4 *>(p);
    x.w[0] = v.x, x.w[1] = v.y, x.w[2] = v.z, x.w[3] = v.w;
    return x;
  }
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const uint32_t lo = 2 * t < n ? p[2 * t] : 0u;
    const uint32_t hi = 2 * t + 1 < n ? p[2 * t + 1] : 0u;
    x.w[t] = lo | (hi << 16);
  }
  return x;
}

// Element t of x goes to p[t * stride], t < n.
__device__ __forceinline__ void store_run(uint16_t *p, int64_t stride, int n, const Run &x) {
  if (stride == 1 && n == kVec && aligned16(p)) {
    *reinterpret_cast<uint4 *>(p) = make_uint4(x.w[0], x.w[1], x.w[2], x.w[3]);
    return;
  }
#pragma unroll
  for (int t = 0; t < kVec; ++t)
    if (t < n) p[t * stride] = get(x, t);
}

// One thread's unit of every token of its CTA.
struct Unit {
  const uint16_t *src;  // token 0's first element of the run
  unsigned char *dst;   // first element of the run (bytes), before the token's offset
  int32_t src_token;    // elements between tokens in src
  int32_t dst_token;    // q_out: elements between tokens; -1: cache slot of the token
  int64_t sd;           // dim stride of dst
  int n;                // elements per run
  int pair;             // first rotation pair (column of the cos/sin tables), -1 for a copy
  bool value;           // a V unit (FP8: quantised with the V scale)
};

// Shape of the per-token unit list.
struct Units {
  int D, R, half;
  bool interleaved;  // pairs (2i, 2i + 1): one run per rotation unit
  int rot_span;      // dims a rotation unit's first run walks: R/2, or R interleaved
  int plain;         // copy units of a head
  int rot;           // units of a rotated head (pairs, then the dims past R)
  int pair_units;    // rotation units of a rotated head
  int q, k, v;       // units of all Q / K / V heads
  int k_per_head;
  int total;
};

__host__ __device__ __forceinline__ Units units_of(const AppendLaunch &a) {
  Units u;
  u.D = a.head_dim, u.R = a.rotary_dim, u.half = a.rotary_dim / 2;
  u.interleaved = a.rope_style == FD_ROPE_INTERLEAVED;
  u.rot_span = u.interleaved ? u.R : u.half;
  u.plain = (u.D + kVec - 1) / kVec;
  u.pair_units = (u.rot_span + kVec - 1) / kVec;
  u.rot = u.R > 0 ? u.pair_units + (u.D - u.R + kVec - 1) / kVec : 0;
  u.q = a.q != nullptr ? a.num_q_heads * u.rot : 0;
  u.k_per_head = u.R > 0 ? u.rot : u.plain;
  u.k = a.num_kv_heads * u.k_per_head;
  u.v = a.v != nullptr ? a.num_kv_heads * u.plain : 0;
  u.total = u.q + u.k + u.v;
  return u;
}

// Unit j of a head whose token-0 source is src and destination dst (bytes;
// elements of `esz` bytes).
__device__ __forceinline__ Unit head_unit(const uint16_t *src, unsigned char *dst, int64_t sd,
                                          int esz, int j, bool rotated, const Units &s) {
  Unit u;
  u.sd = sd;
  u.pair = -1;
  int d0 = j * kVec;
  if (rotated) {
    if (j < s.pair_units) {
      u.pair = s.interleaved ? d0 / 2 : d0;  // first pair: the tables' column
    } else {
      d0 = s.R + (j - s.pair_units) * kVec;
    }
  }
  u.n = u.pair >= 0 ? min(kVec, s.rot_span - d0) : min(kVec, s.D - d0);
  u.src = src + d0;
  u.dst = dst + d0 * sd * esz;
  u.value = false;
  return u;
}

// esz: bytes per cache element (1: FP8).
__device__ __forceinline__ Unit unit_at(const AppendLaunch &a, const Units &s, int w, int64_t sh,
                                        int64_t sd, int esz) {
  const int64_t D = s.D;
  const int32_t q_row = a.num_q_heads * s.D, kv_row = a.num_kv_heads * s.D;
  Unit u;
  if (w < s.q) {
    const int h = w / s.rot;
    u = head_unit(static_cast<const uint16_t *>(a.q) + h * D,
                  static_cast<unsigned char *>(a.q_out) + h * D * 2, 1, 2, w - h * s.rot, true, s);
    u.src_token = q_row;
    u.dst_token = q_row;
  } else if (w < s.q + s.k) {
    w -= s.q;
    const int h = w / s.k_per_head;
    u = head_unit(static_cast<const uint16_t *>(a.k) + h * D,
                  static_cast<unsigned char *>(a.k_dst) + h * sh * esz, sd, esz,
                  w - h * s.k_per_head, s.R > 0, s);
    u.src_token = kv_row;
    u.dst_token = -1;
  } else {
    w -= s.q + s.k;
    const int h = w / s.plain;
    u = head_unit(static_cast<const uint16_t *>(a.v) + h * D,
                  static_cast<unsigned char *>(a.v_dst) + h * sh * esz, sd, esz, w - h * s.plain,
                  false, s);
    u.src_token = kv_row;
    u.dst_token = -1;
    u.value = true;
  }
  return u;
}

// A thread's source of its unit's runs, one of two kinds with the same
// members: load(u, r0, ntok, y_off) issues the loads of tokens r0 .. r0 +
// ntok - 1 (y_off: elements from a rotation unit's first run to its second,
// R/2 split-half; 0 interleaved, whose pairs lie inside the first run),
// wait() waits for them, and run(t, j) returns token t's run x (j = 0) or y
// (j = 1, a split-half rotation unit's second run).

// 16-byte copies into shared memory where the run is full and aligned
// (cp.async, L1 bypassed), through registers otherwise.
__device__ __forceinline__ void stage_run(uint4 *dst, const uint16_t *p, int n) {
  if (n == kVec && aligned16(p)) {
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(p));
  } else {
    const Run x = load_run(p, n);
    *dst = make_uint4(x.w[0], x.w[1], x.w[2], x.w[3]);
  }
}

// Staged in shared memory: run j of token t at x[(2 t + j) * threads], x the
// thread's own column. No registers hold data in flight.
struct Stage {
  static constexpr int kCtasPerSm = 3;  // launch bounds: 40 registers a thread
  static constexpr int kMaxTokens = kMaxTokensPerCta;
  uint4 *x;
  int threads;
  __device__ __forceinline__ void load(const Unit &u, int r0, int ntok, int y_off) {
#pragma unroll
    for (int t = 0; t < kMaxTokensPerCta; ++t) {
      if (t < ntok) {
        const uint16_t *p = u.src + int64_t{r0 + t} * u.src_token;
        stage_run(x + 2 * t * threads, p, u.n);
        if (u.pair >= 0 && y_off > 0) stage_run(x + (2 * t + 1) * threads, p + y_off, u.n);
      }
    }
  }
  __device__ __forceinline__ void wait() const {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
  }
  __device__ __forceinline__ Run run(int t, int j) const {
    const uint4 v = x[(2 * t + j) * threads];
    Run r;
    r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
    return r;
  }
};

// Held in registers: CTAs of one token, whose loads then skip the staging's
// round trip through shared memory.
struct Held {
  static constexpr int kCtasPerSm = 2;  // launch bounds: 64 registers a thread
  static constexpr int kMaxTokens = 1;
  Run x, y;
  __device__ __forceinline__ void load(const Unit &u, int r0, int ntok, int y_off) {
    if (ntok < 1) return;
    const uint16_t *p = u.src + int64_t{r0} * u.src_token;
    x = load_run(p, u.n);
    if (u.pair >= 0 && y_off > 0) y = load_run(p + y_off, u.n);
  }
  __device__ __forceinline__ void wait() const {}
  __device__ __forceinline__ Run run(int, int j) const { return j == 0 ? x : y; }
};

// Element offset of (head 0, dim 0) of token r in k_dst / v_dst. Read at
// each store (an L1 hit) rather than kept in registers.
__device__ __forceinline__ int64_t slot(const AppendLaunch &a, int r) {
  if (a.block_ids == nullptr) return int64_t{r} * a.num_kv_heads * a.head_dim;
  return int64_t{a.block_ids[r]} * a.stride_block + int64_t{a.offsets[r]} * a.stride_token;
}

// Floats per row of the shared cos/sin tables: half rounded up to whole
// 16-byte vectors, so that a full rotation unit (8 pairs from a multiple of
// 8) reads its cos and sin as two float4 each.
__host__ __device__ __forceinline__ int table_row(int half) {
  return (half + 3) & ~3;
}

// Rotates the pairs (x word, y word) = elements 2k, 2k + 1 of a run: unpack
// both words, rotate in FP32, pack with one round-to-nearest conversion per
// word.
template <class T>
__device__ __forceinline__ void rotate_word(uint32_t &xw, uint32_t &yw, float c0, float c1,
                                            float s0, float s1) {
  const float2 x = Elem<T>::load2(xw), y = Elem<T>::load2(yw);
  xw = Elem<T>::store2(rope_first(x.x, y.x, c0, s0), rope_first(x.y, y.y, c1, s1));
  yw = Elem<T>::store2(rope_second(x.x, y.x, c0, s0), rope_second(x.y, y.y, c1, s1));
}

// Rotates the interleaved pair held in one word (x1 in the low half, x2 in
// the high half) with one paired round-to-nearest conversion.
template <class T>
__device__ __forceinline__ void rotate_pair_word(uint32_t &w, float c, float s) {
  const float2 x = Elem<T>::load2(w);
  w = Elem<T>::store2(rope_first(x.x, x.y, c, s), rope_second(x.x, x.y, c, s));
}

// Two FP32 values converted to FP8 (the first in the low byte) by
// cvt.rn.satfinite: round to nearest even; the PTX ISA says a magnitude past
// the format's largest finite value, infinity included, gives that value
// with the input's sign (+-448 0x7e / 0xfe, +-57344 0x7b / 0xfb: the CPU's
// rule), and a NaN gives "NaN in the destination format", with no code or
// sign promised (E5M2 has six NaN codes), so fp8_codes4 stores every NaN as
// 0x7f.
__device__ __forceinline__ uint32_t cvt_e4m3x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ uint32_t cvt_e5m2x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E5M2);
}

// Four E4M3 codes with every NaN stored as the canonical 0x7f whatever its
// sign: a byte whose low 7 bits are all set is NaN, and its sign bit is
// cleared (per byte: (b & 0x7f) + 1 carries into bit 7 only then, never
// into the next byte).
__device__ __forceinline__ uint32_t canonical_nan4(uint32_t w) {
  return w & ~(((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u);
}

// The same for four E5M2 codes, whose NaNs are the magnitudes 0x7d .. 0x7f:
// (b & 0x7f) + 3 carries into bit 7 exactly for those (never into the next
// byte); their sign bit is cleared and their low 7 bits set (n - (n >> 7)
// is 0x7f in each such byte, 0 in the others).
__device__ __forceinline__ uint32_t canonical_nan4_e5m2(uint32_t w) {
  const uint32_t n = ((w & 0x7f7f7f7fu) + 0x03030303u) & 0x80808080u;
  return (w & ~n) | (n - (n >> 7));
}

// Four FP32 values quantised into one word of FP8 codes of the cache's
// format (v[0] in the low byte): the codes of RN(v / scale) by
// core/fp8_quantise.hpp's rule, multiplies and comparisons only, every NaN
// stored as 0x7f.
template <CacheElem kC>
__device__ __forceinline__ uint32_t fp8_codes4(const float (&v)[4], const Fp8Quant &q) {
  if constexpr (kC == CacheElem::kE5m2)
    return canonical_nan4_e5m2(fp8_quantise4<Fp8E5m2>(v, q, cvt_e5m2x2));
  else
    return canonical_nan4(fp8_quantise4<Fp8E4m3>(v, q, cvt_e4m3x2));
}

// The FP8 codes of one K / V run of one token (x; y: a split-half rotation
// unit's second run): rotated in FP32 when a rotation unit, quantised once,
// four elements (one output word) at a time. c / sp: the token's cos / sin
// from the unit's first pair; a full unit reads them as float4s
// (split-half) or float2s (interleaved). kC: the cache's FP8 format.
template <class T, CacheElem kC>
__device__ __forceinline__ void f8_run_codes(const Unit &u, int y_off, const Run &x, const Run &y,
                                             const float *c, const float *sp, const Fp8Quant &qz,
                                             uint32_t (&wx)[2], uint32_t (&wy)[2]) {
  const bool full = u.n == kVec;  // then c, sp are 16-byte aligned
#pragma unroll
  for (int e = 0; e < kVec; e += 4) {
    float xv[4], yv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 4; ++i) xv[i] = Elem<T>::load(get(x, e + i));
    if (u.pair >= 0 && y_off == 0) {
      // Interleaved: elements e + 2 k, e + 2 k + 1 are pair u.pair + e / 2 + k.
      float2 c2, s2;
      if (full) {
        c2 = *reinterpret_cast<const float2 *>(c + e / 2);
        s2 = *reinterpret_cast<const float2 *>(sp + e / 2);
      } else {
        c2 = make_float2(e < u.n ? c[e / 2] : 0.f, e + 2 < u.n ? c[e / 2 + 1] : 0.f);
        s2 = make_float2(e < u.n ? sp[e / 2] : 0.f, e + 2 < u.n ? sp[e / 2 + 1] : 0.f);
      }
      const float cc[2] = {c2.x, c2.y}, ss[2] = {s2.x, s2.y};
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        if (e + 2 * k >= u.n) continue;
        const float a0 = xv[2 * k], b0 = xv[2 * k + 1];
        xv[2 * k] = rope_first(a0, b0, cc[k], ss[k]);
        xv[2 * k + 1] = rope_second(a0, b0, cc[k], ss[k]);
      }
    } else if (u.pair >= 0) {
      // Split-half: element e + i pairs with y's (pair u.pair + e + i).
      float4 c4, s4;
      if (full) {
        c4 = *reinterpret_cast<const float4 *>(c + e);
        s4 = *reinterpret_cast<const float4 *>(sp + e);
      } else {
        c4 = make_float4(e < u.n ? c[e] : 0.f, e + 1 < u.n ? c[e + 1] : 0.f,
                         e + 2 < u.n ? c[e + 2] : 0.f, e + 3 < u.n ? c[e + 3] : 0.f);
        s4 = make_float4(e < u.n ? sp[e] : 0.f, e + 1 < u.n ? sp[e + 1] : 0.f,
                         e + 2 < u.n ? sp[e + 2] : 0.f, e + 3 < u.n ? sp[e + 3] : 0.f);
      }
      const float cc[4] = {c4.x, c4.y, c4.z, c4.w}, ss[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (e + i >= u.n) continue;
        const float a0 = xv[i], b0 = Elem<T>::load(get(y, e + i));
        xv[i] = rope_first(a0, b0, cc[i], ss[i]);
        yv[i] = rope_second(a0, b0, cc[i], ss[i]);
      }
      wy[e / 4] = fp8_codes4<kC>(yv, qz);
    }
    wx[e / 4] = fp8_codes4<kC>(xv, qz);
  }
}

// Bytes [0, n) of w (n <= 8) at p[t * stride].
__device__ __forceinline__ void store_bytes(unsigned char *p, int64_t stride, int n,
                                            const uint32_t (&w)[2]) {
  if (stride == 1 && n == kVec && (reinterpret_cast<uintptr_t>(p) & 7u) == 0) {
    *reinterpret_cast<uint2 *>(p) = make_uint2(w[0], w[1]);
    return;
  }
#pragma unroll
  for (int t = 0; t < kVec; ++t)
    if (t < n) p[t * stride] = static_cast<unsigned char>(w[t / 4] >> (8 * (t & 3)));
}

// Rotates (if a rotation unit) and stores unit u of tokens r0 .. r0 + ntok
// - 1. cos_s / sin_s: the tokens' tables, rows of table_row(half) floats.
// y_off as in the sources' load (0: interleaved pairs). kC: the caches'
// element (FP8: K and V units quantise into it).
template <class T, CacheElem kC, class Source>
__device__ __forceinline__ void store_unit(const Unit &u, int r0, int ntok, int half, int y_off,
                                           const AppendLaunch &a, const float *cos_s,
                                           const float *sin_s, const Source &src,
                                           const int64_t *slots, const Fp8Quant &kq,
                                           const Fp8Quant &vq) {
  const int row = table_row(half);
  // FP8 K / V units: the plan of the unit's scale (field by field: the
  // parameters are not copied to the stack).
  Fp8Quant qz;
  qz.pre = u.value ? vq.pre : kq.pre;
  qz.scale = u.value ? vq.scale : kq.scale;
  qz.down = u.value ? vq.down : kq.down;
  qz.up = u.value ? vq.up : kq.up;
  qz.down_v = u.value ? vq.down_v : kq.down_v;
  qz.up_v = u.value ? vq.up_v : kq.up_v;
#pragma unroll 1
  for (int t = 0; t < Source::kMaxTokens; ++t) {
    if (t < ntok) {
      Run xt = src.run(t, 0);
      Run yt{};
      if (u.pair >= 0 && y_off > 0) yt = src.run(t, 1);
      const int64_t off = u.dst_token >= 0   ? int64_t{r0 + t} * u.dst_token
                          : slots != nullptr ? slots[t]
                                             : slot(a, r0 + t);
      if (kC != CacheElem::k16 && u.dst_token < 0) {
        unsigned char *dst = u.dst + off;
        const float *c = cos_s + t * row + u.pair, *sp = sin_s + t * row + u.pair;
        uint32_t wx[2] = {0u, 0u}, wy[2] = {0u, 0u};
        f8_run_codes<T, kC>(u, y_off, xt, yt, c, sp, qz, wx, wy);
        if (u.pair >= 0 && y_off > 0) store_bytes(dst + y_off * u.sd, u.sd, u.n, wy);
        store_bytes(dst, u.sd, u.n, wx);
        continue;
      }
      uint16_t *dst = reinterpret_cast<uint16_t *>(u.dst) + off;
      if (u.pair >= 0 && y_off == 0) {
        // Interleaved: word k is pair u.pair + k.
        const float *c = cos_s + t * row + u.pair, *s = sin_s + t * row + u.pair;
        if (u.n == kVec) {  // c, s 16-byte aligned (u.pair and row multiples of 4)
          const float4 c4 = *reinterpret_cast<const float4 *>(c);
          const float4 s4 = *reinterpret_cast<const float4 *>(s);
          rotate_pair_word<T>(xt.w[0], c4.x, s4.x);
          rotate_pair_word<T>(xt.w[1], c4.y, s4.y);
          rotate_pair_word<T>(xt.w[2], c4.z, s4.z);
          rotate_pair_word<T>(xt.w[3], c4.w, s4.w);
        } else {
#pragma unroll
          for (int k = 0; k < kVec / 2; ++k)
            if (2 * k < u.n) rotate_pair_word<T>(xt.w[k], c[k], s[k]);
        }
      } else if (u.pair >= 0) {
        const float *c = cos_s + t * row + u.pair, *s = sin_s + t * row + u.pair;
        if (u.n == kVec) {  // c, s 16-byte aligned (u.pair and row multiples of 4)
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const float4 c4 = reinterpret_cast<const float4 *>(c)[k];
            const float4 s4 = reinterpret_cast<const float4 *>(s)[k];
            rotate_word<T>(xt.w[2 * k], yt.w[2 * k], c4.x, c4.y, s4.x, s4.y);
            rotate_word<T>(xt.w[2 * k + 1], yt.w[2 * k + 1], c4.z, c4.w, s4.z, s4.w);
          }
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            if (e < u.n) {
              const float x1 = Elem<T>::load(get(xt, e)), x2 = Elem<T>::load(get(yt, e));
              set(xt, e, Elem<T>::store(rope_first(x1, x2, c[e], s[e])));
              set(yt, e, Elem<T>::store(rope_second(x1, x2, c[e], s[e])));
            }
          }
        }
        store_run(dst + y_off * u.sd, u.sd, u.n, yt);
      }
      store_run(dst, u.sd, u.n, xt);
    }
  }
}

// inv_freq = base^(-2i/R) with the CPU's FP32 exponent. FP64 exp2 of
// exponent * log2(base) (relative error ~2^-48) rounded once to FP32 is the
// correctly rounded value, as the CPU's powf returns, unless the exact value
// lies within ~2^-48 of a rounding boundary. So angle = p * inv_freq is the
// CPU's FP32 angle bit for bit: a one-ulp inv_freq would move the angle of p
// = 131071 by ~0.008 rad. One FP64 exp2 per pair and CTA (the old FP64 pow +
// sincos per token cost ~2.4 us of latency per launch).
__device__ __forceinline__ float inv_freq_of(int i, int R, double log2_base) {
  const float exponent = __fdiv_rn(-2.0f * static_cast<float>(i), static_cast<float>(R));
  return static_cast<float>(exp2(static_cast<double>(exponent) * log2_base));
}

// Accurate FP32 sincosf (not __sinf): within an FP32 ulp or two of the CPU's
// cosf/sinf, far below one f16/bf16 rounding of the result.
__device__ __forceinline__ void cos_sin_entry(int position, float inv_freq, float *c, float *s) {
  const float angle = __fmul_rn(static_cast<float>(position), inv_freq);
  sincosf(angle, s, c);
}

// One CTA per tokens_per_cta tokens. Staged loads: registers for three CTAs
// of up to 512 threads per SM (40 a thread; on the H200 fused RoPE + append
// at 8192 tokens ran 5% faster in bf16, 12% into FP8, than with two CTAs of
// 64). Held loads (one token): two CTAs of 64 registers.
template <class T, CacheElem kC, class Source>
__global__ void __launch_bounds__(kMaxThreads, Source::kCtasPerSm)
    append_kernel(const AppendLaunch a, const Fp8Quant kq, const Fp8Quant vq,
                  const double log2_base, const int tokens_per_cta) {
  extern __shared__ uint4 smem[];
  const Units s = units_of(a);
  const int half = s.half, row = table_row(half), y_off = s.interleaved ? 0 : half;
  const int r0 = blockIdx.x * tokens_per_cta;
  const int ntok = min(tokens_per_cta, a.num_tokens - r0);
  const bool paged = a.block_ids != nullptr;
  const int64_t sh = paged ? a.stride_head : int64_t{s.D};
  const int64_t sd = paged ? a.stride_dim : 1;
  constexpr int esz = kC != CacheElem::k16 ? 1 : 2;
  // Shared memory: the tokens' cache slots (int64, padded to 16 bytes), the
  // cos/sin tables, then (Stage) the staged runs [tpc][2][threads].
  const int nthreads = blockDim.x;
  int64_t *slots = reinterpret_cast<int64_t *>(smem);
  float *table = reinterpret_cast<float *>(smem + (tokens_per_cta + 1) / 2);
  const int table_floats = s.R > 0 ? row * (1 + 2 * tokens_per_cta) : 0;  // multiple of 4
  Source src{};
  if constexpr (std::is_same_v<Source, Stage>)
    src = Stage{reinterpret_cast<uint4 *>(table + table_floats) + threadIdx.x, nthreads};
  int w = threadIdx.x;
  Unit u{};
  if (w < s.total) {
    u = unit_at(a, s, w, sh, sd, esz);
    src.load(u, r0, ntok, y_off);
  }
  // The tokens' cache slots, by the CTA's last threads (those of the V units,
  // which build no table: waiting on the block ids delays nothing else).
  // Only for CTAs of kMaxTokensPerCta tokens (on the H200, 2-7% faster at
  // 8,192 tokens, 3-8% slower with 1 or 2 tokens per CTA; there each store
  // reads its slot itself).
  const bool shared_slots = tokens_per_cta == kMaxTokensPerCta;
  const int j = static_cast<int>(threadIdx.x) - (nthreads - ntok);
  if (shared_slots && j >= 0) slots[j] = slot(a, r0 + j);
  float *inv_freq = table, *cos_s = table + row, *sin_s = table + row + tokens_per_cta * row;
  if (s.R > 0) {  // uniform across the CTA
    for (int i = threadIdx.x; i < half; i += blockDim.x)
      inv_freq[i] = inv_freq_of(i, s.R, log2_base);
    __syncthreads();
    for (int e = threadIdx.x; e < ntok * half; e += blockDim.x) {
      const int t = e / half, i = e - t * half;
      cos_sin_entry(a.positions[r0 + t], inv_freq[i], &cos_s[t * row + i], &sin_s[t * row + i]);
    }
  }
  if (s.R > 0 || shared_slots) __syncthreads();  // the tables, the slots
  while (w < s.total) {
    src.wait();
    store_unit<T, kC>(u, r0, ntok, half, y_off, a, cos_s, sin_s, src,
                      shared_slots ? slots : nullptr, kq, vq);
    w += blockDim.x;
    if (w < s.total) {
      u = unit_at(a, s, w, sh, sd, esz);
      src.load(u, r0, ntok, y_off);
    }
  }
}

}  // namespace

namespace {

template <class T, CacheElem kC, class Source>
cudaError_t launch_kernel(const AppendLaunch &a, int threads, int tpc, double log2_base) {
  const Units s = units_of(a);
  const dim3 grid(static_cast<unsigned>((a.num_tokens + tpc - 1) / tpc));
  size_t smem =
      16 * static_cast<size_t>((tpc + 1) / 2) +
      (s.R > 0 ? sizeof(float) * static_cast<size_t>(table_row(s.half)) * (1 + 2 * tpc) : 0);
  if (std::is_same_v<Source, Stage>)
    smem += sizeof(uint4) * 2 * static_cast<size_t>(tpc) * static_cast<size_t>(threads);
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(append_kernel<T, kC, Source>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  append_kernel<T, kC, Source><<<grid, threads, smem, a.stream>>>(
      a, fp8_quant_plan(a.k_scale), fp8_quant_plan(a.v_scale), log2_base, tpc);
  return cudaGetLastError();
}

template <class T, CacheElem kC>
cudaError_t launch_sourced(const AppendLaunch &a, int threads, int tpc, double log2_base) {
  if (tpc == 1) return launch_kernel<T, kC, Held>(a, threads, tpc, log2_base);
  return launch_kernel<T, kC, Stage>(a, threads, tpc, log2_base);
}

template <class T>
cudaError_t launch_typed(const AppendLaunch &a, int threads, double log2_base) {
  // Several tokens per CTA once there are enough tokens to fill the chip
  // anyway: fewer, longer CTAs with more loads in flight per thread. CTAs
  // of one token hold their loads in registers, the others stage them.
  int tpc = a.num_tokens >= 4096 ? 4 : a.num_tokens >= 2048 ? 2 : 1;
  if (a.tokens_per_group == 1 || a.tokens_per_group == 2 || a.tokens_per_group == 4)
    tpc = a.tokens_per_group;
  if (a.cache_dtype == FD_DTYPE_FP8_E4M3)
    return launch_sourced<T, CacheElem::kE4m3>(a, threads, tpc, log2_base);
  if (a.cache_dtype == FD_DTYPE_FP8_E5M2)
    return launch_sourced<T, CacheElem::kE5m2>(a, threads, tpc, log2_base);
  return launch_sourced<T, CacheElem::k16>(a, threads, tpc, log2_base);
}

}  // namespace

cudaError_t launch_append(const AppendLaunch &a) {
  if (a.num_tokens <= 0) return cudaSuccess;
  const Units s = units_of(a);
  int threads = (s.total + 31) / 32 * 32;
  if (threads > kMaxThreads) threads = kMaxThreads;
  if (threads < 32) threads = 32;
  const double log2_base = s.R > 0 ? std::log2(static_cast<double>(a.rope_base)) : 0.0;
  if (a.dtype == FD_DTYPE_F16) return launch_typed<__half>(a, threads, log2_base);
  return launch_typed<__nv_bfloat16>(a, threads, log2_base);
}

}  // namespace cuda
}  // namespace fd
