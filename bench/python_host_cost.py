#!/usr/bin/env python3
"""Host cost of the Python layer on the per-layer path of a decode step.

Times, on the CPU with shapes so small that the library's own work is a
few microseconds, what each call costs in Python and ctypes:

* ``DecodePlan.run``: one planned decode (16 rows of 16 tokens, 1 KV head,
  head_dim 8, bf16 torch tensors), the call every layer makes;
* ``Transaction.write_layer``: one layer's K/V of a 16-row step;
* a decode step of a tiny Llama (8 layers, hidden 64, 2 heads of 32) in
  transformers with ``FlashDecCache`` against the same model with sdpa and
  transformers' ``DynamicCache``: the difference per layer is what the
  FlashDec path adds on the host (GPU runs pay it the same way unless the
  step is replayed from a CUDA graph, docs/transformers.md).

Prints one JSON object (medians in microseconds over --reps timed runs of
--calls calls each). Needs torch; the model rows need transformers.

    FLASHDEC_LIBRARY=build/libflashdec.so PYTHONPATH=bindings/python \\
        python3 bench/python_host_cost.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def per_call_us(fn, calls: int, reps: int) -> float:
    for _ in range(max(1, calls // 10)):
        fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--skip-model", action="store_true", help="only the binding calls")
    args = ap.parse_args()
    import torch

    import flashdec as fd

    torch.manual_seed(0)
    out: dict = {"calls": args.calls, "reps": args.reps, "torch": torch.__version__}
    rows, tokens, hd = 16, 16, 8
    with fd.Cache(max_blocks=rows * 2 + 4, block_size=16, num_layers=1, num_kv_heads=1, head_dim=hd,
                  dtype=fd.DType.BF16) as cache:  # fmt: skip
        ids = list(range(rows))
        for i in ids:
            cache.add_request(i)
        kv = torch.randn(rows * tokens, 1, hd).to(torch.bfloat16)
        with cache.begin(ids, token_counts=[tokens] * rows) as tx:
            tx.write_layer(0, kv, kv)
            tx.commit()
        tables, lens = cache.export(ids)
        q = torch.randn(rows, 4, hd).to(torch.bfloat16)
        k_arr, v_arr = cache.layer_arrays(0)
        plan = fd.DecodePlan(q, k_arr, v_arr, tables, lens, host_seq_lens=lens)
        o = torch.empty_like(q)
        out["decode_plan_run_us"] = per_call_us(lambda: plan.run(q, k_arr, v_arr, tables, lens, o), args.calls, args.reps)
        plan.close()
        one = torch.randn(rows, 1, hd).to(torch.bfloat16)

        def write() -> None:
            t = cache.begin(ids)
            t.write_layer(0, one, one)
            t.abort()

        begin_abort = per_call_us(lambda: cache.begin(ids).abort(), args.calls, args.reps)
        out["tx_begin_abort_us"] = begin_abort
        out["tx_write_layer_us"] = per_call_us(write, args.calls, args.reps) - begin_abort
    if not args.skip_model:
        import transformers

        import flashdec.transformers as fdt

        fdt.register()
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                                       num_attention_heads=2, num_key_value_heads=1, vocab_size=128,
                                       max_position_embeddings=4096)  # fmt: skip
        cfg._attn_implementation = fdt.ATTN_IMPLEMENTATION
        model = transformers.LlamaForCausalLM(cfg).eval()
        batch, prompt, steps = 16, 32, args.calls
        prompt_ids = torch.randint(0, 128, (batch, prompt))

        def run_steps(make_cache) -> float:
            cache = make_cache()
            with torch.no_grad():
                o = model(input_ids=prompt_ids, past_key_values=cache, use_cache=True)
                tok = [o.logits[:, -1:].argmax(-1)]

                def step() -> None:
                    r = model(input_ids=tok[0], past_key_values=cache, use_cache=True)
                    tok[0] = r.logits[:, -1:].argmax(-1)

                return per_call_us(step, max(8, steps // 20), args.reps)

        fd_us = run_steps(lambda: fdt.FlashDecCache(model, max_tokens=batch * (prompt + 4 * steps)))
        model.set_attn_implementation("sdpa")
        hf_us = run_steps(transformers.DynamicCache)
        out["tiny_llama_step_us"] = {"flashdec_eager": fd_us, "sdpa_dynamic_cache": hf_us}
        out["flashdec_extra_per_layer_us"] = (fd_us - hf_us) / cfg.num_hidden_layers
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
