"""External K/V storage, async exports and the async error query on CPU
caches (where the destinations are host arrays written before return)."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

from conftest import commit_token, small_config


def assert_fails(call, status, substring):
    with pytest.raises(fd.FlashDecError) as e:
        call()
    assert e.value.status == status
    assert substring in e.value.message, e.value.message


def storage(cfg, layout=fd.Layout.TOKEN_MAJOR):
    inner = (cfg.block_size, cfg.head_dim) if layout == fd.Layout.TOKEN_MAJOR else (cfg.head_dim, cfg.block_size)
    shape = (cfg.num_layers, cfg.max_blocks, cfg.num_kv_heads) + inner
    return np.zeros(shape, np.float32), np.zeros(shape, np.float32)


def test_external_storage_receives_the_writes(rng):
    cfg = small_config()
    k_store, v_store = storage(cfg)
    with fd.Cache(cfg, k_storage=k_store, v_storage=v_store) as c:
        assert c.external_storage
        c.add_request(1)
        with c.begin([1]) as tx:
            row = tx.rows()
            k = rng.standard_normal((1, 2, 8)).astype(np.float32)
            tx.write_layer(0, k, k * 2)
            tx.write_layer(1, k * 3, k * 4)
            tx.commit()
        b, o = row.block_ids[0], row.offsets[0]
        np.testing.assert_array_equal(k_store[0, b, :, o], k[0])
        np.testing.assert_array_equal(v_store[1, b, :, o], 4 * k[0])
        karr, _ = c.layer_arrays(1)  # the cache's view aliases the caller's array
        assert np.shares_memory(karr, k_store)
        out = c.decode(1, rng.standard_normal((1, 2, 8)).astype(np.float32), [1])
        assert out.shape == (1, 2, 8)
    with fd.Cache(cfg) as owned:
        assert not owned.external_storage


def test_external_storage_strided_layers(rng):
    # Layers interleaved with other data: [blocks, layers, heads, block, dim]
    # seen through a transposed view.
    cfg = small_config()
    base_k = np.zeros((cfg.max_blocks, cfg.num_layers, 2, cfg.block_size, 8), np.float32)
    base_v = np.zeros_like(base_k)
    with fd.Cache(cfg, k_storage=base_k.transpose(1, 0, 2, 3, 4), v_storage=base_v.transpose(1, 0, 2, 3, 4)) as c:
        c.add_request(3)
        commit_token(c, [3], rng)
        tables, _ = c.export([3])
        assert base_k[tables[0, 0], 1, :, 0].any()
        assert not base_k[tables[0, 0], 1, :, 1].any()


def test_external_storage_errors():
    cfg = small_config()
    k_store, v_store = storage(cfg)
    assert_fails(lambda: fd.Cache(cfg, k_storage=k_store), fd.Status.INVALID_ARGUMENT,
                 "config.k_storage and config.v_storage must both be set")
    assert_fails(lambda: fd.Cache(cfg, k_storage=k_store[:, :4], v_storage=v_store[:, :4]),
                 fd.Status.INVALID_ARGUMENT, "k_storage: expected shape [2, 8, 2, 4, 8]")
    assert_fails(lambda: fd.Cache(cfg, k_storage=k_store, v_storage=v_store.astype(np.float16)),
                 fd.Status.INVALID_ARGUMENT, "v_storage: element type F16")
    odd = np.zeros((2, 8, 2, 8, 4), np.float32).transpose(0, 1, 2, 4, 3)  # dim stride != 1
    assert_fails(lambda: fd.Cache(cfg, k_storage=odd, v_storage=odd),
                 fd.Status.INVALID_ARGUMENT, "config.stride_dim must be 1 for the token-major layout")
    assert not k_store.any() and not v_store.any()


def test_export_async_on_cpu_matches_export(rng):
    with fd.Cache(small_config()) as c:
        for rid in (1, 2):
            c.add_request(rid)
        for _ in range(5):
            commit_token(c, [1, 2], rng)
        commit_token(c, [2], rng)
        tables, lens = c.export([2, 1], table_stride=3)
        got_t = np.full((2, 3), 99, np.int32)
        got_l = np.full(2, 99, np.int32)
        c.export_async([2, 1], got_t, got_l)
        np.testing.assert_array_equal(got_t, tables)
        np.testing.assert_array_equal(got_l, lens)
        only_lens = np.zeros(2, np.int32)
        c.export_async([2, 1], seq_lens=only_lens)
        np.testing.assert_array_equal(only_lens, [6, 5])
        assert c.async_error() is None


def test_export_async_failures_write_nothing(rng):
    with fd.Cache(small_config()) as c:
        c.add_request(1)
        for _ in range(5):
            commit_token(c, [1], rng)  # 2 blocks
        t = np.full((1, 1), 99, np.int32)
        lens = np.full(1, 99, np.int32)
        assert_fails(lambda: c.export_async([1], t, lens), fd.Status.INVALID_ARGUMENT,
                     "more than table_stride 1")
        assert_fails(lambda: c.export_async([42], None, lens), fd.Status.NOT_FOUND, "42")
        assert (t == 99).all() and (lens == 99).all()
        assert_fails(lambda: c.export_async([1], t.astype(np.int64)), fd.Status.INVALID_ARGUMENT,
                     "block_tables: element type must be int32")
        frozen = np.zeros(1, np.int32)
        frozen.flags.writeable = False
        assert_fails(lambda: c.export_async([1], seq_lens=frozen), fd.Status.INVALID_ARGUMENT, "read-only")


def test_tx_block_tables_async_matches_sync_view(rng):
    with fd.Cache(small_config()) as c:
        c.add_request(1)
        c.add_request(2)
        for _ in range(4):
            commit_token(c, [1, 2], rng)
        with c.begin([1, 2]) as tx:
            t = np.full((2, 2), 99, np.int32)
            lens = np.full(2, 99, np.int32)
            tx.block_tables_async(t, lens)
            np.testing.assert_array_equal(t, tx.block_tables(2))
            np.testing.assert_array_equal(lens, [5, 5])
            small = np.full((2, 1), 99, np.int32)
            assert_fails(lambda: tx.block_tables_async(small), fd.Status.INVALID_ARGUMENT, "table_stride")
            assert (small == 99).all()
            assert_fails(lambda: tx.block_tables_async(np.zeros((3, 2), np.int32)), fd.Status.INVALID_ARGUMENT,
                         "block_tables: expected shape [2, *]")


def test_async_error_on_a_closed_cache_raises():
    c = fd.Cache(small_config())
    c.close()
    assert_fails(c.async_error, fd.Status.INVALID_STATE, "cache is closed")


def test_stream_arguments_accept_handles_and_stream_objects_on_cpu(rng):
    # stream= takes an int handle or anything with .cuda_stream (a
    # torch.cuda.Stream); CPU caches and host arrays ignore it.
    class FakeStream:
        cuda_stream = 0

    with fd.Cache(small_config(num_layers=1)) as c:
        c.add_request(1)
        k = rng.standard_normal((1, 2, 8)).astype(np.float32)
        c.append([1], k, 2 * k, stream=FakeStream())
        c.append([1], k, 2 * k, stream=0)
        q = rng.standard_normal((1, 2, 8)).astype(np.float32)
        a = c.decode(0, q, [1], stream=FakeStream())
        b = c.decode(0, q, [1])
        np.testing.assert_array_equal(a, b)
        karr, varr = c.layer_arrays(0)
        assert isinstance(karr, np.ndarray) and not karr.flags.writeable
        assert_fails(lambda: c.append([1], k, k, stream="s"), fd.Status.INVALID_ARGUMENT,
                     "stream: expected an int cudaStream_t handle or a torch.cuda.Stream, got str")
