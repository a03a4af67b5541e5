"""Version, status strings, the error type and library loading."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import flashdec as fd
from flashdec import _lib


def test_version_matches_header():
    assert fd.version() == fd.HEADER_VERSION
    major, minor, patch = (int(x) for x in fd.version().split("."))
    assert fd.version_number() == major * 10000 + minor * 100 + patch
    assert fd.is_compatible()


def test_is_compatible_rules():
    header = _lib.HEADER_VERSION_NUMBER
    assert fd.is_compatible(header)
    assert not fd.is_compatible(10000 + header)  # other major
    assert fd.is_compatible(header + 1)  # newer patch
    if header % 100 > 0:
        assert not fd.is_compatible(header - 1)  # older patch
    if header % 10000 >= 100:
        assert not fd.is_compatible(header - 100)  # older minor
    # A newer minor: before 1.0 it may have changed the ABI (0.2 did), so the
    # minor must be equal; from 1.0 on minors only append.
    assert fd.is_compatible(header + 100) == (_lib.HEADER_VERSION_MAJOR != 0)


def test_soname_carries_the_minor_before_1_0():
    major, minor = _lib.HEADER_VERSION_MAJOR, _lib.HEADER_VERSION_MINOR
    assert _lib.SONAME == (f"libflashdec.so.{major}.{minor}" if major == 0 else f"libflashdec.so.{major}")


def test_status_strings_name_every_code():
    for s in fd.Status:
        assert fd.status_string(s).startswith("FD_" if s else "FD_OK")
    assert fd.status_string(fd.Status.NOT_FOUND).startswith("FD_ERR_NOT_FOUND")
    assert fd.status_string(4242)  # unknown codes still give a string


def test_cuda_device_count_is_non_negative():
    assert fd.cuda_device_count() >= 0


def test_every_header_symbol_is_exported():
    assert _lib.missing_symbols == []


def test_error_carries_status_and_message():
    with pytest.raises(fd.FlashDecError) as info:
        fd.Cache(num_layers=0)
    e = info.value
    assert e.status == fd.Status.INVALID_ARGUMENT
    assert "num_layers" in e.message
    assert "FD_ERR_INVALID_ARGUMENT" in str(e)


def test_check_is_silent_on_ok_and_raises_otherwise():
    fd.check(0)
    with pytest.raises(fd.FlashDecError) as info:
        fd.check(int(fd.Status.NOT_FOUND))
    assert info.value.status is fd.Status.NOT_FOUND


def test_error_message_is_per_thread():
    import threading

    with pytest.raises(fd.FlashDecError):
        fd.Cache(num_layers=0)
    seen = []
    t = threading.Thread(target=lambda: seen.append(_lib.fd_last_error_message()))
    t.start()
    t.join()
    assert seen == [b""]  # the other thread never failed
    assert b"num_layers" in _lib.fd_last_error_message()


def _import_with(env_value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FLASHDEC_LIBRARY=env_value)
    return subprocess.run([sys.executable, "-c", "import flashdec"], env=env, capture_output=True, text=True)


def test_flashdec_library_env_var_is_honoured():
    bad = _import_with("/nonexistent/libflashdec.so")
    assert bad.returncode != 0
    assert "FLASHDEC_LIBRARY" in bad.stderr and "/nonexistent/libflashdec.so" in bad.stderr
    good = _import_with(fd.library_path())
    assert good.returncode == 0, good.stderr
