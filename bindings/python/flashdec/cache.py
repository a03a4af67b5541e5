"""The paged KV cache, its transactions and shared prefixes."""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence, Tuple

import numpy as np

from . import _lib
from ._arrays import Buffer, host_index_array, index_tensor, is_torch_tensor, stream_for, tensor
from .errors import FlashDecError, Status, argument_error, check
from .ops import decode as _decode
from .ops import decode_workspace_size as _decode_workspace_size
from .types import CacheConfig, Device, DeviceType, Layout, RequestState, TxState

_U64P = ctypes.POINTER(ctypes.c_uint64)
_I32P = ctypes.POINTER(ctypes.c_int32)

# Metrics: every field of fd_cache_metrics except the size/padding header, in
# header order. Built from _lib.METRICS_FIELDS so the two cannot drift.
Metrics = dataclasses.make_dataclass(
    "Metrics",
    [
        (name, float if ctype is ctypes.c_double else int)
        for name, ctype in _lib.METRICS_FIELDS
        if name not in ("struct_size", "reserved0")
    ],
    frozen=True,
)
Metrics.__doc__ = "Counters and gauges of a cache (fd_cache_metrics, docs/semantics.md S7)."
Metrics.__module__ = __name__


@dataclass(frozen=True)
class PrefixInfo:
    """State of one resident prefix (fd_prefix_info)."""

    num_blocks: int
    ref_count: int
    last_use: int
    first_block: int


@dataclass(frozen=True)
class TxInfo:
    """Summary of an open transaction (fd_tx_info)."""

    batch: int
    next_layer: int
    state: TxState
    max_blocks_per_seq: int
    new_block_count: int
    token_count: int  # new tokens, the sum of the rows' token counts (= batch for one each)


@dataclass(frozen=True)
class TxRows:
    """Per-row view of an open transaction, in begin's row order."""

    request_ids: np.ndarray  # uint64
    positions: np.ndarray  # int32
    block_ids: np.ndarray  # int32
    offsets: np.ndarray  # int32
    effective_seq_lens: np.ndarray  # int32


@dataclass(frozen=True)
class TxTokens:
    """Per-token view of an open transaction, in packed order (row 0's new
    tokens by position, then row 1's, ...): the order of the layer writes."""

    positions: np.ndarray  # int32
    block_ids: np.ndarray  # int32
    offsets: np.ndarray  # int32


@dataclass(frozen=True)
class LayerStorage:
    """Where one layer's K and V live (owned by the cache until it closes)."""

    k: int  # address
    v: int  # address
    strides: Tuple[int, int, int, int]  # elements: block, head, token, dim


def _ids(request_ids: Iterable[int]) -> np.ndarray:
    return host_index_array(request_ids, "request_ids", np.uint64)


def _rid(request_id: int) -> int:
    """A request id as uint64, refusing values ctypes would silently wrap."""
    value = int(request_id)
    if not 0 <= value < 1 << 64:
        raise argument_error(f"request_id must lie in [0, 2**64), got {value}")
    return value


def _ids_ptr(arr: np.ndarray) -> Any:
    return arr.ctypes.data_as(_U64P)


def _row_counts(values: Iterable[int], name: str, rows: int) -> np.ndarray:
    """One uint32 count per row (token_counts, keep_counts), host memory."""
    arr = host_index_array(values, name, np.uint32)
    if arr.shape[0] != rows:
        raise argument_error(f"{name}: expected {rows} entries (one per row), got {arr.shape[0]}")
    return arr


