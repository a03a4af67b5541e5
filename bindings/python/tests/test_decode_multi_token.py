"""Multi-token queries (q_indptr) on the CPU: causal attention against a
float64 reference computed here; one-token rows through q_indptr give the
bits of q_indptr None; the binding's shape checks name the argument; bad
offsets are the library's INVALID_ARGUMENT; CUDA refuses q_indptr."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import flashdec as fd
from flashdec import _lib

from conftest import commit_token, small_config
from test_decode import paged_problem
from test_decode_plan import raw_params


def causal_reference(q, dense_k, dense_v, lens, indptr):
    """out[t, h] for query token t of row r (q_len n, seq_len L): softmax over
    K/V positions 0 .. L - n + j, j = t - indptr[r], in float64."""
    tokens, hq, d = q.shape
    hkv = dense_k.shape[1]
    out = np.zeros((tokens, hq, d), np.float64)
    for r in range(len(lens)):
        n, length = indptr[r + 1] - indptr[r], lens[r]
        for j in range(n):
            t, visible = indptr[r] + j, length - n + j + 1
            for h in range(hq):
                kh = h // (hq // hkv)
                k = dense_k[r, kh, :visible].astype(np.float64)
                v = dense_v[r, kh, :visible].astype(np.float64)
                s = (k @ q[t, h].astype(np.float64)) / np.sqrt(d)
                p = np.exp(s - s.max())
                out[t, h] = (p / p.sum()) @ v
    return out


def multi_token_problem(rng, lens=(5, 3), q_lens=(2, 3), d=16, bs=4):
    """Rows of ``lens`` K/V tokens whose last ``q_lens`` tokens are queries
    (4 query heads, 2 KV heads)."""
    _, kc, vc, tables, lens_arr, dk, dv = paged_problem(rng, batch=len(lens), d=d, bs=bs, lens=lens)
    indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = rng.standard_normal((int(indptr[-1]), 4, d)).astype(np.float32)
    return q, kc, vc, tables, lens_arr, indptr, dk, dv


def test_multi_token_matches_causal_reference(rng):
    q, kc, vc, tables, lens, indptr, dk, dv = multi_token_problem(rng)
    want = causal_reference(q, dk, dv, lens, indptr)
    out = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr)
    assert out.shape == q.shape == (5, 4, 16) and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    # Queries differ from a one-token call: the last row's first query sees one token.
    np.testing.assert_allclose(out[2], dv[1, np.arange(4) // 2, 0], rtol=1e-6, atol=1e-6)
    # Same bits for any thread count, a list of offsets, a hint, a given out,
    # and through a plan (several layers of one step).
    for kw in (dict(cpu_threads=3), dict(max_q_len_hint=3), dict(num_splits=2)):
        got = fd.decode(q, kc, vc, tables, lens, q_indptr=list(indptr), **kw)
        np.testing.assert_array_equal(got, out)
    given = np.full_like(out, 7.0)
    assert fd.decode(q, kc, vc, tables, lens, given, q_indptr=indptr) is given
    np.testing.assert_array_equal(given, out)
    assert fd.decode_workspace_size(q, kc, vc, tables, lens, q_indptr=indptr, max_q_len_hint=3) >= 0
    with fd.DecodePlan(q, kc, vc, tables, lens, host_seq_lens=lens, q_indptr=indptr, max_q_len_hint=3) as plan:
        for _ in range(2):
            np.testing.assert_array_equal(plan.run(q, kc, vc, tables, lens), out)


@pytest.mark.parametrize("dtype", [np.float16, "bf16"])
def test_multi_token_half_types(rng, dtype):
    q, kc, vc, tables, lens, indptr, dk, dv = multi_token_problem(rng, lens=(9, 6, 4), q_lens=(9, 1, 4))
    if dtype == "bf16":
        conv = lambda x: (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
        back = lambda x: (x.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    else:
        conv = lambda x: x.astype(np.float16)  # noqa: E731
        back = lambda x: x.astype(np.float32)  # noqa: E731
    q, kc, vc, dk, dv = conv(q), conv(kc), conv(vc), back(conv(dk)), back(conv(dv))
    out = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr)
    np.testing.assert_allclose(back(out), causal_reference(back(q), dk, dv, lens, indptr), rtol=2e-2, atol=2e-2)


def test_one_token_rows_through_q_indptr_equal_plain_decode(rng):
    q, kc, vc, tables, lens, _, _ = paged_problem(rng, lens=(5, 1, 9))
    want = fd.decode(q, kc, vc, tables, lens)
    indptr = np.arange(len(lens) + 1, dtype=np.int32)
    got = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr, max_q_len_hint=1)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    with fd.DecodePlan(q, kc, vc, tables, lens, q_indptr=indptr) as plan:
        np.testing.assert_array_equal(plan.run(q, kc, vc, tables, lens).view(np.uint32), want.view(np.uint32))


def test_binding_checks_name_the_argument(monkeypatch, rng):
    q, kc, vc, tables, lens, indptr, _, _ = multi_token_problem(rng)
    out = np.full(q.shape, 7.0, np.float32)

    def not_called(*_args):
        raise AssertionError("the C function must not be called")

    for name in ("fd_decode", "fd_decode_plan_create", "fd_decode_workspace_size"):
        monkeypatch.setattr(_lib, name, not_called)
    cases = [
        (dict(q_indptr=indptr[:2]), "q_indptr: expected shape [3]"),  # not batch + 1 entries
        (dict(q_indptr=[0, 2, 5, 6]), "q_indptr: expected shape [3]"),
        (dict(q_indptr=indptr.astype(np.int64)), "q_indptr: element type must be int32"),
        (dict(q_indptr=[[0, 2, 5]]), "q_indptr: expected a 1-D sequence"),
        (dict(q_indptr=np.array([0, 2, 4], np.int32)), "q: expected shape [4, num_q_heads, head_dim]"),
        (dict(q=q[:4]), "q: expected shape [5, num_q_heads, head_dim]"),
        (dict(out=out[:4]), "out: expected shape [5, 4, 16]"),
        (dict(q=q[0]), "q: expected shape [q_indptr[-1], num_q_heads, head_dim]"),
        (dict(block_tables=tables[:1]), "block_tables: expected shape [2, *]"),
        (dict(seq_lens=lens[:, None]), "seq_lens: expected shape [*]"),
    ]
    for override, message in cases:
        args = dict(q=q, k_cache=kc, v_cache=vc, block_tables=tables, seq_lens=lens, out=out, q_indptr=indptr)
        args.update(override)
        for call in (fd.decode, fd.DecodePlan, fd.decode_workspace_size):
            with pytest.raises(fd.FlashDecError) as e:
                call(**args)
            assert e.value.status == fd.Status.INVALID_ARGUMENT, (override, e.value)
            assert message in e.value.message, (override, e.value.message)
    assert (out == 7.0).all()


def test_bad_offsets_are_the_library_invalid_argument(rng):
    q, kc, vc, tables, lens, indptr, _, _ = multi_token_problem(rng)
    out = np.full(q.shape, 7.0, np.float32)
    # Row 1 has 3 K/V tokens: 4 query tokens cannot all be among them.
    q6, out6 = np.concatenate([q, q[:1]]), np.full((6, 4, 16), 7.0, np.float32)
    cases = [
        (q6, out6, [0, 2, 6], {}, "row 1 has 4 query tokens but seq_lens[1] = 3"),
        (q, out, [1, 2, 5], {}, "q_indptr[0] must be 0"),
        (q, out, [0, 0, 5], {}, "q_indptr must increase"),
        (q, out, indptr, dict(max_q_len_hint=2), "row 1 has 3 query tokens, more than max_q_len_hint = 2"),
    ]
    for q_, out_, offsets, kw, message in cases:
        with pytest.raises(fd.FlashDecError) as e:
            fd.decode(q_, kc, vc, tables, lens, out_, q_indptr=np.array(offsets, np.int32), **kw)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and message in e.value.message, e.value.message
        with fd.DecodePlan(q_, kc, vc, tables, lens, q_indptr=np.array(offsets, np.int32), **kw) as plan:
            with pytest.raises(fd.FlashDecError) as e:
                plan.run(q_, kc, vc, tables, lens, out_)
            assert e.value.status == fd.Status.INVALID_ARGUMENT and message in e.value.message, e.value.message
    assert (out == 7.0).all() and (out6 == 7.0).all()


def test_cuda_device_needs_max_q_len_hint(rng):
    """On CUDA the host cannot read the device's q_indptr: it plans from
    max_q_len_hint, which q_indptr requires there (refused before the device
    is looked at, so this runs without a GPU)."""
    q, kc, vc, tables, lens, indptr, _, _ = multi_token_problem(rng)
    out = np.full(q.shape, 7.0, np.float32)
    p = raw_params(q, kc, vc, tables, lens, out)
    p.batch = len(lens)
    p.q_indptr = indptr.ctypes.data
    fd.check(_lib.fd_decode(ctypes.byref(p)))  # the CPU needs no hint
    out[...] = 7.0
    p.device.type = fd.DeviceType.CUDA
    plan = ctypes.c_void_p()
    for run in (lambda: _lib.fd_decode(ctypes.byref(p)),
                lambda: _lib.fd_decode_plan_create(ctypes.byref(p), None, ctypes.byref(plan))):  # fmt: skip
        with pytest.raises(fd.FlashDecError) as e:
            fd.check(run())
        assert e.value.status == fd.Status.INVALID_ARGUMENT, e.value.message
        assert "max_q_len_hint must be > 0 with q_indptr on CUDA" in e.value.message
    assert (out == 7.0).all() and not plan.value


def test_multi_token_with_cpu_tensors(rng):
    torch = pytest.importorskip("torch")
    q, kc, vc, tables, lens, indptr, _, _ = multi_token_problem(rng)
    want = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr)
    t = torch.from_numpy
    got = fd.decode(t(q), t(kc), t(vc), t(tables), t(lens), q_indptr=t(indptr))
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == q.shape
    np.testing.assert_array_equal(got.numpy(), want)


def test_cache_decode_passes_q_indptr(rng):
    """Cache.decode on a CPU cache: q_indptr goes to decode, and the rows'
    committed tokens are the keys (the queries being their last tokens)."""
    with fd.Cache(small_config()) as cache:
        for rid in (1, 2):
            cache.add_request(rid)
        for step in range(5):
            commit_token(cache, [1, 2] if step < 3 else [1], rng)
        tables, lens = cache.export([1, 2])
        assert list(lens) == [5, 3]
        k, _ = cache.layer_arrays(1)
        hkv, bs, d = k.shape[1], k.shape[2], k.shape[3]
        indptr = np.array([0, 2, 5], np.int32)
        q = rng.standard_normal((5, 4, d)).astype(np.float32)
        out = cache.decode(1, q, [1, 2], q_indptr=indptr)
        dense = [np.zeros((2, hkv, 8, d), np.float32) for _ in range(2)]
        for arr, dst in zip(cache.layer_arrays(1), dense):
            for r in range(2):
                for t in range(lens[r]):
                    dst[r, :, t] = arr[tables[r, t // bs], :, t % bs]
        np.testing.assert_allclose(out, causal_reference(q, dense[0], dense[1], lens, indptr), rtol=1e-5, atol=1e-6)


def _cuda_problem(rng, torch, dtype):
    """f16 (or bf16) host arrays and their CUDA tensors (head_dim 64 and block_size 8, which CUDA serves)."""
    q, kc, vc, tables, lens, indptr, _, _ = multi_token_problem(rng, lens=(19, 6, 4), q_lens=(3, 1, 2), d=64, bs=8)
    host = [x.astype(np.float16) for x in (q, kc, vc)] + [tables, lens, indptr]
    dev = [torch.from_numpy(x).cuda() for x in host]
    if dtype == "bf16":
        dev[:3] = [x.bfloat16() for x in dev[:3]]
        host[:3] = [(x.float().cpu().numpy().view(np.uint32) >> 16).astype(np.uint16) for x in dev[:3]]
    return host, dev


def test_cuda_tensor_checks_of_the_binding(rng):
    """torch CUDA tensors: q_indptr lives on q's device (a host one is the
    binding's refusal); with check_indices the binding reads q_indptr[-1] on
    the call's stream and checks q against it."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    _, (q, kc, vc, tables, lens, indptr) = _cuda_problem(rng, torch, np.float16)
    out = torch.full(tuple(q.shape), 7.0, dtype=q.dtype, device=q.device)
    cases = [
        (q, dict(q_indptr=indptr.cpu()), "q_indptr: lives on cpu, expected cuda:"),
        (q, dict(q_indptr=[0, 3, 4, 6]), "q_indptr: lives on cpu, expected cuda:"),
        (q[:5], dict(q_indptr=indptr, check_indices=True), "q: expected shape [6, num_q_heads, head_dim]"),
    ]
    for q_, kw, message in cases:
        with pytest.raises(fd.FlashDecError) as e:
            fd.decode(q_, kc, vc, tables, lens, out[: q_.shape[0]], max_q_len_hint=3, **kw)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and message in e.value.message, e.value.message
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("dtype", [np.float16, "bf16"])
def test_multi_token_on_cuda_equals_cpu(rng, dtype):
    """CUDA multi-token decode (q_indptr a device tensor, max_q_len_hint
    required) against the CPU backend, directly, checked, and through a plan
    made before q_indptr's entries are known."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or fd.cuda_device_count() == 0:
        pytest.skip("needs torch with CUDA and libflashdec built with CUDA")
    host, dev = _cuda_problem(rng, torch, dtype)
    want = fd.decode(*host[:5], q_indptr=host[5])
    back = (lambda x: (x.astype(np.uint32) << 16).view(np.float32)) if dtype == "bf16" else (lambda x: x.astype(np.float32))
    q, kc, vc, tables, lens, indptr = dev
    for kw in (dict(), dict(check_indices=True)):
        got = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr, max_q_len_hint=3, **kw)
        torch.cuda.synchronize()
        np.testing.assert_allclose(got.float().cpu().numpy(), back(want), rtol=2e-2, atol=2e-2)
    with pytest.raises(fd.FlashDecError) as e:
        fd.decode(q, kc, vc, tables, lens, q_indptr=indptr)
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "max_q_len_hint" in e.value.message
    # Planning on CUDA reads no q_indptr entry: a tensor filled later, or
    # another one per run.
    later = torch.zeros_like(indptr)
    with fd.DecodePlan(q, kc, vc, tables, lens, host_seq_lens=host[4], q_indptr=later, max_q_len_hint=3) as plan:
        later.copy_(indptr)
        for kw in (dict(), dict(q_indptr=indptr)):
            got = plan.run(q, kc, vc, tables, lens, **kw)
            torch.cuda.synchronize()
            np.testing.assert_allclose(got.float().cpu().numpy(), back(want), rtol=2e-2, atol=2e-2)


# -- fd_reference_attention: the dense reference with q_indptr and variants


def test_reference_attention_matches_paged_decode(rng):
    q, kc, vc, tables, lens, indptr, dk, dv = multi_token_problem(rng, lens=(9, 3, 6), q_lens=(4, 3, 1))
    paged = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr)
    ref = fd.reference_attention(q, dk, dv, lens, q_indptr=indptr)
    assert ref.shape == q.shape and ref.dtype == np.float32
    np.testing.assert_allclose(ref, paged, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ref, causal_reference(q, dk, dv, lens, indptr), rtol=1e-5, atol=1e-6)
    # One token per row, no variant: the bits of fd_reference_attention_dense.
    q1 = q[:3].copy()
    dense = fd.reference_attention_dense(q1, dk, dv, lens)
    np.testing.assert_array_equal(fd.reference_attention(q1, dk, dv, lens), dense)
    given = np.full_like(q, 7.0)
    assert fd.reference_attention(q, dk, dv, list(lens), given, q_indptr=list(indptr)) is given
    np.testing.assert_array_equal(given, ref)


def test_reference_attention_variants(rng):
    q, _, _, _, lens, indptr, dk, dv = multi_token_problem(rng, lens=(9, 5), q_lens=(3, 2))
    plain = fd.reference_attention(q, dk, dv, lens, q_indptr=indptr)
    # A window of 1: each query sees only its own position, so out = V there.
    out = fd.reference_attention(q, dk, dv, lens, q_indptr=indptr, sliding_window=1)
    positions = [(0, 6), (0, 7), (0, 8), (1, 3), (1, 4)]
    for t, (r, pos) in enumerate(positions):
        np.testing.assert_allclose(out[t], dv[r, np.arange(4) // 2, pos], rtol=1e-6, atol=1e-6)
    # A window covering every row and -inf sinks: the plain bits.
    np.testing.assert_array_equal(fd.reference_attention(q, dk, dv, lens, q_indptr=indptr, sliding_window=9), plain)
    no_sink = np.full(4, -np.inf, np.float32)
    np.testing.assert_array_equal(fd.reference_attention(q, dk, dv, lens, q_indptr=indptr, sinks=no_sink), plain)
    # Sinks join the denominator only; a soft-cap bounds the scores (float64 here).
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    got = fd.reference_attention(q, dk, dv, lens, q_indptr=indptr, sinks=sinks, logit_softcap=2.0)
    for t, (r, pos) in enumerate(positions):
        for h in range(4):
            k, v = dk[r, h // 2, : pos + 1].astype(np.float64), dv[r, h // 2, : pos + 1].astype(np.float64)
            s = 2.0 * np.tanh((k @ q[t, h].astype(np.float64)) / np.sqrt(16) / 2.0)
            e = np.exp(s)
            np.testing.assert_allclose(got[t, h], (e @ v) / (e.sum() + np.exp(sinks[h])), rtol=1e-5, atol=1e-6)


def test_reference_attention_errors(rng):
    q, _, _, _, lens, indptr, dk, dv = multi_token_problem(rng)
    cases = [
        (dict(sinks=np.array([0, np.nan, 0, 0], np.float32)), "sinks"),  # the library's
        (dict(sliding_window=-1), "sliding_window"),
        (dict(logit_softcap=-1.0), "logit_softcap"),
        (dict(q_indptr=[0, 1, 5]), "q_indptr"),  # row 1: 4 queries but 3 tokens
        (dict(q_indptr=None), "q: expected 2 rows"),  # the binding's: 5 tokens need q_indptr
        (dict(sinks=np.zeros(3, np.float32)), "sinks: expected shape [4]"),
    ]
    for kw, message in cases:
        args = dict(q_indptr=indptr)
        args.update(kw)
        with pytest.raises(fd.FlashDecError) as e:
            fd.reference_attention(q, dk, dv, lens, **args)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and message in e.value.message, (kw, e.value.message)


def test_multi_token_transaction_decode_matches_reference(rng):
    """A cache transaction of 3 and 2 new tokens: Cache.decode over it with
    the transaction's token offsets as q_indptr equals the reference over
    the same K/V laid out densely."""
    with fd.Cache(small_config()) as cache:
        for rid in (1, 2):
            cache.add_request(rid)
        for step in range(3):
            commit_token(cache, [1, 2] if step < 2 else [1], rng)
        needed, free = cache.blocks_needed([1, 2], token_counts=[3, 2])
        with cache.begin([1, 2], token_counts=[3, 2]) as tx:
            assert needed == tx.info().new_block_count
            assert free == cache.metrics().free_blocks + needed
            for layer in range(2):
                tx.write_layer(layer, *(rng.standard_normal((5, 2, 8)).astype(np.float32) for _ in range(2)))
            indptr = tx.token_indptr_async(np.empty(3, np.int32))
            assert indptr.tolist() == [0, 3, 5]
            q = rng.standard_normal((5, 4, 8)).astype(np.float32)
            out = cache.decode(1, q, tx=tx, q_indptr=indptr)
            lens = tx.rows().effective_seq_lens
            tables = tx.block_tables()
            dense = [np.zeros((2, 2, 8, 8), np.float32) for _ in range(2)]
            for arr, dst in zip(cache.layer_arrays(1), dense):
                for r in range(2):
                    for t in range(lens[r]):
                        dst[r, :, t] = arr[tables[r, t // 4], :, t % 4]
            assert lens.tolist() == [6, 4]
            ref = fd.reference_attention(q, dense[0], dense[1], lens, q_indptr=indptr)
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_blocks_needed_with_token_counts_refusals():
    """blocks_needed(token_counts=) refuses what begin(token_counts=) refuses
    and changes nothing."""
    with fd.Cache(small_config()) as cache:
        cache.add_request(1)
        before = cache.metrics()
        for counts, status, text in (
            ([1, 2], fd.Status.INVALID_ARGUMENT, "expected 1 entries"),
            ([0], fd.Status.INVALID_ARGUMENT, "token_counts[0] is 0"),
        ):
            with pytest.raises(fd.FlashDecError) as e:
                cache.blocks_needed([1], token_counts=counts)
            assert e.value.status == status and text in e.value.message
        with pytest.raises(fd.FlashDecError) as e:
            cache.blocks_needed([7], token_counts=[2])
        assert e.value.status == fd.Status.NOT_FOUND
        assert cache.metrics() == before
        assert cache.blocks_needed([1], token_counts=[9]) == (3, before.free_blocks)  # blocks of 4


def test_cache_decode_over_a_multi_token_transaction_on_cuda(rng):
    """Cache.decode(tx=...) with the transaction's token offsets on a CUDA
    cache (q_indptr a device tensor, max_q_len_hint) equals the same calls
    on a CPU cache holding the same float16 tokens."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or fd.cuda_device_count() == 0:
        pytest.skip("needs torch with CUDA and libflashdec built with CUDA")
    cfg = dict(num_layers=1, num_kv_heads=2, head_dim=64, block_size=16, max_blocks=8, dtype=fd.DType.F16)
    data = [rng.standard_normal((n, 2, 64)).astype(np.float16) for n in (2, 2, 5, 5)]
    q = rng.standard_normal((5, 8, 64)).astype(np.float16)
    outs = []
    for device in (fd.Device.cpu(), fd.Device.cuda(0)):
        put = (lambda x: x) if device.type == fd.DeviceType.CPU else (lambda x: torch.from_numpy(x).cuda())
        with fd.Cache(fd.CacheConfig(device=device, **cfg)) as cache:
            cache.add_request(1)
            cache.add_request(2)
            with cache.begin([1, 2]) as tx:
                tx.write_layer(0, put(data[0]), put(data[1]))
                tx.commit()
            with cache.begin([1, 2], token_counts=[3, 2]) as tx:
                tx.write_layer(0, put(data[2]), put(data[3]))
                if device.type == fd.DeviceType.CPU:
                    indptr = tx.token_indptr_async(np.empty(3, np.int32))
                    outs.append(cache.decode(0, q, tx=tx, q_indptr=indptr))
                else:
                    indptr = tx.token_indptr_async(torch.empty(3, dtype=torch.int32, device="cuda"))
                    out = cache.decode(0, put(q), tx=tx, q_indptr=indptr, max_q_len_hint=3)
                    torch.cuda.synchronize()
                    outs.append(out.cpu().numpy())
                tx.abort()
    np.testing.assert_allclose(outs[1].astype(np.float32), outs[0].astype(np.float32), rtol=2e-2, atol=2e-2)
