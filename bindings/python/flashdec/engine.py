"""Decode engine (S8), block-aware scheduler (S9) and workload drivers (S10)."""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _lib
from ._arrays import empty_like_dtype, host_index_array, stream_for, tensor
from .cache import Cache, _ids, _ids_ptr, _prefix_id, _rid, _row_counts
from .errors import FlashDecError, Status, argument_error, check
from .types import CEnum, Layout


class EngineRequestState(CEnum):
    UNKNOWN = 0
    WAITING = 1
    ACTIVE = 2
    FINISHED = 3
    CANCELLED = 4
    REJECTED = 5


class StepOutcome(CEnum):
    OPENED = 0
    BACKPRESSURE = 1


class ScheduleReason(CEnum):
    REQUEST_EXCEEDS_CAPACITY = 0
    AGING_DRAIN = 1
    ACTIVE_LIMIT = 2
    CAPACITY_DEFERRED = 3
    ADMITTED = 4
    BATCH_LIMIT = 5
    IDLE = 6


class DecisionList(CEnum):
    ADMIT = 0
    RUNNABLE = 1
    DEFERRED = 2
    WAITING = 3
    REJECTED = 4


class WorkloadKind(CEnum):
    SYNTHETIC = 0
    SCHEDULER = 1
    INTEGRATED = 2


class WorkloadPolicy(CEnum):
    UNSCHEDULED = 0
    LIFETIME = 1
    GREEDY = 2
    CANCEL_ON_BACKPRESSURE = 3


def _struct_to_dataclass(cls: Any, s: Any, skip: Sequence[str] = ("struct_size",)) -> Any:
    return cls(**{f.name: getattr(s, f.name) for f in dataclasses.fields(cls) if f.name not in skip})


def _handle_out() -> ctypes.c_void_p:
    return ctypes.c_void_p()


class _Handle:
    """Owns one C handle; close() is idempotent, __del__ is only a backstop."""

    _destroy: Callable[[int], None]

    def __init__(self, handle: Optional[int]) -> None:
        self._handle = handle

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            type(self)._destroy(handle)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _h(self) -> int:
        if self._handle is None:
            raise FlashDecError(Status.INVALID_STATE, f"{type(self).__name__.lower()} is closed")
        return self._handle

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------
# Scheduler


def _default(init: Any, struct: Any) -> Any:
    s = struct()
    init(ctypes.byref(s))
    return s


@dataclass
class SchedulerConfig:
    """fd_scheduler_config; defaults from fd_scheduler_config_init."""

    max_active_requests: int = dataclasses.field(
        default_factory=lambda: _default(_lib.fd_scheduler_config_init, _lib.fd_scheduler_config).max_active_requests
    )
    max_batch_requests: int = dataclasses.field(
        default_factory=lambda: _default(_lib.fd_scheduler_config_init, _lib.fd_scheduler_config).max_batch_requests
    )
    reserve_blocks: int = dataclasses.field(
        default_factory=lambda: _default(_lib.fd_scheduler_config_init, _lib.fd_scheduler_config).reserve_blocks
    )
    aging_threshold_steps: int = dataclasses.field(
        default_factory=lambda: _default(_lib.fd_scheduler_config_init, _lib.fd_scheduler_config).aging_threshold_steps
    )

    def to_c(self) -> Any:
        c = _default(_lib.fd_scheduler_config_init, _lib.fd_scheduler_config)
        for f in dataclasses.fields(self):
            setattr(c, f.name, int(getattr(self, f.name)))
        return c


@dataclass
class RequestSpec:
    """What the scheduler knows about a request (fd_request_spec)."""

    id: int
    initial_context_tokens: int = 0
    max_new_tokens: int = 1
    submission_order: int = 0
    prefix_blocks: int = 0
    prefix_id: Optional[str] = None

    def to_c(self) -> Any:
        c = _default(_lib.fd_request_spec_init, _lib.fd_request_spec)
        c.id = int(self.id)
        c.initial_context_tokens = int(self.initial_context_tokens)
        c.max_new_tokens = int(self.max_new_tokens)
        c.submission_order = int(self.submission_order)
        c.prefix_blocks = int(self.prefix_blocks)
        c.prefix_id = None if self.prefix_id is None else _prefix_id(self.prefix_id)
        return c


