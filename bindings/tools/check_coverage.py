#!/usr/bin/env python3
"""Checks that every binding covers every function of include/flashdec.h.

    python3 bindings/tools/check_coverage.py

The header's functions are read with the C parser of gen_bindings.py. Then,
for each binding:

* Python: flashdec/_decls.py declares every function (and no other), and the
  idiomatic modules call each one as ``_lib.fd_xxx``;
* Rust: flashdec-sys/src/generated.rs declares every function (and no other),
  and the safe crate (flashdec/src) calls each one;
* Go: the package (bindings/go, tests excluded) calls each one, as
  ``C.fd_xxx`` or from a C shim in a cgo preamble (cgo reads the header
  itself, so there is no declaration list to compare).

A function a binding deliberately leaves unwrapped goes into UNWRAPPED below
with the reason; an entry for a function that is wrapped after all, or that
the header no longer has, is an error too, so the lists stay true. Exit
status 0 when everything is covered.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Set

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_bindings  # noqa: E402

ROOT = gen_bindings.ROOT
BINDINGS = ROOT / "bindings"

# binding -> {function: why it is not wrapped}. Empty today: every binding
# wraps all of the header.
UNWRAPPED: Dict[str, Dict[str, str]] = {
    "python": {},
    "rust": {},
    "go": {},
}


def strip_comments(text: str, style: str) -> str:
    if style == "py":
        return re.sub(r"#[^\n]*", "", text)
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def read(paths: Iterable[Path], style: str) -> str:
    return "\n".join(strip_comments(p.read_text(), style) for p in sorted(paths))


def called(functions: Iterable[str], text: str, pattern: str) -> Set[str]:
    return {f for f in functions if re.search(pattern.format(re.escape(f)), text)}


def go_sources() -> str:
    """Go calls (C.fd_xxx) plus the C code of the cgo preambles (the comment
    right above `import "C"`), where shims call the library directly."""
    parts: List[str] = []
    for p in sorted(BINDINGS.glob("go/**/*.go")):
        if p.name.endswith("_test.go"):
            continue
        text = p.read_text()
        for m in re.finditer(r"/\*(.*?)\*/\s*import\s+\"C\"", text, re.S):
            parts.append(m.group(1))
        for m in re.finditer(r"((?:^//[^\n]*\n)+)import\s+\"C\"", text, re.M):
            parts.append(re.sub(r"^//", "", m.group(1), flags=re.M))
        parts.append(strip_comments(text, "c"))
    return "\n".join(parts)


def check(header: List[str]) -> List[str]:
    """Every problem found for these header functions, as lines of text."""
    hset = set(header)
    problems: List[str] = []

    def compare_declared(binding: str, declared: Set[str]) -> None:
        for f in sorted(hset - declared):
            problems.append(f"{binding}: {f} is in the header but not declared")
        for f in sorted(declared - hset):
            problems.append(f"{binding}: declares {f}, which the header lacks")

    def compare_used(binding: str, used: Set[str]) -> None:
        skip = UNWRAPPED[binding]
        for f in header:
            if f not in used and f not in skip:
                problems.append(f"{binding}: {f} is neither wrapped nor listed in UNWRAPPED with a reason")
        for f, why in skip.items():
            if f not in hset:
                problems.append(f"{binding}: UNWRAPPED lists {f}, which the header lacks")
            elif f in used:
                problems.append(f"{binding}: UNWRAPPED lists {f} ({why}) but it is wrapped")
            elif not why.strip():
                problems.append(f"{binding}: UNWRAPPED gives no reason for {f}")

    # Python
    decls = (BINDINGS / "python" / "flashdec" / "_decls.py").read_text()
    sig = decls[decls.index("SIGNATURES"):]
    sig = sig[: sig.index("\n}\n")]
    compare_declared("python", set(re.findall(r"^    '(fd_\w+)': \(", sig, re.M)))
    py = read((p for p in BINDINGS.glob("python/flashdec/*.py") if p.name not in ("_lib.py", "_decls.py")), "py")
    compare_used("python", called(header, py, r"_lib\.{}\b"))

    # Rust
    sys_rs = (BINDINGS / "rust" / "flashdec-sys" / "src" / "generated.rs").read_text()
    compare_declared("rust", set(re.findall(r"pub fn (fd_\w+)\s*\(", sys_rs)))
    rs = read(BINDINGS.glob("rust/flashdec/src/*.rs"), "c")
    compare_used("rust", called(header, rs, r"\b{}\s*\("))

    # Go
    compare_used("go", called(header, go_sources(), r"(?:\bC\.{0}\b|\b{0}\s*\()"))
    return problems


def main() -> int:
    header = list(gen_bindings.header_model().functions)
    # Self-test first: a function the header would gain must be reported by
    # every binding (declared nowhere, wrapped nowhere), or the check is blind.
    fake = "fd_coverage_self_test"
    seen = [p for p in check(header + [fake]) if fake in p]
    if len(seen) != 5:
        print(f"binding coverage: the self-test expected 5 reports of {fake}, got {seen}")
        return 1
    problems = check(header)
    for p in problems:
        print("  " + p)
    counts = ", ".join(f"{b}: {len(header) - len(s)} wrapped, {len(s)} listed unwrapped"
                       for b, s in UNWRAPPED.items())
    if problems:
        print(f"binding coverage: {len(problems)} problem(s) over {len(header)} header functions")
        return 1
    print(f"binding coverage: all {len(header)} header functions declared and wrapped ({counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
