"""Stateless operations: paged decode attention, RoPE, dense reference."""

from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from . import _lib
from ._arrays import Buffer, empty_like_dtype, host_index_array, index_tensor, is_torch_tensor, stream_for, tensor
from .errors import FlashDecError, Status, argument_error, check
from .types import Device, DeviceType, DType, Layout, RopeStyle, _rope_style


def _u32(value: int, name: str) -> int:
    if not 0 <= int(value) <= 0xFFFFFFFF:
        raise argument_error(f"{name} must fit in uint32, got {value}")
    return int(value)


def _kv_geometry(k: Buffer, layout: Layout) -> Tuple[int, int, int, int, Tuple[int, int, int, int]]:
    """(num_blocks, num_kv_heads, block_size, head_dim, strides block/head/token/dim)
    of a 4-D K or V cache array in its layout's natural axis order."""
    if len(k.shape) != 4:
        raise argument_error(f"k_cache: expected 4 dimensions, got shape {list(k.shape)}")
    nb, h, a, b = k.shape
    sb, sh, sa, sbb = k.strides
    if layout == Layout.TOKEN_MAJOR:  # [blocks, heads, block_size, head_dim]
        return nb, h, a, b, (sb, sh, sa, sbb)
    return nb, h, b, a, (sb, sh, sbb, sa)  # [blocks, heads, head_dim, block_size]


def _index_rows(x: Any, name: str, device: Device) -> int:
    """Entries of a 1-D int32 index array (the rows of a multi-token call)."""
    return index_tensor(x, name, kind="int32", shape=(None,), device=device).shape[0]


def _query_offsets(q_indptr: Any, batch: int, device: Device) -> Buffer:
    """q_indptr as the library reads it: int32 [batch + 1] in the memory of
    the call's device (a numpy array or tensor, zero-copy; on the CPU also a
    sequence of ints, copied). Its entries are the library's to check
    (q_indptr[0] = 0, every row at least one token and at most its seq_len)."""
    if not (isinstance(q_indptr, np.ndarray) or is_torch_tensor(q_indptr)):
        q_indptr = host_index_array(q_indptr, "q_indptr", np.int32)
    return index_tensor(q_indptr, "q_indptr", kind="int32", shape=(batch + 1,), device=device)


def _query_tokens(qi: Buffer, batch: int, stream: Any, read_device: bool) -> Optional[int]:
    """q_indptr[batch], the query tokens q and out hold: read from host memory,
    or from device memory only when ``read_device`` (the call waits for its
    stream anyway, check_indices), on the call's stream; None otherwise."""
    if qi.device.type == DeviceType.CPU:
        return ctypes.c_int32.from_address(qi.ptr + 4 * batch).value
    if not read_device:
        return None
    import torch

    from ._cuda import torch_stream

    with torch.cuda.stream(torch_stream(stream, qi.owner.device)):
        return int(qi.owner[batch].item())


class _Decode:
    """Checked fd_decode_params plus the buffers it points into."""

    def __init__(self) -> None:
        self.params = _lib.fd_decode_params()
        _lib.fd_decode_params_init(ctypes.byref(self.params))
        self.keep: list = []


