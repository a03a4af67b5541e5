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