@dataclass(frozen=True)
class SnapshotInfo:
    block_size: int
    max_blocks: int
    free_blocks: int
    resident_prefix_blocks: int
    step: int
    version: int


@dataclass(frozen=True)
class DecisionSummary:
    has_drain: int
    step: int
    snapshot_version: int
    drain_for_request_id: int
    committed_blocks_before: int
    committed_blocks_after: int
    needed_physical_blocks_now: int
    free_blocks_before: int
    schedulable_blocks: int
    reason_count: int


def _read_scheduler_config(fn: Any, handle: int) -> SchedulerConfig:
    c = _lib.fd_scheduler_config()
    c.struct_size = ctypes.sizeof(c)
    check(fn(handle, ctypes.byref(c)))
    return _struct_to_dataclass(SchedulerConfig, c)


class Scheduler(_Handle):
    """Block-aware planner (fd_scheduler). Immutable and thread-safe."""

    _destroy = staticmethod(lambda h: _lib.fd_scheduler_destroy(h))

    def __init__(self, config: Optional[SchedulerConfig] = None, **overrides: Any) -> None:
        super().__init__(None)
        cfg = dataclasses.replace(config or SchedulerConfig(), **overrides).to_c()
        out = _handle_out()
        check(_lib.fd_scheduler_create(ctypes.byref(cfg), ctypes.byref(out)))
        self._handle = out.value

    @property
    def config(self) -> SchedulerConfig:
        return _read_scheduler_config(_lib.fd_scheduler_get_config, self._h())

    def plan(self, snapshot: "Snapshot") -> "Decision":
        """Plans one step from ``snapshot`` (pure, deterministic)."""
        out = _handle_out()
        check(_lib.fd_scheduler_plan(self._h(), snapshot._h(), ctypes.byref(out)))
        return Decision(out.value)


class Snapshot(_Handle):
    """Scheduler input (fd_snapshot): pool numbers plus waiting/active requests."""

    _destroy = staticmethod(lambda h: _lib.fd_snapshot_destroy(h))

    def __init__(
        self,
        *,
        block_size: Optional[int] = None,
        max_blocks: Optional[int] = None,
        free_blocks: Optional[int] = None,
        resident_prefix_blocks: Optional[int] = None,
        step: int = 0,
        version: int = 0,
        _handle: Optional[int] = None,
    ) -> None:
        super().__init__(_handle)
        if _handle is not None:
            return
        info = _default(_lib.fd_snapshot_info_init, _lib.fd_snapshot_info)
        for name, value in (
            ("block_size", block_size),
            ("max_blocks", max_blocks),
            ("free_blocks", free_blocks),
            ("resident_prefix_blocks", resident_prefix_blocks),
        ):
            if value is not None:
                setattr(info, name, int(value))
        info.step, info.version = int(step), int(version)
        out = _handle_out()
        check(_lib.fd_snapshot_create(ctypes.byref(info), ctypes.byref(out)))
        self._handle = out.value

    @property
    def info(self) -> SnapshotInfo:
        i = _lib.fd_snapshot_info()
        i.struct_size = ctypes.sizeof(i)
        check(_lib.fd_snapshot_get_info(self._h(), ctypes.byref(i)))
        return _struct_to_dataclass(SnapshotInfo, i)

    def add_waiting(self, spec: RequestSpec, wait_steps: int = 0, skip_count: int = 0) -> None:
        c = spec.to_c()
        check(_lib.fd_snapshot_add_waiting(self._h(), ctypes.byref(c), int(wait_steps), int(skip_count)))

    def add_active(
        self,
        spec: RequestSpec,
        seq_len: int,
        physical_blocks: int,
        shared_blocks: int,
        committed_blocks: int,
        service_wait_steps: int = 0,
    ) -> None:
        c = spec.to_c()
        check(
            _lib.fd_snapshot_add_active(
                self._h(), ctypes.byref(c), int(seq_len), int(physical_blocks), int(shared_blocks),
                int(committed_blocks), int(service_wait_steps),
            )  # fmt: skip
        )


