// The library's persistent CPU worker pool (docs/architecture.md, Threading).
//
// The CPU decode backend used to start and join its threads on every call;
// it now borrows helpers from one pool that the library owns. The pool is an
// internal resource with no observable effect other than speed:
// - it is created on first use and grows to the largest number of helpers
//   any call has asked for (at most kMaxPoolThreads - 1);
// - a call never waits for a helper to become free: the calling thread works
//   too, and helpers that are busy with other calls simply do not join, so
//   calls from many threads at once make progress and never deadlock;
// - the work a call hands out must not depend on which thread, or how many,
//   run it (the decode backend hands out whole work items from an atomic
//   counter, each computed by exactly one thread), so results are the same
//   bits for any thread count;
// - at unload (exit, or dlclose of libflashdec) a static destructor stops and
//   joins the workers, which are then idle (no call can be in flight while
//   the library is unloaded); later calls run on the calling thread alone;
// - in a child of fork() the parent's workers do not exist: the pool is
//   abandoned there (never touched, never joined) and the child's first
//   parallel call creates a fresh one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fd {

// Upper bound of threads (caller included) that one call uses.
constexpr size_t kMaxPoolThreads = 256;

// The thread count a CPU call uses for `requested` (a cpu_threads field): the
// request when > 0, else FLASHDEC_THREADS when it is set to a positive
// integer (read once, at the first call that needs it), else the hardware
// thread count. Always in [1, kMaxPoolThreads].
size_t resolve_cpu_threads(uint32_t requested) noexcept;

// Runs fn(ctx, slot) on the calling thread with slot 0 and, concurrently, on
// up to `participants - 1` pool workers with distinct slots in
// [1, participants). Returns once every invocation has returned. Workers that
// are busy elsewhere (or cannot be started) do not join, so only slot 0 is
// certain to run: fn must take its work from a shared counter and be correct
// with any subset of slots. fn must not throw on a worker; an exception from
// slot 0 is rethrown after the workers that joined have finished.
void parallel_run(size_t participants, void (*fn)(void *ctx, size_t slot), void *ctx);

template <class Body>
void parallel_run(size_t participants, Body &body) {
  parallel_run(
      participants, [](void *ctx, size_t slot) { (*static_cast<Body *>(ctx))(slot); }, &body);
}

// Worker threads the pool has started so far (tests and benchmarks only).
size_t pool_worker_count() noexcept;

}  // namespace fd
