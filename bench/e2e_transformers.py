#!/usr/bin/env python3
"""End to end on a GPU: Hugging Face transformers models decoding through
FlashDec (flashdec.transformers) beside transformers' own paths (issue 18).

Two parts, both on random-init models (nothing is downloaded):

parity   Each architecture of the CPU parity tests (Llama, Qwen2, Mistral,
         Gemma 2, GPT-OSS; small configs) in bfloat16: sdpa's greedy tokens
         for 4 left-padded prompts are fed back to both models (teacher
         forcing); per prompt, the share of steps where FlashDec's argmax is
         sdpa's token, and the largest logit difference from sdpa's logits
         over the same inputs.
e2e      A Llama-3-8B-shaped model (32 layers, hidden 4096, 32/8 heads,
         head_dim 128, vocab 128256) in bfloat16, prompts of --prompt tokens,
         --steps decode steps at each --batch: ms per step and tokens/s of
         FlashDec with the step replayed from a CUDA graph
         (flashdec.transformers.GraphDecoder) and without (eager), beside
         sdpa with transformers' dynamic cache (torch's default backend and
         the flash backend) and, at batch 1, sdpa with the static cache and
         torch.compile (generate's own). Also: the attention share of
         FlashDec's step (its 32 decode calls timed alone, replayed from a
         CUDA graph), and the floor (weights + the K/V read once per step,
         at the copy bandwidth measured in the same run: bytes read and
         written per second).

Step times are CUDA-event times over the steps after the first three, the
host included (a host-bound path shows as idle GPU time). Writes JSON to
--json and a Markdown table to stdout. Exit 77: no CUDA device or no torch.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time


def _sync_time(torch, fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def copy_bandwidth(torch, nbytes=4 << 30):
    """Device copy bandwidth (bytes read + written per second)."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        b.copy_(a)
    e.record()
    e.synchronize()
    bw = 2 * a.numel() * 2 * 10 / (s.elapsed_time(e) / 1e3)
    del a, b
    return bw


# -- parity ------------------------------------------------------------------


def _gpu_config(tt, arch):
    """The CPU suite's config of ``arch`` with a head size the CUDA kernels
    serve (64, or Gemma 2's 256)."""
    cfg = tt._config(arch)
    if getattr(cfg, "head_dim", None) != 256:
        cfg.head_dim = 64
    return cfg


