/* Model-based random test of the paged KV cache (docs/semantics.md S4-S7).
 *
 * A seeded generator issues a long random mix of valid and invalid calls
 * (requests, one- and multi-token transactions, layer writes with and without
 * RoPE, commits keeping all or part of the new tokens, truncation, legacy
 * append, shared prefixes, queries) against fd_cache and, in lockstep, against the
 * independent model in tests/model/cache_model.hpp. After every operation the
 * test checks that:
 *   - the status agrees with the model (any of the faults that apply, with
 *     exactly that fault's counter effects; success when none applies);
 *   - fd_cache_validate() passes;
 *   - every active request's seq_len and block table (exact physical ids: the
 *     free-list order is deterministic) matches, and request states match;
 *   - every fd_cache_metrics field matches, and the state version moved as the
 *     operation demands (same / grows / may grow);
 *   - resident prefixes (blocks, references, LRU order) and the open
 *     transaction's view (info, rows, block tables) match;
 *   - out-pointers of failing calls are untouched;
 * and, periodically, that the whole K/V storage equals a shadow copy built
 * from every write (fd_cache_layer_storage), so committed, aborted and freed
 * data are all where the model says.
 *
 * Environment:
 *   FD_MODEL_OPS    total operations (default 200000), split across seeds
 *   FD_MODEL_SEEDS  number of seeds (default 3)
 *   FD_MODEL_SEED   first seed (default 0x5eed2024); seeds are consecutive
 *   FD_MODEL_TRACE  1: print every operation and its status
 * Soak run (a few million operations, minutes in a Release build):
 *   FD_MODEL_OPS=5000000 FD_MODEL_SEEDS=20 FD_MODEL_SEED=$RANDOM \
 *     ./build/tests/test_cache_model
 * On a disagreement the test prints the seed, the operation index, the call,
 * expected vs actual, and the last operations before it; rerun with the same
 * seed and FD_MODEL_TRACE=1 for the full sequence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>
}

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <string>

#include "flashdec.h"
#include "model/cache_driver.hpp"

namespace {

using namespace fdmodel;

uint64_t env_u64(const char *name, uint64_t fallback) {
  const char *s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  return std::strtoull(s, nullptr, 0);
}

/* Runs one seed for `ops` operations over several random caches. */
bool run_seed(uint64_t seed, uint64_t ops, bool trace, Stats &stats, std::string &failure) {
  Rng rng{seed};
  uint64_t done = 0;
  for (uint64_t e = 0; done < ops; ++e) {
    const uint64_t n = std::min<uint64_t>(ops - done, 1500 + rng.below(3000));
    Episode ep(seed, e, rng, stats, trace);
    if (trace) std::printf("episode %" PRIu64 "\n", e);
    if (!ep.setup() || !ep.run(n)) {
      failure = ep.failure();
      return false;
    }
    done += n;
  }
  return true;
}

void test_cache_model_random(void **state) {
  (void)state;
  const uint64_t total = env_u64("FD_MODEL_OPS", 200000);
  const uint64_t seeds = std::max<uint64_t>(env_u64("FD_MODEL_SEEDS", 3), 1);
  const uint64_t first = env_u64("FD_MODEL_SEED", 0x5eed2024);
  const bool trace = env_u64("FD_MODEL_TRACE", 0) != 0;
  for (uint64_t i = 0; i < seeds; ++i) {
    const uint64_t seed = first + i;
    const uint64_t ops = total / seeds + (i < total % seeds ? 1 : 0);
    Stats stats;
    std::string failure;
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = run_seed(seed, ops, trace, stats, failure);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("cache model: seed %" PRIu64 " ops %" PRIu64 " caches %" PRIu64
                " storage checks %" PRIu64 " %.2fs |%s\n",
                seed, stats.ops, stats.episodes, stats.storage_checks, secs, stats.line().c_str());
    std::fflush(stdout);
    if (!ok) {
      std::printf("%s\n", failure.c_str());  // print_error truncates long messages
      std::fflush(stdout);
      fail_msg("cache model disagreement (seed %" PRIu64 ")", seed);
    }
  }
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cache_model_random),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