class Decision(_Handle):
    """Immutable scheduler output (fd_decision)."""

    _destroy = staticmethod(lambda h: _lib.fd_decision_destroy(h))

    def ids(self, which: DecisionList) -> List[int]:
        count = ctypes.c_uint32(0)
        check(_lib.fd_decision_ids(self._h(), int(which), None, 0, ctypes.byref(count)))
        buf = np.zeros(max(1, count.value), dtype=np.uint64)
        check(_lib.fd_decision_ids(self._h(), int(which), _ids_ptr(buf), count.value, ctypes.byref(count)))
        return [int(x) for x in buf[: count.value]]

    admit = property(lambda self: self.ids(DecisionList.ADMIT))
    runnable = property(lambda self: self.ids(DecisionList.RUNNABLE))
    deferred = property(lambda self: self.ids(DecisionList.DEFERRED))
    waiting = property(lambda self: self.ids(DecisionList.WAITING))
    rejected = property(lambda self: self.ids(DecisionList.REJECTED))

    @property
    def summary(self) -> DecisionSummary:
        s = _lib.fd_decision_summary()
        s.struct_size = ctypes.sizeof(s)
        check(_lib.fd_decision_get_summary(self._h(), ctypes.byref(s)))
        return _struct_to_dataclass(DecisionSummary, s)

    @property
    def reasons(self) -> List[ScheduleReason]:
        buf = (ctypes.c_int32 * 8)()
        n = ctypes.c_uint32(0)
        check(_lib.fd_decision_reasons(self._h(), buf, len(buf), ctypes.byref(n)))
        return [ScheduleReason(buf[i]) for i in range(n.value)]

    @property
    def config(self) -> SchedulerConfig:
        return _read_scheduler_config(_lib.fd_decision_get_config, self._h())

    def snapshot(self) -> Snapshot:
        """A copy of the snapshot this decision was planned from."""
        out = _handle_out()
        check(_lib.fd_decision_copy_snapshot(self._h(), ctypes.byref(out)))
        return Snapshot(_handle=out.value)


# ---------------------------------------------------------------------------
# Engine


@dataclass
class EngineConfig:
    """fd_engine_config; 0 fields take the library's defaults."""

    num_q_heads: int = 0
    rotary_dim: int = 0
    rope_base: float = 10000.0
    sm_scale: float = 0.0
    cpu_threads: int = 0

    def to_c(self) -> Any:
        c = _default(_lib.fd_engine_config_init, _lib.fd_engine_config)
        c.num_q_heads, c.rotary_dim = int(self.num_q_heads), int(self.rotary_dim)
        c.rope_base, c.sm_scale = float(self.rope_base), float(self.sm_scale)
        c.cpu_threads = int(self.cpu_threads)
        return c


EngineMetrics = dataclasses.make_dataclass(
    "EngineMetrics",
    [(n, int) for n, _ in _lib.ENGINE_METRICS_FIELDS if n != "struct_size"],
    frozen=True,
)
EngineMetrics.__doc__ = "Counters and gauges of an engine (fd_engine_metrics, docs/semantics.md S8)."
EngineMetrics.__module__ = __name__


@dataclass(frozen=True)
class Fairness:
    """Caller-kept fairness counters of one request (fd_request_fairness)."""

    id: int
    wait_steps: int = 0
    skip_count: int = 0
    service_wait_steps: int = 0


