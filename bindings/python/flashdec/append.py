"""The checked append primitives (fd_kv_append, fd_rope_kv_append, S3.2).

They write K/V of new tokens into caller-owned paged storage at explicit
(block, offset) slots, with no allocator or request state: the building block
for an engine that keeps its own KV memory. Every value is checked before
anything is written, by this binding (shapes, types, devices) and then by the
library (index ranges, strides), so a failing call leaves the caches and
``q_out`` untouched.
"""

from __future__ import annotations

import ctypes
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _lib
from ._arrays import Buffer, empty_like_dtype, host_index_array, index_tensor, stream_for, tensor
from .errors import argument_error, check
from .ops import _kv_geometry, _u32
from .types import DeviceType, DType, Layout, RopeStyle, _rope_style


def _index(x: Any, name: str, n: int, like: Buffer) -> Tuple[int, Any]:
    """(address, owner) of an int32 [n] index array on ``like``'s device.

    Host indices may be any integer sequence (converted with a range check);
    CUDA indices must already be int32 tensors on the device.
    """
    if like.device.type == DeviceType.CPU:
        arr = host_index_array(x, name, np.int32)
        if arr.shape[0] != n:
            raise argument_error(f"{name}: expected {n} entries (one per token), got {arr.shape[0]}")
        return int(arr.ctypes.data), arr
    b = index_tensor(x, name, kind="int32", shape=(n,), device=like.device)
    return b.ptr, b


def _build(
    k: Any,
    v: Any,
    k_cache: Any,
    v_cache: Any,
    block_ids: Any,
    offsets: Any,
    layout: Layout,
    stream: Any,
    cache_dtype: Optional[DType],
    k_scale: float,
    v_scale: float,
) -> Tuple[Any, List[Any], Buffer]:
    """Checked fd_kv_append_params for K/V, the paged caches and the slots,
    plus the objects that must stay alive during the call. The caches' type
    is ``cache_dtype``, else theirs (k's when they are not FP8-typed): the
    library refuses a pair it does not convert."""
    layout = Layout(layout)
    kb = tensor(k, "k")
    if len(kb.shape) != 3:
        raise argument_error(f"k: expected shape [num_tokens, num_kv_heads, head_dim], got {list(kb.shape)}")
    n, hkv, d = kb.shape
    dev = kb.device
    vb = tensor(v, "v", dtype=kb.dtype, shape=kb.shape, device=dev)
    kc = tensor(k_cache, "k_cache", dtype=cache_dtype, contiguous=False, writable=True, device=dev)
    if cache_dtype is None and not kc.dtype.is_fp8 and kc.dtype != kb.dtype:
        raise argument_error(
            f"k_cache: element type {kc.dtype.name} does not match k's {kb.dtype.name} (caches are of k's type or FP8)"
        )
    vc = tensor(v_cache, "v_cache", dtype=kc.dtype, contiguous=False, writable=True, device=dev)
    if kc.shape != vc.shape or kc.strides != vc.strides:
        raise argument_error(
            f"v_cache: shape {list(vc.shape)} / strides {vc.strides} must equal k_cache's "
            f"{list(kc.shape)} / {kc.strides}"
        )
    nb, ch, bs, cd, strides = _kv_geometry(kc, layout)
    if (ch, cd) != (hkv, d):
        raise argument_error(
            f"k_cache: {ch} heads x head_dim {cd} do not match k's {hkv} heads x head_dim {d}"
        )
    ids_ptr, ids_owner = _index(block_ids, "block_ids", n, kb)
    off_ptr, off_owner = _index(offsets, "offsets", n, kb)
    p = _lib.fd_kv_append_params()
    _lib.fd_kv_append_params_init(ctypes.byref(p))
    p.dtype = int(kb.dtype)
    p.cache_dtype = int(kc.dtype)
    p.k_scale, p.v_scale = float(k_scale), float(v_scale)
    p.layout = int(layout)
    p.num_tokens = _u32(n, "num_tokens")
    p.num_kv_heads = _u32(hkv, "num_kv_heads")
    p.head_dim = _u32(d, "head_dim")
    p.block_size = _u32(bs, "block_size")
    p.num_blocks = _u32(nb, "num_blocks")
    p.k, p.v, p.k_cache, p.v_cache = kb.ptr, vb.ptr, kc.ptr, vc.ptr
    p.stride_block, p.stride_head, p.stride_token, p.stride_dim = strides
    p.block_ids, p.offsets = ids_ptr, off_ptr
    p.device = dev.to_c()
    p.stream = stream_for([kb, vb, kc], stream)
    return p, [kb, vb, kc, vc, ids_owner, off_owner], kb


