"""Attention variants (S2.3) of decode on torch CUDA tensors: sinks as a CUDA
float32 tensor, against the CPU reference_attention with the same variants.

Runs only where torch sees a CUDA device and the library has CUDA (skipped
elsewhere, with the reason shown by pytest -rs)."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
if fd.cuda_device_count() == 0:
    pytest.skip("libflashdec built without CUDA", allow_module_level=True)


def test_cuda_decode_variants_match_reference():
    g = torch.Generator(device="cuda").manual_seed(7)
    hq, hkv, d, bs = 8, 2, 128, 16
    lens = [300, 45, 129]
    mbps = max((n + bs - 1) // bs for n in lens)
    nb = len(lens) * mbps
    kc = torch.randn(nb, hkv, bs, d, generator=g, device="cuda").to(torch.bfloat16)
    vc = torch.randn(nb, hkv, bs, d, generator=g, device="cuda").to(torch.bfloat16)
    q = torch.randn(len(lens), hq, d, generator=g, device="cuda").to(torch.bfloat16)
    tables = torch.arange(nb, dtype=torch.int32, device="cuda").reshape(len(lens), mbps)
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    sinks = torch.linspace(-1.0, 2.0, hq, device="cuda", dtype=torch.float32)
    kw = dict(logit_softcap=30.0, sliding_window=64)
    size = fd.decode_workspace_size(q, kc, vc, tables, lens_t, sinks=sinks, **kw)
    ws = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
    out = fd.decode(q, kc, vc, tables, lens_t, workspace=ws, sinks=sinks, **kw)
    torch.cuda.synchronize()
    # Dense K/V on the host for the reference (bf16 values in float32).
    k = kc[tables.long()].float().permute(0, 2, 1, 3, 4).reshape(len(lens), hkv, mbps * bs, d)
    v = vc[tables.long()].float().permute(0, 2, 1, 3, 4).reshape(len(lens), hkv, mbps * bs, d)
    want = fd.reference_attention(
        q.float().cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), lens, sinks=sinks.cpu().numpy(), **kw
    )
    got = out.float().cpu().numpy()
    err = np.linalg.norm(got - want, axis=-1) / np.maximum(np.linalg.norm(want, axis=-1), 1e-30)
    assert err.max() <= 5e-3, err.max()
    # A host sinks array is refused (sinks live on q's device), and a NaN sink
    # is refused on the checked path.
    with pytest.raises(fd.FlashDecError):
        fd.decode(q, kc, vc, tables, lens_t, workspace=ws, sinks=sinks.cpu().numpy(), **kw)
    bad = sinks.clone()
    bad[3] = float("nan")
    with pytest.raises(fd.FlashDecError) as e:
        fd.decode(q, kc, vc, tables, lens_t, workspace=ws, sinks=bad, check_indices=True, **kw)
    assert "sinks[3]" in e.value.message
