/* Size arithmetic on caller values never overflows (issue 11, bug 2): every
 * product of caller sizes is computed exactly or checked, and a size that
 * cannot be addressed is FD_ERR_INVALID_ARGUMENT naming the parameters. In
 * particular max_blocks_per_seq * block_size (both up to 2^32 - 1) is the
 * capacity of a row, not an int64 overflow. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>
}

#include "fd_test.h"

namespace {

/* One buffer with `out` first: the overlap check measures each input from
 * its start, so inputs that claim huge extents lie after out. */
struct alignas(64) Buffers {
  float out[64];
  float q[64];
  float k[64];
  float v[64];
  int32_t tables[64];
  int32_t lens[64];
};

Buffers g_buf;

fd_decode_params huge_row_params() {
  fd_decode_params p;
  fd_decode_params_init(&p);
  fd_test_decode_dtype(&p, FD_DTYPE_F32);
  p.batch = 1;
  p.num_q_heads = 1;
  p.num_kv_heads = 1;
  p.head_dim = 1;
  p.block_size = 0xffffffffu;
  p.num_blocks = 1;
  p.max_blocks_per_seq = 0xffffffffu;
  p.cpu_threads = 1;
  p.q = g_buf.q;
  p.k_cache = g_buf.k;
  p.v_cache = g_buf.v;
  p.block_tables = g_buf.tables;
  p.seq_lens = g_buf.lens;
  p.out = g_buf.out;
  return p;
}

/* (2^32 - 1)^2, the exact row capacity. */
const char kCapacity[] = "18446744065119617025";

void decode_row_capacity_is_exact(void **) {
  memset(&g_buf, 0, sizeof g_buf);
  fd_decode_params p = huge_row_params();
  size_t bytes = 12345;
  FD_ASSERT_OK(fd_decode_workspace_size(&p, &bytes));
  assert_int_equal(bytes, 0); /* the CPU backend needs none */
  p.max_seq_len_hint = INT32_MAX;
  FD_ASSERT_OK(fd_decode_workspace_size(&p, &bytes));

  /* An out-of-range hint is refused with the exact capacity. */
  bytes = 12345;
  p.max_seq_len_hint = -1;
  FD_ASSERT_FAILS(fd_decode_workspace_size(&p, &bytes), FD_ERR_INVALID_ARGUMENT, kCapacity);
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, kCapacity);
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "max_seq_len_hint");
  assert_int_equal(bytes, 12345);

  /* An empty row decodes to zeros; a negative length names the capacity. */
  p.max_seq_len_hint = 0;
  for (float &x : g_buf.out) x = 7.f;
  FD_ASSERT_OK(fd_decode(&p));
  assert_true(g_buf.out[0] == 0.f);
  assert_true(g_buf.out[1] == 7.f);
  g_buf.lens[0] = -1;
  g_buf.out[0] = 7.f;
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, kCapacity);
  assert_true(g_buf.out[0] == 7.f);
}

void decode_sizes_name_the_parameters(void **) {
  memset(&g_buf, 0, sizeof g_buf);
  /* batch * max_blocks_per_seq entries of block_tables. */
  fd_decode_params p = huge_row_params();
  p.block_size = 16;
  p.batch = 0xffffffffu;
  size_t bytes = 12345;
  FD_ASSERT_FAILS(fd_decode_workspace_size(&p, &bytes), FD_ERR_INVALID_ARGUMENT, "block_tables");
  FD_ASSERT_FAILS(fd_decode_workspace_size(&p, &bytes), FD_ERR_INVALID_ARGUMENT,
                  "max_blocks_per_seq");
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "too large");
  /* batch * num_q_heads * head_dim elements of q and out. */
  p = huge_row_params();
  p.block_size = 16;
  p.max_blocks_per_seq = 1;
  p.num_q_heads = 0xffffffffu;
  p.head_dim = 0xffffffffu;
  FD_ASSERT_FAILS(fd_decode_workspace_size(&p, &bytes), FD_ERR_INVALID_ARGUMENT, "num_q_heads");
  FD_ASSERT_FAILS(fd_decode(&p), FD_ERR_INVALID_ARGUMENT, "too large");
  /* num_blocks * num_kv_heads * block_size * head_dim elements of K/V. */
  p = huge_row_params();
  p.max_blocks_per_seq = 1;
  p.num_blocks = 0xffffffffu;
  p.head_dim = 0xffffffffu;
  FD_ASSERT_FAILS(fd_decode_workspace_size(&p, &bytes), FD_ERR_INVALID_ARGUMENT, "num_blocks");
  /* Explicit strides that address beyond INT64_MAX elements. */
  p = huge_row_params();
  p.block_size = 16;
  p.max_blocks_per_seq = 1;
  p.num_blocks = 0xffffffffu;
  p.stride_block = INT64_MAX;
  p.stride_head = 1;
  p.stride_token = 1;
  p.stride_dim = 1;
  FD_ASSERT_FAILS(fd_decode_workspace_size(&p, &bytes), FD_ERR_INVALID_ARGUMENT, "stride");
  assert_int_equal(bytes, 12345);
}

}  // namespace

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(decode_row_capacity_is_exact),
      cmocka_unit_test(decode_sizes_name_the_parameters),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
