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
// Whole fields: by default the byte count is rounded down to a multiple of
// alignof(T), but never below the minimum (which is a field end). This never
// cuts a field that lies inside one alignof(T) unit, which holds for every
// field past the minimum of most structs used here: 4- and 8-byte scalars and
// pointers at naturally aligned offsets, and fd_device (8 bytes) at 8-aligned
// offsets. The wider fields (fd_engine_step.tx, fd_workload_report.case_name)
// lie inside their struct's minimum; their call sites static_assert that.
// A struct where rounding would drop a whole field (fd_cache_config: an
// fd_device at offset 36 before 8-byte fields; fd_prefix_info: a 4-byte field
// past the minimum at offset 8 of an 8-aligned struct) lists its field ends in
// VersionedFieldEnds instead, and then exactly the whole fields that fit are
// copied.
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
template <>
inline constexpr size_t kReleasedAlignment<fd_kv_append_params> = 8;
template <>
inline constexpr size_t kReleasedAlignment<fd_cache_metrics> = 8;
template <>
inline constexpr size_t kReleasedAlignment<fd_tx_info> = 4;
template <>
inline constexpr size_t kReleasedAlignment<fd_reference_params> = 8;

// End offsets of every field after struct_size, in order, the last being
// sizeof(T): listed for the structs whose whole fields cannot be found by
// rounding (see the top of this file). A listed struct needs no
// kReleasedAlignment entry: its copies are field-exact whatever its alignment.
// check_layout() stops an append that is not listed here.
#define FD_FIELD_END(T, field) (offsetof(T, field) + sizeof(T::field))
template <class T>
struct VersionedFieldEnds {
  static constexpr size_t count = 0;
  static constexpr size_t ends[1] = {0};
};
template <>
struct VersionedFieldEnds<fd_cache_config> {
  static constexpr size_t ends[] = {
      FD_FIELD_END(fd_cache_config, num_layers),
      FD_FIELD_END(fd_cache_config, num_kv_heads),
      FD_FIELD_END(fd_cache_config, head_dim),
      FD_FIELD_END(fd_cache_config, block_size),
      FD_FIELD_END(fd_cache_config, max_blocks),
      FD_FIELD_END(fd_cache_config, prefix_cache_capacity_blocks),
      FD_FIELD_END(fd_cache_config, dtype),
      FD_FIELD_END(fd_cache_config, layout),
      FD_FIELD_END(fd_cache_config, device),
      FD_FIELD_END(fd_cache_config, reserved0),
      FD_FIELD_END(fd_cache_config, k_storage),
      FD_FIELD_END(fd_cache_config, v_storage),
      FD_FIELD_END(fd_cache_config, stride_layer),
      FD_FIELD_END(fd_cache_config, stride_block),
      FD_FIELD_END(fd_cache_config, stride_head),
      FD_FIELD_END(fd_cache_config, stride_token),
      FD_FIELD_END(fd_cache_config, stride_dim),
      FD_FIELD_END(fd_cache_config, input_dtype),
      FD_FIELD_END(fd_cache_config, reserved1),
      FD_FIELD_END(fd_cache_config, k_scales),
      FD_FIELD_END(fd_cache_config, v_scales),
      FD_FIELD_END(fd_cache_config, rope_style),
      FD_FIELD_END(fd_cache_config, reserved2),
  };
  static constexpr size_t count = sizeof ends / sizeof ends[0];
};
template <>
struct VersionedFieldEnds<fd_prefix_info> {
  static constexpr size_t ends[] = {
      FD_FIELD_END(fd_prefix_info, num_blocks),  FD_FIELD_END(fd_prefix_info, ref_count),
      FD_FIELD_END(fd_prefix_info, reserved0),   FD_FIELD_END(fd_prefix_info, last_use),
      FD_FIELD_END(fd_prefix_info, first_block), FD_FIELD_END(fd_prefix_info, reserved1),
  };
  static constexpr size_t count = sizeof ends / sizeof ends[0];
};
#undef FD_FIELD_END

namespace versioned_detail {

constexpr size_t kHead = sizeof(uint32_t);  // struct_size, never copied

template <class T>
constexpr bool lists_field_ends() {
  return VersionedFieldEnds<T>::count > 0;
}

// The listed field ends run upwards from past struct_size to sizeof(T), and
// the minimum is one of them.
template <class T>
constexpr bool field_ends_valid(size_t min_size) {
  using E = VersionedFieldEnds<T>;
  bool has_min = false;
  size_t previous = kHead;
  for (size_t i = 0; i < E::count; ++i) {
    if (E::ends[i] <= previous) return false;
    previous = E::ends[i];
    has_min = has_min || E::ends[i] == min_size;
  }
  return has_min && previous == sizeof(T);
}

template <class T, size_t MinSize>
constexpr void check_layout() {
  static_assert(std::is_standard_layout<T>::value && std::is_trivially_copyable<T>::value,
                "versioned structs are plain C structs");
  static_assert(
      offsetof(T, struct_size) == 0 && std::is_same<decltype(T::struct_size), uint32_t>::value,
      "versioned structs start with uint32_t struct_size");
  static_assert(lists_field_ends<T>() || alignof(T) == kReleasedAlignment<T>,
                "alignof changed since the struct was released (or the struct is not listed in "
                "kReleasedAlignment): older struct sizes need explicit handling");
  static_assert(!lists_field_ends<T>() || field_ends_valid<T>(MinSize),
                "VersionedFieldEnds must list every field of the struct (the last ending at "
                "sizeof), and the minimum must be one of them");
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
  if constexpr (lists_field_ends<T>()) {
    size_t bytes = min_size;
    for (size_t end : VersionedFieldEnds<T>::ends)
      if (end <= fitting) bytes = std::max(bytes, end);
    return bytes;
  } else {
    return std::max(fitting / alignof(T) * alignof(T), min_size);
  }
}

}  // namespace versioned_detail

// Checks a caller's output struct before any work that must not happen for a
// refused call (e.g. opening a step): not NULL and at least MinSize.
// write_versioned checks the same again.
template <size_t MinSize, class T>
void require_versioned(const T *out, const char *what) {
  versioned_detail::check_layout<T, MinSize>();
  require_non_null(out, what);
  versioned_detail::require_min_size(out->struct_size, MinSize, what);
}

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
