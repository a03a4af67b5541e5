/* ABI layout of the public header, pinned at compile time.
 *
 * Every public struct's size, alignment and field offsets on LP64 (x86-64 and
 * AArch64 Linux), and every enum value. Appending a field (minor version)
 * changes only its struct's size here; any other difference (a moved or
 * resized field, a changed value) is an ABI break that needs a new major
 * version (docs/abi.md). The runtime tests check the struct_size conventions
 * against the library. */
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

FD_STRUCT(fd_cache_config, 104, 8);
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
FD_FIELD(fd_cache_config, reserved0, 44, 4);
FD_FIELD(fd_cache_config, k_storage, 48, 8);
FD_FIELD(fd_cache_config, v_storage, 56, 8);
FD_FIELD(fd_cache_config, stride_layer, 64, 8);
FD_FIELD(fd_cache_config, stride_block, 72, 8);
FD_FIELD(fd_cache_config, stride_head, 80, 8);
FD_FIELD(fd_cache_config, stride_token, 88, 8);
FD_FIELD(fd_cache_config, stride_dim, 96, 8);

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

FD_STRUCT(fd_kv_append_params, 168, 8);
FD_FIELD(fd_kv_append_params, struct_size, 0, 4);
FD_FIELD(fd_kv_append_params, dtype, 4, 4);
FD_FIELD(fd_kv_append_params, layout, 8, 4);
FD_FIELD(fd_kv_append_params, num_tokens, 12, 4);
FD_FIELD(fd_kv_append_params, num_q_heads, 16, 4);
FD_FIELD(fd_kv_append_params, num_kv_heads, 20, 4);
FD_FIELD(fd_kv_append_params, head_dim, 24, 4);
FD_FIELD(fd_kv_append_params, block_size, 28, 4);
FD_FIELD(fd_kv_append_params, num_blocks, 32, 4);
FD_FIELD(fd_kv_append_params, rotary_dim, 36, 4);
FD_FIELD(fd_kv_append_params, rope_base, 40, 4);
FD_FIELD(fd_kv_append_params, reserved0, 44, 4);
FD_FIELD(fd_kv_append_params, q, 48, 8);
FD_FIELD(fd_kv_append_params, q_out, 56, 8);
FD_FIELD(fd_kv_append_params, k, 64, 8);
FD_FIELD(fd_kv_append_params, v, 72, 8);
FD_FIELD(fd_kv_append_params, k_cache, 80, 8);
FD_FIELD(fd_kv_append_params, v_cache, 88, 8);
FD_FIELD(fd_kv_append_params, stride_block, 96, 8);
FD_FIELD(fd_kv_append_params, stride_head, 104, 8);
FD_FIELD(fd_kv_append_params, stride_token, 112, 8);
FD_FIELD(fd_kv_append_params, stride_dim, 120, 8);
FD_FIELD(fd_kv_append_params, block_ids, 128, 8);
FD_FIELD(fd_kv_append_params, offsets, 136, 8);
FD_FIELD(fd_kv_append_params, positions, 144, 8);
FD_FIELD(fd_kv_append_params, device, 152, 8);
FD_FIELD(fd_kv_append_params, stream, 160, 8);

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

FD_STRUCT(fd_scheduler_config, 20, 4);
FD_FIELD(fd_scheduler_config, struct_size, 0, 4);
FD_FIELD(fd_scheduler_config, max_active_requests, 4, 4);
FD_FIELD(fd_scheduler_config, max_batch_requests, 8, 4);
FD_FIELD(fd_scheduler_config, reserve_blocks, 12, 4);
FD_FIELD(fd_scheduler_config, aging_threshold_steps, 16, 4);

FD_STRUCT(fd_request_spec, 40, 8);
FD_FIELD(fd_request_spec, struct_size, 0, 4);
FD_FIELD(fd_request_spec, initial_context_tokens, 4, 4);
FD_FIELD(fd_request_spec, id, 8, 8);
FD_FIELD(fd_request_spec, submission_order, 16, 8);
FD_FIELD(fd_request_spec, max_new_tokens, 24, 4);
FD_FIELD(fd_request_spec, prefix_blocks, 28, 4);
FD_FIELD(fd_request_spec, prefix_id, 32, 8);