def _build_decode(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    out: Any,
    *,
    layout: Layout,
    sm_scale: float,
    num_splits: int,
    workspace: Any,
    cpu_threads: int,
    max_seq_len_hint: int,
    check_indices: bool,
    stream: Any,
    out_dtype: Optional[DType] = None,
    q_indptr: Any = None,
    max_q_len_hint: int = 0,
    kv_dtype: Optional[DType] = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    logit_softcap: float = 0.0,
    sliding_window: int = 0,
    sinks: Any = None,
    allocate_out: bool = True,
) -> Tuple[_Decode, Any]:
    """fd_decode_params from arrays. The element types come from the arrays
    (q_dtype from q, kv_dtype from k_cache and v_cache, out_dtype from out or
    ``out_dtype``, default q's): combinations the library does not serve are
    its FD_ERR_UNSUPPORTED, naming the field. Without ``allocate_out`` a
    missing ``out`` stays NULL (planning and sizing read no buffer)."""
    layout = Layout(layout)
    qb = tensor(q, "q")
    rows = "batch" if q_indptr is None else "q_indptr[-1]"
    if len(qb.shape) != 3:
        raise argument_error(f"q: expected shape [{rows}, num_q_heads, head_dim], got {list(qb.shape)}")
    tokens, hq, d = qb.shape
    dev = qb.device
    qi: Optional[Buffer] = None
    if q_indptr is None:
        batch = tokens  # one query token per row
    else:
        # Multi-token queries: the rows are seq_lens', q holds q_indptr[-1] tokens.
        batch = _index_rows(seq_lens, "seq_lens", dev)
        qi = _query_offsets(q_indptr, batch, dev)
        total = _query_tokens(qi, batch, stream, read_device=check_indices and allocate_out)
        if total is not None and total != tokens:
            raise argument_error(
                f"q: expected shape [{total}, num_q_heads, head_dim] (q_indptr[-1] = {total} query tokens), "
                f"got {list(qb.shape)}"
            )
    kb = tensor(k_cache, "k_cache", dtype=kv_dtype, contiguous=False, device=dev)
    vb = tensor(v_cache, "v_cache", dtype=kb.dtype, contiguous=False, device=dev)
    if kb.shape != vb.shape or kb.strides != vb.strides:
        raise argument_error(
            f"v_cache: shape {list(vb.shape)} / strides {vb.strides} must equal k_cache's "
            f"{list(kb.shape)} / {kb.strides}"
        )
    nb, hkv, bs, kd, strides = _kv_geometry(kb, layout)
    if kd != d:
        raise argument_error(f"k_cache: head_dim {kd} does not match q's head_dim {d}")
    bt = index_tensor(block_tables, "block_tables", kind="int32", shape=(batch, None), device=dev)
    sl = index_tensor(seq_lens, "seq_lens", kind="int32", shape=(batch,), device=dev)
    odt = DType(qb.dtype if out_dtype is None else out_dtype)
    if out is None and allocate_out:
        out = empty_like_dtype((tokens, hq, d), odt, like=q, stream=stream)
    dec = _Decode()
    dec.keep += [qb, kb, vb, bt, sl]
    p = dec.params
    p.out_dtype = int(odt)
    if out is not None:
        ob = tensor(out, "out", dtype=out_dtype, shape=(tokens, hq, d), writable=True, device=dev)
        p.out_dtype, p.out = int(ob.dtype), ob.ptr
        dec.keep.append(ob)
    p.batch = _u32(batch, "batch")
    p.num_q_heads = _u32(hq, "num_q_heads")
    p.num_kv_heads = _u32(hkv, "num_kv_heads")
    p.head_dim = _u32(d, "head_dim")
    p.q_dtype = int(qb.dtype)
    p.kv_dtype = int(kb.dtype)
    p.layout = int(layout)
    p.block_size = _u32(bs, "block_size")
    p.num_blocks = _u32(nb, "num_blocks")
    p.max_blocks_per_seq = _u32(bt.shape[1], "max_blocks_per_seq")
    p.k_cache, p.v_cache = kb.ptr, vb.ptr
    p.stride_block, p.stride_head, p.stride_token, p.stride_dim = strides
    p.block_tables, p.seq_lens = bt.ptr, sl.ptr
    p.q = qb.ptr
    if qi is not None:
        p.q_indptr = qi.ptr
        dec.keep.append(qi)
    p.sm_scale = float(sm_scale)
    p.k_scale, p.v_scale = float(k_scale), float(v_scale)
    p.logit_softcap, p.sliding_window = float(logit_softcap), int(sliding_window)
    if sinks is not None:
        # [num_q_heads] float32 on q's device, like the other inputs.
        sb = tensor(sinks, "sinks", dtype=DType.F32, shape=(hq,), device=dev)
        p.sinks = sb.ptr
        dec.keep.append(sb)
    p.flags = _lib.FD_DECODE_CHECK_INDICES if check_indices else 0
    p.max_seq_len_hint = int(max_seq_len_hint)
    p.max_q_len_hint = int(max_q_len_hint)
    p.num_splits = int(num_splits)
    p.cpu_threads = _u32(cpu_threads, "cpu_threads")
    if workspace is not None:
        wb = index_tensor(workspace, "workspace", kind="uint8", shape=(None,), device=dev, writable=True)
        p.workspace, p.workspace_size = wb.ptr, wb.shape[0]
        dec.keep.append(wb)
    p.device = dev.to_c()
    p.stream = stream_for(dec.keep, stream)
    return dec, out


