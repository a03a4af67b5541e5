"""Transactions: rows, layer order, commit/abort, misuse, RoPE form."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

from conftest import tokens


def test_rows_info_and_block_tables(cache, rng):
    cache.add_request(1)
    cache.add_request(2)
    tx = cache.begin([2, 1])
    assert tx.id == 1
    rows = tx.rows()
    assert rows.request_ids.tolist() == [2, 1]
    assert rows.positions.tolist() == [0, 0] and rows.offsets.tolist() == [0, 0]
    assert rows.effective_seq_lens.tolist() == [1, 1]
    assert sorted(rows.block_ids.tolist()) == [0, 1]
    info = tx.info()
    assert (info.batch, info.next_layer, info.state, info.new_block_count) == (2, 0, fd.TxState.OPEN, 2)
    assert tx.block_tables()[:, 0].tolist() == rows.block_ids.tolist()
    tx.abort()


def test_wrong_layer_names_both_and_changes_nothing(cache, rng):
    cache.add_request(1)
    tx = cache.begin([1])
    with pytest.raises(fd.FlashDecError) as e:
        tx.write_layer(1, tokens(rng, 1), tokens(rng, 1))
    assert e.value.status == fd.Status.INVALID_ARGUMENT
    assert "layer 0" in e.value.message and "layer 1" in e.value.message
    assert tx.info().next_layer == 0
    assert cache.metrics().transaction_failure_count == 1
    tx.abort()


def test_commit_needs_every_layer_and_stays_open(cache, rng):
    cache.add_request(1)
    tx = cache.begin([1])
    tx.write_layer(0, tokens(rng, 1), tokens(rng, 1))
    with pytest.raises(fd.FlashDecError) as e:
        tx.commit()
    assert e.value.status == fd.Status.INVALID_STATE
    assert tx.info().next_layer == 1
    tx.write_layer(1, tokens(rng, 1), tokens(rng, 1))
    tx.commit()
    assert cache.export([1])[1].tolist() == [1]
    with pytest.raises(fd.FlashDecError) as e:
        tx.commit()
    assert e.value.status == fd.Status.INVALID_STATE and "committed" in e.value.message


def test_context_manager_aborts_and_restores(cache, rng):
    cache.add_request(1)
    version = cache.state_version
    with pytest.raises(RuntimeError):
        with cache.begin([1]) as tx:
            tx.write_layer(0, tokens(rng, 1), tokens(rng, 1))
            raise RuntimeError("boom")
    m = cache.metrics()
    assert m.open_transaction_count == 0 and m.transaction_abort_count == 1 and m.used_blocks == 0
    assert cache.export([1])[1].tolist() == [0]
    assert cache.state_version >= version
    with pytest.raises(fd.FlashDecError) as e:
        tx.abort()
    assert "aborted" in e.value.message


def test_lifecycle_refused_while_open(cache, rng):
    cache.add_request(1)
    with cache.begin([1]):
        with pytest.raises(fd.FlashDecError) as e:
            cache.add_request(2)
        assert e.value.status == fd.Status.INVALID_STATE
        with pytest.raises(fd.FlashDecError) as e:
            cache.begin([1])
        assert e.value.status == fd.Status.INVALID_STATE
    assert cache.request_state(2) == fd.RequestState.UNKNOWN


def test_write_layer_rope_matches_rope_apply(cache, rng):
    cache.add_request(1)
    for _ in range(3):
        with cache.begin([1]) as tx:
            for layer in range(2):
                tx.write_layer(layer, tokens(rng, 1), tokens(rng, 1))
            tx.commit()
    q = tokens(rng, 1, heads=4)
    with cache.begin([1]) as tx:
        q_out = tx.write_layer_rope(0, q, tokens(rng, 1), tokens(rng, 1), rotary_dim=8, rope_base=10000.0)
        expected = fd.rope_apply(q.copy(), [3], rotary_dim=8)
        np.testing.assert_allclose(q_out, expected, rtol=1e-6, atol=1e-6)
        assert not np.array_equal(q_out, q)
        same = q.copy()
        tx.write_layer_rope(1, same, tokens(rng, 1), tokens(rng, 1), 8, 10000.0, q_out=same)  # in place
        np.testing.assert_allclose(same, expected, rtol=1e-6, atol=1e-6)
        tx.commit()
