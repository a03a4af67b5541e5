#!/usr/bin/env python3
"""Merges rounds of bench/decode_bench results and compares two builds.

    compare_decode_grids.py merge OUT.json ROUND1.json [ROUND2.json ...]
        one JSON like decode_bench.json whose median_us (and fraction_of_copy,
        effective_GBps) are the medians over the rounds; each case keeps the
        per-round times in rounds_us.
    compare_decode_grids.py compare NEW.json OLD.json
        per case the time ratio new / old, the geometric mean, the cases more
        than 2% slower, and whether the split counts agree.
Cases are matched by shape, batch, context, dtype, block size, layout and q_len.
"""
import json
import statistics
import sys


def key(c):
    ctx = c["context"]
    return (c["shape"], c["batch"], tuple(ctx) if isinstance(ctx, list) else ctx, c["dtype"],
            c["block_size"], c["layout"], c.get("q_len", 1))


def merge(out, rounds):
    runs = [json.load(open(p)) for p in rounds]
    merged = runs[0]
    by_key = [{key(c): c for c in r["cases"]} for r in runs]
    for c in merged["cases"]:
        times = [k[key(c)]["median_us"] for k in by_key]
        t = statistics.median(times)
        scale = c["median_us"] / t
        c["rounds_us"] = times
        c["median_us"] = t
        c["effective_GBps"] *= scale
        c["fraction_of_copy"] *= scale
        c["correct"] = all(k[key(c)]["correct"] for k in by_key)
    merged["copy_GBps"] = statistics.median(r["copy_GBps"] for r in runs)
    merged["rounds"] = len(runs)
    json.dump(merged, open(out, "w"), indent=1)


def compare(new_path, old_path):
    new, old = json.load(open(new_path)), json.load(open(old_path))
    old_by_key = {key(c): c for c in old["cases"]}
    rows = []
    for c in new["cases"]:
        o = old_by_key[key(c)]
        rows.append((c["median_us"] / o["median_us"], key(c), c["splits"], o["splits"],
                     c["median_us"], o["median_us"]))
    rows.sort()
    ratios = [r[0] for r in rows]
    print(f"{len(rows)} cases; time new/old: geomean {statistics.geometric_mean(ratios):.4f}, "
          f"min {ratios[0]:.4f}, max {ratios[-1]:.4f}")
    slower = [r for r in rows if r[0] > 1.02]
    print(f"{len(slower)} cases more than 2% slower; "
          f"{sum(1 for r in rows if r[2] != r[3])} cases with other split counts")
    for r in rows[:3] + rows[-8:]:
        print(f"  {r[0]:.4f}  {' '.join(map(str, r[1]))}  splits {r[2]}/{r[3]}  "
              f"{r[4]:.2f} / {r[5]:.2f} us")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "merge":
        merge(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