def decode(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    out: Any = None,
    *,
    layout: Layout = Layout.TOKEN_MAJOR,
    sm_scale: float = 0.0,
    num_splits: int = 0,
    workspace: Any = None,
    cpu_threads: int = 0,
    max_seq_len_hint: int = 0,
    check_indices: bool = False,
    stream: Any = None,
    out_dtype: Optional[DType] = None,
    q_indptr: Any = None,
    max_q_len_hint: int = 0,
    kv_dtype: Optional[DType] = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    logit_softcap: float = 0.0,
    sliding_window: int = 0,
    sinks: Any = None,
) -> Any:
    """Paged decode attention (fd_decode, docs/semantics.md S2). Returns ``out``.

    Element types come from the arrays: ``q_dtype`` from q, ``kv_dtype`` from
    k_cache/v_cache, ``out_dtype`` from out. The CPU backend serves q and out
    each f32, f16 or bf16 over K/V of any type (f32, f16, bf16, FP8 E4M3/E5M2);
    CUDA serves what its kernels do (q, K/V and out of one type f16/bf16, and
    q = out f16/bf16 over FP8 E4M3 or E5M2); any other combination is
    FlashDecError(UNSUPPORTED) naming the field.

    Args:
        q: [batch, num_q_heads, head_dim] (one query token per row), or
            [q_indptr[-1], num_q_heads, head_dim] with ``q_indptr``;
            float32/float16/bf16 (numpy uint16 or torch.bfloat16). Its device
            (cpu or cuda:n) selects the backend.
        k_cache, v_cache: one layer's K/V storage, 4-D in the layout's axis
            order: token-major [num_blocks, num_kv_heads, block_size, head_dim],
            dim-major [num_blocks, num_kv_heads, head_dim, block_size]. Any
            strides (e.g. a transposed view of vLLM's NHD pages), equal for K
            and V (and one element type); the layout's contiguous axis needs
            stride 1. FP8: torch.float8_e4m3fn / float8_e5m2 tensors, or
            uint8 arrays of raw bits with ``kv_dtype``.
        kv_dtype: the K/V type; None (default): the arrays'. Needed for FP8
            held as uint8 bits (DType.FP8_E4M3 or FP8_E5M2); otherwise it
            must match the arrays.
        k_scale, v_scale: dequantisation scales (S1.1): attention reads K
            as stored x k_scale and V as stored x v_scale; finite and > 0
            (else the library's INVALID_ARGUMENT naming the field); default
            1. Any kv_dtype takes them.
        logit_softcap, sliding_window, sinks: attention variants (S2.3),
            each off by default (0, 0, None) and combinable:
            ``logit_softcap`` > 0 turns every score s into
            cap * tanh(s / cap); ``sliding_window`` w > 0 lets a query at
            position p see positions p - w + 1 .. p only (with q_indptr,
            per query token); ``sinks`` is float32 [num_q_heads] logits on
            q's device (a numpy array on the CPU, a CUDA tensor on CUDA),
            -inf meaning no sink. The binding checks the sinks' type, length
            and device; the library the values (INVALID_ARGUMENT naming the
            field; a NaN sink names its entry, on CUDA only with
            check_indices).
        block_tables: int32 [batch, max_blocks_per_seq], -1 for unused slots.
        seq_lens: int32 [batch], K/V tokens per row (the row's query tokens
            included).
        out: written in place when given (q's shape, same device as q);
            allocated otherwise, of ``out_dtype`` (default q's).
        workspace: uint8 1-D scratch for split-KV (see decode_workspace_size).
        q_indptr: multi-token queries: int32 [batch + 1] offsets into q on
            q's device (a numpy array or tensor; on the CPU also a sequence
            of ints), q_indptr[0] = 0; row r's query tokens are
            q[q_indptr[r]:q_indptr[r + 1]], at least one and at most
            seq_lens[r]. batch is then len(seq_lens) and q/out hold
            q_indptr[-1] tokens. Attention is causal: a row's queries are
            its last tokens, query j of a row of n queries sees K/V positions
            <= seq_lens[r] - n + j. None (default): one token per row, the
            same bits as one-token rows through q_indptr. A bad entry (a row
            of no tokens, or more than its seq_len) is the library's
            INVALID_ARGUMENT naming the row (on CUDA where indices are
            checked). On the CPU the binding checks q's shape against
            q_indptr[-1]; on CUDA it reads that device value only with
            check_indices (on ``stream``): otherwise q.shape[0] must be it.
        max_q_len_hint: upper bound of query tokens per row (0: none given);
            longer rows are INVALID_ARGUMENT where indices are checked. With
            q_indptr on CUDA it is required and sizes the launch (rows of
            more query tokens than one tile holds run as several tiles).
        stream: CUDA stream (an int handle, 0 for the legacy default stream,
            or a torch.cuda.Stream); default torch's current stream of q.
            Everything is read and written on it with no host wait (unless
            check_indices, which waits for it); an allocated ``out`` is
            allocated on it and ready when the stream gets there. Inputs
            produced on another stream must be ordered before it.
    Raises:
        FlashDecError: INVALID_ARGUMENT (from the binding's checks or the
            library's), UNSUPPORTED, NO_DEVICE, DEVICE.
    """
    dec, out = _build_decode(
        q, k_cache, v_cache, block_tables, seq_lens, out,
        layout=layout, sm_scale=sm_scale, num_splits=num_splits, workspace=workspace,
        cpu_threads=cpu_threads, max_seq_len_hint=max_seq_len_hint,
        check_indices=check_indices, stream=stream, out_dtype=out_dtype, q_indptr=q_indptr,
        max_q_len_hint=max_q_len_hint, kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale,
        logit_softcap=logit_softcap, sliding_window=sliding_window, sinks=sinks,
    )  # fmt: skip
    check(_lib.fd_decode(ctypes.byref(dec.params)))
    return out


