"""fd_decode against the dense reference and a numpy formula; RoPE; checks."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd


def numpy_attention(q, k, v, lens, scale=None):
    b, hq, d = q.shape
    hkv = k.shape[1]
    scale = 1 / np.sqrt(d) if scale is None else scale
    out = np.zeros((b, hq, d), np.float64)
    for r in range(b):
        n = lens[r]
        for h in range(hq):
            if n == 0:
                continue
            kh = h // (hq // hkv)
            s = scale * (k[r, kh, :n].astype(np.float64) @ q[r, h].astype(np.float64))
            p = np.exp(s - s.max())
            out[r, h] = (p / p.sum()) @ v[r, kh, :n]
    return out


def paged_problem(rng, batch=3, hq=4, hkv=2, d=16, bs=4, lens=(5, 0, 9), dtype=np.float32):
    mbps = max(1, max((n + bs - 1) // bs for n in lens))
    nb = batch * mbps + 2
    perm = rng.permutation(nb)
    tables = np.full((batch, mbps), -1, np.int32)
    kc = rng.standard_normal((nb, hkv, bs, d)).astype(dtype)
    vc = rng.standard_normal((nb, hkv, bs, d)).astype(dtype)
    dense_k = np.zeros((batch, hkv, mbps * bs, d), dtype)
    dense_v = np.zeros_like(dense_k)
    i = 0
    for r, n in enumerate(lens):
        for j in range((n + bs - 1) // bs):
            tables[r, j] = perm[i]
            dense_k[r, :, j * bs:(j + 1) * bs] = kc[perm[i]]
            dense_v[r, :, j * bs:(j + 1) * bs] = vc[perm[i]]
            i += 1
    q = rng.standard_normal((batch, hq, d)).astype(dtype)
    return q, kc, vc, tables, np.array(lens, np.int32), dense_k, dense_v


def test_decode_matches_reference_and_numpy(rng):
    q, kc, vc, tables, lens, dk, dv = paged_problem(rng)
    out = fd.decode(q, kc, vc, tables, lens, cpu_threads=2)
    ref = fd.reference_attention_dense(q, dk, dv, lens)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, numpy_attention(q, dk, dv, lens), rtol=1e-4, atol=1e-5)
    assert not out[1].any()  # empty row -> zeros


def test_decode_dim_major_and_strided_views(rng):
    q, kc, vc, tables, lens, dk, dv = paged_problem(rng)
    expected = fd.decode(q, kc, vc, tables, lens)
    dim_major_k = np.ascontiguousarray(kc.transpose(0, 1, 3, 2))
    dim_major_v = np.ascontiguousarray(vc.transpose(0, 1, 3, 2))
    out = fd.decode(q, dim_major_k, dim_major_v, tables, lens, layout=fd.Layout.DIM_MAJOR)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    # vLLM NHD pages [blocks, block_size, heads, dim] viewed as (block, head, token, dim)
    nhd_k = np.ascontiguousarray(kc.transpose(0, 2, 1, 3))
    nhd_v = np.ascontiguousarray(vc.transpose(0, 2, 1, 3))
    out2 = fd.decode(q, nhd_k.transpose(0, 2, 1, 3), nhd_v.transpose(0, 2, 1, 3), tables, lens)
    np.testing.assert_allclose(out2, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-2), ("bf16", 5e-2)])
def test_decode_half_types(rng, dtype, tol):
    q, kc, vc, tables, lens, dk, dv = paged_problem(rng)
    ref = fd.reference_attention_dense(q, dk, dv, lens)
    if dtype == "bf16":
        conv = lambda x: (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
        back = lambda x: (x.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    else:
        conv = lambda x: x.astype(np.float16)  # noqa: E731
        back = lambda x: x.astype(np.float32)  # noqa: E731
    out = fd.decode(conv(q), conv(kc), conv(vc), tables, lens)
    assert out.dtype == (np.uint16 if dtype == "bf16" else np.float16)
    np.testing.assert_allclose(back(out), ref, rtol=tol, atol=tol)


def test_decode_argument_checks_before_the_call(rng):
    q, kc, vc, tables, lens, _, _ = paged_problem(rng)
    out = np.full(q.shape, 7.0, np.float32)
    cases = [
        dict(v_cache=vc.astype(np.float16)),  # K and V of different element types
        dict(q=q[:, :, ::2]),  # head_dim mismatch
        dict(block_tables=tables.astype(np.int64)),
        dict(seq_lens=lens[:2]),
        dict(q=np.asfortranarray(q)),  # not contiguous
    ]
    for override in cases:
        args = dict(q=q, k_cache=kc, v_cache=vc, block_tables=tables, seq_lens=lens)
        args.update(override)
        with pytest.raises(fd.FlashDecError) as e:
            fd.decode(out=out, **args)
        assert e.value.status == fd.Status.INVALID_ARGUMENT
    ro = out.copy()
    ro.flags.writeable = False
    with pytest.raises(fd.FlashDecError) as e:
        fd.decode(q, kc, vc, tables, lens, ro)
    assert "read-only" in e.value.message
    assert (out == 7.0).all()


def test_library_rejects_bad_indices_without_writing(rng):
    q, kc, vc, tables, lens, _, _ = paged_problem(rng)
    out = np.full(q.shape, 7.0, np.float32)
    bad = tables.copy()
    bad[0, 0] = kc.shape[0] + 5
    with pytest.raises(fd.FlashDecError) as e:
        fd.decode(q, kc, vc, bad, lens, out)
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "block" in e.value.message
    too_long = lens.copy()
    too_long[2] = 1000
    with pytest.raises(fd.FlashDecError):
        fd.decode(q, kc, vc, tables, too_long, out)
    assert (out == 7.0).all()


def test_split_kv_with_workspace(rng):
    q, kc, vc, tables, lens, dk, dv = paged_problem(rng, lens=(9, 3, 12))
    size = fd.decode_workspace_size(q, kc, vc, tables, lens, num_splits=3)
    assert size >= 0  # the CPU backend may need none
    ws = np.zeros(max(size, 1), np.uint8)
    out = fd.decode(q, kc, vc, tables, lens, num_splits=3, workspace=ws)
    np.testing.assert_allclose(out, fd.reference_attention_dense(q, dk, dv, lens), rtol=1e-5, atol=1e-6)
    if size > 1:
        with pytest.raises(fd.FlashDecError) as e:
            fd.decode(q, kc, vc, tables, lens, num_splits=3, workspace=ws[:1])
        assert "workspace" in e.value.message


def test_rope_apply_matches_formula(rng):
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    pos = [0, 1, 7]
    y = fd.rope_apply(x.copy(), pos, rotary_dim=4, rope_base=100.0)
    inv = 100.0 ** (-np.arange(2) * 2 / 4)
    for t, p in enumerate(pos):
        c, s = np.cos(p * inv), np.sin(p * inv)
        x1, x2 = x[t, :, :2], x[t, :, 2:4]
        np.testing.assert_allclose(y[t, :, :2], x1 * c - x2 * s, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(y[t, :, 2:4], x2 * c + x1 * s, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(y[t, :, 4:], x[t, :, 4:])
    before = x.copy()
    with pytest.raises(fd.FlashDecError) as e:
        fd.rope_apply(x, pos, rotary_dim=3)
    assert "rotary_dim" in e.value.message
    np.testing.assert_array_equal(x, before)


def _unaligned(shape, dtype):
    """A writable array whose data starts one byte past an aligned address."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    raw = bytearray(n * dtype.itemsize + 1)
    arr = np.frombuffer(raw, dtype=dtype, count=n, offset=1).reshape(shape)
    assert not arr.flags.aligned
    return arr