class Cache:
    """A paged KV cache (fd_cache).

    Use as a context manager or call :meth:`close`. The C handle is externally
    synchronised; this wrapper serialises calls with a lock, so a Cache may be
    shared between Python threads. Every failing call raises
    :class:`~flashdec.FlashDecError` and, as in C, changes nothing.

    Streams (CUDA caches): every method that reads or writes device memory
    takes ``stream=`` (an int ``cudaStream_t`` handle, 0 for the legacy
    default stream, or a ``torch.cuda.Stream``; default: torch's current
    stream of the device) and enqueues its work there; the others
    (requests, :meth:`export`, :meth:`begin`, commit/abort, metrics) are host
    bookkeeping. Creation clears owned storage on a private stream and waits
    for it, so a new cache is ready for any stream; external storage is not
    touched at creation.
    """

    def __init__(
        self,
        config: Optional[CacheConfig] = None,
        *,
        k_storage: Any = None,
        v_storage: Any = None,
        k_scales: Optional[Sequence[float]] = None,
        v_scales: Optional[Sequence[float]] = None,
        **overrides: Any,
    ) -> None:
        """Creates a cache from ``config`` (default: library defaults) with
        ``overrides`` applied, e.g. ``Cache(num_layers=2, head_dim=64)``.

        ``k_storage`` and ``v_storage`` (both or neither) make the cache manage
        blocks inside memory the caller already owns instead of allocating its
        own: writable arrays of the cache's dtype and device, shaped
        [num_layers, max_blocks, num_kv_heads, block_size, head_dim]
        (dim-major: [.., head_dim, block_size]), any strides with the layout's
        contiguous axis at 1, equal for K and V. The cache does not clear
        them and keeps a reference to both until it closes.

        FP8 caches (``dtype=DType.FP8_E4M3`` or ``FP8_E5M2``, with
        ``input_dtype`` F16/BF16, or F32 on the CPU): ``k_scales`` and
        ``v_scales`` are the per-layer dequantisation scales (num_layers
        floats each, finite and > 0; None: all 1), copied at creation;
        replace them later with :meth:`set_kv_scales`. Writes store
        saturate(x / scale) rounded to nearest even (docs/semantics.md S1.1).
        """
        self._handle: Optional[int] = None
        self._lock = threading.RLock()
        # Engines borrowing this cache: closed before the cache is destroyed,
        # since the C engine must not outlive its cache.
        self._dependents: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._storage: Tuple[Any, ...] = ()
        cfg = dataclasses.replace(config or CacheConfig(), **overrides)
        c = cfg.to_c()
        if k_storage is not None or v_storage is not None:
            self._storage = _set_external_storage(c, cfg, k_storage, v_storage)
        scales = [_scale_array(x, name, cfg.num_layers) for x, name in ((k_scales, "k_scales"), (v_scales, "v_scales"))]
        c.k_scales, c.v_scales = (None if a is None else a.ctypes.data for a in scales)
        handle = ctypes.c_void_p()
        check(_lib.fd_cache_create(ctypes.byref(c), ctypes.byref(handle)))
        self._handle = handle.value
        self._config = self._read_config()

    # -- lifecycle -------------------------------------------------------
    def close(self) -> None:
        """Destroys the cache (idempotent). Any open transaction is discarded."""
        with self._lock:
            for dependent in list(self._dependents):
                dependent.close()
            handle, self._handle = self._handle, None
            if handle is not None:
                _lib.fd_cache_destroy(handle)
            self._storage = ()  # external storage is the caller's again

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # Backstop only: deterministic release is close() / `with`.
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _h(self) -> int:
        if self._handle is None:
            raise FlashDecError(Status.INVALID_STATE, "cache is closed")
        return self._handle

    def _call(self, fn: Any, *args: Any) -> None:
        with self._lock:
            check(fn(self._h(), *args))

    def _read_config(self) -> CacheConfig:
        c = _lib.fd_cache_config()
        c.struct_size = ctypes.sizeof(c)
        self._call(_lib.fd_cache_get_config, ctypes.byref(c))
        self._external = bool(c.k_storage)
        return CacheConfig.from_c(c)

    @property
    def external_storage(self) -> bool:
        """True when K/V live in caller storage (``k_storage``/``v_storage``)."""
        return self._external

    @property
    def config(self) -> CacheConfig:
        """The configuration with defaults resolved (fd_cache_get_config)."""
        return dataclasses.replace(self._config)

    # -- requests --------------------------------------------------------
    def add_request(self, request_id: int) -> None:
        self._call(_lib.fd_cache_add_request, _rid(request_id))

    def finish_request(self, request_id: int) -> None:
        self._call(_lib.fd_cache_finish_request, _rid(request_id))

    def cancel_request(self, request_id: int) -> None:
        self._call(_lib.fd_cache_cancel_request, _rid(request_id))

    def request_state(self, request_id: int) -> RequestState:
        s = ctypes.c_int32(0)
        self._call(_lib.fd_cache_request_state, _rid(request_id), ctypes.byref(s))
        return RequestState(s.value)

    def blocks_needed(
        self, request_ids: Sequence[int], *, token_counts: Optional[Sequence[int]] = None
    ) -> Tuple[int, int]:
        """(blocks needed to grow every row by one token, or row i by
        ``token_counts[i]`` tokens as :meth:`begin` with the same lists
        would (fd_cache_blocks_needed_multi), free blocks now)."""
        ids = _ids(request_ids)
        needed, free = ctypes.c_uint32(0), ctypes.c_uint32(0)
        if token_counts is None:
            self._call(_lib.fd_cache_blocks_needed, _ids_ptr(ids), len(ids), ctypes.byref(needed), ctypes.byref(free))
        else:
            counts = _row_counts(token_counts, "token_counts", len(ids))
            self._call(
                _lib.fd_cache_blocks_needed_multi, _ids_ptr(ids), counts.ctypes.data, len(ids),
                ctypes.byref(needed), ctypes.byref(free),
            )  # fmt: skip
        return int(needed.value), int(free.value)

    def max_blocks_per_seq(self, request_ids: Sequence[int]) -> int:
        ids = _ids(request_ids)
        n = ctypes.c_uint32(0)
        self._call(_lib.fd_cache_max_blocks_per_seq, _ids_ptr(ids), len(ids), ctypes.byref(n))
        return int(n.value)

    def export(self, request_ids: Sequence[int], table_stride: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """(block_tables int32 [n, table_stride] padded with -1, seq_lens int32 [n]).

        table_stride defaults to :meth:`max_blocks_per_seq` (at least 1).
        """
        ids = _ids(request_ids)
        with self._lock:
            if table_stride is None:
                table_stride = max(1, self.max_blocks_per_seq(ids))
            tables = np.empty((len(ids), int(table_stride)), dtype=np.int32)
            lens = np.empty(len(ids), dtype=np.int32)
            self._call(
                _lib.fd_cache_export, _ids_ptr(ids), len(ids), int(table_stride),
                tables.ctypes.data, lens.ctypes.data,
            )  # fmt: skip
        return tables, lens

    @property
    def state_version(self) -> int:
        v = ctypes.c_uint64(0)
        self._call(_lib.fd_cache_state_version, ctypes.byref(v))
        return int(v.value)

    def layer_storage(self, layer: int) -> LayerStorage:
        """Raw addresses and element strides of a layer's K/V (for fd_decode or
        custom kernels). Valid until the cache closes."""
        k, v = ctypes.c_void_p(), ctypes.c_void_p()
        strides = (ctypes.c_int64 * 4)()
        self._call(_lib.fd_cache_layer_storage, int(layer), ctypes.byref(k), ctypes.byref(v), strides)
        return LayerStorage(int(k.value or 0), int(v.value or 0), tuple(int(s) for s in strides))  # type: ignore[arg-type]

    def layer_arrays(self, layer: int) -> Tuple[Any, Any]:
        """Zero-copy views of the cache's own K and V storage for ``layer``,
        shaped [max_blocks, num_kv_heads, block_size, head_dim] (token-major)
        or [max_blocks, num_kv_heads, head_dim, block_size] (dim-major), with
        the storage's strides (external storage: the caller's strides).

        CPU cache: read-only numpy arrays (bf16 as uint16 bits, FP8 as uint8
        bits). CUDA cache: torch tensors on the cache's device (float32,
        float16, bfloat16, float8_e4m3fn or float8_e5m2),
        built through ``__cuda_array_interface__``; each keeps this Cache
        object alive while it lives. Writing through them bypasses the cache's
        bookkeeping: do not, except into blocks you own.

        The views alias cache memory: :meth:`close` frees it (owned storage),
        after which they must not be used. Creating a view enqueues nothing.
        Streams: a CUDA view shows a write once the stream the write ran on
        (``stream=`` of :meth:`Transaction.write_layer` etc.) reaches it; read
        on that stream or order your stream after it (torch events).
        """
        cfg = self._config
        st = self.layer_storage(layer)
        if cfg.layout == Layout.TOKEN_MAJOR:
            shape = (cfg.max_blocks, cfg.num_kv_heads, cfg.block_size, cfg.head_dim)
            strides = (st.strides[0], st.strides[1], st.strides[2], st.strides[3])
        else:
            shape = (cfg.max_blocks, cfg.num_kv_heads, cfg.head_dim, cfg.block_size)
            strides = (st.strides[0], st.strides[1], st.strides[3], st.strides[2])
        if cfg.device.type == DeviceType.CUDA:
            from ._cuda import device_view

            k = device_view(st.k, shape, strides, cfg.dtype, cfg.device.ordinal, self)
            v = device_view(st.v, shape, strides, cfg.dtype, cfg.device.ordinal, self)
            return k, v
        if cfg.device.type != DeviceType.CPU:
            raise argument_error(f"layer_arrays: unsupported device type {cfg.device.type}")
        from ._arrays import NUMPY_DTYPE

        dt = NUMPY_DTYPE[cfg.dtype]
        out = []
        for addr in (st.k, st.v):
            extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
            raw = (ctypes.c_byte * (extent * dt.itemsize)).from_address(addr)
            arr = np.lib.stride_tricks.as_strided(
                np.frombuffer(raw, dtype=dt), shape=shape, strides=tuple(s * dt.itemsize for s in strides)
            )
            arr.flags.writeable = False
            out.append(arr)
        return out[0], out[1]

    def _token_buffer(self, x: Any, name: str, rows: int) -> Any:
        """K or V of ``rows`` tokens as layer writes take them (the cache's input_dtype)."""
        cfg = self._config
        return tensor(
            x, name, dtype=cfg.resolved_input_dtype, shape=(rows, cfg.num_kv_heads, cfg.head_dim), device=cfg.device
        )

    # -- FP8 scales --------------------------------------------------------
    def kv_scales(self) -> Tuple[np.ndarray, np.ndarray]:
        """(k_scales, v_scales): the per-layer dequantisation scales, float32
        [num_layers] each (fd_cache_get_kv_scales); all 1 for a cache that is
        not FP8."""
        n = self._config.num_layers
        k, v = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32)
        self._call(_lib.fd_cache_get_kv_scales, k.ctypes.data, v.ctypes.data)
        return k, v

    def set_kv_scales(self, k_scales: Sequence[float], v_scales: Sequence[float]) -> None:
        """Replaces an FP8 cache's per-layer scales (fd_cache_set_kv_scales),
        num_layers floats each, finite and > 0: later writes quantise with
        them and stored tokens are read with them (their bytes do not change).
        Refused while a transaction is open (INVALID_STATE), for a cache that
        is not FP8 (INVALID_STATE) and for a bad entry (INVALID_ARGUMENT
        naming it); nothing changes then."""
        n = self._config.num_layers
        k = _scale_array(k_scales, "k_scales", n)
        v = _scale_array(v_scales, "v_scales", n)
        self._call(_lib.fd_cache_set_kv_scales, k.ctypes.data, v.ctypes.data)

    def append(self, request_ids: Sequence[int], k: Any, v: Any, stream: Any = None) -> None:
        """Legacy single-layer append (one token per request; num_layers == 1).
        k, v: [len(request_ids), num_kv_heads, head_dim] in the cache's
        input_dtype and device memory. CUDA: k and v are read on ``stream`` (default:
        torch's current stream of k), where the write is enqueued; the call
        returns without waiting."""
        ids = _ids(request_ids)
        kb = self._token_buffer(k, "k", len(ids))
        vb = self._token_buffer(v, "v", len(ids))
        self._call(_lib.fd_cache_append, _ids_ptr(ids), len(ids), kb.ptr, vb.ptr, stream_for([kb, vb], stream))

    def metrics(self) -> Any:
        """A :class:`Metrics` snapshot."""
        m = _lib.fd_cache_metrics()
        m.struct_size = ctypes.sizeof(m)
        self._call(_lib.fd_cache_metrics_get, ctypes.byref(m))
        return Metrics(**{f.name: getattr(m, f.name) for f in dataclasses.fields(Metrics)})

    def validate(self) -> None:
        """Checks every invariant (S7); raises FlashDecError(INVARIANT) naming
        the first violation."""
        self._call(_lib.fd_cache_validate)

    def async_error(self) -> Optional[FlashDecError]:
        """The first asynchronous device fault of work this cache enqueued
        (fd_cache_async_error), as an error value, or None when there is none.
        Never blocks; a CPU cache always returns None."""
        with self._lock:
            status = _lib.fd_cache_async_error(self._h())
            if status == Status.OK:
                return None
            return FlashDecError(status, _lib.fd_last_error_message().decode(errors="replace"))

    def _async_dest(self, x: Any, name: str, shape: Tuple[Optional[int], ...]) -> Optional[Buffer]:
        if x is None:
            return None
        return index_tensor(x, name, kind="int32", shape=shape, device=self._config.device, writable=True)

    def export_async(
        self,
        request_ids: Sequence[int],
        block_tables: Any = None,
        seq_lens: Any = None,
        *,
        stream: Any = None,
    ) -> None:
        """:meth:`export` into caller buffers on the cache's device
        (fd_cache_export_async): int32 ``block_tables`` [n, table_stride] and
        ``seq_lens`` [n], either may be None. For a CUDA cache they are CUDA
        tensors written asynchronously on ``stream`` (default: torch's current
        stream of the tensors; an int handle or a torch.cuda.Stream); for a
        CPU cache, host arrays written before return. On failure nothing is
        written (nor enqueued)."""
        ids = _ids(request_ids)
        bt = self._async_dest(block_tables, "block_tables", (len(ids), None))
        sl = self._async_dest(seq_lens, "seq_lens", (len(ids),))
        stride = bt.shape[1] if bt is not None else 0
        self._call(
            _lib.fd_cache_export_async, _ids_ptr(ids), len(ids), stride,
            bt.ptr if bt is not None else None, sl.ptr if sl is not None else None,
            stream_for([b for b in (bt, sl) if b is not None], stream),
        )  # fmt: skip

    def truncate(self, request_ids: Sequence[int], seq_lens: Sequence[int]) -> None:
        """Shortens committed requests to ``seq_lens`` (fd_cache_truncate,
        S5.3): each at most the request's seq_len and not into an attached
        prefix. Blocks past the new lengths go back to the free list; all or
        nothing for the batch."""
        ids = _ids(request_ids)
        lens = host_index_array(seq_lens, "seq_lens", np.int32)
        if lens.shape[0] != len(ids):
            raise argument_error(f"seq_lens: expected {len(ids)} entries (one per request), got {lens.shape[0]}")
        self._call(_lib.fd_cache_truncate, _ids_ptr(ids), lens.ctypes.data, len(ids))

    # -- transactions ----------------------------------------------------
    def begin(self, request_ids: Sequence[int], *, token_counts: Optional[Sequence[int]] = None) -> "Transaction":
        """Opens a transaction for one new token of each listed request
        (fd_tx_begin), or for ``token_counts[i] >= 1`` tokens of request i
        (fd_tx_begin_multi, S5: a prompt chunk or speculative draft tokens).
        The layer writes then take the transaction's ``info().token_count``
        tokens packed in row order."""
        ids = _ids(request_ids)
        tx = _lib.fd_tx()
        if token_counts is None:
            self._call(_lib.fd_tx_begin, _ids_ptr(ids), len(ids), ctypes.byref(tx))
        else:
            counts = _row_counts(token_counts, "token_counts", len(ids))
            self._call(_lib.fd_tx_begin_multi, _ids_ptr(ids), counts.ctypes.data, len(ids), ctypes.byref(tx))
        return Transaction(self, tx)

    # -- prefixes --------------------------------------------------------
    def register_prefix(self, prefix_id: str, k_blocks: Any, v_blocks: Any, stream: Any = None) -> None:
        """Registers an immutable shared prefix. k_blocks, v_blocks:
        [num_layers, n, num_kv_heads, block_size, head_dim] (dim-major caches:
        [.., head_dim, block_size]) in the cache's dtype and device memory.
        CUDA: copied on ``stream`` (default: torch's current stream of
        k_blocks), which the library synchronises before returning, so the
        blocks are in place for any stream and k_blocks may be reused."""
        cfg = self._config
        inner = (cfg.block_size, cfg.head_dim) if cfg.layout == Layout.TOKEN_MAJOR else (cfg.head_dim, cfg.block_size)
        shape = (cfg.num_layers, None, cfg.num_kv_heads) + inner
        kb = tensor(k_blocks, "k_blocks", dtype=cfg.dtype, shape=shape, device=cfg.device)
        vb = tensor(v_blocks, "v_blocks", dtype=cfg.dtype, shape=kb.shape, device=cfg.device)
        self._call(
            _lib.fd_prefix_register, _prefix_id(prefix_id), kb.ptr, vb.ptr, kb.shape[1],
            stream_for([kb, vb], stream),
        )  # fmt: skip

    def attach_prefix(self, request_id: int, prefix_id: str) -> None:
        self._call(_lib.fd_prefix_attach, _rid(request_id), _prefix_id(prefix_id))

    def evict_prefix(self, prefix_id: str) -> None:
        self._call(_lib.fd_prefix_evict, _prefix_id(prefix_id))

    def prefix_info(self, prefix_id: str) -> PrefixInfo:
        info = _lib.fd_prefix_info()
        info.struct_size = ctypes.sizeof(info)
        self._call(_lib.fd_prefix_get_info, _prefix_id(prefix_id), ctypes.byref(info))
        return PrefixInfo(info.num_blocks, info.ref_count, info.last_use, info.first_block)

    # -- decode over the cache -------------------------------------------
    def decode(
        self,
        layer: int,
        q: Any,
        request_ids: Optional[Sequence[int]] = None,
        *,
        tx: Optional["Transaction"] = None,
        out: Any = None,
        stream: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Decode attention of ``q`` ([rows, num_q_heads, head_dim]) over this cache's ``layer`` for the listed requests' committed
        tokens, or, with ``tx``, for the transaction's rows including their new
        token (effective_seq_lens). Returns ``out`` (allocated when None).
        Extra keyword arguments go to :func:`flashdec.decode`, including
        ``q_indptr`` (multi-token queries, the rows' last tokens: q is then
        [q_indptr[-1], num_q_heads, head_dim]; on a CUDA cache a CUDA tensor,
        with ``max_q_len_hint``); for a transaction from ``begin(...,
        token_counts=)`` that is its :meth:`Transaction.token_indptr_async`
        (attention over its tokens).

        Element types: q's own (f32, f16 or bf16 on a CPU cache, over any
        cache dtype; CUDA serves what its kernels do, e.g. q = out = the
        cache's input_dtype over FP8 E4M3 or E5M2); out is q's unless ``out`` or
        ``out_dtype=`` says otherwise. ``k_scale`` / ``v_scale`` default to
        the layer's current scales (:meth:`kv_scales`; 1 for a cache that is
        not FP8). The attention variants ``logit_softcap=``,
        ``sliding_window=`` and ``sinks=`` (float32 [num_q_heads], host
        array on a CPU cache, CUDA tensor on a CUDA cache) are
        :func:`flashdec.decode`'s, per call (so per layer).

        CPU cache: q/out are host arrays; runs before return. CUDA cache: q/out
        are torch CUDA tensors on the cache's device; the block tables and
        lengths are produced on the device (:meth:`export_async` /
        :meth:`Transaction.block_tables_async`) into int32 tensors, the
        split-KV workspace is a torch uint8 tensor of
        :func:`flashdec.decode_workspace_size` bytes, and all of it plus
        fd_decode is enqueued on ``stream`` (default: torch's current stream;
        an int handle or a torch.cuda.Stream), with no host synchronisation.
        Temporaries and an allocated ``out`` are allocated on that stream.
        The tokens it reads must have been written on ``stream`` or on a
        stream ordered before it; ``out`` is ready when ``stream`` gets there.
        """
        if (request_ids is None) == (tx is None):
            raise argument_error("pass exactly one of request_ids or tx")
        kwargs = self._layer_decode_options(layer, kwargs)
        if self._config.device.type == DeviceType.CUDA:
            return self._decode_cuda(layer, q, request_ids, tx, out, stream, kwargs)
        k, v = self.layer_arrays(layer)
        with self._lock:
            if tx is not None:
                rows = tx.rows()
                tables = tx.block_tables()
                lens = rows.effective_seq_lens
            else:
                tables, lens = self.export(request_ids)  # type: ignore[arg-type]
            return _decode(q, k, v, tables, lens, out, layout=self._config.layout, stream=stream, **kwargs)

    def _layer_decode_options(self, layer: int, kwargs: dict) -> dict:
        """decode's keyword arguments with the cache's K/V type and, unless
        given, the layer's scales."""
        out = dict(kwargs, kv_dtype=self._config.dtype)
        if "k_scale" not in out or "v_scale" not in out:
            if not 0 <= int(layer) < self._config.num_layers:
                raise argument_error(f"layer {layer} out of range [0, {self._config.num_layers})")
            k, v = self.kv_scales()
            out.setdefault("k_scale", float(k[int(layer)]))
            out.setdefault("v_scale", float(v[int(layer)]))
        return out

    def _decode_cuda(
        self, layer: int, q: Any, request_ids: Any, tx: Optional["Transaction"], out: Any, stream: Any, kwargs: dict
    ) -> Any:
        from ._cuda import torch_dtype, torch_module, torch_stream

        torch = torch_module()
        cfg = self._config
        qb = tensor(q, "q", shape=(None, None, cfg.head_dim), device=cfg.device)
        device = torch.device("cuda", cfg.device.ordinal)
        s = torch_stream(stream, device)
        k, v = self.layer_arrays(layer)
        with self._lock, torch.cuda.stream(s):
            if tx is not None:
                info = tx.info()
                rows, stride = info.batch, max(1, info.max_blocks_per_seq)
            else:
                ids = _ids(request_ids)
                rows, stride = len(ids), max(1, self.max_blocks_per_seq(ids))
            multi = kwargs.get("q_indptr") is not None
            if not multi and qb.shape[0] != rows:
                raise argument_error(f"q: expected {rows} rows (one per request), got {qb.shape[0]}")
            tables = torch.empty((rows, stride), dtype=torch.int32, device=device)
            lens = torch.empty((rows,), dtype=torch.int32, device=device)
            if tx is not None:
                tx.block_tables_async(tables, lens, stream=s)
            else:
                self.export_async(ids, tables, lens, stream=s)
            if out is None:
                out = torch.empty(qb.shape, dtype=torch_dtype(kwargs.get("out_dtype") or qb.dtype), device=device)
            workspace = kwargs.pop("workspace", None)
            if workspace is None:
                size = _decode_workspace_size(
                    q, k, v, tables, lens, layout=cfg.layout, out=out,
                    num_splits=kwargs.get("num_splits", 0), max_seq_len_hint=kwargs.get("max_seq_len_hint", 0),
                    sliding_window=kwargs.get("sliding_window", 0), q_indptr=kwargs.get("q_indptr"),
                    max_q_len_hint=kwargs.get("max_q_len_hint", 0),
                )  # fmt: skip
                if size:
                    workspace = torch.empty((size,), dtype=torch.uint8, device=device)
            return _decode(q, k, v, tables, lens, out, layout=cfg.layout, workspace=workspace, stream=s, **kwargs)


