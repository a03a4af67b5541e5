#!/usr/bin/env python3
"""Instruction counts of a kernel's loops, from its SASS, without a GPU.

    scripts/sass_loops.py SASS_FILE KERNEL_SUBSTRING [--ops]

SASS_FILE is the output of `cuobjdump -sass` on a cubin (nvcc -cubin -arch
sm_90 or sm_90a, the compile line of the kernel's file in the CMake build);
KERNEL_SUBSTRING picks the functions whose mangled name contains it. For
each function: its instruction count, and each loop (a backward branch and
its target) with its static instruction count, its cp.async copies (LDGSTS)
and tensor-core instructions; with --ops, the opcodes of each loop by count.
Static counts, not executed ones: a branch inside a loop counts both sides.
docs/benchmarks.md says how to get cuobjdump where the CUDA toolkit lacks it.
"""
import argparse
import collections
import re
import sys

LINE = re.compile(r"\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\s+(?:`\()?\s*(0x[0-9a-f]+)")


def functions(text):
    """(name, [(address, instruction)]) for each function in cuobjdump output."""
    name, body = None, []
    for line in text.splitlines():
        if "Function : " in line:
            if name is not None:
                yield name, body
            name, body = line.split("Function : ", 1)[1].strip(), []
            continue
        m = LINE.match(line)
        if m and name is not None:
            body.append((int(m.group(1), 16), m.group(2)))
    if name is not None:
        yield name, body


def opcode(instruction):
    words = instruction.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass")
    ap.add_argument("kernel")
    ap.add_argument("--ops", action="store_true", help="opcode counts per loop")
    args = ap.parse_args()
    found = False
    with open(args.sass, errors="replace") as f:
        text = f.read()
    for name, body in functions(text):
        if args.kernel not in name:
            continue
        found = True
        print(f"{name}: {len(body)} instructions")
        for address, instruction in body:
            m = BRANCH.search(instruction)
            if not m or int(m.group(1), 16) >= address:
                continue
            start = int(m.group(1), 16)
            loop = [i for a, i in body if start <= a <= address]
            copies = sum("LDGSTS" in i for i in loop)
            mma = sum(opcode(i) in ("HMMA", "HGMMA") for i in loop)
            print(f"  loop {start:#x}-{address:#x}: {len(loop)} instructions, "
                  f"{copies} LDGSTS, {mma} HMMA/HGMMA")
            if args.ops:
                counts = collections.Counter(opcode(i) for i in loop)
                print("    " + ", ".join(f"{op} {n}" for op, n in counts.most_common()))
    if not found:
        print(f"sass_loops: no function name contains {args.kernel!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
