"""Enums and small value types of the public header.

The enums are :class:`CEnum` classes: plain ``int`` values (they compare equal
to the header's numbers and pass to ctypes as they are) whose ``help()`` lists
their members and own methods, not the inherited ``int`` API.
"""

from __future__ import annotations

import ctypes
import enum
import inspect
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from . import _lib

# What dir() keeps of the machinery of an enum class (the rest is int's API).
_ENUM_DUNDERS = {"__class__", "__doc__", "__module__", "__name__", "__qualname__"}
_ENUM_BASES = {int, object, enum.Enum, enum.IntEnum, getattr(enum, "ReprEnum", enum.Enum)}


class _CEnumType(enum.EnumMeta):
    """Enum metaclass whose dir() (and so help() and pydoc) leaves out the
    hundreds of methods every ``int`` subclass inherits."""

    def __dir__(cls) -> List[str]:
        names = set(_ENUM_DUNDERS)
        for klass in cls.__mro__:
            if klass in _ENUM_BASES:
                continue
            names.update(n for n in vars(klass) if not n.startswith("_"))
        return sorted(names - {"name", "value"})  # documented once, in CEnum


class CEnum(enum.IntEnum, metaclass=_CEnumType):
    """Base of the binding's enums: an :class:`enum.IntEnum` mirroring a C enum
    of flashdec.h, so members are ints (``DType.BF16 == 2``) with ``.name``
    and ``.value``; ``Cls(number)`` and ``Cls["NAME"]`` look members up."""

    __signature__ = inspect.Signature(
        [inspect.Parameter("value", inspect.Parameter.POSITIONAL_ONLY)]
    )


class DType(CEnum):
    """fd_dtype. BF16 data travels in numpy as uint16 arrays (raw bits).

    FP8_E4M3 and FP8_E5M2 (OCP 8-bit floats, docs/semantics.md S1.1) are
    types of stored K/V only: a cache's dtype, decode's K/V and append's
    caches. numpy carries them as uint8 arrays of raw bits (the call then
    names the format: the cache's dtype, ``kv_dtype=``, ``cache_dtype=``);
    torch tensors of ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` carry
    it themselves, zero-copy."""

    F32 = 0
    F16 = 1
    BF16 = 2
    FP8_E4M3 = 3
    FP8_E5M2 = 4

    @property
    def itemsize(self) -> int:
        return {DType.F32: 4, DType.F16: 2, DType.BF16: 2}.get(self, 1)

    @property
    def is_fp8(self) -> bool:
        """True for the 8-bit stored-K/V types."""
        return self in (DType.FP8_E4M3, DType.FP8_E5M2)


class Layout(CEnum):
    """fd_kv_layout: TOKEN_MAJOR = [block_size][head_dim] per block/head."""

    TOKEN_MAJOR = 0
    DIM_MAJOR = 1


class RopeStyle(CEnum):
    """fd_rope_style: which dims of a head RoPE rotates together
    (docs/semantics.md S3.1). Both use inv_freq[i] = rope_base^(-2i /
    rotary_dim) and leave dims from rotary_dim on unchanged.

    SPLIT_HALF (default): pair i is (i, i + rotary_dim/2), "rotate_half"
    (GPT-NeoX; Llama, Mistral, Qwen, Gemma, Phi in Hugging Face layout).
    INTERLEAVED: pair i is (2i, 2i + 1) (GPT-J, CodeGen, ChatGLM, Meta's
    original Llama layout). A checkpoint's Q/K weights fix the style."""

    SPLIT_HALF = 0
    INTERLEAVED = 1


def _rope_style(style: int) -> int:
    """The int32 a ``rope_style`` field or argument passes to C. Any int32
    goes through (the library refuses an unknown style, naming it); a value
    outside int32 would wrap in ctypes, so it is refused here."""
    value = int(style)
    if not -0x80000000 <= value <= 0x7FFFFFFF:
        from .errors import argument_error

        raise argument_error(f"rope_style must fit in int32, got {value}")
    return value


class DeviceType(CEnum):
    """fd_device_type: where a cache's memory lives and its work runs."""

    CPU = 0
    CUDA = 1


class RequestState(CEnum):
    """fd_request_state of a cache request (:meth:`Cache.request_state`)."""

    UNKNOWN = 0
    ACTIVE = 1
    FINISHED = 2
    CANCELLED = 3


class TxState(CEnum):
    """fd_tx_state of a transaction."""

    OPEN = 0
    COMMITTED = 1
    ABORTED = 2


