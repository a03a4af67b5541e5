"""Scheduler (always bound), engine and workloads (skipped until exported)."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd
from flashdec import _lib

from conftest import small_config

needs_engine = pytest.mark.skipif("fd_engine_create" in _lib.missing_symbols, reason="engine not in this build")
needs_workloads = pytest.mark.skipif("fd_workload_run" in _lib.missing_symbols, reason="workloads not in this build")


def test_scheduler_admits_fifo_and_reports():
    with fd.Scheduler(max_active_requests=2, max_batch_requests=2) as s:
        assert s.config.max_active_requests == 2
        snap = fd.Snapshot(block_size=4, max_blocks=8, free_blocks=8)
        for i in range(3):
            snap.add_waiting(fd.RequestSpec(id=10 + i, max_new_tokens=4, submission_order=i))
        with s.plan(snap) as d:
            assert d.admit == [10, 11]
            assert d.runnable == [10, 11] and d.waiting == [12]
            assert fd.ScheduleReason.ADMITTED in d.reasons
            assert fd.ScheduleReason.ACTIVE_LIMIT in d.reasons
            assert d.summary.committed_blocks_after == 2
            assert d.config == s.config
            with d.snapshot() as copy:
                assert copy.info.max_blocks == 8


def test_scheduler_rejects_oversized_and_bad_snapshots():
    with fd.Scheduler() as s:
        snap = fd.Snapshot(block_size=4, max_blocks=2, free_blocks=2)
        snap.add_waiting(fd.RequestSpec(id=1, max_new_tokens=100))
        assert s.plan(snap).rejected == [1]
        with pytest.raises(fd.FlashDecError) as e:
            snap.add_waiting(fd.RequestSpec(id=1, max_new_tokens=1, submission_order=5))
        assert e.value.status == fd.Status.ALREADY_EXISTS
    with pytest.raises(fd.FlashDecError) as e:
        fd.Snapshot(block_size=4, max_blocks=2, free_blocks=3)
    assert "free_blocks" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        fd.Scheduler(max_active_requests=0)
    assert "max_active_requests" in e.value.message


@needs_engine
def test_engine_unscheduled_step(rng):
    cache = fd.Cache(small_config())
    eng = fd.Engine(cache, num_q_heads=4, cpu_threads=1)
    eng.add_request(1)
    eng.admit(1)
    assert eng.request_state(1) == fd.EngineRequestState.ACTIVE
    with eng.begin_step([1]) as step:
        assert step.opened
        for layer in range(2):
            out = step.layer(layer, rng.standard_normal((1, 4, 8)).astype(np.float32),
                             rng.standard_normal((1, 2, 8)).astype(np.float32),
                             rng.standard_normal((1, 2, 8)).astype(np.float32))
            assert out.shape == (1, 4, 8)
        step.commit()
    assert eng.metrics().completed_step_count == 1
    eng.validate()
    cache.close()  # closes the engine first
    assert eng.closed


@needs_workloads
def test_workload_cases_and_run():
    cases = fd.workload_cases(fd.WorkloadKind.SCHEDULER)
    assert "boundary_deadlock" in cases
    runs = fd.run_workload(fd.WorkloadKind.SCHEDULER, "boundary_deadlock")
    assert len(runs) == 3
    completed = {fd.WorkloadPolicy(r.policy): r.requests_completed for r, _ in runs}
    assert completed[fd.WorkloadPolicy.LIFETIME] == 2


def _engines(n=2):
    """``n`` f32 CPU caches with an engine each (4 query heads), same config."""
    caches = [fd.Cache(small_config()) for _ in range(n)]
    return caches, [fd.Engine(c, num_q_heads=4, rotary_dim=8, cpu_threads=1) for c in caches]


def _stored(cache, request_id):
    """A request's committed K and V of every layer, [layers, seq_len, heads, dim]."""
    tables, lens = cache.export([request_id])
    bs = cache.config.block_size
    out = []
    for layer in range(cache.config.num_layers):
        k, v = cache.layer_arrays(layer)
        out.append([np.stack([x[tables[0, t // bs], :, t % bs] for t in range(lens[0])]) for x in (k, v)])
    return np.array(out)


@needs_engine
def test_engine_multi_token_step_equals_one_token_steps(rng):
    """Row 1 appends 3 tokens and row 2 two in one step; the other engine
    runs them as three one-token steps. Same attention outputs, same cache."""
    caches, (multi, single) = _engines()
    ctx = rng.standard_normal((2, 2, 2, 2, 8)).astype(np.float32)  # [k/v, 2 context tokens, layers, heads, dim]
    for e in (multi, single):
        for rid in (1, 2):
            e.add_request(rid)
            e.admit(rid)
        for j in range(2):
            e.prefill(1, ctx[0, j], ctx[1, j])
    # Per layer: q, k, v of the 5 tokens packed in row order (row 1's 3, row 2's 2).
    layer_inputs = [tuple(rng.standard_normal((5, h, 8)).astype(np.float32) for h in (4, 2, 2)) for _ in range(2)]
    with multi.begin_step([1, 2], token_counts=[3, 2]) as step:
        assert step.opened and (step.batch, step.token_count) == (2, 5)
        want = [step.layer(layer, *x) for layer, x in enumerate(layer_inputs)]
        step.commit()
    rows = {0: [0, 3], 1: [1, 4], 2: [2]}  # one-token step s: packed indices of its rows' tokens
    for s, idx in rows.items():
        ids = [1, 2][: len(idx)]
        with single.begin_step(ids) as step:
            assert step.token_count == len(ids)
            for layer, x in enumerate(layer_inputs):
                got = step.layer(layer, *(a[idx] for a in x))
                np.testing.assert_allclose(got, want[layer][idx], rtol=1e-5, atol=1e-6)
            step.commit()
    assert caches[0].export([1, 2])[1].tolist() == caches[1].export([1, 2])[1].tolist() == [5, 2]
    for rid in (1, 2):
        np.testing.assert_array_equal(_stored(caches[0], rid), _stored(caches[1], rid))
    assert multi.metrics().appended_token_count == single.metrics().appended_token_count == 5
    multi.validate()
    for c in caches:
        c.close()


@needs_engine
def test_engine_commit_step_keep_and_errors(rng):
    caches, (eng,) = _engines(1)
    cache = caches[0]
    for rid in (1, 2):
        eng.add_request(rid)
        eng.admit(rid)
    with pytest.raises(fd.FlashDecError) as e:
        eng.begin_step([1, 2], token_counts=[0, 2])
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "token_counts[0]" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        eng.begin_step([1, 2], token_counts=[1, 2, 3])  # the binding's check
    assert "token_counts: expected 2 entries" in e.value.message
    step = eng.begin_step([1, 2], token_counts=[5, 2])  # row 1: two blocks
    assert step.opened and step.needed_blocks == 3
    for layer in range(2):
        step.layer(layer, *(rng.standard_normal((7, h, 8)).astype(np.float32) for h in (4, 2, 2)))
    with pytest.raises(fd.FlashDecError) as e:
        step.layer(0, *(np.zeros((2, h, 8), np.float32) for h in (4, 2, 2)))  # 7 tokens, not 2 rows
    assert "q: expected shape [7, *, 8]" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        step.commit(keep_counts=[6, 1])
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "keep_counts[0]" in e.value.message
    assert eng.metrics().open_step_transaction_count == 1  # still open, unchanged
    step.commit(keep_counts=[3, 0])
    assert cache.export([1, 2])[1].tolist() == [3, 0]
    m = cache.metrics()
    assert m.used_blocks == 1 and m.transaction_rollback_block_count == 2
    assert eng.metrics().appended_token_count == 3
    with pytest.raises(fd.FlashDecError) as e:
        step.commit(keep_counts=[1, 1])
    assert e.value.status == fd.Status.INVALID_STATE
    eng.validate()
    cache.close()


@needs_engine
def test_engine_prefill_tokens_equals_token_by_token(rng):
    caches, (bulk, single) = _engines()
    k = rng.standard_normal((2, 6, 2, 8)).astype(np.float32)  # [layers, tokens, heads, dim]
    v = rng.standard_normal((2, 6, 2, 8)).astype(np.float32)
    for e in (bulk, single):
        e.add_request(1)
        e.admit(1)
        e.prefill(1, np.ascontiguousarray(k[:, 0]), np.ascontiguousarray(v[:, 0]))  # bulk starts at position 1
    bulk.prefill_tokens(1, np.ascontiguousarray(k[:, 1:]), np.ascontiguousarray(v[:, 1:]))
    for j in range(1, 6):
        single.prefill(1, np.ascontiguousarray(k[:, j]), np.ascontiguousarray(v[:, j]))
    assert caches[0].export([1])[1].tolist() == [6]
    np.testing.assert_array_equal(_stored(caches[0], 1), _stored(caches[1], 1))
    assert bulk.metrics().prefill_token_count == single.metrics().prefill_token_count == 6
    with pytest.raises(fd.FlashDecError) as e:
        bulk.prefill_tokens(9, k, v)
    assert e.value.status == fd.Status.NOT_FOUND
    with pytest.raises(fd.FlashDecError) as e:
        bulk.prefill_tokens(1, k[0], v[0])  # the binding's shape check
    assert "k: expected shape [2, *, 2, 8]" in e.value.message
    assert caches[0].export([1])[1].tolist() == [6]
    for c in caches:
        c.close()