FD_STRUCT(fd_snapshot_info, 40, 8);
FD_FIELD(fd_snapshot_info, struct_size, 0, 4);
FD_FIELD(fd_snapshot_info, block_size, 4, 4);
FD_FIELD(fd_snapshot_info, max_blocks, 8, 4);
FD_FIELD(fd_snapshot_info, free_blocks, 12, 4);
FD_FIELD(fd_snapshot_info, resident_prefix_blocks, 16, 4);
FD_FIELD(fd_snapshot_info, reserved0, 20, 4);
FD_FIELD(fd_snapshot_info, step, 24, 8);
FD_FIELD(fd_snapshot_info, version, 32, 8);

FD_STRUCT(fd_decision_summary, 56, 8);
FD_FIELD(fd_decision_summary, struct_size, 0, 4);
FD_FIELD(fd_decision_summary, has_drain, 4, 4);
FD_FIELD(fd_decision_summary, step, 8, 8);
FD_FIELD(fd_decision_summary, snapshot_version, 16, 8);
FD_FIELD(fd_decision_summary, drain_for_request_id, 24, 8);
FD_FIELD(fd_decision_summary, committed_blocks_before, 32, 4);
FD_FIELD(fd_decision_summary, committed_blocks_after, 36, 4);
FD_FIELD(fd_decision_summary, needed_physical_blocks_now, 40, 4);
FD_FIELD(fd_decision_summary, free_blocks_before, 44, 4);
FD_FIELD(fd_decision_summary, schedulable_blocks, 48, 4);
FD_FIELD(fd_decision_summary, reason_count, 52, 4);

FD_STRUCT(fd_engine_config, 24, 4);
FD_FIELD(fd_engine_config, struct_size, 0, 4);
FD_FIELD(fd_engine_config, num_q_heads, 4, 4);
FD_FIELD(fd_engine_config, rotary_dim, 8, 4);
FD_FIELD(fd_engine_config, rope_base, 12, 4);
FD_FIELD(fd_engine_config, sm_scale, 16, 4);
FD_FIELD(fd_engine_config, cpu_threads, 20, 4);

FD_STRUCT(fd_engine_step, 40, 8);
FD_FIELD(fd_engine_step, struct_size, 0, 4);
FD_FIELD(fd_engine_step, outcome, 4, 4);
FD_FIELD(fd_engine_step, tx, 8, 16);
FD_FIELD(fd_engine_step, batch, 24, 4);
FD_FIELD(fd_engine_step, needed_blocks, 28, 4);
FD_FIELD(fd_engine_step, free_blocks, 32, 4);
FD_FIELD(fd_engine_step, reserved0, 36, 4);

FD_STRUCT(fd_request_fairness, 24, 8);
FD_FIELD(fd_request_fairness, id, 0, 8);
FD_FIELD(fd_request_fairness, wait_steps, 8, 4);
FD_FIELD(fd_request_fairness, skip_count, 12, 4);
FD_FIELD(fd_request_fairness, service_wait_steps, 16, 4);
FD_FIELD(fd_request_fairness, reserved0, 20, 4);

FD_STRUCT(fd_engine_metrics, 152, 8);
FD_FIELD(fd_engine_metrics, struct_size, 0, 4);
FD_FIELD(fd_engine_metrics, scheduler_managed, 4, 4);
FD_FIELD(fd_engine_metrics, waiting_request_count, 8, 8);
FD_FIELD(fd_engine_metrics, active_request_count, 16, 8);
FD_FIELD(fd_engine_metrics, finished_request_count, 24, 8);
FD_FIELD(fd_engine_metrics, cancelled_request_count, 32, 8);
FD_FIELD(fd_engine_metrics, rejected_request_count, 40, 8);
FD_FIELD(fd_engine_metrics, completed_step_count, 48, 8);
FD_FIELD(fd_engine_metrics, appended_token_count, 56, 8);
FD_FIELD(fd_engine_metrics, prefill_token_count, 64, 8);
FD_FIELD(fd_engine_metrics, backpressure_count, 72, 8);
FD_FIELD(fd_engine_metrics, state_version, 80, 8);
FD_FIELD(fd_engine_metrics, cache_state_version, 88, 8);
FD_FIELD(fd_engine_metrics, committed_blocks, 96, 8);
FD_FIELD(fd_engine_metrics, committed_but_unallocated_blocks, 104, 8);
FD_FIELD(fd_engine_metrics, stale_decision_count, 112, 8);
FD_FIELD(fd_engine_metrics, applied_decision_count, 120, 8);
FD_FIELD(fd_engine_metrics, open_step_transaction_count, 128, 8);
FD_FIELD(fd_engine_metrics, transaction_layer_step_count, 136, 8);
FD_FIELD(fd_engine_metrics, transaction_abort_count, 144, 8);

