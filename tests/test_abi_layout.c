/* ABI layout of the public header, pinned at compile time.
 *
 * Every public struct's size, alignment and field offsets on LP64 (x86-64 and
 * AArch64 Linux), and every enum value. A change here is an ABI break: it
 * needs a new major version (docs/abi.md), not an edit of this file. The
 * runtime tests check the struct_size conventions against the library. */
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

/* ------------------------------------------------------------------------ */
/* Structs */

FD_STRUCT(fd_device, 8, 4);
FD_FIELD(fd_device, type, 0, 4);
FD_FIELD(fd_device, ordinal, 4, 4);

FD_STRUCT(fd_cache_config, 44, 4);
FD_FIELD(fd_cache_config, struct_size, 0, 4);
FD_FIELD(fd_cache_config, num_layers, 4, 4);
FD_FIELD(fd_cache_config, num_kv_heads, 8, 4);
FD_FIELD(fd_cache_config, head_dim, 12, 4);
FD_FIELD(fd_cache_config, block_size, 16, 4);
FD_FIELD(fd_cache_config, max_blocks, 20, 4);
FD_FIELD(fd_cache_config, prefix_cache_capacity_blocks, 24, 4);
FD_FIELD(fd_cache_config, dtype, 28, 4);
FD_FIELD(fd_cache_config, layout, 32, 4);
FD_FIELD(fd_cache_config, device, 36, 8);

FD_STRUCT(fd_cache_metrics, 376, 8);
FD_FIELD(fd_cache_metrics, struct_size, 0, 4);
FD_FIELD(fd_cache_metrics, reserved0, 4, 4);
FD_FIELD(fd_cache_metrics, max_blocks, 8, 8);
FD_FIELD(fd_cache_metrics, used_blocks, 16, 8);
FD_FIELD(fd_cache_metrics, free_blocks, 24, 8);
FD_FIELD(fd_cache_metrics, block_utilization, 32, 8);
FD_FIELD(fd_cache_metrics, active_tokens, 40, 8);
FD_FIELD(fd_cache_metrics, physical_data_tokens, 48, 8);
FD_FIELD(fd_cache_metrics, reserved_tokens, 56, 8);
FD_FIELD(fd_cache_metrics, internal_fragmentation_tokens, 64, 8);
FD_FIELD(fd_cache_metrics, internal_fragmentation_ratio, 72, 8);
FD_FIELD(fd_cache_metrics, allocation_count, 80, 8);
FD_FIELD(fd_cache_metrics, fresh_allocation_count, 88, 8);
FD_FIELD(fd_cache_metrics, reuse_count, 96, 8);
FD_FIELD(fd_cache_metrics, free_count, 104, 8);
FD_FIELD(fd_cache_metrics, capacity_failure_count, 112, 8);
FD_FIELD(fd_cache_metrics, active_request_count, 120, 8);
FD_FIELD(fd_cache_metrics, finished_request_count, 128, 8);
FD_FIELD(fd_cache_metrics, cancelled_request_count, 136, 8);
FD_FIELD(fd_cache_metrics, transaction_begin_count, 144, 8);
FD_FIELD(fd_cache_metrics, transaction_commit_count, 152, 8);
FD_FIELD(fd_cache_metrics, transaction_abort_count, 160, 8);
FD_FIELD(fd_cache_metrics, open_transaction_count, 168, 8);
FD_FIELD(fd_cache_metrics, pending_request_count, 176, 8);
FD_FIELD(fd_cache_metrics, reserved_transaction_blocks, 184, 8);
FD_FIELD(fd_cache_metrics, transaction_layer_write_count, 192, 8);
FD_FIELD(fd_cache_metrics, transaction_rollback_block_count, 200, 8);
FD_FIELD(fd_cache_metrics, transaction_failure_count, 208, 8);
FD_FIELD(fd_cache_metrics, retained_transaction_state_count, 216, 8);
FD_FIELD(fd_cache_metrics, terminal_transaction_history_count, 224, 8);
FD_FIELD(fd_cache_metrics, terminal_transaction_history_limit, 232, 8);
FD_FIELD(fd_cache_metrics, bytes_per_block, 240, 8);
FD_FIELD(fd_cache_metrics, allocated_kv_bytes, 248, 8);
FD_FIELD(fd_cache_metrics, reserved_transaction_bytes, 256, 8);
FD_FIELD(fd_cache_metrics, prefix_cache_capacity_blocks, 264, 8);
FD_FIELD(fd_cache_metrics, resident_prefix_count, 272, 8);
FD_FIELD(fd_cache_metrics, resident_prefix_blocks, 280, 8);
FD_FIELD(fd_cache_metrics, active_prefix_references, 288, 8);
FD_FIELD(fd_cache_metrics, shared_prefix_blocks, 296, 8);
FD_FIELD(fd_cache_metrics, saved_prefix_blocks, 304, 8);
FD_FIELD(fd_cache_metrics, saved_prefix_bytes, 312, 8);
FD_FIELD(fd_cache_metrics, prefix_registration_count, 320, 8);
FD_FIELD(fd_cache_metrics, prefix_hit_count, 328, 8);
FD_FIELD(fd_cache_metrics, prefix_miss_count, 336, 8);
FD_FIELD(fd_cache_metrics, prefix_hit_ratio, 344, 8);
FD_FIELD(fd_cache_metrics, prefix_eviction_count, 352, 8);
FD_FIELD(fd_cache_metrics, prefix_capacity_failure_count, 360, 8);
FD_FIELD(fd_cache_metrics, state_version, 368, 8);

