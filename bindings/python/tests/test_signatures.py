"""The generated declarations (flashdec/_decls.py, from the header by
bindings/tools/gen_bindings.py) cover every function of the header and every
fd_* symbol the library exports, and ctypes applies them."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

import flashdec as fd
from flashdec import _decls, _lib

from conftest import HEADER, library_file


def header_functions() -> set:
    # An independent reading of the header (a regex, not the generator's parser).
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    return set(re.findall(r"FD_API\s+[^;(]*?\b(fd_[a-z0-9_]+)\s*\(", text))


def test_header_functions_match_declarations():
    declared = set(_lib.SIGNATURES)
    in_header = header_functions()
    assert len(in_header) > 80, "FD_API functions not found in the header"
    assert in_header - declared == set(), "header functions without ctypes declarations"
    assert declared - in_header == set(), "declarations of functions the header lacks"
    assert set(_decls.PARAMETERS) == declared


def test_declared_functions_have_argtypes_and_restype():
    for name, (restype, argtypes) in _lib.SIGNATURES.items():
        if name in _lib.missing_symbols:
            continue  # reported by test_basics.test_every_header_symbol_is_exported
        fn = getattr(_lib, name)
        assert fn is getattr(_lib.lib, name), name
        assert fn.argtypes == list(argtypes), name
        assert fn.restype is restype, name
        assert len(argtypes) == len(_decls.PARAMETERS[name]), name


def test_parameter_types_follow_the_header():
    sig = _lib.SIGNATURES
    # handles travel as void pointers, out-handles as pointers to them
    assert sig["fd_cache_create"] == (_lib.fd_status, [ctypes.POINTER(_lib.fd_cache_config),
                                                       ctypes.POINTER(ctypes.c_void_p)])
    assert sig["fd_cache_destroy"] == (None, [ctypes.c_void_p])
    # strings, structs by value, 64-bit ids, floats, streams
    assert sig["fd_prefix_attach"][1] == [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p]
    assert sig["fd_tx_commit"][1] == [ctypes.c_void_p, _lib.fd_tx]
    assert sig["fd_tx_write_layer_rope"][1][8] is ctypes.c_float
    assert sig["fd_cache_append"][1][-1] is ctypes.c_void_p  # fd_stream
    assert sig["fd_version_number"] == (ctypes.c_uint32, [])
    assert sig["fd_workload_case_name"][1][2] == ctypes.POINTER(ctypes.c_char_p)
    # int64_t strides[4] decays to a pointer
    assert issubclass(sig["fd_cache_layer_storage"][1][4], ctypes.POINTER(ctypes.c_int64))


def test_typed_pointers_take_addresses_and_refuse_wrong_elements(cache):
    fn = _lib.fd_cache_state_version  # (const fd_cache *, uint64_t *)
    v = ctypes.c_uint64(0)
    assert fn(cache._h(), ctypes.byref(v)) == 0
    arr = np.zeros(1, dtype=np.uint64)
    assert fn(cache._h(), arr.ctypes.data) == 0  # a raw address (numpy/torch data pointer)
    assert arr[0] == v.value
    with pytest.raises(ctypes.ArgumentError):
        fn(cache._h(), ctypes.byref(ctypes.c_uint32(0)))  # wrong element type
    with pytest.raises(ctypes.ArgumentError):
        fn(cache._h(), "not a pointer")


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm not installed")
def test_exported_symbols_are_declared():
    out = subprocess.run(["nm", "-D", "--defined-only", library_file()], capture_output=True, text=True, check=True)
    exported = {m.split("@")[0] for m in re.findall(r"\sT\s+(fd_\S+)", out.stdout)}
    assert exported, "nm found no fd_* exports"
    assert exported - set(_lib.SIGNATURES) == set(), "exported functions unknown to the binding"
    # Every export carries the version node named after the SONAME
    # (FLASHDEC_0.2 for libflashdec.so.0.2), where nm shows versions at all.
    nodes = {m.lstrip("@") for m in re.findall(r"\sT\s+fd_\w+@(@?\S+)", out.stdout)}
    if nodes:
        assert nodes == {"FLASHDEC_" + _lib.SONAME[len("libflashdec.so."):]}, nodes


def test_header_version_matches_library():
    assert _lib.HEADER_VERSION_NUMBER == _decls.FD_VERSION_NUMBER
    assert fd.is_compatible()