class Step:
    """An engine step (fd_engine_step). ``opened`` is False on backpressure.
    ``token_count`` is the step's new tokens (``batch``, or the sum of
    ``token_counts`` of :meth:`Engine.begin_step`).
    As a context manager, an opened step still open at exit is aborted."""

    def __init__(self, engine: "Engine", raw: Any, token_count: Optional[int] = None) -> None:
        self.engine = engine
        self.outcome = StepOutcome(raw.outcome)
        self.batch = int(raw.batch)
        self.token_count = self.batch if token_count is None else int(token_count)
        self.needed_blocks = int(raw.needed_blocks)
        self.free_blocks = int(raw.free_blocks)
        self._tx = _lib.fd_tx(raw.tx.id, raw.tx.cache_version)
        self._finished = self.outcome != StepOutcome.OPENED

    @property
    def opened(self) -> bool:
        return self.outcome == StepOutcome.OPENED

    @property
    def tx_id(self) -> int:
        return int(self._tx.id)

    def layer(self, layer: int, q: Any, k: Any, v: Any, out: Any = None, stream: Any = None) -> Any:
        """Runs ``layer``: RoPE on q/k, append, paged decode. q, k, v and the
        returned attention output hold the step's ``token_count`` tokens
        packed in row order ([token_count, heads, head_dim]; token_count =
        batch for one token per row; several tokens of a row attend
        causally). A failure aborts the whole step (library contract) and
        raises. All four are of the cache's input_dtype (its dtype, or the
        f16/bf16/f32 an FP8 cache takes; the engine reads the layer's K/V
        scales at :meth:`Engine.begin_step`).

        CUDA cache: q, k, v and out are CUDA tensors, read and written on
        ``stream`` (default: torch's current stream of q; an int handle or a
        torch.cuda.Stream); the call only enqueues, and ``out`` (allocated on
        that stream when None) is ready when the stream gets there. Every
        layer of a step, and the next step, must use the stream of layer 0
        or one ordered after it (the engine reuses its device scratch)."""
        e = self.engine
        cfg = e.cache._config
        idt = cfg.resolved_input_dtype
        n = self.token_count
        qb = tensor(q, "q", dtype=idt, shape=(n, None, cfg.head_dim), device=cfg.device)
        kb = e.cache._token_buffer(k, "k", n)
        vb = e.cache._token_buffer(v, "v", n)
        if out is None:
            out = empty_like_dtype(qb.shape, idt, like=q, stream=stream)
        ob = tensor(out, "out", dtype=idt, shape=qb.shape, writable=True, device=cfg.device)
        try:
            e._call(_lib.fd_engine_step_layer, self._tx, int(layer), qb.ptr, kb.ptr, vb.ptr, ob.ptr,
                    stream_for([qb, kb, ob], stream))
        except FlashDecError:
            self._finished = True  # the engine aborted the step
            raise
        return out

    def commit(self, keep_counts: Optional[Sequence[int]] = None) -> None:
        """Publishes the step (fd_engine_commit_step), or with ``keep_counts``
        only the first ``keep_counts[i]`` new tokens of row i
        (fd_engine_commit_step_keep: the accept step of speculative decoding;
        a bad count raises and leaves the step open)."""
        if keep_counts is None:
            self.engine._call(_lib.fd_engine_commit_step, self._tx)
        else:
            keep = _row_counts(keep_counts, "keep_counts", self.batch)
            self.engine._call(_lib.fd_engine_commit_step_keep, self._tx, keep.ctypes.data, len(keep))
        self._finished = True

    def abort(self) -> None:
        self.engine._call(_lib.fd_engine_abort_step, self._tx)
        self._finished = True

    def __enter__(self) -> "Step":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self._finished or self.engine.closed:
            return
        try:
            self.abort()
        except FlashDecError:
            if exc_type is None:
                raise


