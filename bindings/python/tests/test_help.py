"""help(flashdec) reads like a library's documentation: the package docstring's
example runs, and the enums do not drag in the inherited int API."""

from __future__ import annotations

import doctest
import enum
import pydoc

import flashdec as fd
from flashdec.types import CEnum

# Names only int's own API has; none may show up in help(flashdec).
INT_API = ("bit_length", "to_bytes", "from_bytes", "as_integer_ratio", "conjugate", "__rshift__")


def _render(obj) -> str:
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


def _public_enums():
    return sorted(
        (v for v in vars(fd).values() if isinstance(v, enum.EnumMeta) and issubclass(v, int)),
        key=lambda e: e.__name__,
    )


def test_package_docstring_example_runs():
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = finder.find(fd, "flashdec")
    assert tests and tests[0].examples, "the package docstring has no example"
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.attempted >= 5
    assert result.failed == 0


def test_help_is_concise():
    text = _render(fd)
    lines = text.splitlines()
    # About 1900 lines today (dataclasses, Cache, Engine, ...); the int API of
    # the 12 enums alone used to add about 3500.
    assert len(lines) < 2500, len(lines)
    for name in INT_API:
        assert name not in text, f"help(flashdec) shows int's {name}"
    assert "inherited from builtins.int" not in text
    # The description keeps the install note, the lookup order and the enums.
    assert "pip install ./bindings/python" in text
    assert "FLASHDEC_LIBRARY" in text


def test_every_enum_is_a_cenum_with_short_help():
    enums = _public_enums()
    assert {e.__name__ for e in enums} >= {"DType", "Layout", "DeviceType", "Status", "TxState"}
    package_doc = fd.__doc__ or ""
    for e in enums:
        assert issubclass(e, CEnum), f"{e.__name__} derives from IntEnum directly: help() lists int's API"
        text = _render(e)
        assert len(text.splitlines()) < 80, (e.__name__, len(text.splitlines()))
        for member in e:
            assert f" |  {member.name} = <{e.__name__}." in text  # pydoc shortens long reprs
        assert "bit_length" not in text
        # Documented once, in the package docstring's enum paragraph.
        assert f":class:`{e.__name__}`" in package_doc, f"{e.__name__} missing from flashdec.__doc__"


def test_enums_stay_ints():
    assert fd.DType.BF16 == 2 and isinstance(fd.DType.BF16, int)
    assert fd.DType(1) is fd.DType.F16 and fd.DType["F32"] is fd.DType.F32
    assert fd.DType.BF16.itemsize == 2 and fd.DType.F32.itemsize == 4
    assert fd.Status.NOT_FOUND.bit_length() == 2  # still there, just not in help()
    assert fd.Layout.DIM_MAJOR.name == "DIM_MAJOR" and fd.Layout.DIM_MAJOR.value == 1
    assert "itemsize" in dir(fd.DType) and "bit_length" not in dir(fd.DType)
    assert f"{fd.TxState.ABORTED}" == "2"