def parity(torch, transformers, fdt, steps, archs, device="cuda"):
    sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/bindings/python/tests")
    import test_transformers as tt  # the CPU suite's configs and prompts

    rows = []
    for arch in archs:
        import copy

        cfg = _gpu_config(tt, arch)
        cls = transformers.AutoModelForCausalLM
        # sdpa has no soft-cap or sinks: Gemma 2 and GPT-OSS are compared with eager.
        impl = "eager" if arch in ("gemma2", "gpt_oss") else "sdpa"
        ref, ours = tt._models(arch, reference=impl, dtype=torch.bfloat16, config=cfg)
        ref, ours = ref.to(device).eval(), ours.to(device).eval()
        ids, mask = tt._left_pad(tt._prompts(4, seed=1))
        ids, mask = ids.to(device), mask.to(device)
        with torch.no_grad():
            gen = ref.generate(ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                               pad_token_id=tt.PAD)[:, ids.shape[1]:]  # fmt: skip
            full = torch.cat([ids, gen], 1)
            full_mask = torch.cat([mask, torch.ones_like(gen)], 1)
            pos = (full_mask.cumsum(-1) - 1).clamp(min=0)  # generate's positions: padding skipped
            P = ids.shape[1]
            want = ref(full, attention_mask=full_mask, position_ids=pos).logits[:, P - 1 : -1].float()

            def teacher_forced(model, cache):
                out = model(ids, attention_mask=mask, position_ids=pos[:, :P], past_key_values=cache, logits_to_keep=1)
                got = [out.logits[:, -1:]]
                for t in range(steps - 1):
                    m = full_mask[:, : P + t + 1]
                    step = model(gen[:, t : t + 1], attention_mask=m, position_ids=pos[:, P + t : P + t + 1],
                                 past_key_values=cache)  # fmt: skip
                    got.append(step.logits)
                return torch.cat(got, 1).float()

            cache = fdt.FlashDecCache(ours, max_tokens=4 * (full.shape[1] + 16))
            got = teacher_forced(ours, cache)
            cache.close()
            # The reference's own step-by-step logits (its dynamic cache): how
            # far two correct bf16 computations of the same model drift apart.
            base = teacher_forced(ref, transformers.DynamicCache(config=ref.config))
            # Two correct transformers implementations against each other: eager
            # fed sdpa's tokens (for the architectures compared with sdpa).
            other = None
            if impl == "sdpa":
                eager = cls.from_config(copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.bfloat16)
                eager.load_state_dict(ref.state_dict())
                eager = eager.to(device).eval()
                other = teacher_forced(eager, transformers.DynamicCache(config=eager.config))
                del eager
            # float32 truth: the same weights upcast; which bf16 run is closer to it?
            truth = copy.deepcopy(ref).float()(full, attention_mask=full_mask, position_ids=pos).logits[:, P - 1 : -1]
            err = {"flashdec": (got - truth).abs().mean().item(), impl: (want - truth).abs().mean().item()}
        agree = (got.argmax(-1) == gen).float().mean(1).tolist()
        diff = (got - want).abs().amax((1, 2)).tolist()
        base_agree = (base.argmax(-1) == gen).float().mean(1).tolist()
        base_diff = (base - want).abs().amax((1, 2)).tolist()
        rows.append({"arch": arch, "reference": impl, "steps": steps, "agreement": agree, "max_logit_diff": diff,
                     "reference_stepwise_agreement": base_agree, "reference_stepwise_max_logit_diff": base_diff,
                     "logit_absmax": want.abs().amax().item(), "mean_abs_diff_from_float32": err,
                     "eager_vs_sdpa_agreement": None if other is None
                     else (other.argmax(-1) == gen).float().mean(1).tolist()})  # fmt: skip
        print(f"parity {arch}: agreement {[round(a, 4) for a in agree]}, max |dlogit| {max(diff):.4f}; "
              f"{impl} step by step {[round(a, 4) for a in base_agree]}, {max(base_diff):.4f}; "
              f"mean |dlogit| from float32 {err}", file=sys.stderr)
        del ref, ours
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def graph_check(torch, transformers, fdt, steps=24):
    """GraphDecoder against the eager FlashDec step on a small Llama in bf16:
    same tokens fed to both; the largest logit difference and whether the
    argmax ever differs."""
    sys.path.insert(0, __file__.rsplit("/bench/", 1)[0] + "/bindings/python/tests")
    import test_transformers as tt

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        _gpu_config(tt, "llama"), attn_implementation=fdt.ATTN_IMPLEMENTATION, dtype=torch.bfloat16
    ).cuda().eval()
    prompt = torch.randint(3, tt.VOCAB, (3, 40), device="cuda")
    caches = [fdt.FlashDecCache(model, max_tokens=4096) for _ in range(2)]
    with torch.no_grad():
        firsts = [model(prompt, past_key_values=c, logits_to_keep=1).logits[:, -1] for c in caches]
        dec = fdt.GraphDecoder(model, caches[1], caches[1]._row_ids, max_seq_len=256)
        tok, worst, same = firsts[0].argmax(-1), 0.0, True
        for _ in range(steps):
            a = model(tok.view(-1, 1), past_key_values=caches[0]).logits[:, -1].float()
            b = dec.step(tok).float()
            worst = max(worst, (a - b).abs().max().item())
            same = same and bool((a.argmax(-1) == b.argmax(-1)).all())
            tok = a.argmax(-1)
        lens = [c.fd.export(c._row_ids)[1].tolist() for c in caches]
    dec.close()
    for c in caches:
        c.close()
    row = {"steps": steps, "max_logit_diff": worst, "same_argmax": same, "lens_equal": lens[0] == lens[1]}
    print(f"graph check: {row}", file=sys.stderr)
    return row


# -- end to end --------------------------------------------------------------


def llama8b_config(transformers, layers):
    return transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=False,
    )  # fmt: skip


def time_steps(torch, step, first_token, steps, warm=3):
    """Runs ``steps`` decode steps from ``first_token``; returns ms per step
    over the steps after ``warm``."""
    tok = first_token
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(steps):
        if i == warm:
            s.record()
        tok = step(tok)
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / (steps - warm)


