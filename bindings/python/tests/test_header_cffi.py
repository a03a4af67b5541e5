"""Another toolchain can parse the public header: cffi's cdef accepts
include/flashdec.h once FD_API and preprocessor lines are removed (docs/abi.md
rule 14), and the layout cffi derives agrees with ctypes."""

from __future__ import annotations

import re

import pytest

from flashdec import _lib

from conftest import HEADER, library_file

cffi = pytest.importorskip("cffi")


def cdef_source() -> str:
    """The header as cdef input: C++-only blocks (#ifdef __cplusplus ...
    #endif) and every other preprocessor line removed, FD_API erased."""
    kept, skipping = [], False
    for line in HEADER.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#ifdef __cplusplus"):
            skipping = True
        elif skipping and stripped.startswith("#endif"):
            skipping = False
        elif not skipping and not stripped.startswith("#"):
            kept.append(line)
    return re.sub(r"\bFD_API\b", "", "\n".join(kept))


@pytest.fixture(scope="module")
def ffi():
    f = cffi.FFI()
    f.cdef(cdef_source())
    return f


def test_header_parses(ffi):
    assert ffi.typeof("fd_cache_config").kind == "struct"


def test_every_function_is_declared(ffi):
    lib = ffi.dlopen(library_file())
    for name in _lib.SIGNATURES:
        if name in _lib.missing_symbols:
            continue  # reported by test_basics.test_every_header_symbol_is_exported
        assert ffi.typeof(getattr(lib, name)).kind == "function", name
    # and cffi can call through its own declarations
    assert ffi.string(lib.fd_version_string()).decode() == __import__("flashdec").version()


def test_cffi_layout_matches_ctypes(ffi):
    for name, struct in _lib.STRUCTS.items():
        assert ffi.sizeof(name) == __import__("ctypes").sizeof(struct), name
        for field, *_ in struct._fields_:
            assert ffi.offsetof(name, field) == getattr(struct, field).offset, f"{name}.{field}"


def test_enum_values_match(ffi):
    import flashdec as fd

    for s in fd.Status:
        const = "FD_OK" if s == 0 else "FD_ERR_" + s.name
        assert getattr(ffi.dlopen(library_file()), const) == int(s)
