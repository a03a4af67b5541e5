/* Host allocation failure injection for the unit suites (C++ only; the
 * library is linked statically into them). Include in exactly one source
 * file of a test binary: it replaces the global operator new and delete of
 * that binary. Once armed with fd_alloc_fail_arm(k), the k-th following
 * allocation (counted from 0) on the calling thread throws std::bad_alloc,
 * once; other threads are not affected. Sweeping k from 0 until the call
 * under test succeeds with the failure unused fails every allocation the call
 * makes, one run each.
 *
 * Covered: operator new / new[] and the nothrow forms (libstdc++ routes them
 * through this operator new), hence every standard container and string. Not
 * covered: malloc / calloc called directly (the CPU cache's K/V storage) and
 * the aligned (std::align_val_t) forms.
 *
 * It also counts: between fd_alloc_count_start() and fd_alloc_count_stop(),
 * the bytes requested on the calling thread. Public-API suites may include it
 * too: the shared library's allocations reach the binary's operator new. */
#ifndef FD_ALLOC_FAILURES_H
#define FD_ALLOC_FAILURES_H

#include <cstdlib>
#include <new>

namespace fd_alloc_failures {
// Allocations left before the injected failure; < 0: not armed.
inline thread_local long t_allocations_left = -1;
// Bytes requested while counting is on.
inline thread_local bool t_counting = false;
inline thread_local std::size_t t_bytes = 0;
}  // namespace fd_alloc_failures

// The replacements are kept out of line: inlined, GCC pairs the free() below
// with the operator new of the caller's allocation and reports a mismatch
// (-Wmismatched-new-delete, seen in the ASan build).
[[gnu::noinline]] void *operator new(std::size_t n) {
  long &left = fd_alloc_failures::t_allocations_left;
  if (left >= 0 && left-- == 0) throw std::bad_alloc();
  if (fd_alloc_failures::t_counting) fd_alloc_failures::t_bytes += n;
  void *p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
[[gnu::noinline]] void operator delete(void *p) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete(void *p, std::size_t) noexcept {
  std::free(p);
}

/* Arms the failure of allocation k (0 = the next one) on this thread. */
static inline void fd_alloc_fail_arm(long k) {
  fd_alloc_failures::t_allocations_left = k;
}

/* Counts the bytes requested on this thread from now on. */
static inline void fd_alloc_count_start(void) {
  fd_alloc_failures::t_bytes = 0;
  fd_alloc_failures::t_counting = true;
}
/* Stops counting; returns the bytes requested since fd_alloc_count_start. */
static inline std::size_t fd_alloc_count_stop(void) {
  fd_alloc_failures::t_counting = false;
  return fd_alloc_failures::t_bytes;
}

/* Disarms; returns true when the armed failure fired. */
static inline bool fd_alloc_fail_disarm() {
  const bool fired = fd_alloc_failures::t_allocations_left < 0;
  fd_alloc_failures::t_allocations_left = -1;
  return fired;
}

#endif /* FD_ALLOC_FAILURES_H */
