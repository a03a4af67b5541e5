#include "core/error.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace fd {
namespace {
// The only per-thread state of the library: the detail of the last failure.
thread_local std::string t_last_error;
}  // namespace

std::string vformat(const char *fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::vector<char> buf(static_cast<size_t>(n) + 1);
  std::vsnprintf(buf.data(), buf.size(), fmt, args);
  return std::string(buf.data(), static_cast<size_t>(n));
}

std::string format(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = vformat(fmt, args);
  va_end(args);
  return s;
}

void fail(fd_status status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = vformat(fmt, args);
  va_end(args);
  throw Error(status, std::move(s));
}

fd_status set_last_error(fd_status status, const std::string &message) noexcept {
  try {
    t_last_error = message;
  } catch (...) {
    // Out of memory while storing the message: keep the status, drop the text.
    t_last_error.clear();
  }
  return status;
}

}  // namespace fd

extern "C" {

FD_API const char *fd_last_error_message(void) {
  return fd::t_last_error.c_str();
}

FD_API const char *fd_status_string(fd_status status) {
  // Any value may arrive (the header promises it), and loading an fd_status
  // outside the enumerators' range is undefined behaviour in C++: read the
  // parameter's bytes as its 32-bit underlying integer instead (the enum is
  // forced to 32 bits; a C caller passes an int).
  static_assert(sizeof(fd_status) == sizeof(int32_t), "fd_status is 32 bits");
  int32_t value = 0;
  std::memcpy(&value, &status, sizeof value);
  switch (value) {
    case FD_OK: return "FD_OK: success";
    case FD_ERR_INVALID_ARGUMENT: return "FD_ERR_INVALID_ARGUMENT: invalid argument";
    case FD_ERR_OUT_OF_BLOCKS: return "FD_ERR_OUT_OF_BLOCKS: out of KV blocks";
    case FD_ERR_NOT_FOUND: return "FD_ERR_NOT_FOUND: not found";
    case FD_ERR_INVALID_STATE: return "FD_ERR_INVALID_STATE: invalid state";
    case FD_ERR_STALE_HANDLE: return "FD_ERR_STALE_HANDLE: stale handle";
    case FD_ERR_UNSUPPORTED: return "FD_ERR_UNSUPPORTED: unsupported configuration";
    case FD_ERR_NO_DEVICE: return "FD_ERR_NO_DEVICE: no usable CUDA device";
    case FD_ERR_DEVICE: return "FD_ERR_DEVICE: CUDA device error";
    case FD_ERR_OUT_OF_MEMORY: return "FD_ERR_OUT_OF_MEMORY: out of memory";
    case FD_ERR_INTERNAL: return "FD_ERR_INTERNAL: internal error";
    case FD_ERR_ALREADY_EXISTS: return "FD_ERR_ALREADY_EXISTS: already exists";
    case FD_ERR_INVARIANT: return "FD_ERR_INVARIANT: invariant violated";
    default: break;
  }
  return "FD_ERR_?: unknown status";
}

}  // extern "C"
