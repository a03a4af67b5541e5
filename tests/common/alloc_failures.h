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
 * the aligned (std::align_val_t) forms. */
#ifndef FD_ALLOC_FAILURES_H
#define FD_ALLOC_FAILURES_H

#include <cstdlib>
#include <new>

namespace fd_alloc_failures {
// Allocations left before the injected failure; < 0: not armed.
inline thread_local long t_allocations_left = -1;
}  // namespace fd_alloc_failures

// The replacements are kept out of line: inlined, GCC pairs the free() below
// with the operator new of the caller's allocation and reports a mismatch
// (-Wmismatched-new-delete, seen in the ASan build).
[[gnu::noinline]] void *operator new(std::size_t n) {
  long &left = fd_alloc_failures::t_allocations_left;
  if (left >= 0 && left-- == 0) throw std::bad_alloc();
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

/* Disarms; returns true when the armed failure fired. */
static inline bool fd_alloc_fail_disarm() {
  const bool fired = fd_alloc_failures::t_allocations_left < 0;
  fd_alloc_failures::t_allocations_left = -1;
  return fired;
}

#endif /* FD_ALLOC_FAILURES_H */
