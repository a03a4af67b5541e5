#include "core/thread_pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace fd {
namespace {

// One parallel call: lives on the caller's stack from submission until every
// helper that joined it has returned.
struct Job {
  void (*fn)(void *, size_t) = nullptr;
  void *ctx = nullptr;
  size_t helpers_wanted = 0;  // slots 1..helpers_wanted may be handed out
  size_t joined = 0;          // helpers that took a slot (guarded by Pool::mu_)
  size_t finished = 0;        // helpers that returned (guarded by Pool::mu_)
  bool queued = false;        // still offered to idle workers (guarded by Pool::mu_)
  Job *next = nullptr;
  std::condition_variable done;
};

// How long an idle worker keeps polling for a new job before it sleeps on
// the condition variable: back-to-back calls (one per layer in a decode step)
// then start without a futex wake-up each.
constexpr auto kSpin = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Pool {
 public:
  void run(size_t participants, void (*fn)(void *, size_t), void *ctx);
  void stop() noexcept;
  size_t workers() const noexcept { return started_.load(std::memory_order_acquire); }

 private:
  void grow(size_t helpers) noexcept;
  void worker_main();
  void unqueue(Job *job);  // mu_ held

  std::mutex mu_;
  std::condition_variable wake_;
  Job *head_ = nullptr;  // jobs with slots left, oldest first (guarded by mu_)
  size_t sleeping_ = 0;  // workers waiting on wake_ (guarded by mu_)
  bool stopping_ = false;
  std::atomic<size_t> queued_jobs_{0};  // for the idle spin, which runs unlocked

  std::mutex grow_mu_;
  std::vector<std::thread> threads_;  // guarded by grow_mu_
  std::atomic<size_t> started_{0};
};

void Pool::unqueue(Job *job) {
  for (Job **link = &head_; *link != nullptr; link = &(*link)->next) {
    if (*link == job) {
      *link = job->next;
      job->next = nullptr;
      job->queued = false;
      queued_jobs_.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
  }
}

// Starts workers until there are `helpers`. A thread that cannot start (no
// memory, a process thread limit) ends the growth: calls then run with the
// workers there are, which changes nothing but speed.
void Pool::grow(size_t helpers) noexcept {
  if (started_.load(std::memory_order_acquire) >= helpers) return;
  try {
    std::lock_guard<std::mutex> guard(grow_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    threads_.reserve(kMaxPoolThreads);
    while (threads_.size() < helpers) {
      threads_.emplace_back([this] { worker_main(); });
      started_.store(threads_.size(), std::memory_order_release);
    }
  } catch (...) {
  }
}

void Pool::run(size_t participants, void (*fn)(void *, size_t), void *ctx) {
  grow(participants - 1);
  Job job;
  job.fn = fn;
  job.ctx = ctx;
  job.helpers_wanted = std::min(participants - 1, workers());
  size_t wake = 0;
  bool submitted = false;
  if (job.helpers_wanted > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      Job **link = &head_;
      while (*link != nullptr) link = &(*link)->next;
      *link = &job;
      job.queued = true;
      submitted = true;
      queued_jobs_.fetch_add(1, std::memory_order_relaxed);
      wake = std::min(sleeping_, job.helpers_wanted);
    }
  }
  if (!submitted) {  // no worker can help (none started, or stopping)
    fn(ctx, 0);
    return;
  }
  for (size_t i = 0; i < wake; ++i) wake_.notify_one();

  std::exception_ptr error;
  try {
    fn(ctx, 0);
  } catch (...) {
    error = std::current_exception();
  }
  {
    // No new helper may join once the caller is done; the ones that did are
    // waited for (they read the caller's data).
    std::unique_lock<std::mutex> lock(mu_);
    if (job.queued) unqueue(&job);
    job.done.wait(lock, [&job] { return job.finished == job.joined; });
  }
  if (error) std::rethrow_exception(error);
}

void Pool::worker_main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stopping_) return;
    if (head_ != nullptr) {
      Job *job = head_;
      const size_t slot = ++job->joined;
      if (job->joined == job->helpers_wanted) unqueue(job);
      lock.unlock();
      job->fn(job->ctx, slot);  // documented not to throw
      lock.lock();
      // Notified under the lock: the caller cannot return (and free the job)
      // before this worker lets go of the mutex.
      if (++job->finished == job->joined && !job->queued) job->done.notify_one();
      continue;
    }
    lock.unlock();
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (unsigned i = 1; queued_jobs_.load(std::memory_order_relaxed) == 0; ++i) {
      cpu_relax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
    }
    lock.lock();
    if (head_ != nullptr || stopping_) continue;
    ++sleeping_;
    wake_.wait(lock);
    --sleeping_;
  }
}