def e2e(torch, transformers, fdt, args, bw, save=lambda rows: None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = llama8b_config(transformers, args.layers)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation=fdt.ATTN_IMPLEMENTATION, dtype=torch.bfloat16
        ).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    results = []
    for batch in args.batch:
        g = torch.Generator(device="cuda").manual_seed(batch)
        prompt = torch.randint(3, cfg.vocab_size, (batch, args.prompt), device="cuda", generator=g)
        row = {"batch": batch, "prompt": args.prompt, "steps": args.steps}
        mid = args.prompt + args.steps // 2
        # Reading every weight and the K/V once, at the copy's traffic rate
        # (bytes read + written per second).
        row["floor_ms"] = (weight_bytes + batch * mid * kv_per_token) / bw * 1e3
        n = args.steps
        # FlashDec: prefill in one forward, then eager steps, then graph steps.
        model.set_attn_implementation(fdt.ATTN_IMPLEMENTATION)
        with torch.no_grad():
            cache = fdt.FlashDecCache(model, max_tokens=batch * (args.prompt + 2 * n + 32))
            out, row["fd_prefill_s"] = _sync_time(
                torch, lambda: model(prompt, past_key_values=cache, logits_to_keep=1).logits[:, -1]
            )
            first = out.argmax(-1)
            ids = list(cache._row_ids)

            def eager_step(tok):
                return model(tok.view(-1, 1), past_key_values=cache).logits[:, -1].argmax(-1)

            row["fd_eager_ms"] = time_steps(torch, eager_step, first, min(n, 16))
            dec = fdt.GraphDecoder(model, cache, ids, max_seq_len=args.prompt + 2 * n + 32)
            row["fd_graph_ms"] = time_steps(torch, lambda t: dec.step(t).argmax(-1), first, n)
            # The attention alone: the step's 32 decode calls over the same tables.
            q = torch.randn((batch, cfg.num_attention_heads, cfg.head_dim), dtype=torch.bfloat16, device="cuda")

            def attention_only():
                for layer in range(cfg.num_hidden_layers):
                    k, v = cache._layer_arrays[layer]
                    dec.plan.run(q, k, v, dec.tables, dec.lens, workspace=dec.workspace)

            attention_only()  # replayed from a graph: kernel time, not Python's
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                attention_only()
            graph.replay()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(10):
                graph.replay()
            e.record()
            e.synchronize()
            row["fd_attention_ms"] = s.elapsed_time(e) / 10
            del graph
            dec.close()
            cache.close()
        del cache, dec, out
        gc.collect()
        torch.cuda.empty_cache()
        # transformers: sdpa with the dynamic cache, default and flash backends.
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            dyn = transformers.DynamicCache(config=cfg)
            out, row["hf_prefill_s"] = _sync_time(
                torch, lambda: model(prompt, past_key_values=dyn, logits_to_keep=1).logits[:, -1]
            )
            first = out.argmax(-1)

            def hf_step(tok):
                return model(tok.view(-1, 1), past_key_values=dyn).logits[:, -1].argmax(-1)

            row["hf_sdpa_dynamic_ms"] = time_steps(torch, hf_step, first, n)
            dyn.crop(-n)  # back to the prompt
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                row["hf_sdpa_flash_dynamic_ms"] = time_steps(torch, hf_step, first, n)
        del dyn, out
        gc.collect()
        torch.cuda.empty_cache()
        summarise(row)
        print("e2e " + json.dumps(row), file=sys.stderr)
        results.append(row)
        save(results)
    # torch.compile last: its compile time must not keep the other rows from finishing.
    for row in results:
        if row["batch"] in args.compile_batch:
            g = torch.Generator(device="cuda").manual_seed(row["batch"])
            prompt = torch.randint(3, cfg.vocab_size, (row["batch"], args.prompt), device="cuda", generator=g)
            model.set_attn_implementation("sdpa")
            row.update(static_compile(torch, model, prompt, args.steps))
            summarise(row)
            print("e2e " + json.dumps(row), file=sys.stderr)
            save(results)
    return results, weight_bytes


