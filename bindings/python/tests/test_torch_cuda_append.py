"""Append primitives, async exports and the async error query on torch CUDA
tensors (CUDA caches), against torch / the synchronous CPU-side views.

Runs only where torch sees a CUDA device and the library was built with CUDA
(skipped elsewhere, with the reason shown by pytest -rs).
"""

from __future__ import annotations

import pytest

import flashdec as fd

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
if fd.cuda_device_count() == 0:
    pytest.skip("libflashdec was built without CUDA", allow_module_level=True)


def test_kv_append_and_rope_on_cuda_tensors():
    g = torch.Generator(device="cuda").manual_seed(7)
    n, hq, hkv, d, bs, nb = 5, 8, 2, 64, 16, 12
    opts = dict(dtype=torch.bfloat16, device="cuda")
    k_cache = torch.zeros(nb, hkv, bs, d, **opts)
    v_cache = torch.zeros_like(k_cache)
    q = torch.randn(n, hq, d, generator=g, **opts)
    k = torch.randn(n, hkv, d, generator=g, **opts)
    v = torch.randn(n, hkv, d, generator=g, **opts)
    ids = torch.tensor([3, 0, 11, 3, 7], dtype=torch.int32, device="cuda")
    offs = torch.tensor([0, 15, 4, 1, 9], dtype=torch.int32, device="cuda")
    pos = torch.tensor([0, 17, 300, 1, 42], dtype=torch.int32, device="cuda")
    fd.kv_append(k, v, k_cache, v_cache, ids, offs)
    torch.cuda.synchronize()
    for i in range(n):
        assert torch.equal(k_cache[ids[i], :, offs[i]], k[i])
        assert torch.equal(v_cache[ids[i], :, offs[i]], v[i])
    q_out = fd.rope_kv_append(q, k, v, k_cache, v_cache, ids, offs, pos, rotary_dim=d)
    torch.cuda.synchronize()
    q_ref = fd.rope_apply(q.float().cpu().numpy(), pos.cpu().numpy(), d)
    assert torch.allclose(q_out.float().cpu(), torch.from_numpy(q_ref), atol=2e-2, rtol=2e-2)
    # A bad id is refused before any write.
    before = k_cache.clone()
    bad = torch.tensor([0, 0, nb, 0, 0], dtype=torch.int32, device="cuda")
    with pytest.raises(fd.FlashDecError) as e:
        fd.kv_append(k, v, k_cache, v_cache, bad, offs)
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "block_ids[2]" in e.value.message
    assert torch.equal(k_cache, before)


def test_export_async_into_cuda_tensors():
    cfg = fd.CacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, max_blocks=32,
                         dtype=fd.DType.BF16, device=fd.Device.cuda(0))
    with fd.Cache(cfg) as c:
        for rid in (1, 2):
            c.add_request(rid)
        for step in range(20):
            kv = torch.randn(2, 2, 64, dtype=torch.bfloat16, device="cuda")
            c.append([1, 2], kv, kv)
        tables, lens = c.export([2, 1], table_stride=4)
        t = torch.full((2, 4), 99, dtype=torch.int32, device="cuda")
        sl = torch.full((2,), 99, dtype=torch.int32, device="cuda")
        c.export_async([2, 1], t, sl)
        torch.cuda.synchronize()
        assert t.cpu().numpy().tolist() == tables.tolist()
        assert sl.cpu().numpy().tolist() == lens.tolist()
        with c.begin([1]) as tx:
            tt = torch.full((1, 4), 99, dtype=torch.int32, device="cuda")
            tl = torch.zeros(1, dtype=torch.int32, device="cuda")
            tx.block_tables_async(tt, tl)
            torch.cuda.synchronize()
            assert tt.cpu().numpy().tolist() == tx.block_tables(4).tolist()
            assert int(tl[0]) == 21
        with pytest.raises(fd.FlashDecError) as e:
            c.export_async([1], torch.zeros(1, 4, dtype=torch.int32))  # host tensor, CUDA cache
        assert "lives on cpu, expected cuda:0" in e.value.message
        assert c.async_error() is None
