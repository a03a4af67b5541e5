#!/usr/bin/env python3
"""Decode attention: FlashDec (fd_decode through the Python binding) beside
torch SDPA with the cuDNN backend on dense (unpaged) K/V, same data, same run.

The docs/benchmarks.md grid at bf16, blocks of 16, token-major: shapes A-D,
batch x context 1x32768, 1x2048, 8x8192, 32x4096, 64x4096, 128x2048,
256x1024 and ragged (64 rows, lengths U[128, 8192], seed 0; FlashDec only:
dense SDPA would be padded). Each case holds the same K/V values twice: paged
(blocks in a seeded random permutation) for FlashDec and dense [batch,
kv_heads, len, head_dim] for cuDNN, called two ways, each reading every
K/V element once as FlashDec does: native GQA (q [batch, q_heads, 1,
head_dim], enable_gqa=True) and the GQA group as the query length (q
[batch, kv_heads, group, head_dim], no mask); the faster correct one is the
peer (JSON: cudnn_form and both times).

Protocol (docs/benchmarks.md): enough buffer sets to exceed 420 MB, one CUDA
graph of many launches cycling through them, median of replays / launches
(two series), copy ceiling (1 GiB device copy, bytes read + written) in the
same process. Every case is checked against a float32 reference (q = 3 N(0,1),
K, V N(0,1); worst per-(row, head) relative error, bf16 <= 5e-3).

  PYTHONPATH=bindings/python FLASHDEC_LIBRARY=build/libflashdec.so \\
      python3 bench/decode_sdpa.py [--filter C_8x,D_] [--no-peer] [--json F] \\
      [--prev PREV.json] [--plan-lengths]

--plan-lengths runs FlashDec through a DecodePlan made once per case from
the rows' exact lengths (fd_decode_plan_create with host lengths, as an
engine plans each step) instead of fd_decode with the longest row as hint;
only ragged batches plan differently. --no-peer skips cuDNN (e.g. a run of
an earlier commit's library); --prev adds that run's FlashDec column to the
table. Prints a Markdown table (stdout) and writes the JSON (--json). Exit 0
done, 1 a wrong result, 77 no torch / no GPU / no library.
"""
import argparse
import json
import math
import sys

SHAPES = {"A": (32, 8, 128), "B": (32, 32, 128), "C": (16, 2, 128), "D": (32, 4, 64)}
GRID = [(1, 32768), (1, 2048), (8, 8192), (32, 4096), (64, 4096), (128, 2048), (256, 1024),
        (64, 0)]  # context 0: ragged
BS = 16
SET_BYTES = 420e6


def case_name(shape, batch, ctx):
    return "%s %dx%s" % (shape, batch, "ragged" if ctx == 0 else ctx)