def summarise(row):
    batch = row["batch"]
    hf = {k: v for k, v in row.items() if k.startswith("hf_") and k.endswith("_ms")}
    best = min(hf, key=hf.get)
    row["hf_best"], row["hf_best_ms"] = best, hf[best]
    row["speedup_vs_best_hf"] = hf[best] / row["fd_graph_ms"]
    row["fd_tokens_per_s"] = batch * 1e3 / row["fd_graph_ms"]
    row["hf_best_tokens_per_s"] = batch * 1e3 / hf[best]
    row["fd_floor_fraction"] = row["floor_ms"] / row["fd_graph_ms"]
    row["fd_attention_share"] = row["fd_attention_ms"] / row["fd_graph_ms"]


def static_compile(torch, model, prompt, n):
    """generate() with the static cache (transformers compiles its forward)."""
    out = {}
    try:
        kw = dict(do_sample=False, cache_implementation="static", pad_token_id=0)
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=n, min_new_tokens=n, **kw)  # compiles
            _, t1 = _sync_time(torch, lambda: model.generate(prompt, max_new_tokens=1, min_new_tokens=1, **kw))
            _, tn = _sync_time(torch, lambda: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, **kw))
        out["hf_sdpa_static_compile_ms"] = (tn - t1) / (n - 1) * 1e3
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        out["hf_static_compile_error"] = f"{type(e).__name__}: {e}"[:300]
    gc.collect()
    torch.cuda.empty_cache()
    return out


def table(rows):
    lines = [
        "| batch | FlashDec graph ms/step | tokens/s | eager ms/step | best HF path | HF ms/step | HF tokens/s "
        "| speedup | attention share | floor ms | fraction of floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['fd_graph_ms']:.2f} | {r['fd_tokens_per_s']:.0f} | {r['fd_eager_ms']:.2f} "
            f"| {r['hf_best'][3:-3]} | {r['hf_best_ms']:.2f} | {r['hf_best_tokens_per_s']:.0f} "
            f"| {r['speedup_vs_best_hf']:.2f}x | {r['fd_attention_share']:.2f} | {r['floor_ms']:.2f} "
            f"| {r['fd_floor_fraction']:.2f} |"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="e2e.json")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--compile-batch", type=int, nargs="*", default=[1])
    ap.add_argument("--parity-steps", type=int, default=256)
    ap.add_argument("--parity-archs", nargs="*", default=["llama", "qwen2", "mistral", "gemma2", "gpt_oss"])
    ap.add_argument("--skip", nargs="*", default=[], choices=["parity", "e2e"])
    ap.add_argument("--parity-cpu", action="store_true", help="run only the parity part, on the CPU (a quick check)")
    args = ap.parse_args()
    try:
        import torch
        import transformers

        import flashdec
        import flashdec.transformers as fdt
    except ImportError as e:
        print(json.dumps({"error": f"no torch/transformers: {e}"}))
        return 77
    fdt.register()
    if args.parity_cpu:
        parity(torch, transformers, fdt, args.parity_steps, args.parity_archs, device="cpu")
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 77
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "flashdec": flashdec.version(),
    }
    result["copy_bandwidth_gbs"] = copy_bandwidth(torch) / 1e9

    def save(rows=None):  # after every part: a run cut short keeps what it measured
        if rows is not None:
            result["e2e"] = rows
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

    result["graph_check"] = graph_check(torch, transformers, fdt)
    if "parity" not in args.skip:
        result["parity"] = parity(torch, transformers, fdt, args.parity_steps, args.parity_archs)
        save()
    if "e2e" not in args.skip:
        result["e2e"], result["weight_bytes"] = e2e(
            torch, transformers, fdt, args, result["copy_bandwidth_gbs"] * 1e9, save
        )
    save()
    if "e2e" in result:
        print(table(result["e2e"]))
    print(f"graph check: {result['graph_check']}")
    for p in result.get("parity", []):
        print(f"parity {p['arch']} vs {p['reference']}: teacher-forced agreement per prompt "
              f"{[round(a, 4) for a in p['agreement']]}, max logit diff {max(p['max_logit_diff']):.4f} "
              f"(logits up to {p['logit_absmax']:.2f}); eager fed sdpa's tokens: {p['eager_vs_sdpa_agreement']}; "
              f"{p['reference']} itself step by step: "
              f"{[round(a, 4) for a in p['reference_stepwise_agreement']]}, "
              f"{max(p['reference_stepwise_max_logit_diff']):.4f}; mean |logit - float32 model's|: "
              f"{p['mean_abs_diff_from_float32']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