def decode_workspace_size(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    *,
    layout: Layout = Layout.TOKEN_MAJOR,
    num_splits: int = 0,
    max_seq_len_hint: int = 0,
    out: Any = None,
    out_dtype: Optional[DType] = None,
    q_indptr: Any = None,
    max_q_len_hint: int = 0,
    kv_dtype: Optional[DType] = None,
    logit_softcap: float = 0.0,
    sliding_window: int = 0,
    sinks: Any = None,
) -> int:
    """Workspace bytes :func:`decode` needs for these arguments (host only:
    nothing is read from the arrays but a host ``q_indptr[-1]``, nothing
    allocated or enqueued). The variants are :func:`decode`'s:
    ``sliding_window`` can shrink the split layout (only visible tokens are
    counted), so pass the call's."""
    dec, _ = _build_decode(
        q, k_cache, v_cache, block_tables, seq_lens, out,
        layout=layout, sm_scale=0.0, num_splits=num_splits, workspace=None, cpu_threads=0,
        max_seq_len_hint=max_seq_len_hint, check_indices=False, stream=None, out_dtype=out_dtype,
        q_indptr=q_indptr, max_q_len_hint=max_q_len_hint, kv_dtype=kv_dtype,
        logit_softcap=logit_softcap, sliding_window=sliding_window, sinks=sinks, allocate_out=False,
    )  # fmt: skip
    n = ctypes.c_size_t(0)
    check(_lib.fd_decode_workspace_size(ctypes.byref(dec.params), ctypes.byref(n)))
    return int(n.value)