def kv_append(
    k: Any,
    v: Any,
    k_cache: Any,
    v_cache: Any,
    block_ids: Any,
    offsets: Any,
    *,
    layout: Layout = Layout.TOKEN_MAJOR,
    stream: Any = None,
    cache_dtype: Optional[DType] = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Writes token i's K and V into slot (block_ids[i], offsets[i]) of one
    layer's paged storage (fd_kv_append).

    Args:
        k, v: [num_tokens, num_kv_heads, head_dim], contiguous, one type
            (float32, float16, bf16 as numpy uint16 or torch.bfloat16). Their
            device (cpu or cuda:n) selects the backend.
        k_cache, v_cache: writable, 4-D in the layout's axis order as in
            :func:`flashdec.decode` (token-major [num_blocks, num_kv_heads,
            block_size, head_dim], dim-major [.., head_dim, block_size]); any
            strides, equal for K and V, with the layout's contiguous axis at 1.
            Of k's type, or FP8 (torch.float8_e4m3fn / float8_e5m2 tensors,
            or uint8 arrays of raw bits with ``cache_dtype``): K and V are
            then stored as saturate(x / scale) rounded to nearest even
            (docs/semantics.md S1.1).
        cache_dtype: the caches' type (fd_kv_append_params.cache_dtype);
            None (default): the arrays' (k's for non-FP8 arrays). Needed for
            FP8 held as uint8 bits.
        k_scale, v_scale: quantisation scales, finite and > 0 (default 1;
            other than 1 only into an FP8 cache), else the library's
            INVALID_ARGUMENT naming the field.
        block_ids, offsets: one int32 per token; any integer sequence on the
            host, int32 tensors on the device for CUDA.
        stream: CUDA stream (an int handle, 0 for the legacy default stream,
            or a torch.cuda.Stream); default torch's current stream of k.
            The indices are checked on the host first (copied from the
            device after waiting for ``stream``), then the append kernel is
            enqueued on ``stream``; the caches are written when it gets
            there.
    Raises:
        FlashDecError: INVALID_ARGUMENT (shapes, types, devices; an id outside
            [0, num_blocks) or offset outside [0, block_size), named with its
            index: nothing is written), UNSUPPORTED, NO_DEVICE, DEVICE.
    """
    # `keep` holds the arrays p points into until the call has returned.
    p, keep, _ = _build(k, v, k_cache, v_cache, block_ids, offsets, layout, stream, cache_dtype, k_scale, v_scale)
    check(_lib.fd_kv_append(ctypes.byref(p)))


def rope_kv_append(
    q: Any,
    k: Any,
    v: Any,
    k_cache: Any,
    v_cache: Any,
    block_ids: Any,
    offsets: Any,
    positions: Any,
    rotary_dim: int,
    rope_base: float = 10000.0,
    q_out: Any = None,
    *,
    layout: Layout = Layout.TOKEN_MAJOR,
    stream: Any = None,
    cache_dtype: Optional[DType] = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    style: RopeStyle = RopeStyle.SPLIT_HALF,
) -> Any:
    """Fused RoPE + append (fd_rope_kv_append): rotates q and k of token i at
    positions[i], writes rotated K and raw V into (block_ids[i], offsets[i])
    and returns the rotated Q (into ``q_out``, which may be ``q`` itself).

    q: [num_tokens, num_q_heads, head_dim], num_q_heads a multiple of k's
    heads; positions: one non-negative int32 per token (on the device for
    CUDA). Other arguments as :func:`kv_append` (streams, ``cache_dtype`` and
    scales included: into an FP8 cache the rotated K is quantised from its
    FP32 value; ``q_out``, of k's type and allocated on ``stream`` when
    None, is ready when the stream gets there). ``style`` is the
    :class:`RopeStyle` (fd_kv_append_params.rope_style; default SPLIT_HALF),
    as :func:`flashdec.rope_apply`'s; an unknown value is the library's
    INVALID_ARGUMENT naming rope_style.
    On failure nothing is written, ``q_out`` included.
    """
    p, keep, kb = _build(k, v, k_cache, v_cache, block_ids, offsets, layout, stream, cache_dtype, k_scale, v_scale)
    n, _, d = kb.shape
    qb = tensor(q, "q", dtype=kb.dtype, shape=(n, None, d), device=kb.device)
    if q_out is None:
        q_out = empty_like_dtype(qb.shape, kb.dtype, like=q, stream=stream)
    ob = tensor(q_out, "q_out", dtype=kb.dtype, shape=qb.shape, writable=True, device=kb.device)
    pos_ptr, pos_owner = _index(positions, "positions", n, kb)
    p.num_q_heads = _u32(qb.shape[1], "num_q_heads")
    p.q, p.q_out, p.positions = qb.ptr, ob.ptr, pos_ptr
    p.rotary_dim = _u32(rotary_dim, "rotary_dim")
    p.rope_base = float(rope_base)
    p.rope_style = _rope_style(style)
    keep += [qb, ob, pos_owner]
    check(_lib.fd_rope_kv_append(ctypes.byref(p)))
    return q_out


__all__ = ["kv_append", "rope_kv_append"]
