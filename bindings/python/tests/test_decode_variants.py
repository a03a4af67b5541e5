"""Attention variants of decode (S2.3: logit_softcap, sliding_window, sinks)
through decode, DecodePlan, decode_workspace_size and Cache.decode: equal to
reference_attention with the same variants; -inf sinks give the plain bits;
bad values are the library's INVALID_ARGUMENT naming the field, a wrong-length
sinks array the binding's. CUDA tensors: test_torch_cuda_variants.py."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

from conftest import commit_token, small_config
from test_decode_multi_token import multi_token_problem

SINKS = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
VARIANTS = [
    dict(logit_softcap=2.0),
    dict(sliding_window=1),
    dict(sliding_window=5),
    dict(sliding_window=8),
    dict(sinks=SINKS),
    dict(logit_softcap=3.0, sliding_window=6, sinks=SINKS),
]


def problem(rng):
    """Rows of 37, 20 and 9 tokens with 4, 1 and 3 query tokens (blocks of 4:
    windows start mid-block and several splits per row)."""
    return multi_token_problem(rng, lens=(37, 20, 9), q_lens=(4, 1, 3))


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(sorted(kw)) + str(kw.get("sliding_window", "")))
def test_decode_variants_match_reference(rng, kw):
    q, kc, vc, tables, lens, indptr, dk, dv = problem(rng)
    want = fd.reference_attention(q, dk, dv, lens, q_indptr=indptr, **kw)
    for extra in (dict(), dict(num_splits=3, cpu_threads=2)):
        got = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr, **kw, **extra)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # One query token per row (no q_indptr).
    q1 = q[indptr[1:] - 1].copy()
    want1 = fd.reference_attention(q1, dk, dv, lens, **kw)
    np.testing.assert_allclose(fd.decode(q1, kc, vc, tables, lens, **kw), want1, rtol=1e-5, atol=1e-5)
    # A plan made with the variants; its runs equal decode's bits.
    size = fd.decode_workspace_size(q, kc, vc, tables, lens, q_indptr=indptr, **kw)
    assert size >= 0
    out = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr, **kw)
    with fd.DecodePlan(q, kc, vc, tables, lens, host_seq_lens=lens, q_indptr=indptr, **kw) as plan:
        np.testing.assert_allclose(plan.run(q, kc, vc, tables, lens), want, rtol=1e-5, atol=1e-5)


def test_plan_runs_take_their_own_variants(rng):
    """The library takes the variants from each run (layers alternate
    windows): a plan made with a window runs plain and other-variant layers
    exactly."""
    q, kc, vc, tables, lens, indptr, dk, dv = problem(rng)
    with fd.DecodePlan(q, kc, vc, tables, lens, host_seq_lens=lens, q_indptr=indptr, sliding_window=4) as plan:
        np.testing.assert_allclose(
            plan.run(q, kc, vc, tables, lens),
            fd.reference_attention(q, dk, dv, lens, q_indptr=indptr, sliding_window=4), rtol=1e-5, atol=1e-5,
        )  # fmt: skip
        for kw in (dict(sliding_window=0), dict(sliding_window=16, logit_softcap=5.0), dict(sinks=SINKS)):
            want = fd.reference_attention(q, dk, dv, lens, q_indptr=indptr, **dict(dict(sliding_window=4), **kw))
            np.testing.assert_allclose(plan.run(q, kc, vc, tables, lens, **kw), want, rtol=1e-5, atol=1e-5)


def test_bf16_variants_match_reference(rng):
    q, kc, vc, tables, lens, indptr, dk, dv = problem(rng)
    conv = lambda x: (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
    back = lambda x: (x.astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    kw = dict(logit_softcap=3.0, sliding_window=6, sinks=SINKS)
    got = fd.decode(conv(q), conv(kc), conv(vc), tables, lens, q_indptr=indptr, **kw)
    want = fd.reference_attention(back(conv(q)), back(conv(dk)), back(conv(dv)), lens, q_indptr=indptr, **kw)
    err = np.linalg.norm(back(got) - want, axis=-1) / np.maximum(np.linalg.norm(want, axis=-1), 1e-30)
    assert err.max() <= 5e-3, err.max()


def test_minus_inf_sinks_and_long_window_give_the_plain_bits(rng):
    q, kc, vc, tables, lens, indptr, _, _ = problem(rng)
    plain = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr)
    for kw in (dict(sinks=np.full(4, -np.inf, np.float32)), dict(sliding_window=37), dict(sliding_window=1000)):
        got = fd.decode(q, kc, vc, tables, lens, q_indptr=indptr, **kw)
        np.testing.assert_array_equal(got.view(np.uint32), plain.view(np.uint32))
    with fd.DecodePlan(q, kc, vc, tables, lens, q_indptr=indptr) as plan:
        got = plan.run(q, kc, vc, tables, lens, sinks=np.full(4, -np.inf, np.float32))
        np.testing.assert_array_equal(got.view(np.uint32), plain.view(np.uint32))


def test_bad_variants_are_refused(rng):
    q, kc, vc, tables, lens, indptr, _, _ = problem(rng)
    cases = [
        (dict(sinks=np.array([0, 0, np.nan, 0], np.float32)), "sinks[2]"),  # the library's
        (dict(sliding_window=-1), "sliding_window"),
        (dict(logit_softcap=-1.0), "logit_softcap"),
        (dict(logit_softcap=float("inf")), "logit_softcap"),
        (dict(sinks=np.zeros(3, np.float32)), "sinks: expected shape [4]"),  # the binding's
        (dict(sinks=np.zeros((4, 1), np.float32)), "sinks"),
    ]
    for kw, message in cases:
        out = np.full(q.shape, 7.0, np.float32)
        with pytest.raises(fd.FlashDecError) as e:
            fd.decode(q, kc, vc, tables, lens, out, q_indptr=indptr, **kw)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and message in e.value.message, (kw, e.value.message)
        assert (out == 7.0).all(), kw  # nothing written
        with pytest.raises(fd.FlashDecError) as e:
            with fd.DecodePlan(q, kc, vc, tables, lens, q_indptr=indptr) as plan:
                plan.run(q, kc, vc, tables, lens, **kw)
        assert message in e.value.message, (kw, e.value.message)
    with pytest.raises(fd.FlashDecError) as e:
        fd.decode_workspace_size(q, kc, vc, tables, lens, q_indptr=indptr, sinks=np.zeros(5, np.float32))
    assert "sinks: expected shape [4]" in e.value.message


def test_cache_decode_with_variants(rng):
    with fd.Cache(small_config()) as cache:
        for rid in (1, 2):
            cache.add_request(rid)
        for step in range(7):
            commit_token(cache, [1, 2] if step < 4 else [1], rng)
        k, v = cache.layer_arrays(1)
        tables, lens = cache.export([1, 2])
        q = rng.standard_normal((2, 4, 8)).astype(np.float32)
        sinks = np.array([1.0, -0.5, 0.0, 3.0], np.float32)
        kw = dict(logit_softcap=4.0, sliding_window=3, sinks=sinks)
        want = fd.decode(q, k, v, tables, lens, **kw)
        got = cache.decode(1, q, [1, 2], **kw)
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(got, cache.decode(1, q, [1, 2]))