def test_misaligned_arrays_raise_before_the_call(rng, monkeypatch):
    """The library reads through typed pointers: misaligned buffers must be
    refused by the binding, without reaching C and without writing."""
    from flashdec import _lib

    def not_called(*_args):
        raise AssertionError("the C function must not be called")

    for name in ("fd_decode", "fd_rope_apply", "fd_rope_apply_style", "fd_reference_attention_dense", "fd_kv_append"):
        monkeypatch.setattr(_lib, name, not_called)
    q, kc, vc, tables, lens, _, _ = paged_problem(rng, dtype=np.float16)
    out = np.full(q.shape, 7.0, np.float16)
    bad_q = _unaligned(q.shape, np.float16)
    bad_q[...] = q
    bad_tables = _unaligned(tables.shape, np.int32)
    bad_tables[...] = tables
    for args in ((bad_q, kc, vc, tables, lens), (q, kc, vc, bad_tables, lens)):
        with pytest.raises(fd.FlashDecError) as e:
            fd.decode(*args, out=out)
        assert e.value.status == fd.Status.INVALID_ARGUMENT
        assert "not aligned" in e.value.message
    assert (out == 7.0).all()
    x = _unaligned((2, 1, 4), np.float32)
    x[...] = 1.0
    with pytest.raises(fd.FlashDecError) as e:
        fd.rope_apply(x, [0, 1], rotary_dim=4)
    assert e.value.message.startswith("x: data at") and "not aligned to its item size 4" in e.value.message
    assert (x == 1.0).all()
    k = np.zeros((1, 1, 2, 4), np.float16)
    with pytest.raises(fd.FlashDecError) as e:
        fd.reference_attention_dense(bad_q[:1, :1, :4].copy(), k, _unaligned(k.shape, np.float16), [1])
    assert "v: data at" in e.value.message
    kv = _unaligned((1, 2, 16), np.float16)
    with pytest.raises(fd.FlashDecError) as e:
        fd.kv_append(kv, kv, np.zeros((3, 2, 4, 16), np.float16), np.zeros((3, 2, 4, 16), np.float16), [0], [0])
    assert "k: data at" in e.value.message