def _set_external_storage(c: Any, cfg: CacheConfig, k: Any, v: Any) -> Tuple[Any, ...]:
    """Points ``c`` at caller K/V storage; returns the buffers' owners. A
    missing half is passed as NULL so that the library reports it."""
    inner = (cfg.block_size, cfg.head_dim) if cfg.layout == Layout.TOKEN_MAJOR else (cfg.head_dim, cfg.block_size)
    shape = (cfg.num_layers, cfg.max_blocks, cfg.num_kv_heads) + inner
    bufs = []
    for x, name in ((k, "k_storage"), (v, "v_storage")):
        if x is not None:
            bufs.append(
                tensor(x, name, dtype=cfg.dtype, shape=shape, writable=True, contiguous=False, device=cfg.device)
            )
    first = bufs[0]
    if len(bufs) == 2 and bufs[1].strides != first.strides:
        raise argument_error(f"v_storage: strides {bufs[1].strides} must equal k_storage's {first.strides}")
    s = first.strides
    c.k_storage = first.ptr if k is not None else None
    c.v_storage = bufs[-1].ptr if v is not None else None
    c.stride_layer, c.stride_block, c.stride_head = s[0], s[1], s[2]
    if cfg.layout == Layout.TOKEN_MAJOR:
        c.stride_token, c.stride_dim = s[3], s[4]
    else:
        c.stride_dim, c.stride_token = s[3], s[4]
    return tuple(b.owner for b in bufs)


