"""torch tensors (CPU; CUDA when available) go through data_ptr without copies."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

torch = pytest.importorskip("torch")


def test_decode_with_cpu_tensors():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, generator=g)
    kc = torch.randn(4, 2, 4, 8, generator=g)
    vc = torch.randn(4, 2, 4, 8, generator=g)
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([5, 8], dtype=torch.int32)
    out = fd.decode(q, kc, vc, tables, lens)
    assert isinstance(out, torch.Tensor)
    ref = fd.decode(q.numpy(), kc.numpy(), vc.numpy(), tables.numpy(), lens.numpy())
    np.testing.assert_array_equal(out.numpy(), ref)
    bf = fd.decode(q.bfloat16(), kc.bfloat16(), vc.bfloat16(), tables, lens)
    assert bf.dtype == torch.bfloat16


def test_cache_append_with_tensors():
    with fd.Cache(num_layers=1, num_kv_heads=2, head_dim=8, block_size=4, max_blocks=4, dtype=fd.DType.F32) as c:
        c.add_request(1)
        k = torch.randn(1, 2, 8)
        c.append([1], k, torch.randn(1, 2, 8))
        karr, _ = c.layer_arrays(0)
        np.testing.assert_array_equal(karr[c.export([1])[0][0, 0], :, 0], k[0].numpy())
