/* ABI layout of the public header, pinned at compile time.
 *
 * Every public struct's size, alignment and field offsets on LP64 (x86-64 and
 * AArch64 Linux), every enum value and #define constant. The table,
 * tests/abi_layout_expected.h, is generated from the header by
 * bindings/tools/gen_bindings.py, which computes the layout with the C rules
 * itself; here the compiler checks every line. That the layout only grows by
 * appending (no field moved or resized, no value changed: docs/abi.md) is
 * checked by `gen_bindings.py --check` against the released baseline,
 * bindings/abi/baseline.txt (ctest abi_baseline). After a header edit:
 * `python3 bindings/tools/gen_bindings.py`. The runtime tests check the
 * struct_size conventions against the library. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "fd_test.h"

#if !defined(__LP64__)
#error "test_abi_layout pins the LP64 layout; add a table for this data model"
#endif

#define FD_FIELD(type, field, offset, size)                                      \
  _Static_assert(offsetof(type, field) == (offset), #type "." #field " offset"); \
  _Static_assert(sizeof(((type *)0)->field) == (size), #type "." #field " size")
#define FD_STRUCT(type, size, align)                     \
  _Static_assert(sizeof(type) == (size), #type " size"); \
  _Static_assert(__alignof__(type) == (align), #type " alignment")
#define FD_ENUM_TYPE(type) _Static_assert(sizeof(type) == 4, #type " is 32-bit")
#define FD_ENUM(value, expected) _Static_assert((value) == (expected), #value " value")
#define FD_POINTER_TYPE(type) _Static_assert(sizeof(type) == sizeof(void *), #type " is a pointer")
#define FD_CONSTANT(macro, expected) _Static_assert((macro) == (expected), #macro " value")

#include "abi_layout_expected.h"

_Static_assert(FD_VERSION_NUMBER ==
                   FD_VERSION_MAJOR * 10000 + FD_VERSION_MINOR * 100 + FD_VERSION_PATCH,
               "FD_VERSION_NUMBER");

/* ------------------------------------------------------------------------ */
/* Runtime: the struct_size conventions, as the library applies them. */

/* Every *_init function sets struct_size to the size the caller compiled
 * and ignores NULL. */
static void test_init_functions_set_struct_size(void **state) {
  (void)state;
#define FD_CHECK_INIT(type, init)                      \
  do {                                                 \
    type value;                                        \
    memset(&value, 0xAB, sizeof value);                \
    init(&value);                                      \
    assert_int_equal(value.struct_size, sizeof value); \
    init(NULL);                                        \
  } while (0)
  FD_CHECK_INIT(fd_cache_config, fd_cache_config_init);
  FD_CHECK_INIT(fd_decode_params, fd_decode_params_init);
  FD_CHECK_INIT(fd_kv_append_params, fd_kv_append_params_init);
  FD_CHECK_INIT(fd_scheduler_config, fd_scheduler_config_init);
  FD_CHECK_INIT(fd_request_spec, fd_request_spec_init);
  FD_CHECK_INIT(fd_snapshot_info, fd_snapshot_info_init);
  FD_CHECK_INIT(fd_engine_config, fd_engine_config_init);
  FD_CHECK_INIT(fd_workload_options, fd_workload_options_init);
#undef FD_CHECK_INIT
}

static fd_cache *small_cache(void) {
  fd_cache_config config;
  fd_cache_config_init(&config);
  config.max_blocks = 8;
  fd_cache *cache = NULL;
  FD_ASSERT_OK(fd_cache_create(&config, &cache));
  return cache;
}

/* An older caller's result struct: the library writes only the fields that
 * fit in its struct_size and never touches the bytes after it. */
static void test_short_result_struct_keeps_tail(void **state) {
  (void)state;
  fd_cache *cache = small_cache();

  unsigned char raw[sizeof(fd_cache_metrics)];
  memset(raw, 0xCD, sizeof raw);
  fd_cache_metrics *m = (fd_cache_metrics *)(void *)raw;
  const uint32_t short_size = (uint32_t)(offsetof(fd_cache_metrics, max_blocks) + sizeof(uint64_t));
  m->struct_size = short_size;
  FD_ASSERT_OK(fd_cache_metrics_get(cache, m));
  assert_int_equal(m->struct_size, short_size);
  assert_int_equal(m->max_blocks, 8);
  for (size_t i = short_size; i < sizeof raw; ++i) assert_int_equal(raw[i], 0xCD);

  unsigned char raw_config[sizeof(fd_cache_config)];
  memset(raw_config, 0xCD, sizeof raw_config);
  fd_cache_config *c = (fd_cache_config *)(void *)raw_config;
  const uint32_t config_size = (uint32_t)(offsetof(fd_cache_config, max_blocks) + sizeof(uint32_t));
  c->struct_size = config_size;
  FD_ASSERT_OK(fd_cache_get_config(cache, c));
  assert_int_equal(c->struct_size, config_size);
  assert_int_equal(c->max_blocks, 8);
  assert_int_equal(c->head_dim, 128);
  for (size_t i = config_size; i < sizeof raw_config; ++i) assert_int_equal(raw_config[i], 0xCD);

  fd_cache_destroy(cache);
}

/* A caller compiled against a newer header (larger struct_size) is refused
 * for inputs (docs/abi.md): its extra fields would be silently ignored. */
static void test_newer_input_struct_refused(void **state) {
  (void)state;
  fd_cache_config config;
  fd_cache_config_init(&config);
  config.struct_size = (uint32_t)sizeof config + 8;
  fd_cache *cache = NULL;
  FD_ASSERT_FAILS(fd_cache_create(&config, &cache), FD_ERR_INVALID_ARGUMENT, "struct_size");
  assert_null(cache);

  fd_decode_params params;
  fd_decode_params_init(&params);
  params.struct_size = (uint32_t)sizeof params + 8;
  FD_ASSERT_FAILS(fd_decode(&params), FD_ERR_INVALID_ARGUMENT, "struct_size");
  fd_decode_plan *plan = NULL;
  FD_ASSERT_FAILS(fd_decode_plan_create(&params, NULL, &plan), FD_ERR_INVALID_ARGUMENT,
                  "struct_size");
  assert_null(plan);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_init_functions_set_struct_size),
      cmocka_unit_test(test_short_result_struct_keeps_tail),
      cmocka_unit_test(test_newer_input_struct_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
