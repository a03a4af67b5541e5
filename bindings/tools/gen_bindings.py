#!/usr/bin/env python3
"""Derives the bindings' declarations from include/flashdec.h, the one source.

    python3 bindings/tools/gen_bindings.py           # rewrite the generated files
    python3 bindings/tools/gen_bindings.py --check   # exit 1 if one is stale

The header is parsed by a real C parser (pycparser, the parser behind cffi's
``cdef``) after the preprocessor lines, the C++ guard and the export macro are
removed; the ``#define FD_*`` constants are read from the preprocessor lines.
From that one model it writes:

* ``bindings/python/flashdec/_decls.py``: ctypes structs, enum values,
  constants and every function's ``(restype, argtypes)``;
* ``bindings/layout_probe.c``: prints sizeof/offsetof of every header struct
  and field, for the Python and Rust layout tests;
* ``bindings/rust/flashdec-sys/tests/common/fields.rs``: the struct/field list
  of the Rust layout test;
* ``bindings/rust/flashdec-sys/src/fields.rs``: ``named_fields()`` of the
  metrics structs (generic printing in the parity example).

The Rust declarations themselves (``flashdec-sys/src/generated.rs``) come from
bindgen (Debian package ``bindgen``) with the flags in ``BINDGEN_FLAGS``. When
bindgen is missing, writing keeps the checked-in file and ``--check`` says
that it skipped the comparison.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "include" / "flashdec.h"
PY_OUT = ROOT / "bindings" / "python" / "flashdec" / "_decls.py"
PROBE_OUT = ROOT / "bindings" / "layout_probe.c"
RUST_FIELDS_OUT = ROOT / "bindings" / "rust" / "flashdec-sys" / "tests" / "common" / "fields.rs"
RUST_NAMED_OUT = ROOT / "bindings" / "rust" / "flashdec-sys" / "src" / "fields.rs"
RUST_SYS_OUT = ROOT / "bindings" / "rust" / "flashdec-sys" / "src" / "generated.rs"

# bindgen options. Enums become `pub type fd_x = c_uint` plus unprefixed
# constants (`FD_OK`), which is how the safe crate uses them; doc comments are
# left out (the header is the documentation, and rustdoc would try to run its
# indented examples as doctests); bindgen's own layout tests are kept.
BINDGEN_FLAGS = [
    "--no-doc-comments",
    "--allowlist-function", "fd_.*",
    "--allowlist-type", "fd_.*",
    "--allowlist-var", "FD_.*",
    "--default-enum-style", "consts",
    "--no-prepend-enum-name",
    "--size_t-is-usize",
]

# Integer and floating types the header uses (fixed-width only, rule 14).
SCALARS = {
    "uint32_t": ("c_uint32", "unsigned int"),
    "int32_t": ("c_int32", "int"),
    "uint64_t": ("c_uint64", "unsigned long long"),
    "int64_t": ("c_int64", "long long"),
    "size_t": ("c_size_t", "unsigned long"),
    "float": ("c_float", None),
    "double": ("c_double", None),
    "char": ("c_char", None),
}


# --------------------------------------------------------------------------
# The model


@dataclass
class CType:
    """A C type reduced to what the bindings need: a base name and pointer
    levels (outermost last), plus an array length for struct members."""

    base: str  # "void", a SCALARS key, or an fd_* typedef name
    pointers: int = 0
    array: Optional[int] = None

    def c(self) -> str:
        s = self.base + " " + "*" * self.pointers
        return s.strip() + (f"[{self.array}]" if self.array else "")


@dataclass
class Model:
    constants: Dict[str, int] = field(default_factory=dict)
    enums: Dict[str, List[Tuple[str, int]]] = field(default_factory=dict)
    opaque: List[str] = field(default_factory=list)  # typedef struct x x;
    structs: Dict[str, List[Tuple[str, CType]]] = field(default_factory=dict)
    aliases: Dict[str, CType] = field(default_factory=dict)  # fd_stream
    callbacks: Dict[str, Tuple[CType, List[CType]]] = field(default_factory=dict)
    functions: Dict[str, Tuple[CType, List[Tuple[str, CType]]]] = field(default_factory=dict)


def cdef_source(text: str) -> str:
    """The header as plain declarations: comments, preprocessor lines and the
    `extern "C"` guard removed, FD_API erased (what cffi's cdef accepts)."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    kept, skipping = [], False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#ifdef __cplusplus"):
            skipping = True
        elif skipping and s.startswith("#endif"):
            skipping = False
        elif not skipping and not s.startswith("#"):
            kept.append(line)
    return re.sub(r"\bFD_API\b", "", "\n".join(kept))


def header_constants(text: str) -> Dict[str, int]:
    """`#define FD_X <integer expression>` lines, evaluated in order."""
    values: Dict[str, int] = {}
    for m in re.finditer(r"^#define\s+(FD_\w+)\s+(.+?)\s*$", text, re.M):
        expr = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", m.group(2))
        if not re.fullmatch(r"[\w\s()+*/-]+", expr):
            continue  # not an integer expression (FD_API)
        try:
            values[m.group(1)] = int(eval(expr, {"__builtins__": {}}, dict(values)))  # noqa: S307
        except NameError:
            continue
    return values


def parse(text: str) -> Model:
    from pycparser import c_ast, c_parser

    prelude = "".join(f"typedef {c or 'int'} {n};\n" for n, (_, c) in SCALARS.items() if c)
    # `struct CUstream_st` stays incomplete, as in the header.
    ast = c_parser.CParser().parse(prelude + cdef_source(text), filename=str(HEADER))
    model = Model(constants=header_constants(text))
    prelude_names = {n for n, (_, c) in SCALARS.items() if c}

    def ctype(node) -> CType:
        if isinstance(node, c_ast.PtrDecl):
            inner = ctype(node.type)
            return CType(inner.base, inner.pointers + 1)
        if isinstance(node, c_ast.ArrayDecl):
            inner = ctype(node.type)
            return CType(inner.base, inner.pointers, int(node.dim.value.rstrip("uU")))
        if isinstance(node, c_ast.TypeDecl):
            t = node.type
            if isinstance(t, c_ast.IdentifierType):
                return CType(" ".join(t.names))
            if isinstance(t, c_ast.Struct):
                return CType("struct " + t.name)
        raise ValueError(f"unsupported type node {node}")

    def params(fn) -> List[Tuple[str, CType]]:
        out = []
        for p in (fn.args.params if fn.args else []):
            if isinstance(p, c_ast.Typename) and ctype(p.type).c() == "void":
                continue  # f(void)
            t = ctype(p.type)
            if t.array:  # a parameter array decays to a pointer
                t = CType(t.base, t.pointers + 1)
            out.append((p.name, t))
        return out

    for node in ast.ext:
        if isinstance(node, c_ast.Typedef):
            name, t = node.name, node.type
            if name in prelude_names:
                continue
            if isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.Enum):
                values, nxt = [], 0
                for e in t.type.values.enumerators:
                    if e.value is not None:
                        nxt = int(e.value.value.rstrip("uU"), 0)
                    values.append((e.name, nxt))
                    nxt += 1
                model.enums[name] = values
            elif isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.Struct):
                s = t.type
                if s.decls is None:
                    model.opaque.append(name)
                else:
                    model.structs[name] = [(d.name, ctype(d.type)) for d in s.decls]
            elif isinstance(t, c_ast.PtrDecl) and isinstance(t.type, c_ast.FuncDecl):
                fn = t.type
                model.callbacks[name] = (ctype(fn.type), [pt for _, pt in params(fn)])
            else:
                model.aliases[name] = ctype(t)
        elif isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            fn = node.type
            model.functions[node.name] = (ctype(fn.type), params(fn))
        else:
            raise ValueError(f"unexpected top-level declaration at {node.coord}")
    return model


