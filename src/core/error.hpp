// Error plumbing shared by every component.
//
// Internals report failures by throwing fd::Error (status + message). Every
// exported function runs its body inside fd::guard(), which turns an Error, a
// std::bad_alloc or any other exception into a status and stores the message
// in the calling thread's last-error slot. No exception crosses the C ABI.
#pragma once

#include <cstdarg>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "flashdec.h"

namespace fd {

class Error : public std::exception {
 public:
  Error(fd_status status, std::string message) : status_(status), message_(std::move(message)) {}
  fd_status status() const noexcept { return status_; }
  const char *what() const noexcept override { return message_.c_str(); }

 private:
  fd_status status_;
  std::string message_;
};

// printf-style formatting into a std::string.
std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vformat(const char *fmt, va_list args);

// Throws fd::Error(status, formatted message).
[[noreturn]] void fail(fd_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

// Stores `message` as the calling thread's last error and returns `status`.
fd_status set_last_error(fd_status status, const std::string &message) noexcept;

// Runs `body` (which returns fd_status) and maps every exception to a status.
template <class Body>
fd_status guard(Body &&body) noexcept {
  try {
    return body();
  } catch (const Error &e) {
    return set_last_error(e.status(), e.what());
  } catch (const std::bad_alloc &) {
    return set_last_error(FD_ERR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception &e) {
    return set_last_error(FD_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return set_last_error(FD_ERR_INTERNAL, "internal error: unknown exception");
  }
}

// Throws FD_ERR_INVALID_ARGUMENT naming `what` when `p` is NULL.
inline void require_non_null(const void *p, const char *what) {
  if (p == nullptr) fail(FD_ERR_INVALID_ARGUMENT, "%s must not be NULL", what);
}

}  // namespace fd