void Pool::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  std::lock_guard<std::mutex> guard(grow_mu_);
  for (std::thread &t : threads_) t.join();
  threads_.clear();
}

// The one pool. A plain atomic pointer (no lock) so that a forked child can
// drop the parent's pool whatever state its mutexes were left in.
std::atomic<Pool *> g_pool{nullptr};
std::atomic<bool> g_unloaded{false};

// In a child of fork() only the forking thread exists: the parent's workers
// are gone and its pool's mutexes may be held by them. Abandon it (leaked on
// purpose, never touched again); the next parallel call builds a new one.
void drop_pool_in_child() {
  g_pool.store(nullptr, std::memory_order_relaxed);
}

// Stops and joins the workers when libflashdec is unloaded (exit, dlclose).
// They are idle then: unloading a library during one of its calls is
// undefined anyway. Workers touch no other static object, so the order of
// static destruction does not matter, and joining idle threads cannot
// deadlock (they only wait on the pool's own condition variable).
struct PoolReaper {
  PoolReaper() = default;
  PoolReaper(const PoolReaper &) = delete;
  PoolReaper &operator=(const PoolReaper &) = delete;
  ~PoolReaper() {
    g_unloaded.store(true, std::memory_order_release);
    if (Pool *p = g_pool.exchange(nullptr, std::memory_order_acq_rel)) {
      p->stop();
      delete p;
    }
  }
};
PoolReaper g_reaper;

Pool *get_pool() noexcept {
  if (g_unloaded.load(std::memory_order_acquire)) return nullptr;
  if (Pool *p = g_pool.load(std::memory_order_acquire)) return p;
  static const bool fork_handler = pthread_atfork(nullptr, nullptr, drop_pool_in_child) == 0;
  (void)fork_handler;
  Pool *fresh = nullptr;
  try {
    fresh = new Pool;
  } catch (...) {
    return nullptr;  // no memory: this call runs on the calling thread
  }
  Pool *expected = nullptr;
  if (g_pool.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return fresh;
  delete fresh;  // another thread won the race (no worker was started in ours)
  return expected;
}

size_t parse_env_threads() noexcept {
  const char *s = std::getenv("FLASHDEC_THREADS");
  if (s == nullptr || *s < '0' || *s > '9') return 0;  // unset, empty, signed or junk
  errno = 0;
  char *end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0') return 0;
  return static_cast<size_t>(std::min<unsigned long long>(v, kMaxPoolThreads));
}

}  // namespace

size_t resolve_cpu_threads(uint32_t requested) noexcept {
  static const size_t env = parse_env_threads();
  static const size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  size_t n = requested != 0 ? requested : env != 0 ? env : hardware;
  return std::clamp<size_t>(n, 1, kMaxPoolThreads);
}

void parallel_run(size_t participants, void (*fn)(void *ctx, size_t slot), void *ctx) {
  participants = std::min(participants, kMaxPoolThreads);
  Pool *pool = participants > 1 ? get_pool() : nullptr;
  if (pool == nullptr) {
    fn(ctx, 0);
    return;
  }
  pool->run(participants, fn, ctx);
}

size_t pool_worker_count() noexcept {
  const Pool *p = g_pool.load(std::memory_order_acquire);
  return p != nullptr ? p->workers() : 0;
}

}  // namespace fd
