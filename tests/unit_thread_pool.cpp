/* The library's CPU worker pool (src/core/thread_pool.hpp,
 * docs/architecture.md "Threading"): FLASHDEC_THREADS is read once; every
 * work item of a parallel call is done exactly once, slot 0 on the caller,
 * helpers with distinct slots; workers persist across calls (no thread per
 * call); concurrent calls from many threads all finish; an exception on the
 * caller's slot is rethrown after the helpers return; a forked child gets a
 * working pool of its own. Label "threads": also run under ThreadSanitizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.hpp"
#include "fd_test.h"

#if defined(__SANITIZE_THREAD__)
#define FD_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FD_TSAN 1
#endif
#endif

namespace {

// Runs `items` items on `participants` threads; returns how often each ran and
// records the slots and threads seen.
struct Counted {
  std::vector<std::atomic<int>> hits;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::set<size_t> slots;
  std::set<std::thread::id> threads;
  explicit Counted(size_t items) : hits(items) {}
};

void run_counted(Counted &c, size_t participants) {
  const std::thread::id caller = std::this_thread::get_id();
  bool caller_ok = true;
  auto body = [&](size_t slot) {
    if (slot == 0 && std::this_thread::get_id() != caller) caller_ok = false;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      if (!c.slots.insert(slot).second) std::abort();  // a slot handed out twice
      c.threads.insert(std::this_thread::get_id());
    }
    for (size_t i = c.next.fetch_add(1); i < c.hits.size(); i = c.next.fetch_add(1)) {
      volatile double x = 0;
      for (int k = 0; k < 2000; ++k) x = x + k;  // some work, so helpers get a share
      c.hits[i].fetch_add(1);
    }
  };
  fd::parallel_run(participants, body);
  assert_true(caller_ok);
  assert_true(c.slots.count(0) == 1);
  for (size_t s : c.slots) assert_true(s < participants);
  for (auto &h : c.hits) assert_int_equal(h.load(), 1);
}

// Runs first (main sets FLASHDEC_THREADS=3 before any pool call).
void test_env_read_once(void **) {
  assert_int_equal(fd::resolve_cpu_threads(0), 3);
  setenv("FLASHDEC_THREADS", "5", 1);
  assert_int_equal(fd::resolve_cpu_threads(0), 3);  // read once
  assert_int_equal(fd::resolve_cpu_threads(7), 7);  // an explicit request wins
  assert_int_equal(fd::resolve_cpu_threads(100000), fd::kMaxPoolThreads);
}

void test_every_item_once(void **) {
  for (size_t participants : {1u, 2u, 4u, 9u}) {
    for (size_t items : {0u, 1u, 3u, 200u}) {
      Counted c(items);
      run_counted(c, participants);
    }
  }
}

void test_workers_persist(void **) {
  Counted first(64);
  run_counted(first, 4);
  const size_t workers = fd::pool_worker_count();
  assert_true(workers >= 3);  // grown to the largest request so far (9 above)
  std::set<std::thread::id> seen;
  for (int call = 0; call < 200; ++call) {
    Counted c(64);
    run_counted(c, 4);
    seen.insert(c.threads.begin(), c.threads.end());
  }
  // The same threads serve every call: the caller plus pool workers only.
  assert_true(seen.size() <= workers + 1);
  assert_int_equal(fd::pool_worker_count(), workers);
}

void test_concurrent_callers(void **) {
  constexpr int kCallers = 6, kCalls = 60;
  std::atomic<int> done{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t)
    callers.emplace_back([&, t] {
      for (int call = 0; call < kCalls; ++call) {
        const size_t items = 1 + static_cast<size_t>((t * 7 + call) % 40);
        std::vector<std::atomic<int>> hits(items);
        std::atomic<size_t> next{0};
        auto body = [&](size_t) {
          for (size_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) hits[i].fetch_add(1);
        };
        fd::parallel_run(1 + static_cast<size_t>(call % 5), body);
        for (auto &h : hits)
          if (h.load() != 1) std::abort();
      }
      done.fetch_add(1);
    });
  for (auto &c : callers) c.join();
  assert_int_equal(done.load(), kCallers);
}

void test_caller_exception(void **) {
  std::atomic<int> helpers_running{0}, helpers_done{0};
  auto body = [&](size_t slot) {
    if (slot == 0) throw std::runtime_error("slot 0");
    helpers_running.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    helpers_done.fetch_add(1);
  };
  bool thrown = false;
  try {
    fd::parallel_run(4, body);
  } catch (const std::runtime_error &) {
    thrown = true;
  }
  assert_true(thrown);
  // Every helper that joined had returned before parallel_run did.
  assert_int_equal(helpers_running.load(), helpers_done.load());
}

void test_fork_child_gets_own_pool(void **) {
#if defined(FD_TSAN)
  skip();  // ThreadSanitizer does not support threads started after a multi-threaded fork
#else
  Counted warm(64);
  run_counted(warm, 4);  // the parent's pool exists and has workers
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(30);  // a hang (waiting for the parent's workers) fails instead of blocking
    for (int call = 0; call < 20; ++call) {
      std::vector<std::atomic<int>> hits(100);
      std::atomic<size_t> next{0};
      std::set<std::thread::id> threads;
      std::mutex mu;
      auto body = [&](size_t) {
        {
          std::lock_guard<std::mutex> lock(mu);
          threads.insert(std::this_thread::get_id());
        }
        for (size_t i = next.fetch_add(1); i < hits.size(); i = next.fetch_add(1)) {
          volatile double x = 0;
          for (int k = 0; k < 20000; ++k) x = x + k;
          hits[i].fetch_add(1);
        }
      };
      fd::parallel_run(4, body);
      for (auto &h : hits)
        if (h.load() != 1) _exit(2);
    }
    _exit(fd::pool_worker_count() >= 3 ? 0 : 3);  // a fresh pool with its own workers
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  Counted after(64);
  run_counted(after, 4);  // the parent's pool still works
#endif
}

}  // namespace

int main(void) {
  setenv("FLASHDEC_THREADS", "3", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env_read_once),    cmocka_unit_test(test_every_item_once),
      cmocka_unit_test(test_workers_persist),  cmocka_unit_test(test_concurrent_callers),
      cmocka_unit_test(test_caller_exception), cmocka_unit_test(test_fork_child_gets_own_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
