"""flashdec.transformers: Hugging Face models decoding through the FlashDec
paged cache on the CPU (float32), token for token against the same model with
attn_implementation="eager" (issue 18's CPU parity).

Per architecture (random-init from its config class; nothing is downloaded):
- model.generate over a left-padded batch of 4 prompts of different lengths,
  256 new tokens, against eager's generate on the same batch;
- ContinuousBatcher (one request per prompt, at most 4 active, so the fifth
  joins when the early one finishes and reuses its blocks; a shared-prefix
  pair) against eager's generate on each prompt alone.
"""

from __future__ import annotations

import copy
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="flashdec.transformers needs torch (scripts/setup.sh installs it)")
transformers = pytest.importorskip("transformers", reason="flashdec.transformers needs transformers")

import flashdec  # noqa: E402
import flashdec.transformers as fdt  # noqa: E402
from flashdec import DType, FlashDecError, Status  # noqa: E402

VOCAB = 256
STEPS = 256
PAD = 0


def _config(arch: str):
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, initializer_range=0.1, pad_token_id=PAD, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    if arch == "llama":
        return transformers.LlamaConfig(num_hidden_layers=2, **common)
    if arch == "qwen2":  # GQA with q/k/v biases; every other layer sliding
        return transformers.Qwen2Config(
            num_hidden_layers=2, use_sliding_window=True, sliding_window=40, max_window_layers=1, **common
        )
    if arch == "mistral":
        return transformers.MistralConfig(num_hidden_layers=2, sliding_window=48, **common)
    if arch == "gemma2":  # soft-cap, head_dim 256, alternating 32-token windows
        common.update(head_dim=256, query_pre_attn_scalar=144)
        return transformers.Gemma2Config(
            num_hidden_layers=2, sliding_window=32, attn_logit_softcapping=4.0, final_logit_softcapping=30.0,
            **common,
        )  # fmt: skip
    if arch == "gpt_oss":  # sinks, alternating sliding layers, MoE
        common.update(head_dim=16, num_local_experts=4, num_experts_per_tok=2)
        return transformers.GptOssConfig(num_hidden_layers=2, sliding_window=40, **common)
    raise AssertionError(arch)


ARCHS = ["llama", "qwen2", "mistral", "gemma2", "gpt_oss"]


def _models(arch: str, seed: int = 0, *, reference: str = "eager", dtype=None, config=None):
    """The same random weights as a reference model (``reference``
    attention) and a FlashDec model (bench/e2e_transformers.py uses it too)."""
    fdt.register()
    cfg = config if config is not None else _config(arch)
    torch.manual_seed(seed)
    cls = transformers.AutoModelForCausalLM
    kw = {} if dtype is None else {"dtype": dtype}
    eager = cls.from_config(copy.deepcopy(cfg), attn_implementation=reference, **kw).eval()
    ours = cls.from_config(copy.deepcopy(cfg), attn_implementation=fdt.ATTN_IMPLEMENTATION, **kw).eval()
    ours.load_state_dict(eager.state_dict())
    if arch == "gpt_oss":  # the sinks start at zero; make them matter
        with torch.no_grad():
            for a, b in zip(eager.modules(), ours.modules()):
                if hasattr(a, "sinks"):
                    s = torch.randn_like(a.sinks) * 2
                    a.sinks.copy_(s)
                    b.sinks.copy_(s)
    return eager, ours


def _prompts(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 23, 12, 37, 9, 30][:n]
    return [torch.randint(3, VOCAB, (L,), generator=g).tolist() for L in lengths]


def _left_pad(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def _greedy(model, ids, mask, steps, **kw):
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
        pad_token_id=PAD, **kw,
    )  # fmt: skip
    return out[:, ids.shape[1] :]