@dataclass(frozen=True)
class Device:
    """Where memory lives and work runs. ``Device.cpu()`` or ``Device.cuda(n)``."""

    type: DeviceType = DeviceType.CPU
    ordinal: int = 0

    @staticmethod
    def cpu() -> "Device":
        return Device(DeviceType.CPU, 0)

    @staticmethod
    def cuda(ordinal: int = 0) -> "Device":
        return Device(DeviceType.CUDA, ordinal)

    def to_c(self) -> _lib.fd_device:
        return _lib.fd_device(int(self.type), int(self.ordinal))

    @staticmethod
    def from_c(d: _lib.fd_device) -> "Device":
        try:
            t = DeviceType(d.type)
        except ValueError:
            t = d.type  # type: ignore[assignment]
        return Device(t, d.ordinal)


def _default_config() -> _lib.fd_cache_config:
    c = _lib.fd_cache_config()
    _lib.fd_cache_config_init(ctypes.byref(c))
    return c


@dataclass
class CacheConfig:
    """Parameters of a :class:`~flashdec.Cache` (fd_cache_config).

    Defaults come from the library's fd_cache_config_init, so they follow the
    runtime rather than a copy in this binding.

    ``input_dtype`` is the type of the K, V and Q given to layer writes and
    of the engine's step tensors: None (default, C's -1) means ``dtype``; an
    FP8 cache needs F16 or BF16 (or F32 on the CPU). The per-layer scales of
    an FP8 cache are given to :class:`~flashdec.Cache` (``k_scales=``,
    ``v_scales=``), not here: fd_cache_get_config does not report them.

    ``rope_style`` is the :class:`RopeStyle` of the cache's fused RoPE writes
    (:meth:`Transaction.write_layer_rope`, and so the engine's steps and
    prefill); default SPLIT_HALF. An unknown value is refused by the library
    (INVALID_ARGUMENT naming rope_style) when the cache is created.
    """

    num_layers: int = field(default_factory=lambda: _default_config().num_layers)
    num_kv_heads: int = field(default_factory=lambda: _default_config().num_kv_heads)
    head_dim: int = field(default_factory=lambda: _default_config().head_dim)
    block_size: int = field(default_factory=lambda: _default_config().block_size)
    max_blocks: int = field(default_factory=lambda: _default_config().max_blocks)
    prefix_cache_capacity_blocks: int = field(
        default_factory=lambda: _default_config().prefix_cache_capacity_blocks
    )
    dtype: DType = field(default_factory=lambda: DType(_default_config().dtype))
    layout: Layout = field(default_factory=lambda: Layout(_default_config().layout))
    device: Device = field(default_factory=lambda: Device.from_c(_default_config().device))
    input_dtype: Optional[DType] = None
    rope_style: RopeStyle = field(default_factory=lambda: RopeStyle(_default_config().rope_style))

    @property
    def resolved_input_dtype(self) -> DType:
        """The type layer writes and engine steps take: input_dtype, else dtype."""
        return DType(self.dtype if self.input_dtype is None else self.input_dtype)

    def to_c(self) -> _lib.fd_cache_config:
        c = _default_config()
        for name in (
            "num_layers",
            "num_kv_heads",
            "head_dim",
            "block_size",
            "max_blocks",
            "prefix_cache_capacity_blocks",
        ):
            value = int(getattr(self, name))
            if not 0 <= value <= 0xFFFFFFFF:
                from .errors import argument_error

                raise argument_error(f"{name} must fit in uint32, got {value}")
            setattr(c, name, value)
        c.dtype = int(self.dtype)
        c.layout = int(self.layout)
        c.device = self.device.to_c()
        c.input_dtype = -1 if self.input_dtype is None else int(self.input_dtype)
        c.rope_style = _rope_style(self.rope_style)
        return c

    @staticmethod
    def from_c(c: _lib.fd_cache_config) -> "CacheConfig":
        return CacheConfig(
            num_layers=c.num_layers,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            block_size=c.block_size,
            max_blocks=c.max_blocks,
            prefix_cache_capacity_blocks=c.prefix_cache_capacity_blocks,
            dtype=DType(c.dtype),
            layout=Layout(c.layout),
            device=Device.from_c(c.device),
            input_dtype=None if c.input_dtype < 0 else DType(c.input_dtype),
            rope_style=RopeStyle(c.rope_style),
        )

    @property
    def token_shape(self) -> Tuple[int, int]:
        """(num_kv_heads, head_dim): the trailing shape of one token's K or V."""
        return (self.num_kv_heads, self.head_dim)
