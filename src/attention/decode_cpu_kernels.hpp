// The arithmetic of the CPU decode backend: dot products, a portable
// vectorised exp, the online softmax update and the weighted V sums.
//
// Every function here is a fixed sequence of IEEE single-precision additions,
// multiplications and comparisons on eight-lane values (GCC vector types),
// with no FMA and no reassociation. The same source compiled for SSE2 (two
// registers per value) or AVX2 (one) therefore gives the same bits, and so
// does every build of the library: nothing depends on libm or on -ffast-math.
// All helpers are forced inline so that the AVX2 copy of the work item in
// decode_cpu.cpp really compiles them for AVX2.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#define FD_HOT_INLINE [[gnu::always_inline]] inline

// The helpers take and return eight-float values. They are always inlined,
// so the baseline ABI for such values (which GCC warns differs from AVX's)
// is never used across a call; the -Wpsabi note about it (GCC reports it at
// the end of the translation unit, clang at each use) is switched off for
// the translation unit. Clang honours the GCC pragma too.
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace fd {
namespace cpu {

typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef uint32_t U8 __attribute__((vector_size(32)));

// Loads/stores eight floats (unaligned); macros, not functions returning F8,
// whose ABI differs between the baseline and the AVX2 copy.
#define FD_LOAD8(dst, src) std::memcpy(&(dst), (src), sizeof(F8))
#define FD_STORE8(dst, src) std::memcpy((dst), &(src), sizeof(F8))

// Eight 16-bit K/V/Q elements (bf16 or f16 bits) widened to FP32 in vector
// form. Both conversions are exact, so they give the same bits as the scalar
// fd::bf16_to_f32 / fd::f16_to_f32.
typedef uint16_t U16x8 __attribute__((vector_size(16)));

// bf16 -> f32: the bits shifted up by 16.
FD_HOT_INLINE void bf16x8_to_f32(const uint16_t *src, float *dst) {
  U16x8 h;
  std::memcpy(&h, src, sizeof h);
  const U8 bits = __builtin_convertvector(h, U8) << 16;
  std::memcpy(dst, &bits, sizeof bits);
}

// f16 -> f32, branch-free: normal numbers re-bias the exponent, inf/NaN keep
// an all-ones exponent, subnormals are an exact integer-to-float conversion
// (mantissa * 2^-24), picked lane by lane with bit masks.
FD_HOT_INLINE void f16x8_to_f32(const uint16_t *src, float *dst) {
  U16x8 h16;
  std::memcpy(&h16, src, sizeof h16);
  const U8 h = __builtin_convertvector(h16, U8);
  const U8 sign = (h & 0x8000u) << 16;
  const U8 exp = (h >> 10) & 0x1fu;
  const U8 mant = h & 0x3ffu;
  const U8 is_subnormal = (U8)(exp == 0u);  // all ones where true
  const U8 is_special = (U8)(exp == 31u);
  const U8 normal = ((exp + 112u) << 23) | (mant << 13);
  const U8 special = 0x7f800000u | (mant << 13);
  const F8 sub_f = __builtin_convertvector((I8)mant, F8) * 0x1p-24f;
  U8 subnormal;
  std::memcpy(&subnormal, &sub_f, sizeof subnormal);
  U8 bits = (normal & ~is_special) | (special & is_special);
  bits = (bits & ~is_subnormal) | (subnormal & is_subnormal);
  bits |= sign;
  std::memcpy(dst, &bits, sizeof bits);
}

FD_HOT_INLINE F8 splat(float x) {
  return F8{} + x;
}

// Sums eight partial sums in a fixed tree order.
FD_HOT_INLINE float reduce8(const float *lane) {
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}
FD_HOT_INLINE float reduce8(const F8 &v) {
  float lane[8];
  std::memcpy(lane, &v, sizeof lane);
  return reduce8(lane);
}

// Lane-wise max(a, b) that keeps a where b is not greater (b NaN included).
FD_HOT_INLINE F8 vmax(F8 a, F8 b) {
  const I8 gt = b > a;
  I8 ai, bi;
  std::memcpy(&ai, &a, sizeof ai);
  std::memcpy(&bi, &b, sizeof bi);
  const I8 r = (bi & gt) | (ai & ~gt);
  F8 out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

// e^x lane by lane for x <= 0 (what softmax needs; NaN stays NaN, -inf and
// anything below -87.5 give 0). Cephes expf: x = n ln2 + r with
// |r| <= ln2 / 2 (ln2 in two parts, n * kLn2Hi exact), e^r by a degree-7
// polynomial, then a multiply by 2^n built from bits. Relative error about
// 1e-7; n lies in [-126, 0], so 2^n is a normal number.
FD_HOT_INLINE F8 exp8(F8 x) {
  const I8 under = x < splat(-87.5f);
  const F8 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const F8 t = x * splat(1.44269504088896341f) + magic;
  const F8 n = t - magic;
  const F8 r = (x - n * splat(0.693359375f)) - n * splat(-2.12194440e-4f);
  const F8 z = r * r;
  F8 y = splat(1.9875691500e-4f) * r + splat(1.3981999507e-3f);
  y = y * r + splat(8.3334519073e-3f);
  y = y * r + splat(4.1665795894e-2f);
  y = y * r + splat(1.6666665459e-1f);
  y = y * r + splat(5.0000001201e-1f);
  y = (y * z + r) + splat(1.0f);
  U8 tb, mb;
  std::memcpy(&tb, &t, sizeof tb);
  const F8 magic_copy = magic;
  std::memcpy(&mb, &magic_copy, sizeof mb);
  const U8 scale_bits = (tb - mb + 127u) << 23;  // (n + 127) << 23
  F8 scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  y = y * scale;
  U8 yb, ub;
  std::memcpy(&yb, &y, sizeof yb);
  std::memcpy(&ub, &under, sizeof ub);
  yb &= ~ub;
  std::memcpy(&y, &yb, sizeof y);
  return y;
}

FD_HOT_INLINE float exp1(float x) {
  const F8 v = exp8(splat(x));
  float lane[8];
  std::memcpy(lane, &v, sizeof lane);
  return lane[0];
}

// Dot product with eight partial sums (lane d % 8), reduced by reduce8, plus
// the dims past the last multiple of eight in order.
FD_HOT_INLINE float dot(const float *a, const float *b, size_t n) {
  F8 l = {};
  size_t d = 0;
  for (; d + 8 <= n; d += 8) {
    F8 x, y;
    FD_LOAD8(x, a + d);
    FD_LOAD8(y, b + d);
    l += x * y;
  }
  float tail = 0.f;
  for (; d < n; ++d) tail += a[d] * b[d];
  return reduce8(l) + tail;
}

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define FD_HAVE_SHUFFLEVECTOR 1
#else
#define FD_HAVE_SHUFFLEVECTOR 0
#endif

// reduce8 of each of a[0..7], as the eight lanes of one value: the same tree
// ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)), done on whole vectors.
FD_HOT_INLINE F8 reduce8x8(const F8 *a) {
#if FD_HAVE_SHUFFLEVECTOR
  F8 h[4];  // h[i] = [a[2i] l_k + l_k+4 (k < 4), a[2i+1] likewise]
  for (int i = 0; i < 4; ++i)
    h[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  F8 q[2];  // q[i] = [(s0+s1), (s2+s3)] of each of four vectors
  for (int i = 0; i < 2; ++i)
    q[i] = __builtin_shufflevector(h[2 * i], h[2 * i + 1], 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(h[2 * i], h[2 * i + 1], 1, 3, 5, 7, 9, 11, 13, 15);
  return __builtin_shufflevector(q[0], q[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(q[0], q[1], 1, 3, 5, 7, 9, 11, 13, 15);
#else
  float lane[8];
  for (int i = 0; i < 8; ++i) lane[i] = reduce8(a[i]);
  F8 r;
  std::memcpy(&r, lane, sizeof r);
  return r;
#endif
}

// p[g * stride + j] = dot(q[g], k[j]) for the group's query heads g and
// tokens j < n. Blocks of four heads x two tokens share each load of K and Q
// and keep eight sets of partial sums in flight; each dot's summation order
// is exactly dot()'s.
FD_HOT_INLINE void scores(const float *q, const float *k, size_t n, size_t group, size_t dim,
                          size_t stride, float *p) {
  const size_t d8 = dim / 8 * 8;
  size_t g = 0;
  for (; g + 4 <= group; g += 4) {
    const float *qg = q + g * dim;
    size_t j = 0;
    for (; j + 2 <= n; j += 2) {
      const float *k0 = k + j * dim, *k1 = k0 + dim;
      F8 l[8] = {};  // l[2h + t]: head g + h, token j + t
      for (size_t d = 0; d < d8; d += 8) {
        F8 x0, x1;
        FD_LOAD8(x0, k0 + d);
        FD_LOAD8(x1, k1 + d);
        for (size_t h = 0; h < 4; ++h) {
          F8 a;
          FD_LOAD8(a, qg + h * dim + d);
          l[2 * h] += a * x0;
          l[2 * h + 1] += a * x1;
        }
      }
      float tail[8] = {};
      for (size_t d = d8; d < dim; ++d)
        for (size_t h = 0; h < 4; ++h) {
          tail[2 * h] += qg[h * dim + d] * k0[d];
          tail[2 * h + 1] += qg[h * dim + d] * k1[d];
        }
      F8 t8;
      std::memcpy(&t8, tail, sizeof t8);
      const F8 r = reduce8x8(l) + t8;
      float out[8];
      std::memcpy(out, &r, sizeof out);
      for (size_t h = 0; h < 4; ++h) {
        p[(g + h) * stride + j] = out[2 * h];
        p[(g + h) * stride + j + 1] = out[2 * h + 1];
      }
    }
    for (; j < n; ++j)
      for (size_t h = 0; h < 4; ++h) p[(g + h) * stride + j] = dot(qg + h * dim, k + j * dim, dim);
  }
  for (; g < group; ++g)
    for (size_t j = 0; j < n; ++j) p[g * stride + j] = dot(q + g * dim, k + j * dim, dim);
}

// Online softmax for one query head and one tile: w ([n] scores, padded to a
// multiple of 8 with room to spare) becomes the weights relative to the new
// running maximum; m and l are the head's running max and weight sum.
// Returns the factor the head's accumulated V sums must be multiplied by.
FD_HOT_INLINE float softmax_update(float *w, size_t n, float &m, float &l) {
  const size_t n8 = (n + 7) / 8 * 8;
  for (size_t j = n; j < n8; ++j) w[j] = -INFINITY;  // weights 0
  F8 mx = splat(-INFINITY);
  for (size_t j = 0; j < n8; j += 8) {
    F8 x;
    FD_LOAD8(x, w + j);
    mx = vmax(mx, x);
  }
  float tile_max = -INFINITY;
  {
    float lane[8];
    std::memcpy(lane, &mx, sizeof lane);
    for (float x : lane) tile_max = x > tile_max ? x : tile_max;
  }
  const float old_max = m;
  const float new_max = tile_max > old_max ? tile_max : old_max;
  const F8 nm = splat(new_max);
  F8 sum8 = {};
  for (size_t j = 0; j < n8; j += 8) {
    F8 x;
    FD_LOAD8(x, w + j);
    const F8 e = exp8(x - nm);
    FD_STORE8(w + j, e);
    sum8 += e;
  }
  const float sum = reduce8(sum8);
  m = new_max;
  if (old_max == -INFINITY) {  // first tile: nothing to rescale
    l = sum;
    return 0.f;
  }
  const float correction = exp1(old_max - new_max);
  l = l * correction + sum;
  return correction;
}

// acc[h][d] = acc[h][d] * corr[h] + sum_j w[h][j] * v[j][d] for kHeads
// heads (w rows `stride` apart, acc rows `dim` apart) over n V rows
// (v, [n, dim]). Tokens are folded four at a time in a fixed order,
// (w0 v0 + w1 v1) + (w2 v2 + w3 v3), and the sums stay in registers over the
// whole tile, eight dims at a time.
template <size_t kHeads>
FD_HOT_INLINE void accumulate(const float *w, size_t stride, const float *v, size_t n, size_t dim,
                              const float *corr, float *acc) {
  const size_t d8 = dim / 8 * 8;
  for (size_t d = 0; d < d8; d += 8) {
    F8 a[kHeads];
    for (size_t h = 0; h < kHeads; ++h) {
      FD_LOAD8(a[h], acc + h * dim + d);
      a[h] *= corr[h];
    }
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
      F8 v0, v1, v2, v3;
      FD_LOAD8(v0, v + j * dim + d);
      FD_LOAD8(v1, v + (j + 1) * dim + d);
      FD_LOAD8(v2, v + (j + 2) * dim + d);
      FD_LOAD8(v3, v + (j + 3) * dim + d);
      for (size_t h = 0; h < kHeads; ++h) {
        const float *wh = w + h * stride + j;
        a[h] += (wh[0] * v0 + wh[1] * v1) + (wh[2] * v2 + wh[3] * v3);
      }
    }
    for (; j < n; ++j) {
      F8 vj;
      FD_LOAD8(vj, v + j * dim + d);
      for (size_t h = 0; h < kHeads; ++h) a[h] += w[h * stride + j] * vj;
    }
    for (size_t h = 0; h < kHeads; ++h) FD_STORE8(acc + h * dim + d, a[h]);
  }
  for (size_t d = d8; d < dim; ++d)
    for (size_t h = 0; h < kHeads; ++h) {
      const float *wh = w + h * stride;
      float a = acc[h * dim + d] * corr[h];
      size_t j = 0;
      for (; j + 4 <= n; j += 4)
        a += (wh[j] * v[j * dim + d] + wh[j + 1] * v[(j + 1) * dim + d]) +
             (wh[j + 2] * v[(j + 2) * dim + d] + wh[j + 3] * v[(j + 3) * dim + d]);
      for (; j < n; ++j) a += wh[j] * v[j * dim + d];
      acc[h * dim + d] = a;
    }
}

}  // namespace cpu
}  // namespace fd
