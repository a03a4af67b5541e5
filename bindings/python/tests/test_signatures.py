"""Every function of the header is declared in _lib.SIGNATURES (and nothing
else), and every fd_* symbol the shared library exports is declared."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from flashdec import _lib

from conftest import HEADER, library_file


def header_functions() -> set:
    text = HEADER.read_text()
    return set(re.findall(r"FD_API\s+[^;(]*?\b(fd_[a-z0-9_]+)\s*\(", text))


def test_header_functions_match_declarations():
    declared = set(_lib.SIGNATURES)
    in_header = header_functions()
    assert in_header, "no FD_API functions found in the header"
    assert in_header - declared == set(), "header functions without ctypes declarations"
    assert declared - in_header == set(), "declarations of functions the header lacks"


def test_declared_functions_have_argtypes_and_restype():
    for name in _lib.SIGNATURES:
        if name in _lib.missing_symbols:
            continue  # reported by test_basics.test_every_header_symbol_is_exported
        fn = getattr(_lib.lib, name)
        restype, argtypes = _lib.SIGNATURES[name]
        assert fn.argtypes == list(argtypes), name
        assert fn.restype is restype, name


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm not installed")
def test_exported_symbols_are_declared():
    out = subprocess.run(["nm", "-D", "--defined-only", library_file()], capture_output=True, text=True, check=True)
    exported = {m.split("@")[0] for m in re.findall(r"\sT\s+(fd_\S+)", out.stdout)}
    assert exported - set(_lib.SIGNATURES) == set(), "exported functions unknown to the binding"
