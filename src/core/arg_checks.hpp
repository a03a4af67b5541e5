// Argument checks shared by every public entry point (the ops front ends,
// the cache, transactions and prefixes, the engine, the scheduler and the
// workload results): pointer alignment and overflow-free size arithmetic.
// Each throws fd::Error naming the parameter.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/error.hpp"

namespace fd {

// The library reads and writes array elements through typed pointers
// (uint16_t for f16/bf16, float, int32_t, uint64_t ids, structs), which is
// undefined behaviour on a misaligned address, so every array argument of
// every public function must start on a multiple of its element alignment
// (flashdec.h: 2 bytes for f16/bf16, 4 for f32 and int32, 8 for uint64 and
// for arrays of structs with 64-bit fields). Element offsets are whole
// elements, so an aligned base keeps every element aligned. NULL passes (the
// NULL rules are the caller's). This is the one alignment check of the
// library: FD_ERR_INVALID_ARGUMENT "<name> (<address>) must be aligned to <n>
// bytes".
inline bool is_aligned(const void *p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}
inline void require_aligned(const void *p, size_t alignment, const char *name) {
  if (p != nullptr && !is_aligned(p, alignment))
    fail(FD_ERR_INVALID_ARGUMENT, "%s (%p) must be aligned to %zu bytes (its element alignment)",
         name, p, alignment);
}

// Element counts the ops may address: far enough from INT64_MAX / SIZE_MAX
// that byte offsets (elements * 4) and sums of them cannot overflow.
constexpr uint64_t kMaxOpElements = static_cast<uint64_t>(INT64_MAX) / 16;

// a * b, or FD_ERR_INVALID_ARGUMENT "<what> is too large to address".
inline uint64_t checked_extent_mul(uint64_t a, uint64_t b, const char *what) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r) || r > kMaxOpElements)
    fail(FD_ERR_INVALID_ARGUMENT, "%s is too large to address", what);
  return r;
}

// a + b under the same limit.
inline uint64_t checked_extent_add(uint64_t a, uint64_t b, const char *what) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r) || r > kMaxOpElements)
    fail(FD_ERR_INVALID_ARGUMENT, "%s is too large to address", what);
  return r;
}

// True when [a, a + a_bytes) and [b, b + b_bytes) share a byte. Written
// without computing a + a_bytes, which could wrap near the top of the
// address space.
inline bool ranges_overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x <= y ? y - x < a_bytes : x - y < b_bytes;
}

}  // namespace fd