FD_STRUCT(fd_tx, 16, 8);
FD_FIELD(fd_tx, id, 0, 8);
FD_FIELD(fd_tx, cache_version, 8, 8);

FD_STRUCT(fd_tx_info, 24, 4);
FD_FIELD(fd_tx_info, struct_size, 0, 4);
FD_FIELD(fd_tx_info, batch, 4, 4);
FD_FIELD(fd_tx_info, next_layer, 8, 4);
FD_FIELD(fd_tx_info, state, 12, 4);
FD_FIELD(fd_tx_info, max_blocks_per_seq, 16, 4);
FD_FIELD(fd_tx_info, new_block_count, 20, 4);

FD_STRUCT(fd_prefix_info, 32, 8);
FD_FIELD(fd_prefix_info, struct_size, 0, 4);
FD_FIELD(fd_prefix_info, num_blocks, 4, 4);
FD_FIELD(fd_prefix_info, ref_count, 8, 4);
FD_FIELD(fd_prefix_info, reserved0, 12, 4);
FD_FIELD(fd_prefix_info, last_use, 16, 8);
FD_FIELD(fd_prefix_info, first_block, 24, 4);
FD_FIELD(fd_prefix_info, reserved1, 28, 4);

FD_STRUCT(fd_decode_params, 176, 8);
FD_FIELD(fd_decode_params, struct_size, 0, 4);
FD_FIELD(fd_decode_params, dtype, 4, 4);
FD_FIELD(fd_decode_params, layout, 8, 4);
FD_FIELD(fd_decode_params, batch, 12, 4);
FD_FIELD(fd_decode_params, num_q_heads, 16, 4);
FD_FIELD(fd_decode_params, num_kv_heads, 20, 4);
FD_FIELD(fd_decode_params, head_dim, 24, 4);
FD_FIELD(fd_decode_params, block_size, 28, 4);
FD_FIELD(fd_decode_params, num_blocks, 32, 4);
FD_FIELD(fd_decode_params, max_blocks_per_seq, 36, 4);
FD_FIELD(fd_decode_params, sm_scale, 40, 4);
FD_FIELD(fd_decode_params, flags, 44, 4);
FD_FIELD(fd_decode_params, q, 48, 8);
FD_FIELD(fd_decode_params, k_cache, 56, 8);
FD_FIELD(fd_decode_params, v_cache, 64, 8);
FD_FIELD(fd_decode_params, stride_block, 72, 8);
FD_FIELD(fd_decode_params, stride_head, 80, 8);
FD_FIELD(fd_decode_params, stride_token, 88, 8);
FD_FIELD(fd_decode_params, stride_dim, 96, 8);
FD_FIELD(fd_decode_params, block_tables, 104, 8);
FD_FIELD(fd_decode_params, seq_lens, 112, 8);
FD_FIELD(fd_decode_params, out, 120, 8);
FD_FIELD(fd_decode_params, max_seq_len_hint, 128, 4);
FD_FIELD(fd_decode_params, num_splits, 132, 4);
FD_FIELD(fd_decode_params, workspace, 136, 8);
FD_FIELD(fd_decode_params, workspace_size, 144, 8);
FD_FIELD(fd_decode_params, device, 152, 8);
FD_FIELD(fd_decode_params, stream, 160, 8);
FD_FIELD(fd_decode_params, cpu_threads, 168, 4);
FD_FIELD(fd_decode_params, reserved0, 172, 4);

