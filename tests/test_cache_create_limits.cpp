/* fd_cache_create refuses a cache that cannot fit before it allocates
 * anything (issue 11, bug 3): FD_ERR_OUT_OF_MEMORY with a message, within a
 * few milliseconds and with no sizeable allocation, whatever the
 * configuration (e.g. 2^31 layers x 2^30 blocks, or INT32_MAX blocks of one
 * token). Before, the per-block bookkeeping (gigabytes for 2^31 blocks) was
 * built first and the storage size checked only afterwards.
 *
 * The global operator new of this binary (tests/common/alloc_failures.h)
 * counts the bytes requested while a call runs (the shared library's
 * allocations come here too); the wall time
 * bound is generous (100 ms, for a loaded CI machine): the refusal itself is
 * a handful of multiplications. */
#include <chrono>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>
}

#include "alloc_failures.h"
#include "fd_test.h"

#if defined(__SANITIZE_ADDRESS__)
/* Before the fix these configurations asked for gigabytes: let the
 * sanitizer's allocator return NULL (as libc's does) instead of aborting. */
extern "C" __attribute__((visibility("default"), used)) const char *__asan_default_options(void) {
  return "allocator_may_return_null=1";
}
#endif

namespace {

constexpr size_t kMaxBytes = 1u << 20;
constexpr double kMaxSeconds = 0.1;

void expect_refused_fast(const fd_cache_config &cfg, fd_status status, const char *text) {
  int sentinel = 0;
  fd_cache *out = reinterpret_cast<fd_cache *>(&sentinel);
  fd_alloc_count_start();
  const auto t0 = std::chrono::steady_clock::now();
  const fd_status s = fd_cache_create(&cfg, &out);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t bytes = fd_alloc_count_stop();
  const char *msg = fd_last_error_message();
  if (s != status || strstr(msg, text) == NULL) {
    print_error("fd_cache_create returned %s (\"%s\"), expected %s with \"%s\"\n",
                fd_status_string(s), msg, fd_status_string(status), text);
    fail();
  }
  assert_ptr_equal(out, reinterpret_cast<fd_cache *>(&sentinel));
  if (seconds > kMaxSeconds || bytes > kMaxBytes) {
    print_error("refusing took %.3f s and %zu bytes of operator new (limits %.3f s, %zu bytes)\n",
                seconds, bytes, kMaxSeconds, kMaxBytes);
    fail();
  }
}

fd_cache_config tiny_blocks(uint32_t layers, uint32_t max_blocks) {
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.num_layers = layers;
  cfg.num_kv_heads = 1;
  cfg.head_dim = 1;
  cfg.block_size = 1;
  cfg.max_blocks = max_blocks;
  return cfg;
}

void impossible_caches_are_refused_before_allocating(void **) {
  /* 2^31 layers x 2^30 blocks of one f16 element: 2^62 bytes each of K, V. */
  expect_refused_fast(tiny_blocks(1u << 31, 1u << 30), FD_ERR_OUT_OF_MEMORY, "cannot allocate");
  /* INT32_MAX one-token blocks of the default 8 heads x 128 dims: 4 TiB. */
  fd_cache_config cfg;
  fd_cache_config_init(&cfg);
  cfg.block_size = 1;
  cfg.max_blocks = INT32_MAX;
  expect_refused_fast(cfg, FD_ERR_OUT_OF_MEMORY, "cannot allocate");
  /* The message gives the sizes and what they are compared with. */
  expect_refused_fast(cfg, FD_ERR_OUT_OF_MEMORY, "physical memory");
  /* Every layer count and block count, up to the largest. */
  for (uint32_t layers = 1u << 20; layers != 0; layers <<= 1)
    expect_refused_fast(tiny_blocks(layers, INT32_MAX), FD_ERR_OUT_OF_MEMORY, "cannot allocate");
  /* Sizes that do not even fit size_t stay an invalid argument. */
  cfg = tiny_blocks(0xffffffffu, INT32_MAX);
  cfg.num_kv_heads = 0xffffffffu;
  cfg.head_dim = 0xffffffffu;
  expect_refused_fast(cfg, FD_ERR_INVALID_ARGUMENT, "overflows");
}

void device_caches_check_the_device_first(void **) {
  int32_t devices = 0;
  FD_ASSERT_OK(fd_cuda_device_count(&devices));
  if (devices != 0) skip(); /* a real device would serve this cache */
  /* INT32_MAX blocks: 10 GiB of host bookkeeping would come first. */
  fd_cache_config cfg = tiny_blocks(1, INT32_MAX);
  cfg.device.type = FD_DEVICE_CUDA;
  expect_refused_fast(cfg, FD_ERR_NO_DEVICE, "");
}

void possible_caches_still_work(void **) {
  fd_cache_config cfg = tiny_blocks(2, 1u << 16);
  fd_cache *c = NULL;
  FD_ASSERT_OK(fd_cache_create(&cfg, &c));
  fd_cache_metrics m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  FD_ASSERT_OK(fd_cache_metrics_get(c, &m));
  assert_int_equal(m.free_blocks, 1u << 16);
  fd_cache_destroy(c);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(impossible_caches_are_refused_before_allocating),
      cmocka_unit_test(device_caches_check_the_device_first),
      cmocka_unit_test(possible_caches_still_work),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
