"""A second toolchain reads the public header: cffi's cdef accepts
include/flashdec.h once FD_API and the preprocessor lines are removed (docs/abi.md
rule 14). Its view of functions, layouts and enum values must agree with the
generated ctypes declarations, and regenerating them from the header must give
the installed _decls.py byte for byte."""

from __future__ import annotations

import ctypes
import enum
import importlib.util
import os
import sys
from pathlib import Path

import pytest

import flashdec as fd
from flashdec import _decls, _lib

from conftest import HEADER, REPO, library_file

cffi = pytest.importorskip("cffi")
pytest.importorskip("pycparser")


@pytest.fixture(scope="module")
def gen():
    """bindings/tools/gen_bindings.py, imported as a module."""
    spec = importlib.util.spec_from_file_location("gen_bindings", REPO / "bindings" / "tools" / "gen_bindings.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def ffi(gen):
    f = cffi.FFI()
    f.cdef(gen.cdef_source(HEADER.read_text()))
    return f


def test_generated_declarations_are_current(gen):
    expected = gen.emit_python(gen.header_model())
    assert Path(_decls.__file__).read_text() == expected, (
        "flashdec/_decls.py is stale: run python3 bindings/tools/gen_bindings.py")
    assert (REPO / "bindings" / "layout_probe.c").read_text() == gen.emit_probe(gen.header_model())


def test_header_parses(ffi):
    assert ffi.typeof("fd_cache_config").kind == "struct"


def test_every_function_is_declared(ffi):
    lib = ffi.dlopen(library_file())
    for name, (restype, argtypes) in _lib.SIGNATURES.items():
        if name in _lib.missing_symbols:
            continue  # reported by test_basics.test_every_header_symbol_is_exported
        t = ffi.typeof(getattr(lib, name))
        assert t.kind == "function", name
        assert len(t.args) == len(argtypes), name
        assert (t.result.cname == "void") == (restype is None), name
        for a, ct in zip(t.args, argtypes):
            # same width in both views (pointers are pointer-sized)
            assert ffi.sizeof(a) == ctypes.sizeof(ct), f"{name}: {a.cname}"
    # and cffi can call through its own declarations
    assert ffi.string(lib.fd_version_string()).decode() == fd.version()


def test_cffi_layout_matches_ctypes(ffi):
    for name, struct in _lib.STRUCTS.items():
        assert ffi.sizeof(name) == ctypes.sizeof(struct), name
        assert ffi.alignof(name) == ctypes.alignment(struct), name
        for field, *_ in struct._fields_:
            assert ffi.offsetof(name, field) == getattr(struct, field).offset, f"{name}.{field}"


def test_enum_values_match(ffi):
    lib = ffi.dlopen(library_file())
    for enum_name, values in _decls.ENUMS.items():
        for const, value in values:
            assert getattr(lib, const) == value == getattr(_decls, const), const


PYTHON_ENUMS = {
    "fd_status": fd.Status,
    "fd_dtype": fd.DType,
    "fd_kv_layout": fd.Layout,
    "fd_device_type": fd.DeviceType,
    "fd_request_state": fd.RequestState,
    "fd_tx_state": fd.TxState,
    "fd_rope_style": fd.RopeStyle,
    "fd_schedule_reason": fd.ScheduleReason,
    "fd_decision_list": fd.DecisionList,
    "fd_engine_request_state": fd.EngineRequestState,
    "fd_engine_step_outcome": fd.StepOutcome,
    "fd_workload_kind": fd.WorkloadKind,
    "fd_workload_policy": fd.WorkloadPolicy,
}


def test_python_enums_mirror_the_header():
    """The idiomatic IntEnums (hand-written for their docs) hold exactly the
    header's values, named without the common prefix."""
    assert set(PYTHON_ENUMS) == set(_decls.ENUMS), "a header enum without a Python IntEnum"
    for c_name, py_enum in PYTHON_ENUMS.items():
        consts = [(k, v) for k, v in _decls.ENUMS[c_name] if not k.endswith("FORCE_32BIT")]
        prefix = os.path.commonprefix([k for k, _ in consts])
        prefix = prefix[: prefix.rfind("_") + 1]
        expected = {k[len(prefix):].removeprefix("ERR_"): v for k, v in consts}
        assert issubclass(py_enum, enum.IntEnum)
        assert {m.name: int(m) for m in py_enum} == expected, c_name