def _first_difference(a, b):
    a, b = list(a), list(b)
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_padded_batch_matches_eager(arch):
    eager, ours = _models(arch)
    ids, mask = _left_pad(_prompts(4, seed=1))
    with torch.no_grad():
        want = _greedy(eager, ids, mask, STEPS)
        cache = fdt.FlashDecCache(ours, max_tokens=4 * (ids.shape[1] + STEPS))
        got = _greedy(ours, ids, mask, STEPS, past_key_values=cache)
    for row in range(ids.shape[0]):
        diff = _first_difference(got[row], want[row])
        assert diff is None, f"{arch} row {row}: first different token at step {diff}"
    # Padding is not stored: each row holds its prompt plus STEPS - 1 generated tokens.
    tables, lens = cache.fd.export(cache._row_ids)
    assert lens.tolist() == [int(m.sum()) + STEPS - 1 for m in mask]
    assert cache.get_seq_length() == ids.shape[1] + STEPS - 1
    cache.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_continuous_batching_matches_eager_per_prompt(arch):
    eager, ours = _models(arch)
    prompts = _prompts(5, seed=2)
    prefix = _prompts(1, seed=3)[0][:4] * 8  # 32 tokens: two blocks of 16
    shared = [prefix + p[:7] for p in _prompts(2, seed=4)]
    budget = [STEPS, 40, STEPS, STEPS, STEPS]  # request 1 finishes early; request 4 waits for its place
    want = {}
    with torch.no_grad():
        for i, p in enumerate(prompts + shared):
            steps = budget[i] if i < len(budget) else STEPS // 2
            ids = torch.tensor([p])
            want[i] = _greedy(eager, ids, torch.ones_like(ids), steps)[0].tolist()

    block = 16
    per_request = -(-(max(len(p) for p in prompts) + STEPS) // block)
    cache = fdt.FlashDecCache(ours, num_blocks=4 * per_request, block_size=block, prefix_blocks=2)
    # generate's min_new_tokens keeps EOS out of the reference; the batcher's select does the same.
    no_eos = torch.tensor([ours.config.eos_token_id])
    batcher = fdt.ContinuousBatcher(
        ours, cache, max_batch=4, select=lambda logits: logits.index_fill(-1, no_eos, -float("inf")).argmax(-1)
    )
    requests = [batcher.add(p, budget[i]) for i, p in enumerate(prompts)]
    free_at_start = cache.fd.metrics().free_blocks
    finish_order = []
    joined_at = None
    step = 0
    while batcher.waiting or batcher.active:
        done = batcher.step()
        step += 1
        finish_order += [requests.index(r) for r in done if r in requests]
        if joined_at is None and requests[4] in batcher.active:
            joined_at = step
    assert finish_order[0] == 1, "the 40-token request finishes first"
    assert joined_at == 41, f"request 4 joins right after request 1 finishes (step {joined_at})"
    assert cache.fd.metrics().free_blocks == free_at_start, "every block is back in the pool"
    for i, r in enumerate(requests):
        diff = _first_difference(r.tokens, want[i])
        assert diff is None and len(r.tokens) == budget[i], f"{arch} request {i}: first different token at {diff}"

    # A shared prefix, computed once, attached to two requests.
    batcher.add_prefix("system", prefix)
    pair = [batcher.add(p, STEPS // 2, prefix="system") for p in shared]
    assert cache.fd.prefix_info("system").ref_count == 2 or batcher.waiting
    batcher.run()
    for j, r in enumerate(pair):
        diff = _first_difference(r.tokens, want[len(prompts) + j])
        assert diff is None, f"{arch} shared-prefix request {j}: first different token at {diff}"
    cache.close()


def test_forward_without_cache_matches_eager_logits():
    eager, ours = _models("gemma2")
    ids, mask = _left_pad(_prompts(3, seed=5))
    with torch.no_grad():
        want = eager(ids, attention_mask=mask, use_cache=False).logits
        got = ours(ids, attention_mask=mask, use_cache=False).logits
    real = mask.bool()
    np.testing.assert_allclose(got[real].numpy(), want[real].numpy(), rtol=1e-4, atol=1e-4)


def _eager_bf16_kv(module, query, key, value, attention_mask, **kwargs):
    """eager attention over K/V rounded to bfloat16: what a bf16 cache stores."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return eager_attention_forward(
        module, query, key.to(torch.bfloat16).float(), value.to(torch.bfloat16).float(), attention_mask, **kwargs
    )


def test_float32_model_over_bfloat16_cache_matches_rounded_eager():
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    transformers.AttentionInterface.register("eager_bf16_kv", _eager_bf16_kv)
    AttentionMaskInterface.register("eager_bf16_kv", eager_mask)
    eager, ours = _models("llama")
    eager.set_attn_implementation("eager_bf16_kv")
    ids, mask = _left_pad(_prompts(4, seed=6))
    with torch.no_grad():
        want = _greedy(eager, ids, mask, 64)
        cache = fdt.FlashDecCache(ours, max_tokens=4096, kv_dtype=DType.BF16)
        got = _greedy(ours, ids, mask, 64, past_key_values=cache)
    assert cache.fd.config.dtype == DType.BF16
    assert torch.equal(got, want)


def test_fp8_cache_generates_close_to_float32():
    eager, ours = _models("llama")
    ids, mask = _left_pad(_prompts(2, seed=7))
    with torch.no_grad():
        want = eager(ids, attention_mask=mask).logits
        cache = fdt.FlashDecCache(ours, max_tokens=1024, kv_dtype=DType.FP8_E4M3)
        got = ours(ids, attention_mask=mask, past_key_values=cache).logits
    real = mask.bool()
    err = (got[real] - want[real]).abs().max().item()
    assert 0 < err < 0.05 * want[real].abs().max().item()
    assert cache.fd.config.dtype == DType.FP8_E4M3


def _status(excinfo):
    return excinfo.value.status, excinfo.value.message


def test_cache_refuses_a_model_without_fd_paged():
    eager, _ = _models("llama")
    with pytest.raises(FlashDecError) as e:
        fdt.FlashDecCache(eager, max_tokens=64)
    status, message = _status(e)
    assert status == Status.UNSUPPORTED and 'attn_implementation="eager"' in message


def test_unsupported_features_name_themselves_and_change_nothing():
    _, ours = _models("llama")
    ids, mask = _left_pad(_prompts(2, seed=8))
    cache = fdt.FlashDecCache(ours, max_tokens=512)
    before = cache.fd.metrics()
    with torch.no_grad():
        four_d = torch.zeros((2, 1, ids.shape[1], ids.shape[1]))
        with pytest.raises(FlashDecError) as e:
            ours(ids, attention_mask=four_d, past_key_values=cache)
        assert e.value.status == Status.UNSUPPORTED and "4-D attention mask" in e.value.message
    for what, text in ((lambda: cache.crop(1), "cropping"), (lambda: cache.reorder_cache(torch.tensor([0])), "beam")):
        with pytest.raises(FlashDecError) as e:
            what()
        assert e.value.status == Status.UNSUPPORTED and text in e.value.message
    after = cache.fd.metrics()
    assert (after.used_blocks, after.transaction_begin_count, after.active_request_count) == (
        before.used_blocks, before.transaction_begin_count, before.active_request_count)
    # Beam search is refused when generate first reorders the rows.
    with torch.no_grad(), pytest.raises(FlashDecError) as e:
        ours.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=2, do_sample=False,
                      pad_token_id=PAD, past_key_values=cache)  # fmt: skip
    assert e.value.status == Status.UNSUPPORTED and ("beam search" in e.value.message or "repeating" in e.value.message)
    cache.close()


def test_unsupported_layer_type_is_named():
    cfg = _config("llama")
    cfg.layer_types = ["full_attention", "chunked_attention"]
    fdt.register()
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=fdt.ATTN_IMPLEMENTATION)
    with pytest.raises(FlashDecError) as e:
        fdt.FlashDecCache(model, max_tokens=64)
    assert e.value.status == Status.UNSUPPORTED and 'layer 1 is of type "chunked_attention"' in e.value.message


def test_batcher_argument_errors():
    _, ours = _models("llama")
    cache = fdt.FlashDecCache(ours, max_tokens=512, prefix_blocks=2)
    batcher = fdt.ContinuousBatcher(ours, cache)
    cases = [
        (lambda: batcher.add([], 4), Status.INVALID_ARGUMENT, "non-empty prompt"),
        (lambda: batcher.add([3, 4], 0), Status.INVALID_ARGUMENT, "max_new_tokens >= 1"),
        (lambda: batcher.add([3, 4], 4, prefix="none"), Status.NOT_FOUND, "no prefix named 'none'"),
        (lambda: batcher.add_prefix("p", [3] * 15), Status.INVALID_ARGUMENT, "multiple of block_size (16)"),
    ]
    for call, status, text in cases:
        with pytest.raises(FlashDecError) as e:
            call()
        assert e.value.status == status and text in e.value.message, e.value.message
    assert not batcher.waiting and not batcher.active
    m = cache.fd.metrics()
    assert (m.free_blocks, m.active_request_count, m.prefix_registration_count) == (cache.fd.config.max_blocks, 0, 0)
    cache.close()


def test_batcher_reserves_blocks_so_admitted_requests_never_run_out():
    _, ours = _models("llama")
    cache = fdt.FlashDecCache(ours, num_blocks=8, block_size=16)
    pool = cache.fd.config.max_blocks
    batcher = fdt.ContinuousBatcher(ours, cache)
    prompts = _prompts(3, seed=9)
    # Each needs ceil((len + 40) / 16) blocks: not all three fit the pool at once.
    requests = [batcher.add(p[:20] + [5] * (20 - len(p[:20])), 40) for p in prompts]
    batcher.step()
    assert sum(r.blocks for r in batcher.active) <= pool
    assert len(batcher.active) < 3 and batcher.waiting
    batcher.run()
    assert all(r.done and len(r.tokens) == 40 for r in requests)
    assert cache.fd.metrics().free_blocks == pool
    cache.close()


def test_batcher_refuses_a_request_the_pool_can_never_hold():
    _, ours = _models("llama")
    cache = fdt.FlashDecCache(ours, num_blocks=4, block_size=16)
    batcher = fdt.ContinuousBatcher(ours, cache)
    with pytest.raises(FlashDecError) as e:
        batcher.add([3] * 20, 200)
    assert e.value.status == Status.OUT_OF_BLOCKS and "needs 14 blocks; the pool has" in e.value.message
    assert not batcher.waiting and cache.fd.metrics().active_request_count == 0
    cache.close()


def test_batcher_prefix_does_not_eat_active_reservations():
    _, ours = _models("llama")
    cache = fdt.FlashDecCache(ours, num_blocks=8, block_size=16, prefix_blocks=4)
    batcher = fdt.ContinuousBatcher(ours, cache)
    r = batcher.add([3] * 20, 60)  # reserves ceil(80 / 16) = 5 of the 12 blocks
    batcher.step()
    before = cache.fd.metrics()
    with pytest.raises(FlashDecError) as e:
        batcher.add_prefix("p", [4] * 64)  # 4 blocks, 8 while computed: 7 are left
    assert e.value.status == Status.OUT_OF_BLOCKS and "needs 8 free blocks" in e.value.message
    after = cache.fd.metrics()
    assert (after.used_blocks, after.resident_prefix_count) == (before.used_blocks, 0)
    batcher.run()
    assert r.done and len(r.tokens) == 60
    batcher.add_prefix("p", [4] * 64)  # nothing active: room for it now
    assert cache.fd.prefix_info("p").num_blocks == 4
    cache.close()


def _refused(call, status, text):
    with pytest.raises(FlashDecError) as e:
        call()
    assert e.value.status == status and text in e.value.message, e.value.message


def test_cache_creation_refusals():
    _, ours = _models("llama")
    _refused(lambda: fdt.FlashDecCache(ours), Status.INVALID_ARGUMENT, "give max_tokens or num_blocks")
    _refused(
        lambda: fdt.FlashDecCache(ours, max_tokens=64, dtype=torch.float64), Status.UNSUPPORTED, "model dtype"
    )
    cfg = _config("llama")
    cfg.is_causal = False
    _refused(lambda: fdt.FlashDecCache(cfg, max_tokens=64), Status.UNSUPPORTED, "non-causal")
    _refused(
        lambda: fdt.GraphDecoder(ours, fdt.FlashDecCache(ours, max_tokens=64), [0], 64),
        Status.UNSUPPORTED, "needs a CUDA cache",
    )  # fmt: skip


def test_refused_forwards_change_nothing():
    _, ours = _models("llama")
    ids, mask = _left_pad(_prompts(2, seed=10))
    with torch.no_grad():
        # A first forward the pool cannot hold: the rows it added are taken back.
        small = fdt.FlashDecCache(ours, num_blocks=1, block_size=16)
        before = small.fd.metrics()
        _refused(lambda: ours(ids, attention_mask=mask, past_key_values=small), Status.OUT_OF_BLOCKS, "new blocks")
        after = small.fd.metrics()
        assert (after.used_blocks, after.active_request_count) == (before.used_blocks, 0)
        assert small.get_seq_length() == 0 and small.batch_size == -1
        cache = fdt.FlashDecCache(ours, max_tokens=1024)
        ours(ids, attention_mask=mask, past_key_values=cache)
        seen, lens = cache.get_seq_length(), cache.fd.export(cache._row_ids)[1].tolist()
        three = torch.full((3, 1), 5)
        _refused(lambda: ours(three, past_key_values=cache), Status.INVALID_ARGUMENT, "the cache holds 2 rows")
        cache.set_next_step(cache._row_ids, [1, 1])
        _refused(lambda: ours(ids[:1], past_key_values=cache), Status.INVALID_ARGUMENT, "set_next_step announced 2")
        for rows, counts in (([], []), ([0, 1], [1])):
            _refused(lambda: cache.set_next_step(rows, counts), Status.INVALID_ARGUMENT, "one token count per request")
        assert (cache.get_seq_length(), cache.fd.export(cache._row_ids)[1].tolist()) == (seen, lens)
        assert cache.fd.metrics().open_transaction_count == 0


def test_attention_call_refusals():
    _, ours = _models("llama")
    cache = fdt.FlashDecCache(ours, max_tokens=256)
    cache._row_ids = [cache.new_request()]
    q = torch.randn(1, 4, 2, 16)
    k = torch.randn(1, 2, 2, 16)
    module = types.SimpleNamespace(training=False)

    def call(layer, key=k, value=k, **kw):
        tagged, v = cache.layers[layer].update(key, value)
        return fdt.attention_forward(module, q, tagged, v, None, **kw)

    _refused(lambda: call(1), Status.INVALID_STATE, "layer 1 ran out of order")
    wide = torch.randn(1, 2, 2, 32)
    _refused(lambda: call(0, key=wide, value=wide), Status.UNSUPPORTED, "head sizes")
    training = types.SimpleNamespace(training=True)
    _refused(lambda: fdt.attention_forward(training, q, k, k, None, dropout=0.1), Status.UNSUPPORTED, "dropout")
    call(0, scaling=0.25)
    _refused(lambda: call(1, scaling=0.5), Status.UNSUPPORTED, "softmax scale that differs")
    # Each refusal aborted the step: nothing was committed.
    m = cache.fd.metrics()
    assert (m.open_transaction_count, m.transaction_commit_count, m.used_blocks) == (0, 0, 0)
    assert cache.get_seq_length() == 0
    cache.close()


def test_batcher_admission_refusals():
    _, ours = _models("llama")
    cache = fdt.FlashDecCache(ours, num_blocks=6, block_size=16, prefix_blocks=4)
    batcher = fdt.ContinuousBatcher(ours, cache, max_step_tokens=16)
    batcher.add([3] * 20, 4)
    _refused(batcher.step, Status.INVALID_ARGUMENT, "a prompt longer than max_step_tokens")
    assert len(batcher.waiting) == 1 and not batcher.active
    batcher.waiting.clear()
    batcher.max_step_tokens = 8192
    batcher.add_prefix("p", [4] * 64)  # 4 of the 10 blocks now hold the prefix
    batcher.add([3] * 90, 10)  # 7 blocks: fits the pool, not what the prefix leaves
    before = cache.fd.metrics()
    _refused(batcher.step, Status.OUT_OF_BLOCKS, "needs 7 blocks; the pool has 6 for requests")
    after = cache.fd.metrics()
    assert len(batcher.waiting) == 1 and (after.used_blocks, after.active_request_count) == (before.used_blocks, 0)
    cache.close()
