"""Stateless operations: paged decode attention, RoPE, dense reference."""

from __future__ import annotations

import ctypes
from typing import Any, Sequence, Tuple

import numpy as np

from . import _lib
from ._arrays import Buffer, empty_like_dtype, host_index_array, index_tensor, stream_for, tensor
from .errors import argument_error, check
from .types import Device, DeviceType, DType, Layout


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
) -> Tuple[_Decode, Any]:
    layout = Layout(layout)
    qb = tensor(q, "q")
    if len(qb.shape) != 3:
        raise argument_error(f"q: expected shape [batch, num_q_heads, head_dim], got {list(qb.shape)}")
    batch, hq, d = qb.shape
    dev = qb.device
    kb = tensor(k_cache, "k_cache", dtype=qb.dtype, contiguous=False, device=dev)
    vb = tensor(v_cache, "v_cache", dtype=qb.dtype, contiguous=False, device=dev)
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
    if out is None:
        out = empty_like_dtype((batch, hq, d), qb.dtype, like=q, stream=stream)
    ob = tensor(out, "out", dtype=qb.dtype, shape=(batch, hq, d), writable=True, device=dev)
    dec = _Decode()
    p = dec.params
    p.dtype = int(qb.dtype)
    p.layout = int(layout)
    p.batch = _u32(batch, "batch")
    p.num_q_heads = _u32(hq, "num_q_heads")
    p.num_kv_heads = _u32(hkv, "num_kv_heads")
    p.head_dim = _u32(d, "head_dim")
    p.block_size = _u32(bs, "block_size")
    p.num_blocks = _u32(nb, "num_blocks")
    p.max_blocks_per_seq = _u32(bt.shape[1], "max_blocks_per_seq")
    p.sm_scale = float(sm_scale)
    p.flags = _lib.FD_DECODE_CHECK_INDICES if check_indices else 0
    p.q, p.k_cache, p.v_cache = qb.ptr, kb.ptr, vb.ptr
    p.stride_block, p.stride_head, p.stride_token, p.stride_dim = strides
    p.block_tables, p.seq_lens, p.out = bt.ptr, sl.ptr, ob.ptr
    p.max_seq_len_hint = int(max_seq_len_hint)
    p.num_splits = int(num_splits)
    if workspace is not None:
        wb = index_tensor(workspace, "workspace", kind="uint8", shape=(None,), device=dev, writable=True)
        p.workspace, p.workspace_size = wb.ptr, wb.shape[0]
        dec.keep.append(wb)
    p.device = dev.to_c()
    p.stream = stream_for([qb, kb, ob], stream)
    p.cpu_threads = _u32(cpu_threads, "cpu_threads")
    dec.keep += [qb, kb, vb, bt, sl, ob]
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
) -> Any:
    """Paged decode attention (fd_decode, docs/semantics.md S2). Returns ``out``.

    Args:
        q: [batch, num_q_heads, head_dim], float32/float16/bf16 (numpy uint16
            or torch.bfloat16). Its device (cpu or cuda:n) selects the backend.
        k_cache, v_cache: one layer's K/V storage, 4-D in the layout's axis
            order: token-major [num_blocks, num_kv_heads, block_size, head_dim],
            dim-major [num_blocks, num_kv_heads, head_dim, block_size]. Any
            strides (e.g. a transposed view of vLLM's NHD pages), equal for K
            and V; the layout's contiguous axis needs stride 1.
        block_tables: int32 [batch, max_blocks_per_seq], -1 for unused slots.
        seq_lens: int32 [batch].
        out: written in place when given ([batch, num_q_heads, head_dim], same
            type and device as q); allocated otherwise.
        workspace: uint8 1-D scratch for split-KV (see decode_workspace_size).
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
        check_indices=check_indices, stream=stream,
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
) -> int:
    """Workspace bytes :func:`decode` needs for these arguments (host only:
    nothing is read from the arrays, nothing enqueued)."""
    dec, _ = _build_decode(
        q, k_cache, v_cache, block_tables, seq_lens, out,
        layout=layout, sm_scale=0.0, num_splits=num_splits, workspace=None, cpu_threads=0,
        max_seq_len_hint=max_seq_len_hint, check_indices=False, stream=None,
    )  # fmt: skip
    n = ctypes.c_size_t(0)
    check(_lib.fd_decode_workspace_size(ctypes.byref(dec.params), ctypes.byref(n)))
    return int(n.value)


def rope_apply(
    x: Any, positions: Sequence[int], rotary_dim: int, rope_base: float = 10000.0
) -> Any:
    """Rotates ``x`` in place (fd_rope_apply, S3.1). Returns ``x``.

    x: host array [num_tokens, num_heads, head_dim], contiguous and writable.
    positions: one non-negative position per token.
    """
    xb = tensor(x, "x", writable=True, device=Device.cpu())
    if len(xb.shape) != 3:
        raise argument_error(f"x: expected shape [num_tokens, num_heads, head_dim], got {list(xb.shape)}")
    pos = host_index_array(positions, "positions", np.int32)
    if pos.shape[0] != xb.shape[0]:
        raise argument_error(f"positions: expected {xb.shape[0]} entries, got {pos.shape[0]}")
    check(
        _lib.fd_rope_apply(
            int(xb.dtype), xb.ptr, _u32(xb.shape[0], "num_tokens"), _u32(xb.shape[1], "num_heads"),
            _u32(xb.shape[2], "head_dim"), pos.ctypes.data, _u32(rotary_dim, "rotary_dim"),
            float(rope_base),
        )  # fmt: skip
    )
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


def cuda_device_count() -> int:
    """Usable CUDA devices (0 without CUDA; never raises for that)."""
    n = ctypes.c_int32(0)
    check(_lib.fd_cuda_device_count(ctypes.byref(n)))
    return int(n.value)


__all__ = [
    "decode",
    "decode_workspace_size",
    "rope_apply",
    "reference_attention_dense",
    "cuda_device_count",
    "DeviceType",
    "DType",
]