def header_model() -> Model:
    return parse(HEADER.read_text())


# --------------------------------------------------------------------------
# Python (ctypes)


def py_type(m: Model, t: CType, in_struct: bool) -> str:
    """ctypes spelling of a header type.

    Handles (pointers to incomplete structs) and CUDA streams are c_void_p, so
    the idiomatic layer stores them as plain integers. A pointer to an integer
    or float is, in a function signature, ``_ptr(c_xxx)``: a typed pointer that
    also takes a raw address (a numpy/torch data pointer as int); in a struct
    it is c_void_p (the idiomatic layer stores addresses there).
    """
    base, n = t.base, t.pointers
    if base in m.enums:
        if n == 0 and not t.array:
            return base  # = c_int32: forced to 32 bits, values < 2**31
        base = "int32_t"
    if base in m.aliases:  # fd_stream: struct CUstream_st *
        a = m.aliases[base]
        base, n = a.base, a.pointers + n
    if n == 0:
        if base == "void":
            return "None"
        if base in SCALARS:
            s = SCALARS[base][0]
        elif base in m.structs or base in m.callbacks:
            s = base
        else:
            raise ValueError(f"no ctypes type for {t.c()}")
        return f"({s} * {t.array})" if t.array else s
    if base == "char":
        return "c_char_p" if n == 1 else _pointers("c_char_p", n - 1)
    if base == "void" or base in m.opaque or base.startswith("struct "):
        return "c_void_p" if n == 1 else _pointers("c_void_p", n - 1)
    if base in m.structs:
        return _pointers(base, n)
    if base in SCALARS and n == 1:
        return "c_void_p" if in_struct else f"_ptr({SCALARS[base][0]})"
    raise ValueError(f"no ctypes type for {t.c()}")