def _scale_array(x: Any, name: str, num_layers: int) -> Optional[np.ndarray]:
    """Per-layer scales as the float32 [num_layers] host array C reads (None
    stays None); the values are the library's to check, naming the entry."""
    if x is None:
        return None
    if is_torch_tensor(x):
        x = x.detach().cpu().numpy()
    arr = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if arr.shape[0] != num_layers:
        raise argument_error(f"{name}: expected {num_layers} entries (one per layer), got {arr.shape[0]}")
    return arr


def _prefix_id(prefix_id: str) -> bytes:
    if not isinstance(prefix_id, str):
        raise argument_error(f"prefix_id must be a str, got {type(prefix_id).__name__}")
    raw = prefix_id.encode()
    if b"\0" in raw:
        raise argument_error("prefix_id must not contain NUL characters")
    return raw


class Transaction:
    """New tokens for a batch of requests (one each, or ``token_counts`` from
    :meth:`Cache.begin`), written layer by layer (fd_tx).

    A value handle: misuse after commit/abort is reported by the library
    (INVALID_STATE "already committed", STALE_HANDLE, NOT_FOUND). As a context
    manager it aborts on exit unless committed or aborted inside the block.
    """

    def __init__(self, cache: Cache, tx: _lib.fd_tx) -> None:
        self.cache = cache
        self._tx = _lib.fd_tx(tx.id, tx.cache_version)
        self._finished = False

    @property
    def id(self) -> int:
        return int(self._tx.id)

    @property
    def cache_version(self) -> int:
        return int(self._tx.cache_version)

    def _rows(self) -> int:
        return self.info().batch

    def _tokens(self) -> int:
        return self.info().token_count

    def write_layer(self, layer: int, k: Any, v: Any, stream: Any = None) -> None:
        """Writes ``layer``'s K and V ([token_count, num_kv_heads, head_dim]
        each, the new tokens packed in row order; token_count = batch for one
        token per row).

        CUDA: k and v are read on ``stream`` (default: torch's current stream
        of k; an int handle or a torch.cuda.Stream) and the call returns after
        enqueueing. Every write of a transaction runs on the stream of its
        first write (or one ordered after it): the rows' slots are uploaded
        there. The committed token is in place once that stream reaches the
        last write; later readers (decode, views) run on it or after it."""
        c = self.cache
        with c._lock:
            n = self._tokens()
            kb = c._token_buffer(k, "k", n)
            vb = c._token_buffer(v, "v", n)
            c._call(_lib.fd_tx_write_layer, self._tx, int(layer), kb.ptr, vb.ptr, stream_for([kb, vb], stream))

    def write_layer_rope(
        self,
        layer: int,
        q: Any,
        k: Any,
        v: Any,
        rotary_dim: int,
        rope_base: float = 10000.0,
        q_out: Any = None,
        stream: Any = None,
    ) -> Any:
        """Rotates q and k at each token's position in the cache's
        ``config.rope_style``, writes rotated K and raw V, and returns the
        rotated Q (into ``q_out``, which may be ``q``; when None it is
        allocated, on ``stream`` for CUDA). Streams as :meth:`write_layer`;
        q_out is ready when ``stream`` gets there."""
        c = self.cache
        cfg = c._config
        with c._lock:
            n = self._tokens()
            idt = cfg.resolved_input_dtype
            qb = tensor(q, "q", dtype=idt, shape=(n, None, cfg.head_dim), device=cfg.device)
            kb = c._token_buffer(k, "k", n)
            vb = c._token_buffer(v, "v", n)
            if q_out is None:
                from ._arrays import empty_like_dtype

                q_out = empty_like_dtype(qb.shape, idt, like=q, stream=stream)
            ob = tensor(q_out, "q_out", dtype=idt, shape=qb.shape, writable=True, device=cfg.device)
            c._call(
                _lib.fd_tx_write_layer_rope, self._tx, int(layer), qb.ptr, qb.shape[1], kb.ptr, vb.ptr,
                int(rotary_dim), float(rope_base), ob.ptr, stream_for([qb, kb, ob], stream),
            )  # fmt: skip
        return q_out

    def commit(self, keep_counts: Optional[Sequence[int]] = None) -> None:
        """Publishes the new tokens (fd_tx_commit), or with ``keep_counts``
        only the first ``keep_counts[i]`` of row i (fd_tx_commit_keep, S5.2:
        speculative verify; the other tokens are dropped and blocks holding
        only dropped tokens go back to the free list). On failure the
        transaction stays open."""
        if keep_counts is None:
            self.cache._call(_lib.fd_tx_commit, self._tx)
        else:
            with self.cache._lock:
                keep = _row_counts(keep_counts, "keep_counts", self._rows())
                self.cache._call(_lib.fd_tx_commit_keep, self._tx, keep.ctypes.data, len(keep))
        self._finished = True

    def abort(self) -> None:
        self.cache._call(_lib.fd_tx_abort, self._tx)
        self._finished = True

    def info(self) -> TxInfo:
        i = _lib.fd_tx_info()
        i.struct_size = ctypes.sizeof(i)
        self.cache._call(_lib.fd_tx_get_info, self._tx, ctypes.byref(i))
        return TxInfo(i.batch, i.next_layer, TxState(i.state), i.max_blocks_per_seq, i.new_block_count, i.token_count)

    def rows(self) -> TxRows:
        with self.cache._lock:
            n = self._rows()
            ids = np.empty(n, dtype=np.uint64)
            cols = [np.empty(n, dtype=np.int32) for _ in range(4)]
            self.cache._call(
                _lib.fd_tx_get_rows, self._tx, n, ids.ctypes.data_as(_U64P),
                *(c.ctypes.data_as(_I32P) for c in cols),
            )  # fmt: skip
        return TxRows(ids, *cols)

    def tokens(self) -> TxTokens:
        """Every new token's position, block and offset (fd_tx_get_tokens)."""
        with self.cache._lock:
            n = self._tokens()
            cols = [np.empty(n, dtype=np.int32) for _ in range(3)]
            self.cache._call(_lib.fd_tx_get_tokens, self._tx, n, *(c.ctypes.data_as(_I32P) for c in cols))
        return TxTokens(*cols)

    def block_tables(self, table_stride: Optional[int] = None) -> np.ndarray:
        """int32 [batch, table_stride] tables including the new blocks."""
        with self.cache._lock:
            info = self.info()
            stride = max(1, info.max_blocks_per_seq) if table_stride is None else int(table_stride)
            out = np.empty((info.batch, stride), dtype=np.int32)
            self.cache._call(_lib.fd_tx_block_tables, self._tx, stride, out.ctypes.data)
        return out

    def block_tables_async(
        self, block_tables: Any = None, effective_seq_lens: Any = None, *, stream: Any = None
    ) -> None:
        """:meth:`block_tables` and the rows' effective_seq_lens into caller
        buffers on the cache's device (fd_tx_block_tables_async): int32
        [batch, table_stride] and [batch], either may be None; same device
        and stream rules as :meth:`Cache.export_async`."""
        c = self.cache
        with c._lock:
            n = self._rows()
            bt = c._async_dest(block_tables, "block_tables", (n, None))
            sl = c._async_dest(effective_seq_lens, "effective_seq_lens", (n,))
            stride = bt.shape[1] if bt is not None else 0
            c._call(
                _lib.fd_tx_block_tables_async, self._tx, stride, bt.ptr if bt is not None else None,
                sl.ptr if sl is not None else None, stream_for([b for b in (bt, sl) if b is not None], stream),
            )  # fmt: skip

    def token_indptr_async(self, token_indptr: Any, *, stream: Any = None) -> Any:
        """The rows' query-token offsets (fd_tx_token_indptr_async): int32
        [batch + 1], entry i = the new tokens of rows 0..i-1, ready as
        ``q_indptr`` of :func:`flashdec.decode` over the transaction's
        tokens. Written into ``token_indptr`` on the cache's device with the
        rules of :meth:`Cache.export_async` (None is the library's
        INVALID_ARGUMENT). Returns ``token_indptr``."""
        c = self.cache
        with c._lock:
            ti = c._async_dest(token_indptr, "token_indptr", (self._rows() + 1,))
            bufs = [] if ti is None else [ti]
            c._call(_lib.fd_tx_token_indptr_async, self._tx, None if ti is None else ti.ptr, stream_for(bufs, stream))
        return token_indptr

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._finished or self.cache.closed:
            return
        try:
            self.abort()
        except FlashDecError:
            if exc_type is None:
                raise  # a failing abort with no other error in flight is news

    def __repr__(self) -> str:
        return f"Transaction(id={self.id}, cache_version={self.cache_version})"
