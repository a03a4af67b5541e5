#!/usr/bin/env python3
"""Derives the bindings' declarations from include/flashdec.h, the one source.

    python3 bindings/tools/gen_bindings.py           # rewrite the generated files
    python3 bindings/tools/gen_bindings.py --check   # exit 1 if one is stale or the ABI broke
    python3 bindings/tools/gen_bindings.py --check --abi-only   # the ABI part only (ctest)

After a header edit (a new field, enum value or function) the first command
is the only step: it rewrites every file below and appends the new items to
the ABI baseline.

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
  metrics structs (generic printing in the parity example);
* ``tests/abi_layout_expected.h``: the LP64 layout (every struct's size and
  alignment, every field's offset and size), every enum value and constant,
  computed here with the C layout rules; tests/test_abi_layout.c checks each
  line with the compiler;
* the version of the binding packages (pyproject.toml, the Rust workspace
  and its Cargo.lock), which is the header's FD_VERSION;
* ``bindings/abi/baseline.txt``: the append-only guard. It lists the released
  ABI (the table above plus the functions' and callbacks' signatures); a run
  appends new items to it, and ``--check`` fails when an item listed there
  moved, was resized, changed or disappeared, or when a field was put into a
  padding hole between listed fields (older callers' garbage; appending into
  a struct's tail padding passes with a note). An intended break
  needs a version that may break (a new major; a new minor while the major is
  0) and ``--accept-abi-break``, which starts the baseline again. ``--check``
  first runs a self-test: edits of the header the guard must report (and
  appends it must accept).

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
# ABI layout: the LP64 table of tests/test_abi_layout.c and the append-only
# baseline


# Size and alignment of the header's scalar types on LP64 (x86-64 and AArch64
# Linux). Enums are 4 bytes (each has a *_FORCE_32BIT member, checked below);
# pointers, handles, callbacks and fd_stream are 8.
LP64 = {
    "uint32_t": (4, 4),
    "int32_t": (4, 4),
    "uint64_t": (8, 8),
    "int64_t": (8, 8),
    "size_t": (8, 8),
    "float": (4, 4),
    "double": (8, 8),
    "char": (1, 1),
}
POINTER = (8, 8)


@dataclass
class FieldLayout:
    name: str
    type: str  # C spelling (const dropped), e.g. "int32_t *", "char[32]"
    offset: int
    size: int


@dataclass
class StructLayout:
    size: int
    align: int
    fields: List[FieldLayout]


def _enum_is_32bit(m: Model, name: str) -> bool:
    values = [v for _, v in m.enums[name]]
    return max(values) == 0x7FFFFFFF and min(values) >= 0


def type_layout(m: Model, t: CType, layouts: Dict[str, StructLayout]) -> Tuple[int, int]:
    """(size, alignment) of a field type on LP64."""
    if t.pointers:
        size, align = POINTER
    elif t.base in m.enums:
        if not _enum_is_32bit(m, t.base):
            raise SystemExit(f"enum {t.base} lacks a *_FORCE_32BIT = 0x7fffffff member: its size is not fixed")
        size, align = 4, 4
    elif t.base in m.aliases:
        size, align = type_layout(m, m.aliases[t.base], layouts)
    elif t.base in m.callbacks:
        size, align = POINTER
    elif t.base in layouts:
        size, align = layouts[t.base].size, layouts[t.base].align
    elif t.base in LP64:
        size, align = LP64[t.base]
    else:
        raise SystemExit(f"no LP64 layout for type {t.c()}")
    return size * (t.array or 1), align


def struct_layouts(m: Model) -> Dict[str, StructLayout]:
    """Every struct's LP64 layout: fields at the next multiple of their
    alignment, the size rounded up to the largest alignment (the C rules;
    tests/test_abi_layout.c checks them against the compiler)."""
    layouts: Dict[str, StructLayout] = {}
    for name, fields in m.structs.items():  # header order: nested structs come first
        offset, align, out = 0, 1, []
        for fname, t in fields:
            size, a = type_layout(m, t, layouts)
            offset = (offset + a - 1) // a * a
            out.append(FieldLayout(fname, t.c(), offset, size))
            offset += size
            align = max(align, a)
        layouts[name] = StructLayout((offset + align - 1) // align * align, align, out)
    return layouts


ABI_EXPECTED_OUT = ROOT / "tests" / "abi_layout_expected.h"
ABI_BASELINE = ROOT / "bindings" / "abi" / "baseline.txt"
# Constants that change by design (the version macros); the others are pinned.
UNPINNED_CONSTANTS = re.compile(r"FD_VERSION_\w+")


def _c_int(v: int) -> str:
    return f"{v:#x}" if v >= 0x10000 else str(v)


def emit_abi_expected(m: Model) -> str:
    layouts = struct_layouts(m)
    out = [
        "/* Generated by bindings/tools/gen_bindings.py from include/flashdec.h. Do not edit:",
        " * change the header and run `python3 bindings/tools/gen_bindings.py`.",
        " *",
        " * The LP64 ABI of the header, computed by the generator with the C layout rules",
        " * (not by a compiler): tests/test_abi_layout.c defines the macros and checks",
        " * every line against the compiler. That fields only move by appending is",
        " * checked by the generator against bindings/abi/baseline.txt. */",
        "",
        "/* FD_STRUCT(type, size, alignment); FD_FIELD(type, field, offset, size) */",
    ]
    for name, s in layouts.items():
        out.append(f"FD_STRUCT({name}, {s.size}, {s.align});")
        out += [f"FD_FIELD({name}, {f.name}, {f.offset}, {f.size});" for f in s.fields]
    out += ["", "/* FD_ENUM_TYPE(type): a 32-bit enum; FD_ENUM(constant, value) */"]
    for name, values in m.enums.items():
        out.append(f"FD_ENUM_TYPE({name});")
        out += [f"FD_ENUM({k}, {_c_int(v)});" for k, v in values]
    out += ["", "/* FD_POINTER_TYPE(type): a typedef of a pointer (streams, callbacks) */"]
    out += [f"FD_POINTER_TYPE({n});" for n, t in m.aliases.items() if t.pointers]
    out += [f"FD_POINTER_TYPE({n});" for n in m.callbacks]
    out += ["", "/* FD_CONSTANT(macro, value): #define constants (the version macros excepted) */"]
    out += [f"FD_CONSTANT({k}, {_c_int(v)});" for k, v in m.constants.items() if not UNPINNED_CONSTANTS.fullmatch(k)]
    return "\n".join(out) + "\n"


def _signature(ret: CType, args: List[CType]) -> str:
    return f"{ret.c()}({', '.join(a.c() for a in args) or 'void'})".replace(" *", "*")


def abi_items(m: Model) -> Dict[str, str]:
    """The ABI as ordered "kind name" -> "value" items (the baseline's lines)."""
    items: Dict[str, str] = {}
    for name, s in struct_layouts(m).items():
        items[f"struct {name}"] = f"align {s.align} size {s.size}"
        for f in s.fields:
            items[f"field {name}.{f.name}"] = f"offset {f.offset} size {f.size} type {f.type.replace(' ', '')}"
    for name, values in m.enums.items():
        items[f"enum {name}"] = "size 4"
        items.update({f"value {name}.{k}": str(v) for k, v in values})
    items.update({f"constant {k}": str(v) for k, v in m.constants.items() if not UNPINNED_CONSTANTS.fullmatch(k)})
    items.update({f"opaque {n}": "struct" for n in m.opaque})
    items.update({f"alias {n}": t.c().replace(" ", "") for n, t in m.aliases.items()})
    items.update({f"callback {n}": _signature(r, a) for n, (r, a) in m.callbacks.items()})
    items.update({f"function {n}": _signature(r, [t for _, t in a]) for n, (r, a) in m.functions.items()})
    return items


def version_of(m: Model) -> Tuple[int, int, int]:
    c = m.constants
    return c["FD_VERSION_MAJOR"], c["FD_VERSION_MINOR"], c["FD_VERSION_PATCH"]


BASELINE_HEAD = """\
# The ABI of include/flashdec.h as released, for the append-only guard of
# bindings/tools/gen_bindings.py. Generated: do not edit. One item a line:
# struct (alignment; the size may only grow), field (offset, size, type),
# enum and value, constant, opaque, alias, callback, function (signature).
#
# `gen_bindings.py` appends new items (fields after a struct's last field,
# new structs, enum values, functions); `gen_bindings.py --check` fails when
# an item listed here moved, changed or disappeared, when a field was put
# between listed ones, or when the header has an item this file lacks.
# An intended break needs a version that may break (a new FD_VERSION_MAJOR;
# in 0.x a new FD_VERSION_MINOR) and `gen_bindings.py --accept-abi-break`,
# which starts this file again from the header.
"""


def format_baseline(version: Tuple[int, int, int], items: Dict[str, str]) -> str:
    lines = [BASELINE_HEAD, "version " + ".".join(map(str, version))]
    lines += [f"{k} {v}" for k, v in items.items()]
    return "\n".join(lines) + "\n"


def parse_baseline(text: str) -> Tuple[Tuple[int, int, int], Dict[str, str]]:
    version: Optional[Tuple[int, int, int]] = None
    items: Dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, rest = line.split(" ", 1)
        if kind == "version":
            major, minor, patch = (int(x) for x in rest.split("."))
            version = (major, minor, patch)
            continue
        name, _, value = rest.partition(" ")
        items[f"{kind} {name}"] = value
    if version is None:
        raise SystemExit(f"{ABI_BASELINE.relative_to(ROOT)}: no version line")
    return version, items


def _numbers(value: str) -> Dict[str, str]:
    it = iter(value.split(" "))
    return dict(zip(it, it))


def abi_compare(base: Dict[str, str], cur: Dict[str, str]) -> Tuple[List[str], List[str], List[str]]:
    """(breaks, appended, notes): what changed of the baseline's items, the
    current items it lacks, and warnings. A field may not be put between
    fields the baseline has (into a padding hole: older callers pass garbage
    there), except that it may take over a reserved field's place exactly
    (reservedN, which callers set to 0). A field appended into the tail
    padding of a baseline struct is allowed with a note: a caller built with
    the baseline passes that padding inside its struct_size, so the library
    must not read the field from such a caller (docs/abi.md rule 10)."""
    breaks: List[str] = []
    notes: List[str] = []
    appended = [k for k in cur if k not in base]
    taken_over = set()
    for key, value in base.items():
        kind, name = key.split(" ", 1)
        if key not in cur:
            if kind == "field" and re.fullmatch(r"reserved\d+", name.split(".")[1]):
                struct = name.split(".")[0]
                old = _numbers(value)
                heir = [k for k in appended if k.startswith(f"field {struct}.")
                        and _numbers(cur[k])["offset"] == old["offset"] and _numbers(cur[k])["size"] == old["size"]]
                if heir:
                    taken_over.add(heir[0])
                    continue
            breaks.append(f"{kind} {name} was removed (it was: {value})")
        elif kind == "struct":
            old, new = _numbers(value), _numbers(cur[key])
            if new["align"] != old["align"]:
                breaks.append(f"struct {name}: alignment {old['align']} -> {new['align']} (older callers' "
                              "sizes are multiples of the old one: docs/abi.md, whole fields only)")
            if int(new["size"]) < int(old["size"]):
                breaks.append(f"struct {name}: size {old['size']} -> {new['size']} (shrank)")
        elif cur[key] != value:
            breaks.append(f"{kind} {name}: {value} -> {cur[key]}")
    for key in appended:
        kind, name = key.split(" ", 1)
        struct = name.split(".")[0]
        if kind != "field" or f"struct {struct}" not in base or key in taken_over:
            continue
        fields = [_numbers(v) for k, v in base.items() if k.startswith(f"field {struct}.")]
        last_end = max((int(f["offset"]) + int(f["size"]) for f in fields), default=0)
        size = int(_numbers(base[f"struct {struct}"])["size"])
        offset = int(_numbers(cur[key])["offset"])
        if offset < last_end:
            breaks.append(f"field {name} was inserted at offset {offset}, between fields of {struct} "
                          f"(its fields end at {last_end}): append new fields at the end")
        elif offset < size:
            notes.append(f"field {name} (offset {offset}) lies in the tail padding of the baseline's "
                         f"{size}-byte {struct}: do not read it from a caller whose struct_size is {size}")
    return breaks, appended, notes


def may_break(base_version: Tuple[int, int, int], version: Tuple[int, int, int]) -> bool:
    """A break needs a new major version, or in 0.x a new minor one."""
    if version[0] != base_version[0]:
        return version[0] > base_version[0]
    return version[0] == 0 and version[1] > base_version[1]


def abi_guard_self_test(text: str) -> List[str]:
    """Edits the header the ways the guard must catch (and the ways it must
    accept) and returns what it missed: the guard is only worth as much as it
    is known to fail."""
    base = abi_items(parse(text))
    misses: List[str] = []

    def edited(what: str, pattern: str, repl: str) -> Optional[Dict[str, str]]:
        new, n = re.subn(pattern, repl, text, count=1, flags=re.S)
        if n != 1:
            misses.append(f"self-test '{what}': the header no longer matches {pattern!r}")
            return None
        return abi_items(parse(new))

    struct = r"(typedef struct fd_decode_params \{\s*uint32_t struct_size;[^\n]*\n)"
    must_break = {
        "a field inserted before others": (struct, r"\1  uint32_t self_test_inserted;\n"),
        "a field resized": (r"(typedef struct fd_decode_params \{.*?)uint32_t batch;", r"\1uint64_t batch;"),
        "an enum value changed": (r"FD_ERR_UNSUPPORTED = 6,", "FD_ERR_UNSUPPORTED = 60,"),
        "a function removed": (r"FD_API fd_status fd_decode\(const fd_decode_params \*params\);", ""),
        "a parameter type changed": (r"fd_decode_plan_workspace_size\(const fd_decode_plan \*plan, size_t \*bytes\)",
                                     "fd_decode_plan_workspace_size(const fd_decode_plan *plan, uint32_t *bytes)"),
    }
    for what, (pattern, repl) in must_break.items():
        cur = edited(what, pattern, repl)
        if cur is not None and not abi_compare(base, cur)[0]:
            misses.append(f"self-test: '{what}' was not reported")
    # A padding hole between two fields (a 4-byte field before an 8-byte
    # one): a field put there moves nothing, but older callers pass garbage
    # in it. Appending into the tail padding is allowed, with a note.
    tail = r"(\n\} fd_decode_params;)"
    hole = r"\n  uint32_t self_test_a;\n  uint64_t self_test_b;"
    holed = edited("a padding hole", tail, hole + r"\1")
    filled = edited("a field put in a padding hole", tail,
                    r"\n  uint32_t self_test_a;\n  uint32_t self_test_in_hole;\n  uint64_t self_test_b;\1")
    if holed is not None and filled is not None and not abi_compare(holed, filled)[0]:
        misses.append("self-test: 'a field put in a padding hole' was not reported")
    wide_tail = r"\n  uint64_t self_test_wide;\n  uint32_t self_test_tail;"  # 4 bytes of tail padding
    padded = edited("tail padding", tail, wide_tail + r"\1")
    in_tail = edited("a field put in tail padding", tail, wide_tail + r"\n  uint32_t self_test_in_tail;\1")
    if padded is not None and in_tail is not None:
        breaks, _, notes = abi_compare(padded, in_tail)
        if breaks or not notes:
            misses.append(f"self-test: 'a field put in tail padding' gave breaks {breaks} / notes {notes}")
    must_pass = {
        "a field appended": (r"(\n\} fd_decode_params;)", r"\n  uint64_t self_test_appended;\1"),
        "a reserved field taken over": (r"(typedef struct fd_prefix_info \{.*?)uint32_t reserved0;",
                                        r"\1uint32_t self_test_heir;"),
        "a function appended": (r"(FD_API fd_status fd_decode\(const fd_decode_params \*params\);)",
                                r"\1\nFD_API void fd_self_test_new(void);"),
    }
    for what, (pattern, repl) in must_pass.items():
        cur = edited(what, pattern, repl)
        if cur is not None:
            breaks, appended, _ = abi_compare(base, cur)
            if breaks or not appended:
                misses.append(f"self-test: '{what}' gave breaks {breaks} / appended {appended}")
    return misses


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


# --------------------------------------------------------------------------
# Package versions: the binding packages carry the library's version


# (file, pattern whose group 1 is the version): the Python project, the Rust
# workspace and its lock file's entries for the two crates.
PACKAGE_VERSIONS = [
    (ROOT / "bindings" / "python" / "pyproject.toml", r'(?ms)^\[project\].*?^version = "([^"]*)"'),
    (ROOT / "bindings" / "rust" / "Cargo.toml", r'(?ms)^\[workspace\.package\].*?^version = "([^"]*)"'),
    (ROOT / "bindings" / "rust" / "Cargo.lock", r'(?m)^name = "flashdec"\nversion = "([^"]*)"'),
    (ROOT / "bindings" / "rust" / "Cargo.lock", r'(?m)^name = "flashdec-sys"\nversion = "([^"]*)"'),
]


def package_version_outputs(m: Model) -> Dict[Path, str]:
    """The files of PACKAGE_VERSIONS with the header's version in place."""
    version = ".".join(map(str, version_of(m)))
    texts: Dict[Path, str] = {}
    for path, pattern in PACKAGE_VERSIONS:
        text = texts.get(path, path.read_text())
        match = re.search(pattern, text)
        if match is None:
            raise SystemExit(f"{path.relative_to(ROOT)}: no version matching {pattern!r}")
        texts[path] = text[: match.start(1)] + version + text[match.end(1):]
    return texts


def abi_baseline(m: Model, args: argparse.Namespace, stale: List[str]) -> int:
    """Checks the header against bindings/abi/baseline.txt and, when writing,
    extends it (or, with --accept-abi-break, starts it again). 0 or 1."""
    rel = ABI_BASELINE.relative_to(ROOT)
    if args.check:
        misses = abi_guard_self_test(HEADER.read_text())
        if misses:
            print("ABI guard self-test failed:", *misses, sep="\n  ")
            return 1
    version, cur = version_of(m), abi_items(m)
    if not ABI_BASELINE.exists():
        if args.check:
            stale.append(f"{rel} (missing)")
            return 0
        ABI_BASELINE.parent.mkdir(parents=True, exist_ok=True)
        ABI_BASELINE.write_text(format_baseline(version, cur))
        print(f"wrote {rel} (new baseline at {'.'.join(map(str, version))})")
        return 0
    base_version, base = parse_baseline(ABI_BASELINE.read_text())
    breaks, appended, notes = abi_compare(base, cur)
    for note in notes:
        print(f"NOTE: {note}")
    if breaks:
        v, bv = ".".join(map(str, version)), ".".join(map(str, base_version))
        if args.check or not args.accept_abi_break:
            print(f"ABI break against {rel} (released at {bv}, header {v}):", *breaks, sep="\n  ")
            print("Append new fields at the end of their struct and new enum values/functions after the "
                  "others. An intended break needs a version that may break (major; minor in 0.x) and "
                  "`gen_bindings.py --accept-abi-break`.")
            return 1
        if not may_break(base_version, version):
            print(f"--accept-abi-break: header {v} may not break the ABI of {bv}: bump FD_VERSION_MAJOR "
                  "(FD_VERSION_MINOR while the major is 0) first.", *breaks, sep="\n  ")
            return 1
        ABI_BASELINE.write_text(format_baseline(version, cur))
        print(f"wrote {rel} (ABI break accepted, new baseline at {v}):", *breaks, sep="\n  ")
        return 0
    # Same items in the header's order, appended ones included (a grown
    # struct's size is the current one).
    text = format_baseline(max(version, base_version), cur)
    if text != ABI_BASELINE.read_text():
        if args.check:
            stale.append(f"{rel} (append: {', '.join(appended) or 'version/sizes'})")
        else:
            ABI_BASELINE.write_text(text)
            print(f"wrote {rel}" + (f" (appended: {', '.join(appended)})" if appended else ""))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when stale")
    ap.add_argument("--abi-only", action="store_true",
                    help="only the ABI layout table and the baseline (no bindings, no bindgen)")
    ap.add_argument("--accept-abi-break", action="store_true",
                    help="start the ABI baseline again (only with a version that may break)")
    args = ap.parse_args()
    try:
        import pycparser  # noqa: F401
    except ImportError:
        print("SKIP: pycparser is not installed (Debian python3-pycparser, or pip install pycparser)")
        return 77 if args.abi_only else 1
    m = header_model()
    outputs = {ABI_EXPECTED_OUT: emit_abi_expected(m)}
    if not args.abi_only:
        outputs.update({
            PY_OUT: emit_python(m),
            PROBE_OUT: emit_probe(m),
            RUST_FIELDS_OUT: emit_rust_fields(m),
            RUST_NAMED_OUT: emit_rust_named(m),
        })
        outputs.update(package_version_outputs(m))
    stale: List[str] = []
    for path, text in outputs.items():
        rel = path.relative_to(ROOT)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(rel))
        elif not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {rel}")
    status = abi_baseline(m, args, stale)
    if not args.abi_only:
        rust = run_bindgen(m)
        rel = RUST_SYS_OUT.relative_to(ROOT)
        if rust is None:
            print(f"SKIP: bindgen not installed (Debian package `bindgen`); {rel} not regenerated/compared")
        elif args.check:
            if not RUST_SYS_OUT.exists() or not same_tokens(RUST_SYS_OUT.read_text(), rust):
                stale.append(str(rel))
            else:
                ver = subprocess.run(["bindgen", "--version"], capture_output=True, text=True).stdout.strip()
                print(f"{rel} matches {ver}")
        elif not RUST_SYS_OUT.exists() or not same_tokens(RUST_SYS_OUT.read_text(), rust):
            RUST_SYS_OUT.write_text(rust)
            print(f"wrote {rel}")
    if stale:
        print("stale generated files (run python3 bindings/tools/gen_bindings.py):", *stale, sep="\n  ")
        return 1
    if status:
        return status
    if args.check:
        what = "ABI layout table and baseline are" if args.abi_only else "generated bindings and ABI baseline are"
        print(f"{what} current ({len(m.functions)} functions, {len(m.structs)} structs, {len(m.enums)} enums; "
              f"ABI guard self-test passed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
