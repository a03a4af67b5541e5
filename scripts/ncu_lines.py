#!/usr/bin/env python3
"""The source lines with the most warp-stall samples in an Nsight Compute
source-page CSV (``ncu --section SourceCounters --page source --csv``), as a
short table for scripts/gpu-profile.sh.

    ncu_lines.py REPORT.csv [TOP]

Prints the total sample count, then the TOP (default 40) lines by samples:
share of all samples, the line's address or number, its text, and the stall
reasons that make up most of it (the columns named "Warp Stall Sampling"
per reason, when the report has them). ncu writes notes before the CSV
header; they are skipped.
"""
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def reason_label(column):
    """A per-reason column's short name: "stall_wait (Warp Stall Sampling)"
    and "Warp Stall Sampling (stall_wait)" both give "stall_wait"."""
    head, _, rest = column.partition(" (")
    inner = rest.rstrip(")")
    return inner if "Warp Stall" in head and inner else head


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    top = int(argv[2]) if len(argv) > 2 else 40
    with open(argv[1], errors="replace") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if any(c.startswith(SAMPLES) for c in r)), None)
    if header_at is None:
        print("no stall-sampling column in the report; its first lines:")
        for r in rows[:20]:
            print(",".join(r)[:200])
        return 1
    header = rows[header_at]
    total_col = next(j for j, c in enumerate(header) if c.startswith(SAMPLES))
    text_col = next((j for j, c in enumerate(header) if c in ("Source", "# Source")), 1)
    where_col = next((j for j, c in enumerate(header) if c in ("Address", "#", "Line")), 0)
    # Per-reason columns ("... Stall Sampling ..." other than the total).
    reasons = [(j, c) for j, c in enumerate(header)
               if "Stall" in c and j != total_col and "Not-issued" not in c]
    lines = []
    for r in rows[header_at + 1:]:
        if len(r) <= total_col:
            continue
        v = number(r[total_col])
        if v:
            lines.append((v, r))
    total = sum(v for v, _ in lines) or 1.0
    print(f"{int(total)} stall samples over {len(lines)} lines")
    for v, r in sorted(lines, key=lambda x: -x[0])[:top]:
        parts = []
        for j, c in reasons:
            x = number(r[j]) if j < len(r) else None
            if x and x >= 0.2 * v:
                parts.append(f"{reason_label(c)}: {int(x)}")
        text = r[text_col] if text_col < len(r) else ""
        where = r[where_col] if where_col < len(r) else ""
        print(f"{100 * v / total:5.1f}% | {where} | {text.strip()[:110]} | {'; '.join(parts)[:120]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
