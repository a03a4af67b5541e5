/* Data side of the cache model test: a shadow copy of every K/V element the
 * cache stores, the test values written into it, and a plain RoPE reference.
 *
 * Values written by plain layer writes, appends and prefix registrations are
 * small integers, exact in FP32, FP16 and BF16, and differ between writes,
 * rows, heads and dims, so that any misplaced token shows up as a wrong value.
 * RoPE-rotated K values are not exact; the shadow marks them and compares them
 * with a tolerance. */
#ifndef FD_TESTS_MODEL_KV_SHADOW_HPP
#define FD_TESTS_MODEL_KV_SHADOW_HPP

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashdec.h"
#include "cache_model.hpp"

namespace fdmodel {

/* A distinct exact integer in [-125, 125] for (tag, a, b, c). */
inline float test_value(uint64_t tag, uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t h = tag * 131 + a * 31 + b * 7 + c * 3;
  return static_cast<float>(static_cast<int64_t>(h % 251) - 125);
}

/* dtype conversions (round to nearest even), independent of the library. */
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu,
                 m = h & 0x3ffu;
  if (e == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(m), -24);
  uint32_t u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112u) << 23) | (m << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t a = u & 0x7fffffffu;
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < 0x38800000u) {
    float af;
    std::memcpy(&af, &a, 4);
    const float r = af + 0.5f;
    uint32_t ru;
    std::memcpy(&ru, &r, 4);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(ru - 0x3f000000u));
  }
  return static_cast<uint16_t>(sign |
                               static_cast<uint16_t>((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13));
}

/* Element i of a buffer of `dtype` (each dtype explicitly; an unknown one
 * is a bug of the test, not a 2-byte type). */
inline float load_elem(const void *base, size_t i, int32_t dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return static_cast<const float *>(base)[i];
    case FD_DTYPE_F16: return from_f16(static_cast<const uint16_t *>(base)[i]);
    case FD_DTYPE_BF16: return from_bf16(static_cast<const uint16_t *>(base)[i]);
    default: std::abort();
  }
}
inline void store_elem(void *base, size_t i, int32_t dtype, float x) {
  switch (dtype) {
    case FD_DTYPE_F32: static_cast<float *>(base)[i] = x; break;
    case FD_DTYPE_F16: static_cast<uint16_t *>(base)[i] = to_f16(x); break;
    case FD_DTYPE_BF16: static_cast<uint16_t *>(base)[i] = to_bf16(x); break;
    default: std::abort();
  }
}

/* A host buffer of `count` elements of `dtype`. */
struct Buffer {
  int32_t dtype = FD_DTYPE_F32;
  std::vector<unsigned char> bytes;
  Buffer(int32_t dt, size_t count) : dtype(dt), bytes(count * dtype_size(dt)) {}
  size_t size() const { return bytes.size() / dtype_size(dtype); }
  void *data() { return bytes.data(); }
  float get(size_t i) const { return load_elem(bytes.data(), i, dtype); }
  void set(size_t i, float x) { store_elem(bytes.data(), i, dtype, x); }
};

/* Split-half RoPE of one head (S3.1), in double. */
inline void rope_reference(float *x, uint32_t rotary_dim, int32_t pos, float base) {
  const uint32_t half = rotary_dim / 2;
  for (uint32_t i = 0; i < half; ++i) {
    const double inv = std::pow(static_cast<double>(base), -2.0 * i / rotary_dim);
    const double ang = pos * inv, c = std::cos(ang), s = std::sin(ang);
    const double x1 = x[i], x2 = x[i + half];
    x[i] = static_cast<float>(x1 * c - x2 * s);
    x[i + half] = static_cast<float>(x2 * c + x1 * s);
  }
}

/* Tolerance for a RoPE-rotated value: generous against rounding and
 * transcendental differences, far below the distance between test values of
 * different tokens (they are unrelated integers up to 125 apart). */
inline float rope_tolerance(float expected) {
  return 0.02f * std::fabs(expected) + 0.06f;
}

/* The expected content of every K and V element of the cache. */
class KvShadow {
 public:
  explicit KvShadow(const fd_cache_config &c)
      : L_(c.num_layers),
        B_(c.max_blocks),
        H_(c.num_kv_heads),
        T_(c.block_size),
        D_(c.head_dim),
        dtype_(c.dtype) {
    const size_t n = size_t{L_} * B_ * H_ * T_ * D_;
    for (int kv = 0; kv < 2; ++kv) {
      val_[kv].assign(n, 0.0f);  // storage is zero-initialised (S4.1)
      approx_[kv].assign(n, 0);
    }
  }
  /* Records a written element; exact values are rounded to the dtype first. */
  void set(int kv, uint32_t layer, int32_t block, uint32_t head, int32_t token, uint32_t dim,
           float value, bool approx) {
    const size_t i =
        index(layer, static_cast<uint32_t>(block), head, static_cast<uint32_t>(token), dim);
    if (!approx) {
      Buffer one(dtype_, 1);
      one.set(0, value);
      value = one.get(0);
    }
    val_[kv][i] = value;
    approx_[kv][i] = approx ? 1 : 0;
  }
  /* Compares the whole storage with the shadow; returns "" or the first
   * difference in words. */
  std::string compare(fd_cache *cache) const {
    for (uint32_t l = 0; l < L_; ++l) {
      void *base[2] = {nullptr, nullptr};
      int64_t st[4] = {0, 0, 0, 0};
      fd_status s = fd_cache_layer_storage(cache, l, &base[0], &base[1], st);
      if (s != FD_OK)
        return "fd_cache_layer_storage(layer " + dec(l) + ") failed: " + fd_last_error_message();
      for (int kv = 0; kv < 2; ++kv)
        for (uint32_t b = 0; b < B_; ++b)
          for (uint32_t h = 0; h < H_; ++h)
            for (uint32_t t = 0; t < T_; ++t)
              for (uint32_t d = 0; d < D_; ++d) {
                const int64_t off = b * st[0] + h * st[1] + t * st[2] + d * st[3];
                const float got = load_elem(base[kv], static_cast<size_t>(off), dtype_);
                const size_t i = index(l, b, h, t, d);
                const float want = val_[kv][i];
                const bool ok =
                    approx_[kv][i] ? std::fabs(got - want) <= rope_tolerance(want) : got == want;
                if (!ok)
                  return std::string(kv == 0 ? "K" : "V") + "[layer " + dec(l) + ", block " +
                         dec(b) + ", head " + dec(h) + ", token " + dec(t) + ", dim " + dec(d) +
                         "] = " + std::to_string(got) + ", expected " + std::to_string(want) +
                         (approx_[kv][i] ? " (rope, approx)" : "");
              }
    }
    return "";
  }

 private:
  size_t index(uint32_t l, uint32_t b, uint32_t h, uint32_t t, uint32_t d) const {
    return (((size_t{l} * B_ + b) * H_ + h) * T_ + t) * D_ + d;
  }
  uint32_t L_, B_, H_, T_, D_;
  int32_t dtype_;
  std::vector<float> val_[2];
  std::vector<unsigned char> approx_[2];
};

}  // namespace fdmodel

#endif  // FD_TESTS_MODEL_KV_SHADOW_HPP