def _new_workspace(size: int, like: Any, stream: Any) -> Any:
    """uint8 scratch of ``size`` bytes where ``like`` lives: numpy on the host,
    torch on ``like``'s CUDA device (allocated on ``stream``, as outputs are)."""
    if is_torch_tensor(like) and like.device.type == "cuda":
        import torch

        from ._cuda import torch_stream

        with torch.cuda.stream(torch_stream(stream, like.device)):
            return torch.empty((size,), dtype=torch.uint8, device=like.device)
    return np.empty((size,), dtype=np.uint8)


class DecodePlan:
    """A decode plan (fd_decode_plan): the split-KV work list of one step,
    made once on the host and used by every layer's :meth:`run`.

    Made from the arrays of a call as :func:`decode` takes them: only their
    shapes, strides, element types and device are read (plus the options
    below), never their contents (but a host ``q_indptr[-1]``). With
    ``host_seq_lens`` (the step's exact K/V lengths, host integers, one per
    row) the split-KV layout is chosen from them; otherwise from
    ``max_seq_len_hint``, as :func:`decode` does.

    ``q_indptr`` (multi-token queries, as in :func:`decode`) is the step's:
    every :meth:`run` uses it unless the run passes its own, and q/out hold
    ``q_indptr[-1]`` tokens (it also makes batch ``len(seq_lens)`` for the
    plan). On CUDA the plan is sized by ``max_q_len_hint`` (required with
    q_indptr there) and reads no q_indptr entry, so the device tensor may be
    filled after planning, or each run may pass its own.

    :meth:`run` takes the arrays of each layer; the planned parts (shapes,
    element types, layout, strides, device and the options) must be the same
    as at planning, or the library refuses with INVALID_ARGUMENT naming the
    field that differs; the pointers and ``stream`` may change every call.
    A plan is immutable and may run on several threads at once, each with its
    own buffers. It holds no device memory: :meth:`close` (or ``with``) frees
    it at once, even while work enqueued with it is pending.

    Example::

        with flashdec.DecodePlan(q, k[0], v[0], tables, lens, host_seq_lens=lens) as plan:
            for layer in range(num_layers):
                out[layer] = plan.run(q, k[layer], v[layer], tables, lens)
    """

    def __init__(
        self,
        q: Any,
        k_cache: Any,
        v_cache: Any,
        block_tables: Any,
        seq_lens: Any,
        out: Any = None,
        *,
        host_seq_lens: Optional[Sequence[int]] = None,
        layout: Layout = Layout.TOKEN_MAJOR,
        sm_scale: float = 0.0,
        num_splits: int = 0,
        cpu_threads: int = 0,
        max_seq_len_hint: int = 0,
        check_indices: bool = False,
        out_dtype: Optional[DType] = None,
        q_indptr: Any = None,
        max_q_len_hint: int = 0,
        kv_dtype: Optional[DType] = None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        logit_softcap: float = 0.0,
        sliding_window: int = 0,
        sinks: Any = None,
    ) -> None:
        self._handle: Optional[int] = None
        self._options: Dict[str, Any] = dict(
            layout=Layout(layout), sm_scale=sm_scale, num_splits=num_splits, cpu_threads=cpu_threads,
            max_seq_len_hint=max_seq_len_hint, check_indices=check_indices, out_dtype=out_dtype,
            q_indptr=q_indptr, max_q_len_hint=max_q_len_hint, kv_dtype=kv_dtype, k_scale=k_scale,
            v_scale=v_scale, logit_softcap=logit_softcap, sliding_window=sliding_window, sinks=sinks,
        )  # fmt: skip
        dec, _ = _build_decode(
            q, k_cache, v_cache, block_tables, seq_lens, out, workspace=None, stream=None,
            allocate_out=False, **self._options,
        )  # fmt: skip
        lens = None
        if host_seq_lens is not None:
            lens = host_index_array(host_seq_lens, "host_seq_lens", np.int32)
            if lens.shape[0] != dec.params.batch:
                raise argument_error(f"host_seq_lens: expected {dec.params.batch} entries, got {lens.shape[0]}")
        handle = ctypes.c_void_p()
        check(
            _lib.fd_decode_plan_create(
                ctypes.byref(dec.params), None if lens is None else lens.ctypes.data, ctypes.byref(handle)
            )
        )
        self._handle = handle.value
        n = ctypes.c_size_t(0)
        check(_lib.fd_decode_plan_workspace_size(self._handle, ctypes.byref(n)))
        self._workspace_size = int(n.value)  # fixed for the plan's life; run() reads it every call

    def close(self) -> None:
        """Frees the plan (fd_decode_plan_destroy); idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _lib.fd_decode_plan_destroy(handle)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _h(self) -> int:
        if self._handle is None:
            raise FlashDecError(Status.INVALID_STATE, "decode plan is closed")
        return self._handle

    @property
    def workspace_size(self) -> int:
        """Workspace bytes every :meth:`run` needs (fd_decode_plan_workspace_size,
        read when the plan was made: it is fixed for the plan's life)."""
        self._h()  # a closed plan: INVALID_STATE, as every other call
        return self._workspace_size

    def run(
        self,
        q: Any,
        k_cache: Any,
        v_cache: Any,
        block_tables: Any,
        seq_lens: Any,
        out: Any = None,
        *,
        workspace: Any = None,
        stream: Any = None,
        q_indptr: Any = None,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        logit_softcap: Optional[float] = None,
        sliding_window: Optional[int] = None,
        sinks: Any = None,
    ) -> Any:
        """One decode call with this plan (fd_decode_run). Returns ``out``
        (allocated when None, as :func:`decode` does).

        ``q_indptr``: this run's query offsets (as in :func:`decode`); None:
        the plan's (None there too: one query token per row).

        ``k_scale`` / ``v_scale``: this run's dequantisation scales (not
        planned: each layer of an FP8 cache has its own); None: the plan's.

        ``logit_softcap`` / ``sliding_window`` / ``sinks``: this run's
        attention variants (S2.3; the library takes them from each run, so
        layers may alternate windows); None: the plan's. The plan's window
        sized its split layout: a run with a longer window (or none) is
        still exact, only slower.

        ``workspace``: uint8 1-D scratch of at least :attr:`workspace_size`
        bytes on the arrays' device; when None and the plan needs one, it is
        allocated for the call (numpy on the CPU; a torch tensor on
        ``stream`` for CUDA arrays). Pass your own to keep run() free of
        allocations, e.g. inside a CUDA graph capture.
        """
        h = self._h()
        if workspace is None:
            size = self.workspace_size
            if size:
                workspace = _new_workspace(size, q, stream)
        given = dict(
            q_indptr=q_indptr, k_scale=k_scale, v_scale=v_scale, logit_softcap=logit_softcap,
            sliding_window=sliding_window, sinks=sinks,
        )  # fmt: skip
        options = dict(self._options, **{name: x for name, x in given.items() if x is not None})
        dec, out = _build_decode(
            q, k_cache, v_cache, block_tables, seq_lens, out, workspace=workspace, stream=stream,
            **options,
        )  # fmt: skip
        check(_lib.fd_decode_run(h, ctypes.byref(dec.params)))
        return out

    def __enter__(self) -> "DecodePlan":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"workspace_size={self.workspace_size}"
        return f"DecodePlan({state})"


def rope_apply(
    x: Any,
    positions: Sequence[int],
    rotary_dim: int,
    rope_base: float = 10000.0,
    *,
    style: RopeStyle = RopeStyle.SPLIT_HALF,
) -> Any:
    """Rotates ``x`` in place (S3.1) in the RoPE convention ``style``.
    Returns ``x``.

    x: host array [num_tokens, num_heads, head_dim], contiguous and writable.
    positions: one non-negative position per token.
    rotary_dim: rotated dims per head, even and <= head_dim; the dims from
    rotary_dim on stay unchanged in either style.
    style: :class:`RopeStyle`; SPLIT_HALF (default) rotates the pairs
    (i, i + rotary_dim/2) through fd_rope_apply, INTERLEAVED the pairs
    (2i, 2i + 1) through fd_rope_apply_style (which gives fd_rope_apply's
    bits for SPLIT_HALF). An unknown value: the library's INVALID_ARGUMENT
    naming rope_style, nothing written.
    """
    xb = tensor(x, "x", writable=True, device=Device.cpu())
    if len(xb.shape) != 3:
        raise argument_error(f"x: expected shape [num_tokens, num_heads, head_dim], got {list(xb.shape)}")
    pos = host_index_array(positions, "positions", np.int32)
    if pos.shape[0] != xb.shape[0]:
        raise argument_error(f"positions: expected {xb.shape[0]} entries, got {pos.shape[0]}")
    style_value = _rope_style(style)
    args = (
        int(xb.dtype), xb.ptr, _u32(xb.shape[0], "num_tokens"), _u32(xb.shape[1], "num_heads"),
        _u32(xb.shape[2], "head_dim"), pos.ctypes.data, _u32(rotary_dim, "rotary_dim"), float(rope_base),
    )  # fmt: skip
    if style_value == RopeStyle.SPLIT_HALF:
        check(_lib.fd_rope_apply(*args))
    else:
        check(_lib.fd_rope_apply_style(*args, style_value))
    return x


def reference_attention_dense(
    q: Any, k: Any, v: Any, seq_lens: Sequence[int], sm_scale: float = 0.0, out: Any = None
) -> Any:
    """Dense CPU reference attention (fd_reference_attention_dense); host
    memory only, runs before return.

    q: [batch, num_q_heads, head_dim]; k, v: [batch, num_kv_heads,
    max_seq_len, head_dim]; all host, contiguous, same type. Returns ``out``.
    """
    qb = tensor(q, "q", device=Device.cpu())
    if len(qb.shape) != 3:
        raise argument_error(f"q: expected shape [batch, num_q_heads, head_dim], got {list(qb.shape)}")
    batch, hq, d = qb.shape
    kb = tensor(k, "k", dtype=qb.dtype, shape=(batch, None, None, d), device=Device.cpu())
    vb = tensor(v, "v", dtype=qb.dtype, shape=kb.shape, device=Device.cpu())
    sl = host_index_array(seq_lens, "seq_lens", np.int32)
    if sl.shape[0] != batch:
        raise argument_error(f"seq_lens: expected {batch} entries, got {sl.shape[0]}")
    if out is None:
        out = empty_like_dtype((batch, hq, d), qb.dtype, like=q)
    ob = tensor(out, "out", dtype=qb.dtype, shape=(batch, hq, d), writable=True, device=Device.cpu())
    check(
        _lib.fd_reference_attention_dense(
            int(qb.dtype), _u32(batch, "batch"), _u32(hq, "num_q_heads"), _u32(kb.shape[1], "num_kv_heads"),
            _u32(d, "head_dim"), _u32(kb.shape[2], "max_seq_len"), qb.ptr, kb.ptr, vb.ptr,
            sl.ctypes.data, float(sm_scale), ob.ptr,
        )  # fmt: skip
    )
    return out


def reference_attention(
    q: Any,
    k: Any,
    v: Any,
    seq_lens: Sequence[int],
    out: Any = None,
    *,
    q_indptr: Any = None,
    sm_scale: float = 0.0,
    logit_softcap: float = 0.0,
    sliding_window: int = 0,
    sinks: Any = None,
) -> Any:
    """Dense CPU reference attention with query tokens and variants
    (fd_reference_attention, S2, S2.2, S2.3); host memory only, runs before
    return. Returns ``out`` (allocated when None).

    q: [batch, num_q_heads, head_dim], or [q_indptr[-1], ...] with
    ``q_indptr`` (int32 [batch + 1] offsets as in :func:`decode`: causal,
    a row's queries are its last tokens); k, v: [batch, num_kv_heads,
    max_seq_len, head_dim], batch = len(seq_lens); all host, contiguous,
    one type. ``logit_softcap``, ``sliding_window`` and ``sinks`` (float32
    [num_q_heads] logits) as in fd_decode_params; 0 / None: off. The
    library checks the values (INVALID_ARGUMENT naming the field).
    """
    cpu = Device.cpu()
    qb = tensor(q, "q", device=cpu)
    if len(qb.shape) != 3:
        raise argument_error(f"q: expected shape [query tokens, num_q_heads, head_dim], got {list(qb.shape)}")
    tokens, hq, d = qb.shape
    sl = host_index_array(seq_lens, "seq_lens", np.int32)
    batch = sl.shape[0]
    kb = tensor(k, "k", dtype=qb.dtype, shape=(batch, None, None, d), device=cpu)
    vb = tensor(v, "v", dtype=qb.dtype, shape=kb.shape, device=cpu)
    p = _lib.fd_reference_params()
    _lib.fd_reference_params_init(ctypes.byref(p))
    keep: list = [qb, kb, vb, sl]
    if q_indptr is not None:
        qi = _query_offsets(q_indptr, batch, cpu)
        total = _query_tokens(qi, batch, None, read_device=False)
        if total != tokens:
            raise argument_error(
                f"q: expected shape [{total}, num_q_heads, head_dim] (q_indptr[-1] = {total} query tokens), "
                f"got {list(qb.shape)}"
            )
        p.q_indptr = qi.ptr
        keep.append(qi)
    elif tokens != batch:
        raise argument_error(f"q: expected {batch} rows (one per seq_lens entry), got {tokens}")
    if sinks is not None:
        sb = tensor(sinks, "sinks", dtype=DType.F32, shape=(hq,), device=cpu)
        p.sinks = sb.ptr
        keep.append(sb)
    if out is None:
        out = empty_like_dtype((tokens, hq, d), qb.dtype, like=q)
    ob = tensor(out, "out", dtype=qb.dtype, shape=(tokens, hq, d), writable=True, device=cpu)
    p.dtype = int(qb.dtype)
    p.batch, p.num_q_heads = _u32(batch, "batch"), _u32(hq, "num_q_heads")
    p.num_kv_heads, p.head_dim = _u32(kb.shape[1], "num_kv_heads"), _u32(d, "head_dim")
    p.max_seq_len = _u32(kb.shape[2], "max_seq_len")
    p.q, p.k, p.v, p.seq_lens, p.out = qb.ptr, kb.ptr, vb.ptr, sl.ctypes.data, ob.ptr
    p.sm_scale, p.logit_softcap, p.sliding_window = float(sm_scale), float(logit_softcap), int(sliding_window)
    check(_lib.fd_reference_attention(ctypes.byref(p)))
    return out


def cuda_device_count() -> int:
    """Usable CUDA devices (0 without CUDA; never raises for that)."""
    n = ctypes.c_int32(0)
    check(_lib.fd_cuda_device_count(ctypes.byref(n)))
    return int(n.value)


__all__ = [
    "DecodePlan",
    "decode",
    "decode_workspace_size",
    "rope_apply",
    "reference_attention",
    "reference_attention_dense",
    "cuda_device_count",
    "DeviceType",
    "DType",
]
