"""ctypes mirrors of the header structs have the C layout: a tiny C program
(bindings/layout_probe.c) compiled against the header prints sizeof/offsetof."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from flashdec import _lib

from conftest import HEADER, REPO


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path_factory.mktemp("probe") / "layout_probe"
    subprocess.run(
        [cc, "-std=c99", "-I", str(HEADER.parent), str(REPO / "bindings" / "layout_probe.c"), "-o", str(exe)],
        check=True,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_struct_sizes(probe):
    for name, struct in _lib.STRUCTS.items():
        assert ctypes.sizeof(struct) == probe[name], name


def test_field_offsets(probe):
    checked = 0
    for name, struct in _lib.STRUCTS.items():
        for field, *_ in struct._fields_:
            key = f"{name}.{field}"
            assert key in probe, f"probe does not print {key}"
            assert getattr(struct, field).offset == probe[key], key
            checked += 1
    # every field the probe prints has a mirror
    assert checked == sum(1 for k in probe if "." in k)