class Engine(_Handle):
    """Decode engine over a CPU or CUDA :class:`Cache` (fd_engine).

    The engine borrows the cache: closing the cache closes the engine first.
    Calls are serialised with the cache's lock (they share one thread contract).
    Streams: :meth:`Step.layer` and :meth:`register_prefix` take ``stream=``;
    :meth:`prefill` orders itself after the caller's stream (see there); the
    other methods are host bookkeeping (creation clears its device scratch
    on a private stream and waits for it).
    """

    _destroy = staticmethod(lambda h: _lib.fd_engine_destroy(h))

    def __init__(self, cache: Cache, config: Optional[EngineConfig] = None, **overrides: Any) -> None:
        super().__init__(None)
        self.cache = cache
        cfg = dataclasses.replace(config or EngineConfig(), **overrides).to_c()
        out = _handle_out()
        with cache._lock:
            check(_lib.fd_engine_create(cache._h(), ctypes.byref(cfg), ctypes.byref(out)))
            self._handle = out.value
            cache._dependents.add(self)

    def close(self) -> None:
        with self.cache._lock:
            super().close()

    def _call(self, fn: Any, *args: Any) -> None:
        with self.cache._lock:
            check(fn(self._h(), *args))

    # lifecycle (unscheduled mode)
    def add_request(self, request_id: int) -> None:
        self._call(_lib.fd_engine_add_request, _rid(request_id))

    def admit(self, request_id: int) -> None:
        self._call(_lib.fd_engine_admit, _rid(request_id))

    def finish(self, request_id: int) -> None:
        self._call(_lib.fd_engine_finish, _rid(request_id))

    def cancel(self, request_id: int) -> None:
        self._call(_lib.fd_engine_cancel, _rid(request_id))

    def request_state(self, request_id: int) -> EngineRequestState:
        s = ctypes.c_int32(0)
        self._call(_lib.fd_engine_get_request_state, _rid(request_id), ctypes.byref(s))
        return EngineRequestState(s.value)

    # steps
    def begin_step(self, request_ids: Sequence[int], *, token_counts: Optional[Sequence[int]] = None) -> Step:
        """Opens a step for one token of each request (fd_engine_begin_step),
        or for ``token_counts[i] >= 1`` tokens of request i
        (fd_engine_begin_step_multi: speculative verify, a prompt chunk whose
        attention is needed). Check ``.opened``: on backpressure nothing
        changed and no layer may run."""
        ids = _ids(request_ids)
        raw = _lib.fd_engine_step()
        raw.struct_size = ctypes.sizeof(raw)
        if token_counts is None:
            self._call(_lib.fd_engine_begin_step, _ids_ptr(ids), len(ids), ctypes.byref(raw))
            return Step(self, raw)
        counts = _row_counts(token_counts, "token_counts", len(ids))
        self._call(_lib.fd_engine_begin_step_multi, _ids_ptr(ids), counts.ctypes.data, len(ids), ctypes.byref(raw))
        return Step(self, raw, int(counts.sum()))

    def prefill(self, request_id: int, k: Any, v: Any, stream: Any = None) -> None:
        """One prompt token, all layers: k, v [num_layers, num_kv_heads, head_dim]
        in the cache's input_dtype.

        CUDA cache: k and v are CUDA tensors. The C call takes no stream: it
        reads them on the legacy default stream and synchronises that stream
        before returning. So that it sees k and v as produced on ``stream``
        (default: torch's current stream of k; an int handle or a
        torch.cuda.Stream), this method first makes the legacy stream wait
        for ``stream`` with an event (no host wait). On return the token is
        in place for any stream and k, v may be reused. The call also waits
        for unrelated work queued on the legacy stream (slow, not wrong)."""
        cfg = self.cache._config
        kb, vb = self._prefill_buffers(k, v, (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim), stream)
        self._call(_lib.fd_engine_prefill_request_layers, _rid(request_id), kb.ptr, vb.ptr)

    def prefill_tokens(self, request_id: int, k: Any, v: Any, stream: Any = None) -> None:
        """Prompt tokens, all layers, in one cache transaction
        (fd_engine_prefill_request_tokens): k, v [num_layers, n, num_kv_heads,
        head_dim], token j rotated at position seq_len + j; all n published
        at once or none. Streams as :meth:`prefill`."""
        cfg = self.cache._config
        kb, vb = self._prefill_buffers(k, v, (cfg.num_layers, None, cfg.num_kv_heads, cfg.head_dim), stream)
        self._call(_lib.fd_engine_prefill_request_tokens, _rid(request_id), kb.shape[1], kb.ptr, vb.ptr)

    def _prefill_buffers(self, k: Any, v: Any, shape: Tuple[Optional[int], ...], stream: Any) -> Tuple[Any, Any]:
        """Checked prefill inputs (v shaped as k); a CUDA k's producer stream
        is ordered before the legacy stream the C call reads them on."""
        cfg = self.cache._config
        kb = tensor(k, "k", dtype=cfg.resolved_input_dtype, shape=shape, device=cfg.device)
        vb = tensor(v, "v", dtype=cfg.resolved_input_dtype, shape=kb.shape, device=cfg.device)
        if kb.torch_stream is not None:  # a CUDA tensor: order its producer first
            from ._cuda import order_legacy_stream_after

            order_legacy_stream_after(stream, k.device)
        return kb, vb

    # scheduler-managed mode
    def submit(self, spec: RequestSpec) -> None:
        c = spec.to_c()
        self._call(_lib.fd_engine_submit_request, ctypes.byref(c))

    def register_prefix(self, prefix_id: str, k_blocks: Any, v_blocks: Any, stream: Any = None) -> None:
        """As :meth:`Cache.register_prefix` (same shapes and stream rules: the
        copy runs on ``stream``, default torch's current stream of k_blocks,
        and is finished before return)."""
        cfg = self.cache._config
        inner = (cfg.block_size, cfg.head_dim) if cfg.layout == Layout.TOKEN_MAJOR else (cfg.head_dim, cfg.block_size)
        shape = (cfg.num_layers, None, cfg.num_kv_heads) + inner
        kb = tensor(k_blocks, "k_blocks", dtype=cfg.dtype, shape=shape, device=cfg.device)
        vb = tensor(v_blocks, "v_blocks", dtype=cfg.dtype, shape=kb.shape, device=cfg.device)
        self._call(_lib.fd_engine_register_prefix, _prefix_id(prefix_id), kb.ptr, vb.ptr, kb.shape[1],
                   stream_for([kb, vb], stream))

    def evict_prefix(self, prefix_id: str) -> None:
        self._call(_lib.fd_engine_evict_prefix, _prefix_id(prefix_id))

    def snapshot(self, step: int = 0, fairness: Sequence[Fairness] = ()) -> Snapshot:
        arr = (_lib.fd_request_fairness * max(1, len(fairness)))()
        for i, f in enumerate(fairness):
            arr[i] = _lib.fd_request_fairness(int(f.id), int(f.wait_steps), int(f.skip_count),
                                              int(f.service_wait_steps), 0)
        out = _handle_out()
        self._call(_lib.fd_engine_snapshot, int(step), arr if fairness else None, len(fairness), ctypes.byref(out))
        return Snapshot(_handle=out.value)

    def apply_decision(self, scheduler: Scheduler, decision: Decision) -> None:
        self._call(_lib.fd_engine_apply_decision, scheduler._h(), decision._h())

    def metrics(self) -> Any:
        m = _lib.fd_engine_metrics()
        m.struct_size = ctypes.sizeof(m)
        self._call(_lib.fd_engine_metrics_get, ctypes.byref(m))
        return _struct_to_dataclass(EngineMetrics, m)

    def validate(self) -> None:
        self._call(_lib.fd_engine_validate)


