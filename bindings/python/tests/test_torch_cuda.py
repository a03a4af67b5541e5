"""fd_decode on torch CUDA tensors through the Python binding, against a torch reference.

Runs only where torch sees a CUDA device (skipped elsewhere, with the reason shown
by pytest -rs). Prints a one-line summary per case so a GPU run's log shows what
was compared.
"""

from __future__ import annotations

import math

import pytest

import flashdec as fd

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)


def paged_reference(q, k_cache, v_cache, tables, lens, block_size):
    """FP32 attention over each row's gathered blocks (token-major axis order)."""
    batch, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    out = torch.zeros(batch, hq, d, dtype=torch.float32, device=q.device)
    for r in range(batch):
        n = int(lens[r])
        if n == 0:
            continue
        nb = (n + block_size - 1) // block_size
        ids = tables[r, :nb].long()
        k = k_cache[ids].float().permute(1, 0, 2, 3).reshape(hkv, nb * block_size, d)[:, :n]
        v = v_cache[ids].float().permute(1, 0, 2, 3).reshape(hkv, nb * block_size, d)[:, :n]
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        s = torch.einsum("hd,htd->ht", q[r].float(), k) / math.sqrt(d)
        out[r] = torch.einsum("ht,htd->hd", torch.softmax(s, dim=-1), v)
    return out


def worst_rel_error(out, ref):
    num = (out.float() - ref).norm(dim=-1)
    den = ref.norm(dim=-1).clamp_min(1e-30)
    return float((num / den).max())


@pytest.mark.parametrize(
    "dtype,hq,hkv,d,bs,nhd",
    [
        (torch.bfloat16, 32, 8, 128, 16, False),
        (torch.float16, 32, 8, 128, 32, False),
        (torch.bfloat16, 16, 2, 128, 16, True),
        (torch.bfloat16, 32, 4, 64, 8, False),
    ],
)
def test_decode_cuda_tensors_match_torch(dtype, hq, hkv, d, bs, nhd):
    g = torch.Generator(device="cuda").manual_seed(1234)
    batch, max_blocks_per_seq = 6, 40
    num_blocks = batch * max_blocks_per_seq
    dev = torch.device("cuda")
    if nhd:
        # vLLM/FlashInfer NHD pages [num_blocks, block_size, kv_heads, d], viewed in
        # token-major axis order without a copy.
        k_pages = torch.randn(num_blocks, bs, hkv, d, generator=g, device=dev).to(dtype)
        v_pages = torch.randn(num_blocks, bs, hkv, d, generator=g, device=dev).to(dtype)
        k_cache, v_cache = k_pages.transpose(1, 2), v_pages.transpose(1, 2)
    else:
        k_cache = torch.randn(num_blocks, hkv, bs, d, generator=g, device=dev).to(dtype)
        v_cache = torch.randn(num_blocks, hkv, bs, d, generator=g, device=dev).to(dtype)
    q = (3.0 * torch.randn(batch, hq, d, generator=g, device=dev)).to(dtype)
    perm = torch.randperm(num_blocks, generator=g, device=dev).to(torch.int32)
    tables = perm.reshape(batch, max_blocks_per_seq).contiguous()
    # Every length fits its row's table (333 would need 42 blocks of 8 tokens).
    long_row = min(333, max_blocks_per_seq * bs - 3)
    lens = torch.tensor([0, 1, bs, bs + 1, long_row, max_blocks_per_seq * bs], dtype=torch.int32, device=dev)
    out = torch.full((batch, hq, d), float("nan"), dtype=dtype, device=dev)
    ws = torch.empty(
        fd.decode_workspace_size(q, k_cache, v_cache, tables, lens, out=out), dtype=torch.uint8, device=dev
    )
    fd.decode(q, k_cache, v_cache, tables, lens, out, workspace=ws)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()
    ref = paged_reference(q, k_cache, v_cache, tables, lens, bs)
    err = worst_rel_error(out, ref)
    tol = 5e-3 if dtype == torch.bfloat16 else 1e-3
    print(
        f"torch-cuda decode {str(dtype).replace('torch.', '')} q/kv/d={hq}/{hkv}/{d} bs={bs}"
        f" nhd={nhd} lens={lens.tolist()} workspace={ws.numel()}B worst_rel_err={err:.2e} (tol {tol})"
    )
    assert err <= tol
    assert float(out[0].float().abs().max()) == 0.0  # empty row is zeros


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_plan_cuda_matches_decode_and_replays_in_a_graph(dtype):
    """DecodePlan on torch CUDA tensors: without host lengths a plan has
    fd_decode's split layout (same bits); with exact host lengths it agrees
    with the reference; a run with the caller's workspace and out is captured
    in a CUDA graph (no allocation, no host synchronisation) and replays with
    new q values to the bits of an eager run."""
    g = torch.Generator(device="cuda").manual_seed(77)
    dev = torch.device("cuda")
    batch, hq, hkv, d, bs, mbps = 5, 16, 4, 128, 16, 64
    num_blocks = batch * mbps
    k = torch.randn(num_blocks, hkv, bs, d, generator=g, device=dev).to(dtype)
    v = torch.randn(num_blocks, hkv, bs, d, generator=g, device=dev).to(dtype)
    q = (3.0 * torch.randn(batch, hq, d, generator=g, device=dev)).to(dtype)
    tables = torch.randperm(num_blocks, generator=g, device=dev).to(torch.int32).reshape(batch, mbps).contiguous()
    host_lens = [0, 1, 17, 700, mbps * bs]
    lens = torch.tensor(host_lens, dtype=torch.int32, device=dev)
    bits = torch.int16

    with fd.DecodePlan(q, k, v, tables, lens) as plan:
        # fd_decode splits as far as its workspace allows: give it what it asks for.
        size = fd.decode_workspace_size(q, k, v, tables, lens)
        assert size == plan.workspace_size
        want = fd.decode(q, k, v, tables, lens, workspace=torch.empty(size, dtype=torch.uint8, device=dev))
        got = plan.run(q, k, v, tables, lens)  # workspace allocated by the binding
        torch.cuda.synchronize()
        assert torch.equal(got.view(bits), want.view(bits))

    plan = fd.DecodePlan(q, k, v, tables, lens, host_seq_lens=host_lens)
    ws = torch.empty(max(plan.workspace_size, 16), dtype=torch.uint8, device=dev)
    out = torch.full_like(q, float("nan"))
    plan.run(q, k, v, tables, lens, out, workspace=ws)
    torch.cuda.synchronize()
    err = worst_rel_error(out, paged_reference(q, k, v, tables, lens, bs))
    tol = 5e-3 if dtype == torch.bfloat16 else 1e-3
    assert err <= tol and float(out[0].float().abs().max()) == 0.0

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch asks
        plan.run(q, k, v, tables, lens, out, workspace=ws)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    captured = torch.full_like(q, float("nan"))
    with torch.cuda.graph(graph):
        plan.run(q, k, v, tables, lens, captured, workspace=ws)
    q.copy_((3.0 * torch.randn(batch, hq, d, generator=g, device=dev)).to(dtype))
    graph.replay()
    torch.cuda.synchronize()
    eager = plan.run(q, k, v, tables, lens, workspace=ws)
    torch.cuda.synchronize()
    assert torch.equal(captured.view(bits), eager.view(bits))
    print(
        f"torch-cuda plan {str(dtype).replace('torch.', '')} lens={host_lens} workspace={plan.workspace_size}B"
        f" worst_rel_err={err:.2e} (tol {tol}); graph replay == eager run"
    )
    plan.close()