def graph_us(torch, launch, sets, reps=15):
    """Median us per launch of one graph of launches cycling the sets (two series)."""
    n = max(sets, 20)
    n = (n + sets - 1) // sets * sets
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(sets):
            launch(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            launch(i % sets)
    g.replay()
    torch.cuda.synchronize()
    series = []
    for _ in range(2):
        t = []
        for _ in range(reps):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            t.append(a.elapsed_time(b) * 1e3 / n)
        t.sort()
        series.append(t[len(t) // 2])
    del g
    return min(series), series


def copy_gbps(torch):
    """1 GiB device copy (float32 elements), bytes read + written; the best
    of a graph-timed copy_ and an event-timed cudaMemcpy-backed clone."""
    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    us, _ = graph_us(torch, lambda i: dst.copy_(src), 1)
    best = us
    for _ in range(10):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3)
    del src, dst
    return 2 * (1 << 30) / (best * 1e-6) / 1e9


def run_case(torch, F, flashdec, peer, shape, batch, ctx, gen, plan_lengths=False):
    hq, hkv, d = SHAPES[shape]
    group = hq // hkv
    dev = torch.device("cuda")
    if ctx == 0:
        g = torch.Generator().manual_seed(0)
        lens = torch.randint(128, 8193, (batch,), generator=g).tolist()
    else:
        lens = [ctx] * batch
    lmax = max(lens)
    nblk = (lmax + BS - 1) // BS
    kv_bytes = sum(lens) * hkv * d * 2 * 2
    eff_bytes = kv_bytes + 2 * batch * hq * d * 2
    sets = max(1, min(64, math.ceil(SET_BYTES / kv_bytes)))
    ds, ps = [], []  # dense (k, v, q4) and paged (q, k_cache, v_cache, tables, out) per set
    perm_gen = torch.Generator().manual_seed(7)
    for s in range(sets):
        q = (3 * torch.randn(batch, hq, d, device=dev, generator=gen)).to(torch.bfloat16)
        k = torch.randn(batch, hkv, nblk * BS, d, device=dev, generator=gen).to(torch.bfloat16)
        v = torch.randn(batch, hkv, nblk * BS, d, device=dev, generator=gen).to(torch.bfloat16)
        perm = torch.randperm(batch * nblk, generator=perm_gen).to(dev)
        # Block j of row b is physical block perm[b * nblk + j].
        def paged(x):
            c = torch.empty(batch * nblk, hkv, BS, d, dtype=x.dtype, device=dev)
            c[perm] = x.view(batch, hkv, nblk, BS, d).permute(0, 2, 1, 3, 4).reshape(-1, hkv, BS, d)
            return c
        tables = perm.view(batch, nblk).to(torch.int32).clone()
        for b, n in enumerate(lens):
            tables[b, (n + BS - 1) // BS:] = -1
        ps.append((q, paged(k), paged(v), tables, torch.empty_like(q)))
        if peer and ctx != 0:
            ds.append((q, k, v))
        else:
            del k, v
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    q0, kc0, vc0, t0, _ = ps[0]
    plan = None
    if plan_lengths:
        # As an engine plans a step: once, from the rows' exact lengths.
        plan = flashdec.DecodePlan(q0, kc0, vc0, t0, seq_lens, ps[0][4], host_seq_lens=lens)
        ws_size = plan.workspace_size
    else:
        ws_size = flashdec.decode_workspace_size(q0, kc0, vc0, t0, seq_lens, max_seq_len_hint=lmax)
    ws = torch.empty(max(ws_size, 16), dtype=torch.uint8, device=dev)

    def ours(i):
        q, kc, vc, tb, out = ps[i]
        if plan is not None:
            plan.run(q, kc, vc, tb, seq_lens, out, workspace=ws)
        else:
            flashdec.decode(q, kc, vc, tb, seq_lens, out, workspace=ws, max_seq_len_hint=lmax)

    entry = {"case": case_name(shape, batch, ctx), "shape": shape, "batch": batch,
             "context": ctx, "kv_MB": kv_bytes / 1e6, "buffer_sets": sets,
             "planned_with_lengths": plan_lengths}
    # Correctness: set 0, float32 reference on up to 4 rows, every head.
    for i in range(sets):
        ps[i][4].fill_(float("nan"))
    ours(0)
    q0, out0 = ps[0][0], ps[0][4]
    errs = {"ours": 0.0}
    # cuDNN two ways: native GQA (q [batch, q_heads, 1, d], enable_gqa) and
    # the group as the query length ([batch, kv_heads, group, d]); the faster
    # correct one is the peer.
    forms = {
        "gqa": lambda q, k, v: F.scaled_dot_product_attention(
            q.view(batch, hq, 1, d), k, v, enable_gqa=True).view(batch, hq, d),
        "group_as_query": lambda q, k, v: F.scaled_dot_product_attention(
            q.view(batch, hkv, group, d), k, v).view(batch, hq, d),
    }
    if group == 1:
        del forms["gqa"]
    peer_outs = {}
    for fname, fn in forms.items():
        if not ds:
            break
        try:
            with peer():
                peer_outs[fname] = fn(*ds[0])
        except Exception as e:
            entry["cudnn_%s_error" % fname] = str(e).splitlines()[0][:300]
    for b in list(range(min(batch, 4))):
        n = lens[b]
        kf = ps[0][1][t0[b, : (n + BS - 1) // BS].long()].permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :n].float()
        vf = ps[0][2][t0[b, : (n + BS - 1) // BS].long()].permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :n].float()
        qf = q0[b].float().view(hkv, group, d)
        ref = torch.softmax(qf @ kf.transpose(-1, -2) / math.sqrt(d), dim=-1) @ vf
        ref = ref.reshape(hq, d)
        for key, o in [("ours", out0)] + list(peer_outs.items()):
            e = ((o[b].float() - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
            errs[key] = max(errs.get(key, 0.0), e if e == e else float("inf"))
    entry["rel_error"] = errs["ours"]
    entry["correct"] = bool(errs["ours"] <= 5e-3 and torch.isfinite(out0.float()).all().item())
    us, series = graph_us(torch, ours, sets)
    entry.update(ours_us=us, ours_series_us=series, ours_GBps=eff_bytes / (us * 1e-6) / 1e9)
    for fname in peer_outs:
        if not errs[fname] <= 1e-2:
            entry["cudnn_%s_wrong" % fname] = errs[fname]
            continue
        try:
            with peer():
                us, series = graph_us(torch, lambda i: forms[fname](*ds[i]), sets)
        except Exception as e:  # a backend refusing the case is reported, not fatal
            entry["cudnn_%s_error" % fname] = str(e).splitlines()[0][:300]
            continue
        entry["cudnn_%s_us" % fname] = us
        if "cudnn_us" not in entry or us < entry["cudnn_us"]:
            entry.update(cudnn_us=us, cudnn_series_us=series, cudnn_form=fname,
                         cudnn_GBps=eff_bytes / (us * 1e-6) / 1e9, cudnn_rel_error=errs[fname])
    if plan is not None:
        plan.close()
    del ps, ds, ws
    torch.cuda.empty_cache()
    return entry


def table(result, prev):
    copy = result["copy_GBps"]
    pv = {c["case"]: c for c in prev["cases"]} if prev else {}
    rows = ["| case | KV MB | ours us | ours / copy | cuDNN us | cuDNN / copy | ours / cuDNN |"
            + (" prev us | prev / copy | ours / prev |" if prev else ""),
            "|---|---|---|---|---|---|---|" + ("---|---|---|" if prev else "")]
    ratios = []
    for c in result["cases"]:
        f = c["ours_GBps"] / copy
        cells = ["%s" % c["case"], "%.1f" % c["kv_MB"], "%.2f" % c["ours_us"], "%.3f" % f]
        if "cudnn_us" in c:
            r = c["cudnn_us"] / c["ours_us"]
            ratios.append(r)
            cells += ["%.2f" % c["cudnn_us"], "%.3f" % (c["cudnn_GBps"] / copy), "%.3f" % r]
        else:
            cells += ["n/a", "n/a", "n/a"]
        if prev:
            p = pv.get(c["case"])
            cells += (["%.2f" % p["ours_us"], "%.3f" % (p["ours_GBps"] / prev["copy_GBps"]),
                       "%.3f" % (p["ours_us"] / c["ours_us"])] if p else ["n/a"] * 3)
        rows.append("| " + " | ".join(cells) + " |")
    if ratios:
        gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        rows.append("\nours / cuDNN (time ratio, > 1: ours faster): geomean %.3f, min %.3f over %d "
                    "cases; copy %.0f GB/s" % (gm, min(ratios), len(ratios), copy))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--filter", default="", help="comma-separated case substrings ('_' = space)")
    ap.add_argument("--no-peer", action="store_true", help="skip cuDNN")
    ap.add_argument("--json", help="write the JSON here")
    ap.add_argument("--prev", help="JSON of an earlier run (another library) for the table")
    ap.add_argument("--plan-lengths", action="store_true",
                    help="run ours through a DecodePlan made from the rows' lengths (as an engine plans a step)")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import flashdec
    except Exception as e:  # no torch or no library
        print("decode_sdpa: %s" % e, file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        return 77
    filters = [f.replace("_", " ") for f in args.filter.split(",") if f]
    gen = torch.Generator(device="cuda").manual_seed(13)
    peer = None if args.no_peer else (lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION]))
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "dtype": "bf16", "block_size": BS,
              "copy_GBps": copy_gbps(torch), "cases": []}
    ok = True
    for shape in SHAPES:
        for batch, ctx in GRID:
            name = case_name(shape, batch, ctx)
            if filters and not any(f in name for f in filters):
                continue
            e = run_case(torch, F, flashdec, peer, shape, batch, ctx, gen, args.plan_lengths)
            ok = ok and e["correct"]
            result["cases"].append(e)
            print("%-16s ours %8.2f us  cuDNN %s  err %.1e%s" % (
                name, e["ours_us"], "%8.2f us" % e["cudnn_us"] if "cudnn_us" in e else "n/a",
                e["rel_error"], "" if e["correct"] else "  WRONG"), file=sys.stderr, flush=True)
    result["copy_GBps_end"] = copy_gbps(torch)
    result["copy_GBps"] = max(result["copy_GBps"], result["copy_GBps_end"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    prev = None
    if args.prev:
        with open(args.prev) as f:
            prev = json.load(f)
    print(table(result, prev))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