# ---------------------------------------------------------------------------
# Workloads

WorkloadReport = dataclasses.make_dataclass(
    "WorkloadReport",
    [
        (n, str if n == "case_name" else float if t is ctypes.c_double else int)
        for n, t in _lib.WORKLOAD_REPORT_FIELDS
        if n != "struct_size"
    ],
    frozen=True,
)
WorkloadReport.__doc__ = "Report of one policy run (fd_workload_report, docs/semantics.md S10)."
WorkloadReport.__module__ = __name__

TRACE_DTYPE = np.dtype(
    [("step", "<u8"), ("latency_us", "<f8"), ("used_blocks", "<u4"), ("committed_blocks", "<u4"),
     ("active", "<u4"), ("waiting", "<u4")]
)  # fmt: skip


def workload_cases(kind: WorkloadKind) -> List[str]:
    """Case names of a workload kind."""
    names = []
    name = ctypes.c_char_p()
    for index in range(1 << 16):
        status = _lib.fd_workload_case_name(int(kind), index, ctypes.byref(name))
        if status == Status.NOT_FOUND:
            return names
        check(status)
        names.append(name.value.decode())
    raise FlashDecError(Status.INTERNAL, "workload case list does not end")


def run_workload(
    kind: WorkloadKind,
    case_name: str,
    *,
    seed: int = 0,
    cpu_threads: int = 1,
    progress: Optional[Callable[[int, int], None]] = None,
) -> List[Tuple[Any, np.ndarray]]:
    """Runs a workload case; returns (WorkloadReport, trace) per policy run.
    ``trace`` is a structured array with TRACE_DTYPE fields."""
    o = _default(_lib.fd_workload_options_init, _lib.fd_workload_options)
    o.kind = int(kind)
    o.case_name = case_name.encode()
    o.seed = int(seed)
    o.cpu_threads = int(cpu_threads)
    errors: List[BaseException] = []
    if progress is not None:

        def trampoline(_user: Any, done: int, total: int) -> None:
            try:
                progress(int(done), int(total))
            except BaseException as e:  # an exception must not unwind through C
                errors.append(e)

        o.progress = _lib.fd_workload_progress_fn(trampoline)
    out = _handle_out()
    check(_lib.fd_workload_run(ctypes.byref(o), ctypes.byref(out)))
    result = out.value
    try:
        if errors:
            raise errors[0]
        n = ctypes.c_uint32(0)
        check(_lib.fd_workload_result_count(result, ctypes.byref(n)))
        runs = []
        for i in range(n.value):
            r = _lib.fd_workload_report()
            r.struct_size = ctypes.sizeof(r)
            check(_lib.fd_workload_result_report(result, i, ctypes.byref(r)))
            fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(WorkloadReport)}
            fields["case_name"] = r.case_name.decode()
            count = ctypes.c_uint32(0)
            check(_lib.fd_workload_result_trace(result, i, None, 0, ctypes.byref(count)))
            trace = np.zeros(count.value, dtype=TRACE_DTYPE)
            if count.value:
                pts = trace.ctypes.data_as(ctypes.POINTER(_lib.fd_workload_trace_point))
                check(_lib.fd_workload_result_trace(result, i, pts, count.value, ctypes.byref(count)))
            runs.append((WorkloadReport(**fields), trace))
        return runs
    finally:
        _lib.fd_workload_result_destroy(result)


__all__ = [
    "Decision",
    "DecisionList",
    "DecisionSummary",
    "Engine",
    "EngineConfig",
    "EngineMetrics",
    "EngineRequestState",
    "Fairness",
    "RequestSpec",
    "ScheduleReason",
    "Scheduler",
    "SchedulerConfig",
    "Snapshot",
    "SnapshotInfo",
    "Step",
    "StepOutcome",
    "WorkloadKind",
    "WorkloadPolicy",
    "WorkloadReport",
    "run_workload",
    "workload_cases",
]
