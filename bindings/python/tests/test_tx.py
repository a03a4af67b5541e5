"""Transactions: rows, layer order, commit/abort, misuse, RoPE form."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

from conftest import commit_token, small_config, tokens


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


# -- several tokens per row (fd_tx_begin_multi, S5), keep (S5.2), truncate (S5.3)


def write_all_layers(cache, tx, rng, n):
    """Writes every layer of ``tx`` (``n`` packed tokens); returns the K written per layer."""
    ks = []
    for layer in range(cache.config.num_layers):
        k = tokens(rng, n)
        tx.write_layer(layer, k, tokens(rng, n))
        ks.append(k)
    return ks


def test_begin_multi_positions_blocks_and_token_indptr(cache, rng):
    cache.add_request(1)
    cache.add_request(2)
    commit_token(cache, [1], rng)  # request 1 holds one token: block 0, offset 0
    with cache.begin([1, 2], token_counts=[4, 2]) as tx:
        info = tx.info()
        assert (info.batch, info.token_count, info.new_block_count, info.max_blocks_per_seq) == (2, 6, 2, 2)
        rows = tx.rows()
        assert rows.positions.tolist() == [1, 0] and rows.effective_seq_lens.tolist() == [5, 2]
        toks = tx.tokens()
        assert toks.positions.tolist() == [1, 2, 3, 4, 0, 1]
        assert toks.offsets.tolist() == [1, 2, 3, 0, 0, 1]
        tables = tx.block_tables()
        row_of = [0, 0, 0, 0, 1, 1]
        assert toks.block_ids.tolist() == [tables[r, p // 4] for r, p in zip(row_of, toks.positions)]
        assert toks.block_ids[0] == rows.block_ids[0] and toks.block_ids[4] == rows.block_ids[1]
        assert len({tables[0, 0], tables[0, 1], tables[1, 0]}) == 3  # two new blocks, one old
        indptr = np.full(3, -7, np.int32)
        assert tx.token_indptr_async(indptr) is indptr
        assert indptr.tolist() == [0, 4, 6]
        # The layer writes take the 6 packed tokens, not one per row.
        with pytest.raises(fd.FlashDecError) as e:
            tx.write_layer(0, tokens(rng, 2), tokens(rng, 2))
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "k: expected shape [6, 2, 8]" in e.value.message
        write_all_layers(cache, tx, rng, 6)
        tx.commit()
    assert cache.export([1, 2])[1].tolist() == [5, 2]
    cache.validate()


def test_begin_multi_and_token_views_refuse_bad_arguments(cache, rng):
    cache.add_request(1)
    cache.add_request(2)
    with pytest.raises(fd.FlashDecError) as e:
        cache.begin([1, 2], token_counts=[3, 0])
    assert e.value.status == fd.Status.INVALID_ARGUMENT
    assert "token_counts[1] is 0: each row appends at least one token" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        cache.begin([1, 2], token_counts=[3])  # the binding's check, before C
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "token_counts: expected 2 entries" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        cache.begin([1, 2], token_counts=[30, 3])  # 8 blocks of 4 tokens
    assert e.value.status == fd.Status.OUT_OF_BLOCKS
    m = cache.metrics()
    assert m.capacity_failure_count == 1 and m.open_transaction_count == 0 and m.free_blocks == 8
    tx = cache.begin([1], token_counts=[2])
    with pytest.raises(fd.FlashDecError) as e:
        tx.token_indptr_async(np.zeros(3, np.int32))  # batch + 1 = 2 entries
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "token_indptr: expected shape [2]" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        tx.token_indptr_async(None)
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "token_indptr" in e.value.message
    tx.abort()
    for view in (tx.tokens, lambda: tx.token_indptr_async(np.zeros(2, np.int32))):
        with pytest.raises(fd.FlashDecError) as e:
            view()
        assert e.value.status == fd.Status.INVALID_STATE and "aborted" in e.value.message


def test_commit_keep_drops_tokens_and_their_blocks(cache, rng):
    cache.add_request(1)
    cache.add_request(2)
    tx = cache.begin([1, 2], token_counts=[5, 3])  # row 1: blocks for 0-3 and 4; row 2: one block
    assert tx.info().new_block_count == 3
    ks = write_all_layers(cache, tx, rng, 8)
    for keep, what in (([6, 3], "keep_counts[0]"), ([1, 4], "keep_counts[1]")):
        with pytest.raises(fd.FlashDecError) as e:
            tx.commit(keep_counts=keep)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and what in e.value.message, e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        tx.commit(keep_counts=[1])
    assert "keep_counts: expected 2 entries" in e.value.message
    assert tx.info().state == fd.TxState.OPEN  # still open and unchanged
    tx.commit(keep_counts=[2, 3])
    tables, lens = cache.export([1, 2])
    assert lens.tolist() == [2, 3]
    assert (tables[:, 1:] == -1).all()  # row 1's second block held only dropped tokens
    m = cache.metrics()
    assert m.free_blocks == 6 and m.used_blocks == 2 and m.transaction_rollback_block_count == 1
    assert m.transaction_commit_count == 1
    k1, _ = cache.layer_arrays(1)
    np.testing.assert_array_equal(k1[tables[0, 0], :, :2], ks[1][:2].transpose(1, 0, 2))  # kept tokens of row 1
    np.testing.assert_array_equal(k1[tables[1, 0], :, :3], ks[1][5:8].transpose(1, 0, 2))
    with pytest.raises(fd.FlashDecError) as e:
        tx.commit(keep_counts=[2, 3])
    assert e.value.status == fd.Status.INVALID_STATE and "committed" in e.value.message
    cache.validate()


def test_truncate_shortens_and_releases_blocks(cache, rng):
    cache.add_request(1)
    cache.add_request(2)
    with cache.begin([1, 2], token_counts=[7, 2]) as tx:
        write_all_layers(cache, tx, rng, 9)
        tx.commit()
    version = cache.state_version
    before = cache.metrics()
    cache.truncate([1, 2], [3, 2])  # row 1 keeps one block of its two; row 2 unchanged
    tables, lens = cache.export([1, 2], table_stride=2)
    assert lens.tolist() == [3, 2] and tables[0, 1] == -1
    m = cache.metrics()
    assert m.free_blocks == before.free_blocks + 1 and m.free_count == before.free_count + 1
    assert cache.state_version > version
    version = cache.state_version
    cache.truncate([1], [3])  # the current length: nothing changes
    assert cache.state_version == version
    cases = [
        (([1], [4]), fd.Status.INVALID_ARGUMENT, "seq_lens[0] = 4 is outside [0, 3]"),
        (([2, 1], [0, -1]), fd.Status.INVALID_ARGUMENT, "seq_lens[1]"),
        (([9], [0]), fd.Status.NOT_FOUND, "9"),
        (([1, 2], [0]), fd.Status.INVALID_ARGUMENT, "seq_lens: expected 2 entries"),  # the binding's
    ]
    for (ids, lens_), status, message in cases:
        with pytest.raises(fd.FlashDecError) as e:
            cache.truncate(ids, lens_)
        assert e.value.status == status and message in e.value.message, e.value.message
    assert cache.state_version == version  # refusals change nothing
    with cache.begin([2]):
        with pytest.raises(fd.FlashDecError) as e:
            cache.truncate([1], [0])
        assert e.value.status == fd.Status.INVALID_STATE
    cache.truncate([1], [0])
    assert cache.export([1])[1].tolist() == [0] and cache.metrics().free_blocks == 7
    cache.validate()


def test_truncate_refuses_to_cut_into_a_prefix(rng):
    cfg = small_config(prefix_cache_capacity_blocks=2)
    with fd.Cache(cfg) as c:
        shape = (cfg.num_layers, 1, cfg.num_kv_heads, cfg.block_size, cfg.head_dim)
        c.register_prefix("sys", np.zeros(shape, np.float32), np.zeros(shape, np.float32))
        c.add_request(1)
        c.attach_prefix(1, "sys")
        commit_token(c, [1], rng)
        with pytest.raises(fd.FlashDecError) as e:
            c.truncate([1], [3])
        assert e.value.status == fd.Status.INVALID_ARGUMENT
        assert "seq_lens[0]" in e.value.message and "would cut into the attached prefix" in e.value.message
        c.truncate([1], [4])  # down to the prefix itself
        assert c.export([1])[1].tolist() == [4] and c.prefix_info("sys").ref_count == 1