def _pointers(s: str, n: int) -> str:
    for _ in range(n):
        s = f"POINTER({s})"
    return s


PY_PRELUDE = '''\
# Generated by bindings/tools/gen_bindings.py from include/flashdec.h. Do not edit:
# change the header and run `python3 bindings/tools/gen_bindings.py`.
"""ctypes declarations of every type, constant and function of flashdec.h."""

# ruff: noqa
from __future__ import annotations

import ctypes
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Dict, List, Optional, Sequence, Tuple

_PTRS: Dict[type, type] = {}


def _ptr(ctype: type) -> type:
    """POINTER(ctype) that also accepts a raw address (int) or None: numpy
    and torch buffers pass their data pointer without a copy, while ctypes
    objects of the wrong element type are still refused."""
    if ctype not in _PTRS:
        base = POINTER(ctype)

        class _Address(base):  # type: ignore[misc, valid-type]
            @classmethod
            def from_param(cls, obj):  # type: ignore[override]
                if isinstance(obj, int):
                    return c_void_p(obj)
                return base.from_param(obj)

        _Address.__name__ = f"LP_{ctype.__name__}_or_address"
        _PTRS[ctype] = _Address
    return _PTRS[ctype]

'''


def emit_python(m: Model) -> str:
    out = [PY_PRELUDE]
    out.append("# #define FD_* constants")
    for k, v in m.constants.items():
        out.append(f"{k} = {v}")
    out.append("")
    out.append("# Enums: name -> [(constant, value)], header order. fd_status and the others")
    out.append("# are 32-bit (FD_*_FORCE_32BIT) and travel as c_int32.")
    out.append("ENUMS: Dict[str, List[Tuple[str, int]]] = {")
    for name, values in m.enums.items():
        out.append(f"    {name!r}: [")
        out += [f"        ({k!r}, {v})," for k, v in values]
        out.append("    ],")
    out.append("}")
    for name, values in m.enums.items():
        out += [f"{k} = {v}" for k, v in values]
    out.append("")
    for name in m.enums:
        out.append(f"{name} = c_int32")
    out.append("")
    out.append("# Incomplete handle types: pointers to them travel as c_void_p.")
    out.append(f"OPAQUE: Tuple[str, ...] = {tuple(m.opaque)!r}")
    for name, t in m.aliases.items():
        out.append(f"{name} = {py_type(m, t, False)}  # {t.c()}")
    for name, (ret, args) in m.callbacks.items():
        arg_s = ", ".join(py_type(m, a, False) for a in args)
        out.append(f"{name} = CFUNCTYPE({py_type(m, ret, False)}, {arg_s})")
    out.append("")
    for name, fields in m.structs.items():
        out += ["", f"class {name}(Structure):", "    _fields_ = ["]
        for fname, t in fields:
            out.append(f"        ({fname!r}, {py_type(m, t, True)}),  # {t.c()}")
        out += ["    ]", ""]
    out.append("")
    out.append("STRUCTS: Dict[str, type] = {")
    out += [f"    {n!r}: {n}," for n in m.structs]
    out.append("}")
    out.append("")
    out.append("# name -> (restype, argtypes), header order.")
    out.append("SIGNATURES: Dict[str, Tuple[Optional[type], Sequence[type]]] = {")
    for name, (ret, args) in m.functions.items():
        arg_s = ", ".join(py_type(m, t, False) for _, t in args)
        out.append(f"    {name!r}: ({py_type(m, ret, False)}, [{arg_s}]),")
    out.append("}")
    out.append("")
    out.append("# Parameter names, for messages and documentation.")
    out.append("PARAMETERS: Dict[str, Tuple[str, ...]] = {")
    for name, (_, args) in m.functions.items():
        out.append(f"    {name!r}: {tuple(p for p, _ in args)!r},")
    out.append("}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# C layout probe and the Rust field lists


def emit_probe(m: Model) -> str:
    out = [
        "/* Generated by bindings/tools/gen_bindings.py from include/flashdec.h. Do not edit.",
        " *",
        " * Prints the size of every public struct of flashdec.h and the offset of every",
        " * field, one \"name value\" line each. The Python and Rust layout tests compare",
        " * their struct declarations with this output. */",
        "#include <stddef.h>",
        "#include <stdio.h>",
        "",
        '#include "flashdec.h"',
        "",
        '#define SIZE(T) printf("%s %zu\\n", #T, sizeof(T))',
        '#define OFF(T, f) printf("%s.%s %zu\\n", #T, #f, offsetof(T, f))',
        "",
        "int main(void) {",
    ]
    for name, fields in m.structs.items():
        out.append(f"  SIZE({name});")
        out += [f"  OFF({name}, {f});" for f, _ in fields]
    out += ["  return 0;", "}"]
    return "\n".join(out) + "\n"


def rust_field(name: str) -> str:
    return name + "_" if name in ("type", "match", "ref", "move", "fn", "struct") else name


def emit_rust_fields(m: Model) -> str:
    out = [
        "// @generated by bindings/tools/gen_bindings.py from include/flashdec.h. Do not edit.",
        "// Every public struct and its fields, for the layout test.",
        "macro_rules! for_each_struct_field {",
        "    ($check:ident) => {",
    ]
    for name, fields in m.structs.items():
        out.append(f"        $check!({name}; {', '.join(rust_field(f) for f, _ in fields)});")
    out += ["    };", "}"]
    return "\n".join(out) + "\n"


def emit_rust_named(m: Model) -> str:
    out = [
        "// @generated by bindings/tools/gen_bindings.py from include/flashdec.h. Do not edit.",
        "use crate::*;",
        "",
        "/// A metrics field value, for generic printing.",
        "#[derive(Copy, Clone, Debug, PartialEq)]",
        "pub enum FieldValue {",
        "    U64(u64),",
        "    F64(f64),",
        "}",
    ]
    for name, fields in m.structs.items():
        if not name.endswith("_metrics"):
            continue
        out += [
            "",
            f"impl {name} {{",
            "    /// Every counter/gauge field (struct_size and padding excluded), in header order.",
            "    pub fn named_fields(&self) -> Vec<(&'static str, FieldValue)> {",
            "        vec![",
        ]
        for f, t in fields:
            if f == "struct_size" or re.fullmatch(r"reserved\d+", f):  # padding
                continue
            if t.base == "double":
                out.append(f'            ("{f}", FieldValue::F64(self.{f})),')
            else:
                out.append(f'            ("{f}", FieldValue::U64(self.{f} as u64)),')
        out += ["        ]", "    }", "}"]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# bindgen


def run_bindgen(m: Model) -> Optional[str]:
    """generated.rs as bindgen writes it now, or None without bindgen.

    One edit follows bindgen: clang gives an enum without negative values the
    type `unsigned int`, but the header passes enum values as `int32_t`
    (struct fields, parameters) and every enum is 32-bit with values below
    2**31, so the enum aliases are made `c_int` (as in Python's c_int32), and
    the safe crate compares and stores them without casts."""
    exe = shutil.which("bindgen")
    if exe is None:
        return None
    res = subprocess.run(
        [exe, str(HEADER), *BINDGEN_FLAGS, "--", f"-I{HEADER.parent}"],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise SystemExit(f"bindgen failed:\n{res.stderr}")
    head = (
        "// @generated by bindgen from include/flashdec.h through bindings/tools/gen_bindings.py.\n"
        "// Do not edit: change the header and run `python3 bindings/tools/gen_bindings.py`.\n"
    )
    text = res.stdout
    for name in m.enums:
        text, n = re.subn(rf"pub type {name} = ::std::os::raw::c_uint;",
                          f"pub type {name} = ::std::os::raw::c_int;", text)
        if n != 1:
            raise SystemExit(f"bindgen output has no unsigned alias for enum {name}")
    return head + text


def same_tokens(a: str, b: str) -> bool:
    """Equal up to whitespace (rustfmt versions lay out bindgen's output differently)."""
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when stale")
    args = ap.parse_args()
    m = header_model()
    outputs = {
        PY_OUT: emit_python(m),
        PROBE_OUT: emit_probe(m),
        RUST_FIELDS_OUT: emit_rust_fields(m),
        RUST_NAMED_OUT: emit_rust_named(m),
    }
    stale = []
    for path, text in outputs.items():
        rel = path.relative_to(ROOT)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(rel))
        elif not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {rel}")
    rust = run_bindgen(m)
    rel = RUST_SYS_OUT.relative_to(ROOT)
    if rust is None:
        print(f"SKIP: bindgen not installed (Debian package `bindgen`); {rel} not regenerated/compared")
    elif args.check:
        if not RUST_SYS_OUT.exists() or not same_tokens(RUST_SYS_OUT.read_text(), rust):
            stale.append(str(rel))
        else:
            print(f"{rel} matches bindgen {subprocess.run(['bindgen', '--version'], capture_output=True, text=True).stdout.strip()}")
    elif not RUST_SYS_OUT.exists() or not same_tokens(RUST_SYS_OUT.read_text(), rust):
        RUST_SYS_OUT.write_text(rust)
        print(f"wrote {rel}")
    if stale:
        print("stale generated files (run python3 bindings/tools/gen_bindings.py):", *stale, sep="\n  ")
        return 1
    if args.check:
        print(f"generated bindings are current ({len(m.functions)} functions, {len(m.structs)} structs, "
              f"{len(m.enums)} enums)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
