#!/usr/bin/env python3
"""Times torch SDPA on the chunked-prefill shapes of `decode_bench --prefill`.

Shape A (32 query heads, 8 KV heads, head_dim 128), bf16, batch 1:
  * a 4096-token causal chunk with no cache before it;
  * 2048 new tokens over 8192 cached ones (query j sees keys 0 .. 8192 + j).

Backends (torch.nn.attention.sdpa_kernel): cuDNN and flash. torch 2.11's
cuDNN backend with is_causal and fewer queries than keys masks top-left
(query i sees keys 0..i), wrong for chunked prefill, so the 2048-over-8192
case gives cuDNN an explicit lower-right boolean mask and flash the
lower-right causal bias (torch.nn.attention.bias.causal_lower_right). K and V
are expanded to the 32 query heads before timing (the GQA broadcast is not
timed). Each result is checked against the other backend and, on a slice of
query heads, against a float32 reference.

TFLOP/s count only the visible (query, key) pairs: 4 * head_dim flops per
pair per query head, as decode_bench does. Prints one JSON object; with
--compare DECODE_BENCH_JSON also a table of FlashDec's prefill cases beside the
best torch backend (stderr).

Exit status: 0 done, 1 a backend disagreed with the reference, 77 no CUDA
device or no torch.
"""
import argparse
import json
import math
import sys

HQ, HKV, D = 32, 8, 128
CASES = [
    # name, new tokens, cached tokens before them
    ("prefill 4096 new, no cache", 4096, 0),
    ("prefill 2048 new over 8192", 2048, 8192),
]


def causal_flops(q_len, cached):
    pairs = q_len * cached + q_len * (q_len + 1) // 2
    return 4.0 * D * HQ * pairs


def time_ms(torch, fn, warmup=5, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2], times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compare", help="decode_bench.json of a --prefill run")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right
    except ImportError as e:
        print(json.dumps({"error": "no torch: %s" % e}))
        return 77
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 77

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(14)
    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "shape": {"q_heads": HQ, "kv_heads": HKV, "head_dim": D, "dtype": "bf16"},
        "cases": [],
    }
    ok = True
    for name, n, cached in CASES:
        L = cached + n
        # As decode_bench: q = 3 * N(0, 1), K and V N(0, 1).
        q = (3 * torch.randn(1, HQ, n, D, device=dev, generator=gen)).to(torch.bfloat16)
        k = torch.randn(1, HKV, L, D, device=dev, generator=gen).to(torch.bfloat16)
        v = torch.randn(1, HKV, L, D, device=dev, generator=gen).to(torch.bfloat16)
        k = k.repeat_interleave(HQ // HKV, dim=1).contiguous()
        v = v.repeat_interleave(HQ // HKV, dim=1).contiguous()
        flops = causal_flops(n, cached)
        # Lower-right causal: query j (position cached + j) sees keys <= cached + j.
        if cached == 0:
            cudnn_kw = {"is_causal": True}
            flash_kw = {"is_causal": True}
        else:
            rows = torch.arange(n, device=dev).view(n, 1)
            cols = torch.arange(L, device=dev).view(1, L)
            cudnn_kw = {"attn_mask": cols <= rows + cached}
            flash_kw = {"attn_mask": causal_lower_right(n, L)}
        entry = {"case": name, "q_len": n, "cached": cached, "causal_flops": flops, "backends": {}}
        outs = {}
        for bname, backend, kw in (
            ("cudnn", SDPBackend.CUDNN_ATTENTION, cudnn_kw),
            ("flash", SDPBackend.FLASH_ATTENTION, flash_kw),
        ):
            try:
                with sdpa_kernel([backend]):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, **kw)  # noqa: E731
                    outs[bname] = fn()
                    ms, times = time_ms(torch, fn, reps=args.reps)
                entry["backends"][bname] = {
                    "median_ms": ms,
                    "min_ms": times[0],
                    "max_ms": times[-1],
                    "TFLOPs": flops / (ms * 1e-3) / 1e12,
                }
            except Exception as e:  # a backend that refuses the case is reported, not fatal
                entry["backends"][bname] = {"error": str(e).splitlines()[0][:300]}
        # Float32 reference on 4 query heads (lower-right causal).
        hs = slice(0, 4)
        qf, kf, vf = q[:, hs].float(), k[:, hs].float(), v[:, hs].float()
        s = (qf @ kf.transpose(-1, -2)) / math.sqrt(D)
        rows = torch.arange(n, device=dev).view(n, 1)
        cols = torch.arange(L, device=dev).view(1, L)
        s = s.masked_fill(cols > rows + cached, float("-inf"))
        ref = torch.softmax(s, dim=-1) @ vf
        for bname, o in outs.items():
            err = ((o[:, hs].float() - ref).norm() / ref.norm()).item()
            entry["backends"][bname]["rel_error_vs_fp32"] = err
            if not err < 1e-2:
                ok = False
                entry["backends"][bname]["wrong"] = True
        best = max(
            (b["TFLOPs"] for b in entry["backends"].values() if "TFLOPs" in b and not b.get("wrong")),
            default=None,
        )
        entry["best_TFLOPs"] = best
        result["cases"].append(entry)
        del q, k, v, outs, s, ref
        torch.cuda.empty_cache()

    if args.compare:
        try:
            with open(args.compare) as f:
                fd = {c.get("case", ""): c for c in json.load(f)["cases"]}
        except (OSError, ValueError, KeyError) as e:
            fd = {}
            print("prefill_sdpa: cannot read %s: %s" % (args.compare, e), file=sys.stderr)
        lines = [
            "| case | FlashDec ms | FlashDec TFLOP/s | cuDNN TFLOP/s | flash TFLOP/s | FlashDec / best |",
            "|---|---|---|---|---|---|",
        ]
        for entry in result["cases"]:
            mine = next((c for n_, c in fd.items() if entry["case"] in n_), None)
            b = entry["backends"]
            cell = lambda x: "%.1f" % x["TFLOPs"] if "TFLOPs" in x else "n/a"  # noqa: E731
            fd_t = mine["TFLOPs"] if mine else None
            ratio = fd_t / entry["best_TFLOPs"] if fd_t and entry["best_TFLOPs"] else None
            entry["flashdec_TFLOPs"] = fd_t
            entry["flashdec_over_best"] = ratio
            lines.append(
                "| %s | %s | %s | %s | %s | %s |"
                % (
                    entry["case"],
                    "%.3f" % (mine["median_us"] * 1e-3) if mine else "n/a",
                    "%.1f" % fd_t if fd_t else "n/a",
                    cell(b.get("cudnn", {})),
                    cell(b.get("flash", {})),
                    "%.3f" % ratio if ratio else "n/a",
                )
            )
        print("\n".join(lines), file=sys.stderr)
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