FD_STRUCT(fd_workload_options, 48, 8);
FD_FIELD(fd_workload_options, struct_size, 0, 4);
FD_FIELD(fd_workload_options, kind, 4, 4);
FD_FIELD(fd_workload_options, case_name, 8, 8);
FD_FIELD(fd_workload_options, seed, 16, 8);
FD_FIELD(fd_workload_options, progress, 24, 8);
FD_FIELD(fd_workload_options, progress_user_data, 32, 8);
FD_FIELD(fd_workload_options, cpu_threads, 40, 4);
FD_FIELD(fd_workload_options, reserved0, 44, 4);

FD_STRUCT(fd_workload_report, 280, 8);
FD_FIELD(fd_workload_report, struct_size, 0, 4);
FD_FIELD(fd_workload_report, kind, 4, 4);
FD_FIELD(fd_workload_report, policy, 8, 4);
FD_FIELD(fd_workload_report, max_blocks, 12, 4);
FD_FIELD(fd_workload_report, case_name, 16, 32);
FD_FIELD(fd_workload_report, seed, 48, 8);
FD_FIELD(fd_workload_report, steps, 56, 8);
FD_FIELD(fd_workload_report, executed_steps, 64, 8);
FD_FIELD(fd_workload_report, requests_submitted, 72, 8);
FD_FIELD(fd_workload_report, requests_completed, 80, 8);
FD_FIELD(fd_workload_report, completion_rate, 88, 8);
FD_FIELD(fd_workload_report, useful_tokens, 96, 8);
FD_FIELD(fd_workload_report, generated_tokens, 104, 8);
FD_FIELD(fd_workload_report, tokens_per_second, 112, 8);
FD_FIELD(fd_workload_report, step_latency_p50_us, 120, 8);
FD_FIELD(fd_workload_report, step_latency_p90_us, 128, 8);
FD_FIELD(fd_workload_report, step_latency_p99_us, 136, 8);
FD_FIELD(fd_workload_report, stalled_steps, 144, 8);
FD_FIELD(fd_workload_report, backpressure_steps, 152, 8);
FD_FIELD(fd_workload_report, deadlocks, 160, 8);
FD_FIELD(fd_workload_report, forced_cancellations, 168, 8);
FD_FIELD(fd_workload_report, user_cancellations, 176, 8);
FD_FIELD(fd_workload_report, rejected_requests, 184, 8);
FD_FIELD(fd_workload_report, aborted_steps, 192, 8);
FD_FIELD(fd_workload_report, mean_admission_wait_steps, 200, 8);
FD_FIELD(fd_workload_report, max_admission_wait_steps, 208, 8);
FD_FIELD(fd_workload_report, max_service_wait_steps, 216, 8);
FD_FIELD(fd_workload_report, fairness, 224, 8);
FD_FIELD(fd_workload_report, peak_used_blocks, 232, 8);
FD_FIELD(fd_workload_report, mean_used_blocks, 240, 8);
FD_FIELD(fd_workload_report, prefix_hits, 248, 8);
FD_FIELD(fd_workload_report, prefix_misses, 256, 8);
FD_FIELD(fd_workload_report, peak_saved_prefix_blocks, 264, 8);
FD_FIELD(fd_workload_report, trajectory_hash, 272, 8);

