"""Status codes and the one exception type of the binding."""

from __future__ import annotations

from typing import Union

from . import _lib
from .types import CEnum


class Status(CEnum):
    """fd_status values (pinned forever in flashdec.h)."""

    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_BLOCKS = 2
    NOT_FOUND = 3
    INVALID_STATE = 4
    STALE_HANDLE = 5
    UNSUPPORTED = 6
    NO_DEVICE = 7
    DEVICE = 8
    OUT_OF_MEMORY = 9
    INTERNAL = 10
    ALREADY_EXISTS = 11
    INVARIANT = 12


def status_string(status: int) -> str:
    """Static name of a status from the library, e.g. "FD_ERR_NOT_FOUND: not found"."""
    return _lib.fd_status_string(int(status)).decode()


class FlashDecError(Exception):
    """A FlashDec call failed.

    Attributes:
        status: the :class:`Status` (a plain int when the library returned a
            code newer than this binding).
        message: the library's detail from fd_last_error_message(), read on the
            failing thread right after the call.
    """

    def __init__(self, status: Union[Status, int], message: str) -> None:
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        super().__init__(f"{status_string(int(status))}: {message}")


def check(status: int) -> None:
    """Raises FlashDecError for every status other than FD_OK.

    The message is thread-local in the library; ctypes runs the call and this
    check on the same Python thread, and the GIL-free window between them runs
    no FlashDec call on this thread, so the message belongs to this failure.
    """
    if status != Status.OK:
        raise FlashDecError(status, _lib.fd_last_error_message().decode(errors="replace"))


def argument_error(message: str) -> FlashDecError:
    """An INVALID_ARGUMENT raised by the binding itself, before any C call
    (wrong shape, dtype, device or contiguity of an array)."""
    return FlashDecError(Status.INVALID_ARGUMENT, message)
