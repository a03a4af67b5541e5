#!/usr/bin/env python3
"""Text generation with a Hugging Face transformers model whose KV cache is a
FlashDec paged cache (flashdec.transformers, docs/transformers.md).

The model is built from its transformers config class with random weights
(nothing is downloaded), the prompts are random token ids of different
lengths, and generation is greedy. Two ways to drive it:

  --mode generate   model.generate() over the left-padded batch
  --mode batcher    fdt.ContinuousBatcher: requests with different budgets join
                    and leave between steps, at most --max-batch at once

--check runs the same weights with attn_implementation="eager" (CPU) or
"sdpa" (CUDA) and reports how many greedy tokens agree. Examples:

  python examples/python/generate_hf.py --check
  python examples/python/generate_hf.py --arch gemma2 --mode batcher --max-new-tokens 128
  python examples/python/generate_hf.py --device cuda --size small --kv-dtype fp8

Needs torch and transformers; run with FLASHDEC_LIBRARY=/path/to/libflashdec.so
if the library is not installed. bindings/run-tests.sh runs it (tiny, CPU).
"""

import argparse
import copy
import time

import torch
import transformers
from tqdm.auto import tqdm
from transformers.generation.streamers import BaseStreamer

import flashdec
import flashdec.transformers as fdt

# head_dim 64: CUDA decode serves 64, 96, 128 and 256 (Gemma 2's); FP8 K/V 64 and 128.
SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 vocab_size=256),
    "small": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                  vocab_size=8192),
}  # fmt: skip
PAD = 0


def build_config(arch: str, size: str, window: int):
    kw = dict(SIZES[size], intermediate_size=3 * SIZES[size]["hidden_size"], max_position_embeddings=4096,
              initializer_range=0.1, pad_token_id=PAD, bos_token_id=1, eos_token_id=None)  # fmt: skip
    if arch == "llama":  # grouped-query attention
        return transformers.LlamaConfig(**kw)
    if arch == "qwen2":  # q/k/v biases; the upper half of the layers slide
        layers = kw["num_hidden_layers"]
        return transformers.Qwen2Config(use_sliding_window=True, sliding_window=window,
                                        max_window_layers=layers // 2, **kw)  # fmt: skip
    if arch == "mistral":  # every layer slides
        return transformers.MistralConfig(sliding_window=window, **kw)
    if arch == "gemma2":  # head_dim 256, logit soft-cap, sliding and full layers alternate
        kw.update(head_dim=256, query_pre_attn_scalar=256)
        return transformers.Gemma2Config(sliding_window=window, attn_logit_softcapping=50.0, **kw)
    if arch == "gpt_oss":  # attention sinks, alternating sliding layers, mixture of experts
        return transformers.GptOssConfig(sliding_window=window, num_local_experts=4, num_experts_per_tok=2, **kw)
    raise ValueError(arch)


class StepBar(BaseStreamer):
    """generate() calls put() once with the prompts, then once per step."""

    def __init__(self, bar):
        self.bar, self.prompt_seen = bar, False

    def put(self, value):
        if self.prompt_seen:
            self.bar.update(1)
        self.prompt_seen = True

    def end(self):
        self.bar.close()


def left_pad(prompts, device):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD, device=device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


def greedy(model, prompts, new_tokens, **kw):
    """Greedy tokens of each prompt (generate over the left-padded batch)."""
    ids, mask = left_pad(prompts, model.device)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=PAD, **kw)  # fmt: skip
    return out[:, ids.shape[1]:].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="llama", choices=["llama", "qwen2", "mistral", "gemma2", "gpt_oss"])
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    ap.add_argument("--prompts", type=int, default=6, help="number of prompts")
    ap.add_argument("--max-prompt-len", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--mode", default="generate", choices=["generate", "batcher"])
    ap.add_argument("--max-batch", type=int, default=4, help="batcher: requests active at once")
    ap.add_argument("--kv-dtype", default="model", choices=["model", "bf16", "fp8"], help="K/V storage type")
    ap.add_argument("--window", type=int, default=32, help="sliding window of the sliding layers")
    ap.add_argument("--check", action="store_true", help="compare greedy tokens with eager/sdpa")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # FlashDec on CUDA: bf16/f16 models
    kv_dtype = {"model": None, "bf16": flashdec.DType.BF16, "fp8": flashdec.DType.FP8_E4M3}[args.kv_dtype]
    print(f"libflashdec {flashdec.version()} ({flashdec.library_path()}); {args.arch}/{args.size} on {device}, "
          f"{dtype}, K/V {args.kv_dtype}, mode {args.mode}")  # fmt: skip

    fdt.register()  # makes attn_implementation="fd_paged" known to transformers
    config = build_config(args.arch, args.size, args.window)
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), attn_implementation=fdt.ATTN_IMPLEMENTATION, dtype=dtype
    ).to(device).eval()

    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(4, args.max_prompt_len + 1, (args.prompts,), generator=g).tolist()
    prompts = [torch.randint(3, config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    # Batcher requests get different budgets, so they finish at different steps and others take their place.
    budgets = [args.max_new_tokens if args.mode == "generate" else max(1, args.max_new_tokens >> (i % 3))
               for i in range(len(prompts))]  # fmt: skip
    cache = fdt.FlashDecCache(model, max_tokens=sum(lengths) + sum(budgets), kv_dtype=kv_dtype)

    start = time.perf_counter()
    with torch.no_grad():
        if args.mode == "generate":
            bar = tqdm(total=args.max_new_tokens, desc="decode steps", unit="step")
            got = greedy(model, prompts, args.max_new_tokens, past_key_values=cache, streamer=StepBar(bar))
        else:
            batcher = fdt.ContinuousBatcher(model, cache, max_batch=args.max_batch)
            requests = [batcher.add(p, n) for p, n in zip(prompts, budgets)]
            with tqdm(total=len(requests), desc="requests", unit="req") as bar:
                batcher.run(progress=bar.update)
            got = [r.tokens for r in requests]
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    produced = sum(map(len, got))
    print(f"flashdec ({fdt.ATTN_IMPLEMENTATION}): {produced} tokens in {seconds:.2f} s, "
          f"{produced / seconds:.1f} tokens/s (prefill included)")  # fmt: skip
    cache.close()

    if args.check:
        # sdpa on CUDA where the architecture has it (GPT-OSS has not: its sinks need eager).
        ref_impl = "sdpa" if device.type == "cuda" and type(model)._supports_sdpa else "eager"
        ref = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=ref_impl, dtype=dtype)
        ref = ref.to(device).eval()
        ref.load_state_dict(model.state_dict())
        start = time.perf_counter()
        with torch.no_grad():
            want = [row[:n] for row, n in zip(greedy(ref, prompts, max(budgets)), budgets)]
        ref_rate = len(want) * max(budgets) / (time.perf_counter() - start)
        print(f"{ref_impl}: {ref_rate:.1f} tokens/s (one cold run each: not a benchmark)")
        firsts = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(y)) for x, y in zip(got, want)]
        same = sum(f == len(w) for f, w in zip(firsts, want))
        print(f"check against {ref_impl}: {same}/{len(want)} requests token-identical; "
              f"{sum(firsts)}/{produced} tokens agree before the first divergence")  # fmt: skip
        if same < len(want) and (device.type == "cuda" or kv_dtype is not None):
            print("(with bf16/FP8 roundings two correct implementations may part at a near-tie)")
        elif same < len(want):
            raise SystemExit("float32 on the CPU: every token should agree")


if __name__ == "__main__":
    main()
