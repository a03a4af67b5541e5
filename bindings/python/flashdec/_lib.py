"""Raw ctypes declarations of include/flashdec.h.

Every exported ``fd_*`` symbol of the header gets ``argtypes`` and ``restype``
here, so ctypes converts and checks every argument instead of guessing (a
missing declaration would silently pass Python ints as C ``int``). The structs
mirror the header field by field; tests/test_layout.py compares their sizes and
offsets with a C program compiled against the header.

Nothing in this module raises FlashDecError: it is the raw layer. The safe API
lives in the other modules of the package.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

# Version of the header these declarations mirror (FD_VERSION_* in flashdec.h).
HEADER_VERSION_MAJOR = 0
HEADER_VERSION_MINOR = 1
HEADER_VERSION_PATCH = 0
HEADER_VERSION_NUMBER = (
    HEADER_VERSION_MAJOR * 10000 + HEADER_VERSION_MINOR * 100 + HEADER_VERSION_PATCH
)

FD_DECODE_CHECK_INDICES = 1

fd_status = c_int32  # the enum is forced to 32 bits by FD_STATUS_FORCE_32BIT
fd_stream = c_void_p  # struct CUstream_st *: ABI-identical to a pointer


class fd_device(Structure):
    _fields_ = [("type", c_int32), ("ordinal", c_int32)]


class fd_cache_config(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_layers", c_uint32),
        ("num_kv_heads", c_uint32),
        ("head_dim", c_uint32),
        ("block_size", c_uint32),
        ("max_blocks", c_uint32),
        ("prefix_cache_capacity_blocks", c_uint32),
        ("dtype", c_int32),
        ("layout", c_int32),
        ("device", fd_device),
        # appended in 0.1: external K/V storage
        ("reserved0", c_uint32),
        ("k_storage", c_void_p),
        ("v_storage", c_void_p),
        ("stride_layer", c_int64),
        ("stride_block", c_int64),
        ("stride_head", c_int64),
        ("stride_token", c_int64),
        ("stride_dim", c_int64),
    ]


class fd_tx(Structure):
    _fields_ = [("id", c_uint64), ("cache_version", c_uint64)]


class fd_tx_info(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("batch", c_uint32),
        ("next_layer", c_uint32),
        ("state", c_int32),
        ("max_blocks_per_seq", c_uint32),
        ("new_block_count", c_uint32),
    ]


class fd_prefix_info(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_blocks", c_uint32),
        ("ref_count", c_uint32),
        ("reserved0", c_uint32),
        ("last_use", c_uint64),
        ("first_block", c_int32),
        ("reserved1", c_uint32),
    ]


# (name, ctype) in header order; shared with metrics.py which builds the
# Python-side dataclass from the same list.
METRICS_FIELDS: List[Tuple[str, type]] = [
    ("struct_size", c_uint32),
    ("reserved0", c_uint32),
    ("max_blocks", c_uint64),
    ("used_blocks", c_uint64),
    ("free_blocks", c_uint64),
    ("block_utilization", c_double),
    ("active_tokens", c_uint64),
    ("physical_data_tokens", c_uint64),
    ("reserved_tokens", c_uint64),
    ("internal_fragmentation_tokens", c_uint64),
    ("internal_fragmentation_ratio", c_double),
    ("allocation_count", c_uint64),
    ("fresh_allocation_count", c_uint64),
    ("reuse_count", c_uint64),
    ("free_count", c_uint64),
    ("capacity_failure_count", c_uint64),
    ("active_request_count", c_uint64),
    ("finished_request_count", c_uint64),
    ("cancelled_request_count", c_uint64),
    ("transaction_begin_count", c_uint64),
    ("transaction_commit_count", c_uint64),
    ("transaction_abort_count", c_uint64),
    ("open_transaction_count", c_uint64),
    ("pending_request_count", c_uint64),
    ("reserved_transaction_blocks", c_uint64),
    ("transaction_layer_write_count", c_uint64),
    ("transaction_rollback_block_count", c_uint64),
    ("transaction_failure_count", c_uint64),
    ("retained_transaction_state_count", c_uint64),
    ("terminal_transaction_history_count", c_uint64),
    ("terminal_transaction_history_limit", c_uint64),
    ("bytes_per_block", c_uint64),
    ("allocated_kv_bytes", c_uint64),
    ("reserved_transaction_bytes", c_uint64),
    ("prefix_cache_capacity_blocks", c_uint64),
    ("resident_prefix_count", c_uint64),
    ("resident_prefix_blocks", c_uint64),
    ("active_prefix_references", c_uint64),
    ("shared_prefix_blocks", c_uint64),
    ("saved_prefix_blocks", c_uint64),
    ("saved_prefix_bytes", c_uint64),
    ("prefix_registration_count", c_uint64),
    ("prefix_hit_count", c_uint64),
    ("prefix_miss_count", c_uint64),
    ("prefix_hit_ratio", c_double),
    ("prefix_eviction_count", c_uint64),
    ("prefix_capacity_failure_count", c_uint64),
    ("state_version", c_uint64),
]


class fd_cache_metrics(Structure):
    _fields_ = METRICS_FIELDS


class fd_decode_params(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("dtype", c_int32),
        ("layout", c_int32),
        ("batch", c_uint32),
        ("num_q_heads", c_uint32),
        ("num_kv_heads", c_uint32),
        ("head_dim", c_uint32),
        ("block_size", c_uint32),
        ("num_blocks", c_uint32),
        ("max_blocks_per_seq", c_uint32),
        ("sm_scale", c_float),
        ("flags", c_uint32),
        ("q", c_void_p),
        ("k_cache", c_void_p),
        ("v_cache", c_void_p),
        ("stride_block", c_int64),
        ("stride_head", c_int64),
        ("stride_token", c_int64),
        ("stride_dim", c_int64),
        ("block_tables", c_void_p),  # const int32_t *
        ("seq_lens", c_void_p),  # const int32_t *
        ("out", c_void_p),
        ("max_seq_len_hint", c_int32),
        ("num_splits", c_int32),
        ("workspace", c_void_p),
        ("workspace_size", c_size_t),
        ("device", fd_device),
        ("stream", fd_stream),
        ("cpu_threads", c_uint32),
        ("reserved0", c_uint32),
    ]


class fd_kv_append_params(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("dtype", c_int32),
        ("layout", c_int32),
        ("num_tokens", c_uint32),
        ("num_q_heads", c_uint32),
        ("num_kv_heads", c_uint32),
        ("head_dim", c_uint32),
        ("block_size", c_uint32),
        ("num_blocks", c_uint32),
        ("rotary_dim", c_uint32),
        ("rope_base", c_float),
        ("reserved0", c_uint32),
        ("q", c_void_p),
        ("q_out", c_void_p),
        ("k", c_void_p),
        ("v", c_void_p),
        ("k_cache", c_void_p),
        ("v_cache", c_void_p),
        ("stride_block", c_int64),
        ("stride_head", c_int64),
        ("stride_token", c_int64),
        ("stride_dim", c_int64),
        ("block_ids", c_void_p),  # const int32_t *
        ("offsets", c_void_p),  # const int32_t *
        ("positions", c_void_p),  # const int32_t *
        ("device", fd_device),
        ("stream", fd_stream),
    ]


class fd_scheduler_config(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_active_requests", c_uint32),
        ("max_batch_requests", c_uint32),
        ("reserve_blocks", c_uint32),
        ("aging_threshold_steps", c_uint32),
    ]


class fd_request_spec(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("initial_context_tokens", c_uint32),
        ("id", c_uint64),
        ("submission_order", c_uint64),
        ("max_new_tokens", c_uint32),
        ("prefix_blocks", c_uint32),
        ("prefix_id", c_char_p),
    ]


class fd_snapshot_info(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("block_size", c_uint32),
        ("max_blocks", c_uint32),
        ("free_blocks", c_uint32),
        ("resident_prefix_blocks", c_uint32),
        ("reserved0", c_uint32),
        ("step", c_uint64),
        ("version", c_uint64),
    ]


class fd_decision_summary(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("has_drain", c_uint32),
        ("step", c_uint64),
        ("snapshot_version", c_uint64),
        ("drain_for_request_id", c_uint64),
        ("committed_blocks_before", c_uint32),
        ("committed_blocks_after", c_uint32),
        ("needed_physical_blocks_now", c_uint32),
        ("free_blocks_before", c_uint32),
        ("schedulable_blocks", c_uint32),
        ("reason_count", c_uint32),
    ]


class fd_engine_config(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_q_heads", c_uint32),
        ("rotary_dim", c_uint32),
        ("rope_base", c_float),
        ("sm_scale", c_float),
        ("cpu_threads", c_uint32),
    ]


class fd_engine_step(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("outcome", c_int32),
        ("tx", fd_tx),
        ("batch", c_uint32),
        ("needed_blocks", c_uint32),
        ("free_blocks", c_uint32),
        ("reserved0", c_uint32),
    ]


class fd_request_fairness(Structure):
    _fields_ = [
        ("id", c_uint64),
        ("wait_steps", c_uint32),
        ("skip_count", c_uint32),
        ("service_wait_steps", c_uint32),
        ("reserved0", c_uint32),
    ]


ENGINE_METRICS_FIELDS: List[Tuple[str, type]] = [
    ("struct_size", c_uint32),
    ("scheduler_managed", c_uint32),
    ("waiting_request_count", c_uint64),
    ("active_request_count", c_uint64),
    ("finished_request_count", c_uint64),
    ("cancelled_request_count", c_uint64),
    ("rejected_request_count", c_uint64),
    ("completed_step_count", c_uint64),
    ("appended_token_count", c_uint64),
    ("prefill_token_count", c_uint64),
    ("backpressure_count", c_uint64),
    ("state_version", c_uint64),
    ("cache_state_version", c_uint64),
    ("committed_blocks", c_uint64),
    ("committed_but_unallocated_blocks", c_uint64),
    ("stale_decision_count", c_uint64),
    ("applied_decision_count", c_uint64),
    ("open_step_transaction_count", c_uint64),
    ("transaction_layer_step_count", c_uint64),
    ("transaction_abort_count", c_uint64),
]


class fd_engine_metrics(Structure):
    _fields_ = ENGINE_METRICS_FIELDS


fd_workload_progress_fn = ctypes.CFUNCTYPE(None, c_void_p, c_uint64, c_uint64)


class fd_workload_options(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("kind", c_int32),
        ("case_name", c_char_p),
        ("seed", c_uint64),
        ("progress", fd_workload_progress_fn),
        ("progress_user_data", c_void_p),
        ("cpu_threads", c_uint32),
        ("reserved0", c_uint32),
    ]


WORKLOAD_REPORT_FIELDS: List[Tuple[str, type]] = [
    ("struct_size", c_uint32),
    ("kind", c_int32),
    ("policy", c_int32),
    ("max_blocks", c_uint32),
    ("case_name", ctypes.c_char * 32),
    ("seed", c_uint64),
    ("steps", c_uint64),
    ("executed_steps", c_uint64),
    ("requests_submitted", c_uint64),
    ("requests_completed", c_uint64),
    ("completion_rate", c_double),
    ("useful_tokens", c_uint64),
    ("generated_tokens", c_uint64),
    ("tokens_per_second", c_double),
    ("step_latency_p50_us", c_double),
    ("step_latency_p90_us", c_double),
    ("step_latency_p99_us", c_double),
    ("stalled_steps", c_uint64),
    ("backpressure_steps", c_uint64),
    ("deadlocks", c_uint64),
    ("forced_cancellations", c_uint64),
    ("user_cancellations", c_uint64),
    ("rejected_requests", c_uint64),
    ("aborted_steps", c_uint64),
    ("mean_admission_wait_steps", c_double),
    ("max_admission_wait_steps", c_uint64),
    ("max_service_wait_steps", c_uint64),
    ("fairness", c_double),
    ("peak_used_blocks", c_uint64),
    ("mean_used_blocks", c_double),
    ("prefix_hits", c_uint64),
    ("prefix_misses", c_uint64),
    ("peak_saved_prefix_blocks", c_uint64),
    ("trajectory_hash", c_uint64),
]


class fd_workload_report(Structure):
    _fields_ = WORKLOAD_REPORT_FIELDS


class fd_workload_trace_point(Structure):
    _fields_ = [
        ("step", c_uint64),
        ("latency_us", c_double),
        ("used_blocks", c_uint32),
        ("committed_blocks", c_uint32),
        ("active", c_uint32),
        ("waiting", c_uint32),
    ]


STRUCTS: Dict[str, type] = {
    "fd_device": fd_device,
    "fd_cache_config": fd_cache_config,
    "fd_tx": fd_tx,
    "fd_tx_info": fd_tx_info,
    "fd_prefix_info": fd_prefix_info,
    "fd_decode_params": fd_decode_params,
    "fd_kv_append_params": fd_kv_append_params,
    "fd_cache_metrics": fd_cache_metrics,
    "fd_scheduler_config": fd_scheduler_config,
    "fd_request_spec": fd_request_spec,
    "fd_snapshot_info": fd_snapshot_info,
    "fd_decision_summary": fd_decision_summary,
    "fd_engine_config": fd_engine_config,
    "fd_engine_step": fd_engine_step,
    "fd_request_fairness": fd_request_fairness,
    "fd_engine_metrics": fd_engine_metrics,
    "fd_workload_options": fd_workload_options,
    "fd_workload_report": fd_workload_report,
    "fd_workload_trace_point": fd_workload_trace_point,
}

_p = c_void_p  # opaque handles (fd_cache *) travel as void pointers
_u64p = POINTER(c_uint64)
_i32p = POINTER(c_int32)
_u32p = POINTER(c_uint32)

# name -> (restype, argtypes), in header order. Data buffers are c_void_p so
# that numpy/torch addresses (plain ints) pass without copies.
SIGNATURES: Dict[str, Tuple[Optional[type], Sequence[type]]] = {
    # status and errors
    "fd_status_string": (c_char_p, [fd_status]),
    "fd_last_error_message": (c_char_p, []),
    # version
    "fd_version_string": (c_char_p, []),
    "fd_version_number": (c_uint32, []),
    # devices
    "fd_cuda_device_count": (fd_status, [_i32p]),
    # cache
    "fd_cache_config_init": (None, [POINTER(fd_cache_config)]),
    "fd_cache_create": (fd_status, [POINTER(fd_cache_config), POINTER(c_void_p)]),
    "fd_cache_destroy": (None, [_p]),
    "fd_cache_get_config": (fd_status, [_p, POINTER(fd_cache_config)]),
    "fd_cache_add_request": (fd_status, [_p, c_uint64]),
    "fd_cache_finish_request": (fd_status, [_p, c_uint64]),
    "fd_cache_cancel_request": (fd_status, [_p, c_uint64]),
    "fd_cache_request_state": (fd_status, [_p, c_uint64, _i32p]),
    "fd_cache_blocks_needed": (fd_status, [_p, _u64p, c_uint32, _u32p, _u32p]),
    "fd_cache_max_blocks_per_seq": (fd_status, [_p, _u64p, c_uint32, _u32p]),
    "fd_cache_export": (fd_status, [_p, _u64p, c_uint32, c_uint32, _p, _p]),
    "fd_cache_state_version": (fd_status, [_p, _u64p]),
    "fd_cache_layer_storage": (
        fd_status,
        [_p, c_uint32, POINTER(c_void_p), POINTER(c_void_p), POINTER(c_int64)],
    ),
    "fd_cache_append": (fd_status, [_p, _u64p, c_uint32, _p, _p, fd_stream]),
    "fd_cache_metrics_get": (fd_status, [_p, POINTER(fd_cache_metrics)]),
    "fd_cache_validate": (fd_status, [_p]),
    "fd_cache_export_async": (fd_status, [_p, _u64p, c_uint32, c_uint32, _p, _p, fd_stream]),
    "fd_cache_async_error": (fd_status, [_p]),
    # transactions
    "fd_tx_begin": (fd_status, [_p, _u64p, c_uint32, POINTER(fd_tx)]),
    "fd_tx_write_layer": (fd_status, [_p, fd_tx, c_uint32, _p, _p, fd_stream]),
    "fd_tx_write_layer_rope": (
        fd_status,
        [_p, fd_tx, c_uint32, _p, c_uint32, _p, _p, c_uint32, c_float, _p, fd_stream],
    ),
    "fd_tx_commit": (fd_status, [_p, fd_tx]),
    "fd_tx_abort": (fd_status, [_p, fd_tx]),
    "fd_tx_get_info": (fd_status, [_p, fd_tx, POINTER(fd_tx_info)]),
    "fd_tx_get_rows": (fd_status, [_p, fd_tx, c_uint32, _u64p, _i32p, _i32p, _i32p, _i32p]),
    "fd_tx_block_tables": (fd_status, [_p, fd_tx, c_uint32, _p]),
    "fd_tx_block_tables_async": (fd_status, [_p, fd_tx, c_uint32, _p, _p, fd_stream]),
    # prefixes
    "fd_prefix_register": (fd_status, [_p, c_char_p, _p, _p, c_uint32, fd_stream]),
    "fd_prefix_attach": (fd_status, [_p, c_uint64, c_char_p]),
    "fd_prefix_evict": (fd_status, [_p, c_char_p]),
    "fd_prefix_get_info": (fd_status, [_p, c_char_p, POINTER(fd_prefix_info)]),
    # decode, rope, reference
    "fd_decode_params_init": (None, [POINTER(fd_decode_params)]),
    "fd_decode_workspace_size": (fd_status, [POINTER(fd_decode_params), POINTER(c_size_t)]),
    "fd_decode": (fd_status, [POINTER(fd_decode_params)]),
    "fd_rope_apply": (
        fd_status,
        [c_int32, _p, c_uint32, c_uint32, c_uint32, _p, c_uint32, c_float],
    ),
    "fd_reference_attention_dense": (
        fd_status,
        [c_int32, c_uint32, c_uint32, c_uint32, c_uint32, c_uint32, _p, _p, _p, _p, c_float, _p],
    ),
    # append primitives
    "fd_kv_append_params_init": (None, [POINTER(fd_kv_append_params)]),
    "fd_kv_append": (fd_status, [POINTER(fd_kv_append_params)]),
    "fd_rope_kv_append": (fd_status, [POINTER(fd_kv_append_params)]),
    # scheduler, snapshots, decisions
    "fd_scheduler_config_init": (None, [POINTER(fd_scheduler_config)]),
    "fd_scheduler_create": (fd_status, [POINTER(fd_scheduler_config), POINTER(c_void_p)]),
    "fd_scheduler_destroy": (None, [_p]),
    "fd_scheduler_get_config": (fd_status, [_p, POINTER(fd_scheduler_config)]),
    "fd_request_spec_init": (None, [POINTER(fd_request_spec)]),
    "fd_snapshot_info_init": (None, [POINTER(fd_snapshot_info)]),
    "fd_snapshot_create": (fd_status, [POINTER(fd_snapshot_info), POINTER(c_void_p)]),
    "fd_snapshot_destroy": (None, [_p]),
    "fd_snapshot_get_info": (fd_status, [_p, POINTER(fd_snapshot_info)]),
    "fd_snapshot_add_waiting": (fd_status, [_p, POINTER(fd_request_spec), c_uint32, c_uint32]),
    "fd_snapshot_add_active": (
        fd_status,
        [_p, POINTER(fd_request_spec), c_int32, c_uint32, c_uint32, c_uint32, c_uint32],
    ),
    "fd_scheduler_plan": (fd_status, [_p, _p, POINTER(c_void_p)]),
    "fd_decision_destroy": (None, [_p]),
    "fd_decision_ids": (fd_status, [_p, c_int32, _u64p, c_uint32, _u32p]),
    "fd_decision_get_summary": (fd_status, [_p, POINTER(fd_decision_summary)]),
    "fd_decision_reasons": (fd_status, [_p, _i32p, c_uint32, _u32p]),
    "fd_decision_get_config": (fd_status, [_p, POINTER(fd_scheduler_config)]),
    "fd_decision_copy_snapshot": (fd_status, [_p, POINTER(c_void_p)]),
    # engine
    "fd_engine_config_init": (None, [POINTER(fd_engine_config)]),
    "fd_engine_create": (fd_status, [_p, POINTER(fd_engine_config), POINTER(c_void_p)]),
    "fd_engine_destroy": (None, [_p]),
    "fd_engine_add_request": (fd_status, [_p, c_uint64]),
    "fd_engine_admit": (fd_status, [_p, c_uint64]),
    "fd_engine_finish": (fd_status, [_p, c_uint64]),
    "fd_engine_cancel": (fd_status, [_p, c_uint64]),
    "fd_engine_get_request_state": (fd_status, [_p, c_uint64, _i32p]),
    "fd_engine_begin_step": (fd_status, [_p, _u64p, c_uint32, POINTER(fd_engine_step)]),
    "fd_engine_step_layer": (fd_status, [_p, fd_tx, c_uint32, _p, _p, _p, _p, fd_stream]),
    "fd_engine_commit_step": (fd_status, [_p, fd_tx]),
    "fd_engine_abort_step": (fd_status, [_p, fd_tx]),
    "fd_engine_prefill_request_layers": (fd_status, [_p, c_uint64, _p, _p]),
    "fd_engine_submit_request": (fd_status, [_p, POINTER(fd_request_spec)]),
    "fd_engine_register_prefix": (fd_status, [_p, c_char_p, _p, _p, c_uint32, fd_stream]),
    "fd_engine_evict_prefix": (fd_status, [_p, c_char_p]),
    "fd_engine_snapshot": (
        fd_status,
        [_p, c_uint64, POINTER(fd_request_fairness), c_uint32, POINTER(c_void_p)],
    ),
    "fd_engine_apply_decision": (fd_status, [_p, _p, _p]),
    "fd_engine_metrics_get": (fd_status, [_p, POINTER(fd_engine_metrics)]),
    "fd_engine_validate": (fd_status, [_p]),
    # workloads
    "fd_workload_options_init": (None, [POINTER(fd_workload_options)]),
    "fd_workload_case_name": (fd_status, [c_int32, c_uint32, POINTER(c_char_p)]),
    "fd_workload_run": (fd_status, [POINTER(fd_workload_options), POINTER(c_void_p)]),
    "fd_workload_result_destroy": (None, [_p]),
    "fd_workload_result_count": (fd_status, [_p, _u32p]),
    "fd_workload_result_report": (fd_status, [_p, c_uint32, POINTER(fd_workload_report)]),
    "fd_workload_result_trace": (
        fd_status,
        [_p, c_uint32, POINTER(fd_workload_trace_point), c_uint32, _u32p],
    ),
}


class _MissingSymbol:
    """Stands in for a header function the loaded library does not export
    (an older or partial build); calling it raises instead of crashing."""

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.path = path

    def __call__(self, *args: object) -> None:
        raise NotImplementedError(
            f"{self.name} is declared in flashdec.h but not exported by {self.path}"
        )


def _candidates() -> List[str]:
    env = os.environ.get("FLASHDEC_LIBRARY")
    if env:
        # An explicit choice must not silently fall back to another copy.
        return [env]
    here = Path(__file__).resolve().parent
    found = [str(here / n) for n in ("libflashdec.so", "libflashdec.so.0") if (here / n).exists()]
    system = ctypes.util.find_library("flashdec")
    if system:
        found.append(system)
    found.append("libflashdec.so.0")  # the SONAME, through the dynamic loader path
    return found


def _load() -> Tuple[ctypes.CDLL, str]:
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError(
        "cannot load libflashdec (set FLASHDEC_LIBRARY to its full path): " + "; ".join(errors)
    )


lib, library_path = _load()
missing_symbols: List[str] = []

for _name, (_res, _args) in SIGNATURES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        missing_symbols.append(_name)
        globals()[_name] = _MissingSymbol(_name, library_path)
        continue
    _fn.restype = _res
    _fn.argtypes = list(_args)
    globals()[_name] = _fn
