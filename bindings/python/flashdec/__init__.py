"""FlashDec: paged-KV decode attention (Python binding of libflashdec).

A :class:`Cache` holds the K/V of many requests in fixed-size blocks; each
decode step writes one token per request inside a :class:`Transaction` and
runs :func:`decode` (paged attention) over the committed tokens; a
:class:`DecodePlan` plans a step once and runs it for every layer. Arrays are
numpy arrays or torch tensors (zero-copy; CUDA tensors for CUDA caches).

Example (CPU, float32; two query heads share one KV head)::

    >>> import numpy as np, flashdec
    >>> rng = np.random.default_rng(0)
    >>> ks, vs = [], []
    >>> with flashdec.Cache(num_layers=1, num_kv_heads=1, head_dim=4, block_size=2,
    ...                     max_blocks=8, dtype=flashdec.DType.F32) as cache:
    ...     cache.add_request(7)
    ...     for step in range(3):                     # three tokens of request 7
    ...         k, v = rng.standard_normal((2, 1, 1, 4), dtype=np.float32)
    ...         ks.append(k[0, 0]); vs.append(v[0, 0])
    ...         with cache.begin([7]) as tx:
    ...             tx.write_layer(0, k, v)
    ...             tx.commit()
    ...     q = rng.standard_normal((1, 2, 4), dtype=np.float32)
    ...     out = cache.decode(0, q, request_ids=[7])
    >>> out.shape
    (1, 2, 4)
    >>> w = np.exp(q[0] @ np.array(ks).T / 2.0)       # softmax(q K^T / sqrt(4)) V
    >>> np.allclose(out[0], (w / w.sum(1, keepdims=True)) @ np.array(vs), atol=1e-5)
    True

Installing: ``pip install ./bindings/python`` from a FlashDec checkout builds
libflashdec (with CUDA when nvcc is found) and puts it inside this package.
The library is looked up in this order: the FLASHDEC_LIBRARY environment
variable (full path; no fallback when set), the copy in this package folder,
then the system loader by the SONAME (``libflashdec.so.0.2``: before 1.0 the
SONAME carries major and minor version, since a 0.x minor may change the ABI).
:func:`library_path` says which one was loaded; :func:`is_compatible` applies
the header's version rule to it.

Enums mirror the header's C enums as ``int`` subclasses (members compare equal
to the C values): :class:`DType` (F32, F16, BF16, and the stored-K/V types
FP8_E4M3, FP8_E5M2), :class:`Layout` (TOKEN_MAJOR, DIM_MAJOR),
:class:`DeviceType` (CPU, CUDA), :class:`RopeStyle` (SPLIT_HALF, INTERLEAVED),
:class:`RequestState`, :class:`TxState`, :class:`Status` (the fd_status codes)
and the scheduler/engine/workload enums :class:`EngineRequestState`,
:class:`StepOutcome`, :class:`ScheduleReason`, :class:`DecisionList`,
:class:`WorkloadKind` and :class:`WorkloadPolicy`.

Every failure raises :class:`FlashDecError` with ``.status`` and ``.message``.
"""

from __future__ import annotations

from . import _lib
from .append import kv_append, rope_kv_append
from .cache import Cache, LayerStorage, Metrics, PrefixInfo, Transaction, TxInfo, TxRows, TxTokens
from . import engine as _engine
from .engine import *  # noqa: F401,F403  (names listed in engine.__all__)
from .errors import FlashDecError, Status, check, status_string
from .ops import (
    DecodePlan,
    cuda_device_count,
    decode,
    decode_workspace_size,
    reference_attention,
    reference_attention_dense,
    rope_apply,
)
from .types import CacheConfig, Device, DeviceType, DType, Layout, RequestState, RopeStyle, TxState

HEADER_VERSION = f"{_lib.HEADER_VERSION_MAJOR}.{_lib.HEADER_VERSION_MINOR}.{_lib.HEADER_VERSION_PATCH}"
__version__ = HEADER_VERSION


def version() -> str:
    """Runtime library version "MAJOR.MINOR.PATCH" (fd_version_string)."""
    return _lib.fd_version_string().decode()


def version_number() -> int:
    """Runtime library version as major * 10000 + minor * 100 + patch."""
    return int(_lib.fd_version_number())


def is_compatible(runtime: int | None = None) -> bool:
    """The header's documented check: a runtime at least as new as the header
    this binding mirrors, with the same major version and, while the major is
    0 (a 0.x minor may change the ABI), the same minor version too."""
    rt = version_number() if runtime is None else int(runtime)
    header = _lib.HEADER_VERSION_NUMBER
    same = rt // 100 == header // 100 if _lib.HEADER_VERSION_MAJOR == 0 else rt // 10000 == header // 10000
    return same and rt >= header


def library_path() -> str:
    """Path the shared library was loaded from."""
    return _lib.library_path


__all__ = list(_engine.__all__) + [
    "Cache",
    "CacheConfig",
    "DecodePlan",
    "Device",
    "DeviceType",
    "DType",
    "FlashDecError",
    "Layout",
    "LayerStorage",
    "Metrics",
    "PrefixInfo",
    "RequestState",
    "RopeStyle",
    "Status",
    "Transaction",
    "TxInfo",
    "TxRows",
    "TxTokens",
    "TxState",
    "check",
    "cuda_device_count",
    "decode",
    "decode_workspace_size",
    "is_compatible",
    "kv_append",
    "library_path",
    "reference_attention",
    "reference_attention_dense",
    "rope_apply",
    "rope_kv_append",
    "status_string",
    "version",
    "version_number",
]
