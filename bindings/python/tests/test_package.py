"""How the package finds libflashdec (FLASHDEC_LIBRARY > the package folder >
the system), and, for an installed wheel (bindings/run-tests.sh sets
FLASHDEC_TEST_WHEEL=1), that it runs with no environment at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flashdec as fd

PACKAGE_DIR = Path(fd.__file__).resolve().parent
SOURCE_PACKAGE = Path(__file__).resolve().parents[1] / "flashdec"
WHEEL = os.environ.get("FLASHDEC_TEST_WHEEL") == "1"


def _python(code: str, **env_changes: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    # Run from the package's parent so that the same flashdec is imported.
    return subprocess.run([sys.executable, "-c", code], cwd=str(PACKAGE_DIR.parent), env=env,
                          capture_output=True, text=True, timeout=120)


def _bundled() -> list:
    return sorted(p for p in PACKAGE_DIR.glob("libflashdec.so*") if p.is_file())


def _soname() -> str:
    """libflashdec.so.MAJOR.MINOR while the major is 0, else .so.MAJOR (the rule
    of flashdec.h's version group, derived here from the version string)."""
    major, minor, _ = fd.HEADER_VERSION.split(".")
    return f"libflashdec.so.{major}.{minor}" if major == "0" else f"libflashdec.so.{major}"


def test_library_path_follows_the_lookup_order():
    loaded = Path(fd.library_path())
    env = os.environ.get("FLASHDEC_LIBRARY")
    if env:
        assert loaded == Path(env)
    elif _bundled():
        assert loaded.parent.resolve() == PACKAGE_DIR
    else:
        assert loaded.name.startswith("libflashdec")
    assert fd.is_compatible()


def test_explicit_library_does_not_fall_back(tmp_path):
    missing = tmp_path / "no-such-libflashdec.so"
    r = _python("import flashdec", FLASHDEC_LIBRARY=str(missing))
    assert r.returncode != 0
    assert "ImportError" in r.stderr and str(missing) in r.stderr
    assert "FLASHDEC_LIBRARY" in r.stderr  # the message says how to point at a library


@pytest.mark.skipif(not WHEEL, reason="checks of an installed wheel (bindings/run-tests.sh)")
class TestInstalledWheel:
    def test_no_environment_needed(self):
        for var in ("FLASHDEC_LIBRARY", "LD_LIBRARY_PATH", "PYTHONPATH"):
            assert var not in os.environ, f"{var} is set: the wheel must work without it"

    def test_package_is_installed_not_the_source_tree(self):
        assert PACKAGE_DIR != SOURCE_PACKAGE.resolve()
        assert "site-packages" in PACKAGE_DIR.parts

    def test_library_is_inside_the_package(self):
        bundled = _bundled()
        assert [p.name for p in bundled] == [_soname()]  # one file, no copies
        assert Path(fd.library_path()).resolve() == bundled[0].resolve()
        assert fd.version() == fd.__version__

    def test_library_needs_no_runpath(self):
        readelf = shutil.which("readelf")
        if not readelf:
            pytest.skip("no readelf")
        dyn = subprocess.run([readelf, "-d", str(_bundled()[0])], capture_output=True, text=True,
                             check=True).stdout
        sonames = [ln.split("[", 1)[1].rstrip("]") for ln in dyn.splitlines() if "(SONAME)" in ln]
        assert sonames == [_soname()], sonames  # the file name the loader looks for
        for line in dyn.splitlines():
            if "(RPATH)" in line or "(RUNPATH)" in line:
                # Anything but $ORIGIN would point into the build machine.
                paths = line.split("[", 1)[1].rstrip("]").split(":")
                assert all(p.startswith("$ORIGIN") for p in paths), line
        needed = [ln.split("[", 1)[1].rstrip("]") for ln in dyn.splitlines() if "(NEEDED)" in ln]
        assert not [n for n in needed if "flashdec" in n or "cuda" in n], needed

    def test_import_and_decode_in_a_clean_process(self):
        code = (
            "import numpy as np, flashdec as fd\n"
            "with fd.Cache(num_layers=1, num_kv_heads=1, head_dim=8, block_size=4, max_blocks=4,"
            " dtype=fd.DType.F32) as c:\n"
            "    c.add_request(1)\n"
            "    with c.begin([1]) as tx:\n"
            "        tx.write_layer(0, np.ones((1, 1, 8), np.float32), np.full((1, 1, 8), 3, np.float32))\n"
            "        tx.commit()\n"
            "    out = c.decode(0, np.ones((1, 2, 8), np.float32), request_ids=[1])\n"
            "print(fd.library_path(), float(out.sum()))\n"
        )
        r = _python(code, FLASHDEC_LIBRARY=None, LD_LIBRARY_PATH=None)
        assert r.returncode == 0, r.stderr
        path, total = r.stdout.split()
        assert Path(path).parent.resolve() == PACKAGE_DIR
        # One token of V = 3 everywhere: every output element is 3.
        assert np.isclose(float(total), 3.0 * 2 * 8)
