// Helpers for the struct_size-versioned structs of the public API (c-abi.md
// rule 10): inputs shorter than the current struct keep defaults for the
// missing tail; outputs are filled only as far as the caller's struct_size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.hpp"

namespace fd {

// Reads a caller's config struct over `defaults`. `min_size` is the smallest
// accepted struct_size (the caller must at least provide the first field
// after struct_size).
template <class T>
T read_versioned(const T *in, T defaults, const char *what, size_t min_size) {
  require_non_null(in, what);
  if (in->struct_size < min_size) {
    fail(FD_ERR_INVALID_ARGUMENT, "%s->struct_size %u is too small (at least %zu)", what,
         in->struct_size, min_size);
  }
  const size_t n = in->struct_size < sizeof(T) ? in->struct_size : sizeof(T);
  std::memcpy(static_cast<void *>(&defaults), in, n);
  defaults.struct_size = static_cast<uint32_t>(sizeof(T));
  return defaults;
}

// Writes `value` into a caller's result struct, as much as its struct_size
// allows, keeping the caller's struct_size.
template <class T>
void write_versioned(T *out, const T &value, const char *what, size_t min_size) {
  require_non_null(out, what);
  if (out->struct_size < min_size) {
    fail(FD_ERR_INVALID_ARGUMENT, "%s->struct_size %u is too small (at least %zu)", what,
         out->struct_size, min_size);
  }
  const uint32_t caller_size = out->struct_size;
  const size_t n = caller_size < sizeof(T) ? caller_size : sizeof(T);
  std::memcpy(static_cast<void *>(out), &value, n);
  out->struct_size = caller_size;
}

}  // namespace fd