/* ------------------------------------------------------------------------ */
/* Enums: 32-bit, values pinned forever */

#define FD_ENUM(value, expected) _Static_assert((value) == (expected), #value " value")

_Static_assert(sizeof(fd_status) == 4, "fd_status is 32-bit");
_Static_assert(sizeof(fd_dtype) == 4, "fd_dtype is 32-bit");
_Static_assert(sizeof(fd_kv_layout) == 4, "fd_kv_layout is 32-bit");
_Static_assert(sizeof(fd_device_type) == 4, "fd_device_type is 32-bit");
_Static_assert(sizeof(fd_request_state) == 4, "fd_request_state is 32-bit");
_Static_assert(sizeof(fd_tx_state) == 4, "fd_tx_state is 32-bit");
_Static_assert(sizeof(fd_stream) == sizeof(void *), "fd_stream is a pointer");

FD_ENUM(FD_OK, 0);
FD_ENUM(FD_ERR_INVALID_ARGUMENT, 1);
FD_ENUM(FD_ERR_OUT_OF_BLOCKS, 2);
FD_ENUM(FD_ERR_NOT_FOUND, 3);
FD_ENUM(FD_ERR_INVALID_STATE, 4);
FD_ENUM(FD_ERR_STALE_HANDLE, 5);
FD_ENUM(FD_ERR_UNSUPPORTED, 6);
FD_ENUM(FD_ERR_NO_DEVICE, 7);
FD_ENUM(FD_ERR_DEVICE, 8);
FD_ENUM(FD_ERR_OUT_OF_MEMORY, 9);
FD_ENUM(FD_ERR_INTERNAL, 10);
FD_ENUM(FD_ERR_ALREADY_EXISTS, 11);
FD_ENUM(FD_ERR_INVARIANT, 12);
FD_ENUM(FD_STATUS_FORCE_32BIT, 0x7fffffff);

FD_ENUM(FD_DTYPE_F32, 0);
FD_ENUM(FD_DTYPE_F16, 1);
FD_ENUM(FD_DTYPE_BF16, 2);
FD_ENUM(FD_DTYPE_FORCE_32BIT, 0x7fffffff);

FD_ENUM(FD_LAYOUT_TOKEN_MAJOR, 0);
FD_ENUM(FD_LAYOUT_DIM_MAJOR, 1);
FD_ENUM(FD_LAYOUT_FORCE_32BIT, 0x7fffffff);

FD_ENUM(FD_DEVICE_CPU, 0);
FD_ENUM(FD_DEVICE_CUDA, 1);
FD_ENUM(FD_DEVICE_FORCE_32BIT, 0x7fffffff);

FD_ENUM(FD_REQUEST_UNKNOWN, 0);
FD_ENUM(FD_REQUEST_ACTIVE, 1);
FD_ENUM(FD_REQUEST_FINISHED, 2);
FD_ENUM(FD_REQUEST_CANCELLED, 3);
FD_ENUM(FD_REQUEST_STATE_FORCE_32BIT, 0x7fffffff);

FD_ENUM(FD_TX_OPEN, 0);
FD_ENUM(FD_TX_COMMITTED, 1);
FD_ENUM(FD_TX_ABORTED, 2);
FD_ENUM(FD_TX_STATE_FORCE_32BIT, 0x7fffffff);

FD_ENUM(FD_DECODE_CHECK_INDICES, 1u);
FD_ENUM(FD_VERSION_NUMBER, FD_VERSION_MAJOR * 10000 + FD_VERSION_MINOR * 100 + FD_VERSION_PATCH);

/* ------------------------------------------------------------------------ */
/* Runtime: the struct_size conventions, as the library applies them. */

/* Every size-versioned struct starts with struct_size, so an old caller's
 * struct can always be recognised. */
static void test_struct_size_comes_first(void **state) {
  (void)state;
  assert_int_equal(offsetof(fd_cache_config, struct_size), 0);
  assert_int_equal(offsetof(fd_cache_metrics, struct_size), 0);
  assert_int_equal(offsetof(fd_tx_info, struct_size), 0);
  assert_int_equal(offsetof(fd_prefix_info, struct_size), 0);
  assert_int_equal(offsetof(fd_decode_params, struct_size), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_struct_size_comes_first),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