FD_STRUCT(fd_workload_trace_point, 32, 8);
FD_FIELD(fd_workload_trace_point, step, 0, 8);
FD_FIELD(fd_workload_trace_point, latency_us, 8, 8);
FD_FIELD(fd_workload_trace_point, used_blocks, 16, 4);
FD_FIELD(fd_workload_trace_point, committed_blocks, 20, 4);
FD_FIELD(fd_workload_trace_point, active, 24, 4);
FD_FIELD(fd_workload_trace_point, waiting, 28, 4);

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
_Static_assert(sizeof(fd_workload_progress_fn) == sizeof(void *), "callbacks are pointers");

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

_Static_assert(sizeof(fd_schedule_reason) == 4, "fd_schedule_reason is 32-bit");
FD_ENUM(FD_REASON_REQUEST_EXCEEDS_CAPACITY, 0);
FD_ENUM(FD_REASON_AGING_DRAIN, 1);
FD_ENUM(FD_REASON_ACTIVE_LIMIT, 2);
FD_ENUM(FD_REASON_CAPACITY_DEFERRED, 3);
FD_ENUM(FD_REASON_ADMITTED, 4);
FD_ENUM(FD_REASON_BATCH_LIMIT, 5);
FD_ENUM(FD_REASON_IDLE, 6);
FD_ENUM(FD_REASON_FORCE_32BIT, 0x7fffffff);

_Static_assert(sizeof(fd_decision_list) == 4, "fd_decision_list is 32-bit");
FD_ENUM(FD_DECISION_ADMIT, 0);
FD_ENUM(FD_DECISION_RUNNABLE, 1);
FD_ENUM(FD_DECISION_DEFERRED, 2);
FD_ENUM(FD_DECISION_WAITING, 3);
FD_ENUM(FD_DECISION_REJECTED, 4);
FD_ENUM(FD_DECISION_LIST_FORCE_32BIT, 0x7fffffff);

_Static_assert(sizeof(fd_engine_request_state) == 4, "fd_engine_request_state is 32-bit");
FD_ENUM(FD_ENGINE_REQUEST_UNKNOWN, 0);
FD_ENUM(FD_ENGINE_REQUEST_WAITING, 1);
FD_ENUM(FD_ENGINE_REQUEST_ACTIVE, 2);
FD_ENUM(FD_ENGINE_REQUEST_FINISHED, 3);
FD_ENUM(FD_ENGINE_REQUEST_CANCELLED, 4);
FD_ENUM(FD_ENGINE_REQUEST_REJECTED, 5);
FD_ENUM(FD_ENGINE_REQUEST_STATE_FORCE_32BIT, 0x7fffffff);

_Static_assert(sizeof(fd_engine_step_outcome) == 4, "fd_engine_step_outcome is 32-bit");
FD_ENUM(FD_STEP_OPENED, 0);
FD_ENUM(FD_STEP_BACKPRESSURE, 1);
FD_ENUM(FD_STEP_OUTCOME_FORCE_32BIT, 0x7fffffff);

_Static_assert(sizeof(fd_workload_kind) == 4, "fd_workload_kind is 32-bit");
FD_ENUM(FD_WORKLOAD_SYNTHETIC, 0);
FD_ENUM(FD_WORKLOAD_SCHEDULER, 1);
FD_ENUM(FD_WORKLOAD_INTEGRATED, 2);
FD_ENUM(FD_WORKLOAD_KIND_FORCE_32BIT, 0x7fffffff);

_Static_assert(sizeof(fd_workload_policy) == 4, "fd_workload_policy is 32-bit");
FD_ENUM(FD_POLICY_UNSCHEDULED, 0);
FD_ENUM(FD_POLICY_LIFETIME, 1);
FD_ENUM(FD_POLICY_GREEDY, 2);
FD_ENUM(FD_POLICY_CANCEL_ON_BACKPRESSURE, 3);
FD_ENUM(FD_POLICY_FORCE_32BIT, 0x7fffffff);

FD_ENUM(FD_DECODE_CHECK_INDICES, 1u);
FD_ENUM(FD_VERSION_NUMBER, FD_VERSION_MAJOR * 10000 + FD_VERSION_MINOR * 100 + FD_VERSION_PATCH);

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
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_init_functions_set_struct_size),
      cmocka_unit_test(test_short_result_struct_keeps_tail),
      cmocka_unit_test(test_newer_input_struct_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
