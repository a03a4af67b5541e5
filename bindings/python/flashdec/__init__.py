"""FlashDec: paged-KV decode attention (Python binding of libflashdec).

Pure ctypes over the C ABI of include/flashdec.h. The library is found through
the FLASHDEC_LIBRARY environment variable (full path), then a copy inside this
package folder, then the system loader (``libflashdec.so.0``).

    import numpy as np, flashdec
    with flashdec.Cache(num_layers=2, num_kv_heads=2, head_dim=64) as cache:
        cache.add_request(7)
        with cache.begin([7]) as tx:
            for layer in range(2):
                tx.write_layer(layer, k, v)
            tx.commit()

Every failure raises :class:`FlashDecError` with ``.status`` and ``.message``.
"""

from __future__ import annotations

from . import _lib
from .append import kv_append, rope_kv_append
from .cache import Cache, LayerStorage, Metrics, PrefixInfo, Transaction, TxInfo, TxRows
from . import engine as _engine
from .engine import *  # noqa: F401,F403  (names listed in engine.__all__)
from .errors import FlashDecError, Status, check, status_string
from .ops import cuda_device_count, decode, decode_workspace_size, reference_attention_dense, rope_apply
from .types import CacheConfig, Device, DeviceType, DType, Layout, RequestState, TxState

HEADER_VERSION = f"{_lib.HEADER_VERSION_MAJOR}.{_lib.HEADER_VERSION_MINOR}.{_lib.HEADER_VERSION_PATCH}"
__version__ = HEADER_VERSION


def version() -> str:
    """Runtime library version "MAJOR.MINOR.PATCH" (fd_version_string)."""
    return _lib.fd_version_string().decode()


def version_number() -> int:
    """Runtime library version as major * 10000 + minor * 100 + patch."""
    return int(_lib.fd_version_number())


def is_compatible(runtime: int | None = None) -> bool:
    """The header's documented check: same major version and a runtime at
    least as new as the header this binding mirrors."""
    rt = version_number() if runtime is None else int(runtime)
    return rt // 10000 == _lib.HEADER_VERSION_MAJOR and rt >= _lib.HEADER_VERSION_NUMBER


def library_path() -> str:
    """Path the shared library was loaded from."""
    return _lib.library_path


__all__ = list(_engine.__all__) + [
    "Cache",
    "CacheConfig",
    "Device",
    "DeviceType",
    "DType",
    "FlashDecError",
    "Layout",
    "LayerStorage",
    "Metrics",
    "PrefixInfo",
    "RequestState",
    "Status",
    "Transaction",
    "TxInfo",
    "TxRows",
    "TxState",
    "check",
    "cuda_device_count",
    "decode",
    "decode_workspace_size",
    "is_compatible",
    "kv_append",
    "library_path",
    "reference_attention_dense",
    "rope_apply",
    "rope_kv_append",
    "status_string",
    "version",
    "version_number",
]
