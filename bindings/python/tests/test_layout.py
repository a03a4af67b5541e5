"""The generated ctypes structs have the C layout: bindings/layout_probe.c
(itself generated from the header's struct list) is compiled against the header
and prints every sizeof/offsetof, which must equal what ctypes computes."""

from __future__ import annotations

import ctypes
import re
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
        [cc, "-std=c99", "-Wall", "-Werror", "-I", str(HEADER.parent),
         str(REPO / "bindings" / "layout_probe.c"), "-o", str(exe)],
        check=True,
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_every_header_struct_is_declared_and_probed(probe):
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    in_header = set(re.findall(r"typedef struct (fd_\w+) \{", text))
    assert in_header and in_header == set(_lib.STRUCTS)
    assert {k for k in probe if "." not in k} == in_header


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
    # every field the probe prints has a declaration
    assert checked == sum(1 for k in probe if "." in k)
