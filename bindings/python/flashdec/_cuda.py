"""torch/CUDA glue: which stream a call runs on, ordering before a C call that
works on the legacy default stream, and zero-copy torch views of device memory.

Imported only when a CUDA cache or a CUDA tensor is involved, so the package
itself needs no torch. Stream arguments of the binding accept None (torch's
current stream of the device), a raw ``cudaStream_t`` handle as an int (0: the
legacy default stream) or a ``torch.cuda.Stream``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ._arrays import stream_handle, torch_dtype
from .errors import FlashDecError, Status
from .types import DType

# __cuda_array_interface__ has no bfloat16 or float8 typestr: bf16 travels as
# int16 bits and FP8 as uint8 bits (types every torch version accepts there)
# and are viewed as their torch type after.
_TYPESTR = {DType.F32: "<f4", DType.F16: "<f2", DType.BF16: "<i2", DType.FP8_E4M3: "|u1", DType.FP8_E5M2: "|u1"}


def torch_module() -> Any:
    """torch, with CUDA; a FlashDecError naming what is missing otherwise."""
    try:
        import torch
    except ImportError as e:
        raise FlashDecError(Status.UNSUPPORTED, "device memory of a CUDA cache needs torch with CUDA") from e
    if not torch.cuda.is_available():
        raise FlashDecError(Status.NO_DEVICE, "torch sees no CUDA device")
    return torch


def torch_stream(stream: Any, device: Any) -> Any:
    """The torch stream object for a stream argument on ``device`` (a
    torch.device): None is torch's current stream there."""
    torch = torch_module()
    if stream is None:
        return torch.cuda.current_stream(device)
    if isinstance(stream, torch.cuda.Stream):
        return stream
    handle = stream_handle(stream)
    for known in (torch.cuda.current_stream(device), torch.cuda.default_stream(device)):
        if int(known.cuda_stream) == handle:
            return known
    return torch.cuda.ExternalStream(handle, device=device)


def order_legacy_stream_after(stream: Any, device: Any) -> None:
    """Makes the legacy default stream wait (on the device, not the host) for
    the work queued so far on ``stream`` (None: torch's current stream), so a
    C call that reads its inputs on the legacy stream sees what that stream
    produced. Nothing to do when ``stream`` is the legacy stream itself."""
    torch = torch_module()
    src = torch_stream(stream, device)
    legacy = torch.cuda.default_stream(device)  # handle 0: the legacy default stream
    if int(src.cuda_stream) == int(legacy.cuda_stream):
        return
    event = torch.cuda.Event()
    event.record(src)
    legacy.wait_event(event)


class _DeviceArray:
    """Device memory described by __cuda_array_interface__ (v3, no stream:
    nothing to synchronise at hand-over). Holds ``owner`` so the memory's
    owner lives as long as any tensor made from this object."""

    def __init__(self, ptr: int, shape: Sequence[int], strides: Sequence[int], dtype: DType, owner: Any) -> None:
        item = DType(dtype).itemsize
        self.__cuda_array_interface__ = {
            "shape": tuple(int(n) for n in shape),
            "typestr": _TYPESTR[dtype],
            "data": (int(ptr), False),  # torch refuses read-only CUDA arrays
            "strides": tuple(int(s) * item for s in strides),
            "version": 3,
        }
        self.owner = owner


def device_view(ptr: int, shape: Sequence[int], strides: Sequence[int], dtype: DType, ordinal: int, owner: Any) -> Any:
    """A zero-copy torch tensor over device memory at ``ptr`` (strides in
    elements) on cuda:``ordinal``; the tensor keeps ``owner`` alive."""
    torch = torch_module()
    device = torch.device("cuda", int(ordinal))
    with torch.cuda.device(device):
        t = torch.as_tensor(_DeviceArray(ptr, shape, strides, dtype, owner), device=device)
    if int(t.data_ptr()) != int(ptr):  # as_tensor copied: never hand out a stale copy
        raise FlashDecError(Status.INTERNAL, f"torch copied device memory at {int(ptr):#x} instead of viewing it")
    return t if dtype in (DType.F32, DType.F16) else t.view(torch_dtype(dtype))
