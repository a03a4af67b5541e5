// Reading and writing the struct_size-versioned structs of the public API
// (docs/abi.md rule 10). One policy for the whole library (docs/abi.md):
//
//  - Every call names a minimum struct_size: the end of the last field it
//    cannot do without. A smaller struct_size is FD_ERR_INVALID_ARGUMENT.
//  - Inputs: a struct_size larger than this library's struct comes from a
//    newer header; the fields we do not know would be silently ignored, so it
//    is FD_ERR_INVALID_ARGUMENT. Otherwise the caller's whole fields are
//    copied over the defaults.
//  - Outputs: a larger struct_size is fine: we fill our fields and leave the
//    caller's tail alone. Only whole fields are written, and struct_size
//    itself never is.
//
// Whole fields: the byte count is rounded down to a multiple of alignof(T),
// but never below the minimum (which is a field end). This never cuts a field
// that lies inside one alignof(T) unit, which holds for every field past the
// minimum of every struct used here: 4- and 8-byte scalars and pointers at
// naturally aligned offsets, and fd_device (8 bytes) at 8-aligned offsets.
// The wider fields (fd_engine_step.tx, fd_workload_report.case_name) lie
// inside their struct's minimum; their call sites static_assert that.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.hpp"

namespace fd {

// alignof(T) as T was first released. An older caller's struct_size is a
// multiple of the alignment its header had; if an appended field raised the
// alignment (an 8-byte field after only 4-byte ones), rounding to the new one
// would drop that caller's last field. The static_assert in check_layout()
// stops such an append until the older sizes are handled explicitly. Every
// struct used with the helpers below must be listed.
template <class T>
inline constexpr size_t kReleasedAlignment = 0;
template <>
inline constexpr size_t kReleasedAlignment<fd_decode_params> = 8;
template <>
inline constexpr size_t kReleasedAlignment<fd_scheduler_config> = 4;
template <>
inline constexpr size_t kReleasedAlignment<fd_request_spec> = 8;
template <>
inline constexpr size_t kReleasedAlignment<fd_snapshot_info> = 8;
template <>
inline constexpr size_t kReleasedAlignment<fd_decision_summary> = 8;
template <>
inline constexpr size_t kReleasedAlignment<fd_engine_config> = 4;
template <>
inline constexpr size_t kReleasedAlignment<fd_engine_step> = 8;
template <>
inline constexpr size_t kReleasedAlignment<fd_engine_metrics> = 8;
template <>
inline constexpr size_t kReleasedAlignment<fd_workload_options> = 8;
template <>
inline constexpr size_t kReleasedAlignment<fd_workload_report> = 8;

namespace versioned_detail {

constexpr size_t kHead = sizeof(uint32_t);  // struct_size, never copied

template <class T, size_t MinSize>
constexpr void check_layout() {
  static_assert(std::is_standard_layout<T>::value && std::is_trivially_copyable<T>::value,
                "versioned structs are plain C structs");
  static_assert(
      offsetof(T, struct_size) == 0 && std::is_same<decltype(T::struct_size), uint32_t>::value,
      "versioned structs start with uint32_t struct_size");
  static_assert(alignof(T) == kReleasedAlignment<T>,
                "alignof changed since the struct was released (or the struct is not listed in "
                "kReleasedAlignment): older struct sizes need explicit handling");
  static_assert(MinSize > kHead && MinSize <= sizeof(T),
                "the minimum must cover a field after struct_size and fit the struct");
}

inline void require_min_size(uint32_t struct_size, size_t min_size, const char *what) {
  if (struct_size < min_size)
    fail(FD_ERR_INVALID_ARGUMENT, "%s->struct_size %u is too small (at least %zu bytes)", what,
         struct_size, min_size);
}

// Bytes of the caller's struct that hold whole fields known to this library.
template <class T>
size_t whole_field_bytes(uint32_t struct_size, size_t min_size) {
  const size_t fitting = std::min<size_t>(struct_size, sizeof(T));
  return std::max(fitting / alignof(T) * alignof(T), min_size);
}

}  // namespace versioned_detail

// Reads a caller's input struct over `defaults`; the result's struct_size is
// sizeof(T).
template <size_t MinSize, class T>
T read_versioned(const T *in, T defaults, const char *what) {
  versioned_detail::check_layout<T, MinSize>();
  require_non_null(in, what);
  versioned_detail::require_min_size(in->struct_size, MinSize, what);
  if (in->struct_size > sizeof(T))
    fail(FD_ERR_INVALID_ARGUMENT,
         "%s->struct_size %u is larger than this library's struct (%zu bytes): the caller "
         "was built against a newer header, whose extra fields this library cannot honour",
         what, in->struct_size, sizeof(T));
  const size_t n = versioned_detail::whole_field_bytes<T>(in->struct_size, MinSize);
  const size_t head = versioned_detail::kHead;
  std::memcpy(reinterpret_cast<unsigned char *>(&defaults) + head,
              reinterpret_cast<const unsigned char *>(in) + head, n - head);
  defaults.struct_size = static_cast<uint32_t>(sizeof(T));
  return defaults;
}

// Writes `value` into a caller's result struct: the whole fields that fit in
// its struct_size, never struct_size itself. Checks before writing anything.
template <size_t MinSize, class T>
void write_versioned(T *out, const T &value, const char *what) {
  versioned_detail::check_layout<T, MinSize>();
  require_non_null(out, what);
  versioned_detail::require_min_size(out->struct_size, MinSize, what);
  const size_t n = versioned_detail::whole_field_bytes<T>(out->struct_size, MinSize);
  const size_t head = versioned_detail::kHead;
  std::memcpy(reinterpret_cast<unsigned char *>(out) + head,
              reinterpret_cast<const unsigned char *>(&value) + head, n - head);
}

}  // namespace fd
