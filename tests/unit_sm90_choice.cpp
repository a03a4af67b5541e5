/* The rule that picks the Hopper multi-token kernel (src/attention/
 * sm90_choice.hpp), checked on the CPU: which calls it serves at the edges
 * of every condition (query rows per tile 15/16 at head_dim 128 and 31/32 at
 * 64, one query token, element types, layouts, head dims, variants). The
 * CUDA suites check that the kernel it picks is correct (gpu_decode,
 * test_multi_token_hopper); this suite pins the choice itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

#include <initializer_list>

#include "attention/sm90_choice.hpp"
#include "fd_test.h"

namespace {

using fd::cuda::sm90_serves;

struct Call {
  int32_t q = FD_DTYPE_BF16, kv = FD_DTYPE_BF16;
  bool dim_major = false;
  int32_t head_dim = 128, max_q_len = 8;
  int64_t rows = 64;
  bool plain = true;
};

bool serves(const Call &c) {
  return sm90_serves(c.q, c.kv, c.dim_major, c.head_dim, c.max_q_len, c.rows, c.plain);
}

void test_query_rows(void **state) {
  (void)state;
  Call c;
  assert_true(serves(c));
  c.rows = 16;
  assert_true(serves(c));
  c.rows = 15;
  assert_false(serves(c));
  c.head_dim = 64;
  c.rows = 32;
  assert_true(serves(c));
  c.rows = 31;
  assert_false(serves(c));
  c.rows = 16;
  assert_false(serves(c));
}

void test_one_query_token(void **state) {
  (void)state;
  Call c;
  c.max_q_len = 1;
  assert_false(serves(c)); /* plain decode keeps its own kernel */
  c.max_q_len = 2;
  assert_true(serves(c));
}

void test_types_layouts_dims(void **state) {
  (void)state;
  Call c;
  c.q = c.kv = FD_DTYPE_F16;
  assert_true(serves(c));
  c.q = FD_DTYPE_BF16;
  assert_false(serves(c)); /* mixed 16-bit types */
  c.q = FD_DTYPE_BF16, c.kv = FD_DTYPE_FP8_E4M3;
  assert_false(serves(c));
  c.q = c.kv = FD_DTYPE_F32;
  assert_false(serves(c));
  c = Call{};
  c.dim_major = true;
  assert_false(serves(c));
  c = Call{};
  for (int32_t d : {96, 256, 32}) {
    c.head_dim = d;
    assert_false(serves(c));
  }
  c = Call{};
  c.plain = false; /* soft-cap, sliding window or sinks */
  assert_false(serves(c));
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_query_rows),
      cmocka_unit_test(test_one_query_token),
      cmocka_unit_test(test_types_layouts_dims),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
