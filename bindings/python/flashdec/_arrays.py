"""Zero-copy adaptation of numpy arrays and torch tensors to C pointers.

Every check (dtype, shape, contiguity, writability, device) happens here,
before any C call, so a mistake becomes a FlashDecError(INVALID_ARGUMENT)
naming the parameter instead of a wrong read of memory. Data is never copied:
the pointer handed to C is the array's own buffer, and the returned
:class:`Buffer` keeps the array alive for the duration of the call.

Metadata arrays (request ids, positions, block tables on the host) are small;
:func:`host_index_array` converts any sequence into a fresh contiguous array.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .errors import argument_error
from .types import Device, DeviceType, DType

_NUMPY_TO_DTYPE = {
    np.dtype(np.float32): DType.F32,
    np.dtype(np.float16): DType.F16,
    np.dtype(np.uint16): DType.BF16,  # bf16 travels as its raw bits
}

# dtype -> numpy dtype of arrays holding it (FP8 as its raw bits, uint8)
NUMPY_DTYPE = {
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.BF16: np.dtype(np.uint16),
    DType.FP8_E4M3: np.dtype(np.uint8),
    DType.FP8_E5M2: np.dtype(np.uint8),
}

# What numpy (or torch) uint8 data is when a call expects an FP8 type: its raw bits.
_RAW_FP8 = "uint8"


def is_torch_tensor(x: Any) -> bool:
    """True for torch tensors, without importing torch for other objects."""
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


@functools.lru_cache(maxsize=None)
def _torch_value_types() -> dict:
    """DType -> torch dtype of the value types this torch has (the float8
    types since torch 2.1). Built once (every call describes tensors)."""
    import torch  # only reached when a tensor was passed, so torch is present

    types = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}
    for dt, name in ((DType.FP8_E4M3, "float8_e4m3fn"), (DType.FP8_E5M2, "float8_e5m2")):
        if hasattr(torch, name):
            types[dt] = getattr(torch, name)
    return types


def torch_dtype(dtype: DType) -> Any:
    """The torch dtype holding ``dtype`` (FP8: torch.float8_e4m3fn / float8_e5m2)."""
    types = _torch_value_types()
    if DType(dtype) not in types:
        raise argument_error(f"this torch has no dtype for {DType(dtype).name}")
    return types[DType(dtype)]


@functools.lru_cache(maxsize=None)
def _torch_dtype_map() -> dict:
    import torch

    m: dict = {tdt: dt for dt, tdt in _torch_value_types().items()}
    m.update({torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8"})
    return m


@dataclass
class Buffer:
    """A checked view of an array: what C needs plus a reference that keeps
    the memory alive while the call runs."""

    ptr: int
    dtype: Any  # DType for tensors of values, "int32"/"int64"/... for indices
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # in elements
    device: Device
    owner: Any
    torch_stream: Optional[int] = None  # current CUDA stream of a CUDA tensor

    @property
    def contiguous(self) -> bool:
        expected = 1
        for dim, stride in zip(reversed(self.shape), reversed(self.strides)):
            if dim != 1 and stride != expected:
                return False
            expected *= dim
        return True


_CPU = Device.cpu()
# numpy dtype -> what _describe reports: a DType for value types, the
# dtype's name ("int32", ...) otherwise; filled as dtypes are seen (numpy's
# dtype.name is slow enough to show on a per-layer call).
_NUMPY_DESCRIBED: dict = dict(_NUMPY_TO_DTYPE)


def _describe(x: Any, name: str) -> Buffer:
    if isinstance(x, np.ndarray):
        dt: Any = _NUMPY_DESCRIBED.get(x.dtype)
        if dt is None:
            dt = _NUMPY_DESCRIBED.setdefault(x.dtype, x.dtype.name)
        item = x.itemsize
        ptr, _ = x.__array_interface__["data"]
        strides = x.strides
        if ptr % item:
            # The library reads elements through typed pointers: a misaligned
            # buffer (e.g. np.frombuffer at an odd offset) is refused here.
            raise argument_error(f"{name}: data at {ptr:#x} is not aligned to its item size {item}")
        if any(st % item for st in strides):
            raise argument_error(f"{name}: strides {strides} are not multiples of the item size")
        return Buffer(
            ptr=ptr,
            dtype=dt,
            shape=x.shape,
            strides=tuple(st // item for st in strides),
            device=_CPU,
            owner=x,
        )
    if is_torch_tensor(x):
        dt = _torch_dtype_map().get(x.dtype, str(x.dtype))
        if int(x.data_ptr()) % x.element_size():
            raise argument_error(
                f"{name}: data at {int(x.data_ptr()):#x} is not aligned to its item size {x.element_size()}"
            )
        stream = None
        if x.device.type == "cuda":
            import torch

            index = x.device.index if x.device.index is not None else torch.cuda.current_device()
            device = Device.cuda(index)
            stream = int(torch.cuda.current_stream(x.device).cuda_stream)
        elif x.device.type == "cpu":
            device = _CPU
        else:
            raise argument_error(f"{name}: tensors on {x.device} are not supported (cpu or cuda only)")
        return Buffer(
            ptr=int(x.data_ptr()),
            dtype=dt,
            shape=tuple(x.shape),
            strides=x.stride(),
            device=device,
            owner=x,
            torch_stream=stream,
        )
    raise argument_error(f"{name}: expected a numpy array or torch tensor, got {type(x).__name__}")


def _writable(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return bool(x.flags.writeable)
    return True  # torch tensors have no read-only flag


def tensor(
    x: Any,
    name: str,
    *,
    dtype: Optional[DType] = None,
    shape: Optional[Sequence[Optional[int]]] = None,
    writable: bool = False,
    contiguous: bool = True,
    device: Optional[Device] = None,
) -> Buffer:
    """Checks a value tensor (F32/F16/BF16/FP8 data) and returns its Buffer.

    ``shape`` entries of None accept any size. ``dtype`` None accepts any value
    type (the caller then compares it with other arrays). uint8 data is raw
    FP8 bits: accepted where ``dtype`` is an FP8 type, which it then is.
    """
    b = _describe(x, name)
    if b.dtype == _RAW_FP8 and dtype is not None and DType(dtype).is_fp8:
        b.dtype = DType(dtype)
    if not isinstance(b.dtype, DType):
        hint = " (FP8 bits as uint8 need the format named: kv_dtype= / cache_dtype=)" if b.dtype == _RAW_FP8 else ""
        raise argument_error(
            f"{name}: unsupported element type {b.dtype} (float32, float16, bf16 as uint16/bfloat16, "
            f"FP8 as uint8 bits or torch.float8_e4m3fn/float8_e5m2){hint}"
        )
    if dtype is not None and b.dtype != dtype:
        raise argument_error(f"{name}: element type {b.dtype.name} does not match the expected {DType(dtype).name}")
    _check_shape(b, name, shape)
    if contiguous and not b.contiguous:
        raise argument_error(f"{name}: must be C-contiguous (shape {b.shape}, strides {b.strides})")
    if writable and not _writable(x):
        raise argument_error(f"{name}: array is read-only but is written by the call")
    if device is not None and b.device != device:
        raise argument_error(f"{name}: lives on {_devname(b.device)}, expected {_devname(device)}")
    return b


def index_tensor(
    x: Any,
    name: str,
    *,
    kind: str,
    shape: Sequence[Optional[int]],
    device: Optional[Device] = None,
    writable: bool = False,
) -> Buffer:
    """Checks an int32/int64/uint64 index tensor (block tables, seq lens)."""
    b = _describe(x, name)
    if b.dtype != kind:
        raise argument_error(f"{name}: element type must be {kind}, got {b.dtype}")
    _check_shape(b, name, shape)
    if not b.contiguous:
        raise argument_error(f"{name}: must be C-contiguous")
    if writable and not _writable(x):
        raise argument_error(f"{name}: array is read-only but is written by the call")
    if device is not None and b.device != device:
        raise argument_error(f"{name}: lives on {_devname(b.device)}, expected {_devname(device)}")
    return b


def host_index_array(values: Any, name: str, dtype: Any) -> np.ndarray:
    """Any sequence of integers -> a fresh 1-D contiguous numpy array of ``dtype``,
    with a range check (numpy would otherwise wrap negative ids silently)."""
    if is_torch_tensor(values):
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise argument_error(f"{name}: expected a 1-D sequence, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise argument_error(f"{name}: expected integers, got {arr.dtype}")
    info = np.iinfo(dtype)
    if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
        raise argument_error(f"{name}: values must lie in [{info.min}, {info.max}]")
    return np.ascontiguousarray(arr, dtype=dtype)


def _check_shape(b: Buffer, name: str, shape: Optional[Sequence[Optional[int]]]) -> None:
    if shape is None:
        return
    ok = len(b.shape) == len(shape) and all(e is None or e == d for e, d in zip(shape, b.shape))
    if not ok:
        want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise argument_error(f"{name}: expected shape {want}, got {list(b.shape)}")


def _devname(d: Device) -> str:
    return "cpu" if d.type == DeviceType.CPU else f"cuda:{d.ordinal}"


def stream_handle(stream: Any) -> int:
    """A stream argument (int handle or object with ``cuda_stream``, such as a
    torch.cuda.Stream) as the int handle C takes."""
    try:
        return int(operator.index(getattr(stream, "cuda_stream", stream)))
    except TypeError:
        raise argument_error(
            f"stream: expected an int cudaStream_t handle or a torch.cuda.Stream, got {type(stream).__name__}"
        ) from None


def stream_for(buffers: Sequence[Buffer], stream: Any) -> Optional[int]:
    """The stream to pass to C: the caller's explicit one (an int handle, 0 for
    the legacy default stream, or a ``torch.cuda.Stream``), else torch's
    current stream of the first CUDA tensor (so work orders after the caller's
    own kernels), else NULL (the legacy default stream)."""
    if stream is not None:
        return stream_handle(stream)
    for b in buffers:
        if b.torch_stream is not None:
            return b.torch_stream or None
    return None


def empty_like_dtype(shape: Sequence[int], dtype: DType, like: Any = None, stream: Any = None) -> Any:
    """A new output array: a torch tensor on ``like``'s device when ``like`` is a
    tensor, else a numpy array. A CUDA tensor is allocated on ``stream`` (the
    stream the call writing it runs on; None: torch's current stream), so
    torch's caching allocator reuses its memory only in that stream's order."""
    if like is not None and is_torch_tensor(like):
        import torch

        tdt = torch_dtype(dtype)
        if stream is not None and like.device.type == "cuda":
            from ._cuda import torch_stream

            with torch.cuda.stream(torch_stream(stream, like.device)):
                return torch.empty(tuple(shape), dtype=tdt, device=like.device)
        return torch.empty(tuple(shape), dtype=tdt, device=like.device)
    return np.empty(tuple(shape), dtype=NUMPY_DTYPE[dtype])
