"""The loaded library and its raw ctypes functions.

Every declaration comes from ``_decls``, which bindings/tools/gen_bindings.py
generates from include/flashdec.h with a C parser: the structs, enum values,
``FD_*`` constants and every function's ``argtypes``/``restype``. Nothing is
typed by hand here, so the header is the only place a signature is written.
tests/test_layout.py compares the generated structs with a C program compiled
against the header; tests/test_signatures.py checks the declarations cover
every exported symbol.

Nothing in this module raises FlashDecError: it is the raw layer. The safe API
lives in the other modules of the package.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import List, Tuple

from ._decls import *  # noqa: F401,F403  (structs, enums, constants, fd_* types)
from ._decls import (
    ENUMS,
    FD_VERSION_MAJOR,
    FD_VERSION_MINOR,
    FD_VERSION_NUMBER,
    FD_VERSION_PATCH,
    PARAMETERS,
    SIGNATURES,
    STRUCTS,
    fd_cache_metrics,
    fd_engine_metrics,
    fd_workload_report,
)

# Version of the header these declarations were generated from.
HEADER_VERSION_MAJOR = FD_VERSION_MAJOR
HEADER_VERSION_MINOR = FD_VERSION_MINOR
HEADER_VERSION_PATCH = FD_VERSION_PATCH
HEADER_VERSION_NUMBER = FD_VERSION_NUMBER

# The SONAME of a library with this header's ABI (docs/abi.md, "Versioning at
# 0.x"): libflashdec.so.MAJOR.MINOR while the major is 0, since a 0.x minor may
# break the ABI; libflashdec.so.MAJOR from 1.0 on.
SONAME = (
    f"libflashdec.so.{FD_VERSION_MAJOR}.{FD_VERSION_MINOR}"
    if FD_VERSION_MAJOR == 0
    else f"libflashdec.so.{FD_VERSION_MAJOR}"
)

# (name, ctype) in header order, for the Python-side dataclasses.
METRICS_FIELDS: List[Tuple[str, type]] = list(fd_cache_metrics._fields_)
ENGINE_METRICS_FIELDS: List[Tuple[str, type]] = list(fd_engine_metrics._fields_)
WORKLOAD_REPORT_FIELDS: List[Tuple[str, type]] = list(fd_workload_report._fields_)


class _MissingSymbol:
    """Stands in for a header function the loaded library does not export
    (an older or partial build); calling it raises instead of crashing."""

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.path = path

    def __call__(self, *args: object) -> None:
        raise NotImplementedError(
            f"{self.name} is declared in flashdec.h but not exported by {self.path}"
        )


def _candidates() -> List[str]:
    env = os.environ.get("FLASHDEC_LIBRARY")
    if env:
        # An explicit choice must not silently fall back to another copy.
        return [env]
    here = Path(__file__).resolve().parent
    found = [str(here / n) for n in ("libflashdec.so", SONAME) if (here / n).exists()]
    # The system's copy by its SONAME, through the dynamic loader path. Not
    # ctypes.util.find_library("flashdec"): it answers whichever libflashdec
    # ldconfig lists first, possibly one of another 0.x ABI.
    found.append(SONAME)
    return found


def _load() -> Tuple[ctypes.CDLL, str]:
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError(
        "cannot load libflashdec (set FLASHDEC_LIBRARY to its full path): " + "; ".join(errors)
    )


lib, library_path = _load()
missing_symbols: List[str] = []

for _name, (_res, _args) in SIGNATURES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        missing_symbols.append(_name)
        globals()[_name] = _MissingSymbol(_name, library_path)
        continue
    _fn.restype = _res
    _fn.argtypes = list(_args)
    globals()[_name] = _fn
