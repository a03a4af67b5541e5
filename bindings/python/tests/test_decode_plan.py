"""DecodePlan on the CPU: plan + run gives fd_decode's bits; a run that
differs from its plan is refused; mixed element types are served on the CPU. Multi-token queries (q_indptr): test_decode_multi_token.py."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import flashdec as fd
from flashdec import _lib

from test_decode import paged_problem


def to_bf16(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("host", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bf16"])
def test_plan_run_equals_decode_bit_for_bit(rng, host, dtype):
    conv = to_bf16 if dtype == "bf16" else (lambda x: x.astype(dtype))
    q, kc, vc, tables, lens, _, _ = paged_problem(rng, batch=4, lens=(9, 0, 300, 5))
    q, kc, vc = conv(q), conv(kc), conv(vc)
    opts = dict(num_splits=2, cpu_threads=2)
    with fd.DecodePlan(q, kc, vc, tables, lens, host_seq_lens=lens if host else None, **opts) as plan:
        assert plan.workspace_size >= 0
        for layer in range(2):  # one plan, several layers
            k_l, v_l = kc[::-1].copy() if layer else kc, vc[::-1].copy() if layer else vc
            want = fd.decode(q, k_l, v_l, tables, lens, **opts)
            got = plan.run(q, k_l, v_l, tables, lens)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
            out = np.full_like(want, 7)
            assert plan.run(q, k_l, v_l, tables, lens, out) is out
            np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))
    assert plan.closed
    plan.close()  # idempotent
    with pytest.raises(fd.FlashDecError) as e:
        plan.run(q, kc, vc, tables, lens)
    assert e.value.status == fd.Status.INVALID_STATE
    assert e.value.message == "decode plan is closed"
    with pytest.raises(fd.FlashDecError) as e:
        plan.workspace_size
    assert e.value.status == fd.Status.INVALID_STATE
    assert e.value.message == "decode plan is closed"


def test_plan_with_caller_workspace_and_threads(rng):
    q, kc, vc, tables, lens, dk, dv = paged_problem(rng, lens=(700, 3, 260))
    plan = fd.DecodePlan(q, kc, vc, tables, lens, host_seq_lens=list(lens), num_splits=4)
    want = fd.decode(q, kc, vc, tables, lens, num_splits=4)
    ws = np.zeros(max(plan.workspace_size, 1), np.uint8)
    outs = [None] * 4

    def run(i: int) -> None:
        outs[i] = plan.run(q, kc, vc, tables, lens, workspace=np.zeros_like(ws))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out in outs:
        np.testing.assert_array_equal(out, want)
    np.testing.assert_allclose(want, fd.reference_attention_dense(q, dk, dv, lens), rtol=1e-5, atol=1e-6)
    if plan.workspace_size > 1:
        with pytest.raises(fd.FlashDecError) as e:
            plan.run(q, kc, vc, tables, lens, workspace=ws[:1])
        assert "workspace" in e.value.message
    assert "workspace_size" in repr(plan)
    plan.close()
    assert repr(plan) == "DecodePlan(closed)"


def test_run_that_differs_from_its_plan_is_refused(rng):
    q, kc, vc, tables, lens, _, _ = paged_problem(rng)
    out = np.full(q.shape, 7.0, np.float32)
    with fd.DecodePlan(q, kc, vc, tables, lens, host_seq_lens=lens) as plan:
        with pytest.raises(fd.FlashDecError) as e:  # two rows instead of three
            plan.run(q[:2], kc, vc, tables[:2], lens[:2], out[:2])
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "batch" in e.value.message
        with pytest.raises(fd.FlashDecError) as e:  # two query heads instead of four
            plan.run(q[:, :2].copy(), kc, vc, tables, lens)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "num_q_heads" in e.value.message
    assert (out == 7.0).all()
    with pytest.raises(fd.FlashDecError) as e:
        fd.DecodePlan(q, kc, vc, tables, lens, host_seq_lens=lens[:2])
    assert "host_seq_lens" in e.value.message


def raw_params(q, kc, vc, tables, lens, out) -> "_lib.fd_decode_params":
    p = _lib.fd_decode_params()
    _lib.fd_decode_params_init(ctypes.byref(p))
    p.batch, p.num_q_heads, p.head_dim = q.shape
    p.num_kv_heads, p.block_size, p.num_blocks = kc.shape[1], kc.shape[2], kc.shape[0]
    p.q_dtype = p.kv_dtype = p.out_dtype = fd.DType.F32
    p.max_blocks_per_seq = tables.shape[1]
    p.q, p.k_cache, p.v_cache = q.ctypes.data, kc.ctypes.data, vc.ctypes.data
    p.block_tables, p.seq_lens, p.out = tables.ctypes.data, lens.ctypes.data, out.ctypes.data
    return p


def test_raw_run_with_another_head_dim_is_refused(rng):
    q, kc, vc, tables, lens, _, _ = paged_problem(rng)
    out = np.full(q.shape, 7.0, np.float32)
    p = raw_params(q, kc, vc, tables, lens, out)
    plan = ctypes.c_void_p()
    fd.check(_lib.fd_decode_plan_create(ctypes.byref(p), None, ctypes.byref(plan)))
    try:
        fd.check(_lib.fd_decode_run(plan, ctypes.byref(p)))
        out[...] = 7.0
        p.head_dim //= 2
        with pytest.raises(fd.FlashDecError) as e:
            fd.check(_lib.fd_decode_run(plan, ctypes.byref(p)))
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "head_dim" in e.value.message
        assert (out == 7.0).all()
    finally:
        _lib.fd_decode_plan_destroy(plan)


def test_mixed_element_types_on_the_cpu(rng):
    """The CPU backend serves q and out each f32/f16/bf16 over any K/V type
    (0.2, issue 15): the same attention as f32 over the same values."""
    q, kc, vc, tables, lens, _, _ = paged_problem(rng)
    q16, k16, v16 = to_bf16(q), kc.astype(np.float16), vc.astype(np.float16)  # q bf16, K/V f16
    q32 = (q16.astype(np.uint32) << 16).view(np.float32)
    want = fd.decode(q32, k16.astype(np.float32), v16.astype(np.float32), tables, lens)
    for call in (fd.decode, lambda *a: fd.DecodePlan(*a).run(*a)):
        got = call(q16, k16, v16, tables, lens, np.full(q.shape, 7, np.float32))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert fd.decode(q16, k16, v16, tables, lens).dtype == np.uint16  # out defaults to q's type
    with pytest.raises(fd.FlashDecError) as e:  # one K/V element type: the binding's check
        fd.decode(q, kc, v16, tables, lens)
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "v_cache" in e.value.message
