"""Cache lifecycle, requests, export, metrics, append, failures that change nothing."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

from conftest import commit_token, small_config, tokens


def test_config_roundtrip_and_defaults():
    default = fd.CacheConfig()
    assert default.num_layers >= 1 and default.dtype in fd.DType
    with fd.Cache(small_config(layout=fd.Layout.DIM_MAJOR)) as c:
        cfg = c.config
        assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.block_size, cfg.max_blocks) == (2, 2, 8, 4, 8)
        assert cfg.layout == fd.Layout.DIM_MAJOR and cfg.dtype == fd.DType.F32
        assert cfg.device == fd.Device.cpu()


def test_close_is_idempotent_and_closed_cache_raises():
    c = fd.Cache(small_config())
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(fd.FlashDecError) as e:
        c.add_request(1)
    assert e.value.status == fd.Status.INVALID_STATE and "closed" in e.value.message


def test_invalid_config_names_the_field():
    with pytest.raises(fd.FlashDecError) as e:
        fd.Cache(small_config(prefix_cache_capacity_blocks=9))
    assert e.value.status == fd.Status.INVALID_ARGUMENT
    assert "prefix" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        fd.Cache(small_config(num_layers=-1))
    assert "num_layers" in e.value.message


def test_cuda_cache_without_device_is_no_device():
    if fd.cuda_device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(fd.FlashDecError) as e:
        fd.Cache(small_config(device=fd.Device.cuda(0), dtype=fd.DType.F16))
    assert e.value.status in (fd.Status.NO_DEVICE, fd.Status.UNSUPPORTED)


def test_request_lifecycle(cache):
    assert cache.request_state(5) == fd.RequestState.UNKNOWN
    cache.add_request(5)
    cache.add_request(5)  # no-op on an active id
    assert cache.request_state(5) == fd.RequestState.ACTIVE
    cache.finish_request(5)
    assert cache.request_state(5) == fd.RequestState.FINISHED
    with pytest.raises(fd.FlashDecError) as e:
        cache.add_request(5)
    assert e.value.status == fd.Status.INVALID_STATE and "5" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        cache.cancel_request(6)
    assert e.value.status == fd.Status.NOT_FOUND


def test_export_blocks_needed_and_metrics(cache, rng):
    for r in (1, 2):
        cache.add_request(r)
    assert cache.blocks_needed([1, 2]) == (2, 8)
    for _ in range(5):
        commit_token(cache, [1, 2], rng)
    tables, lens = cache.export([2, 1])
    assert lens.tolist() == [5, 5]
    assert tables.shape == (2, 2) and tables.dtype == np.int32
    assert set(tables.ravel().tolist()) == {0, 1, 2, 3}
    wide, _ = cache.export([1], table_stride=4)
    assert wide[0, 2:].tolist() == [-1, -1]
    m = cache.metrics()
    assert (m.used_blocks, m.free_blocks, m.active_tokens) == (4, 4, 10)
    assert m.transaction_commit_count == 5 and m.transaction_layer_write_count == 10
    assert m.bytes_per_block == 2 * 2 * 2 * 4 * 8 * 4
    assert m.block_utilization == pytest.approx(0.5)
    cache.validate()


def test_failed_export_changes_nothing(cache, rng):
    cache.add_request(1)
    for _ in range(5):
        commit_token(cache, [1], rng)
    before = cache.state_version
    with pytest.raises(fd.FlashDecError) as e:
        cache.export([1], table_stride=1)
    assert e.value.status == fd.Status.INVALID_ARGUMENT
    with pytest.raises(fd.FlashDecError) as e:
        cache.export([])
    assert e.value.status == fd.Status.INVALID_ARGUMENT
    assert cache.state_version == before


def test_out_of_blocks_is_reported_and_counted(rng):
    with fd.Cache(small_config(max_blocks=1)) as c:
        c.add_request(1)
        c.add_request(2)
        with pytest.raises(fd.FlashDecError) as e:
            c.begin([1, 2])
        assert e.value.status == fd.Status.OUT_OF_BLOCKS
        m = c.metrics()
        assert m.capacity_failure_count == 1 and m.used_blocks == 0 and m.open_transaction_count == 0


def test_append_single_layer_and_layer_arrays_alias_storage(rng):
    with fd.Cache(small_config(num_layers=1)) as c:
        c.add_request(3)
        k, v = tokens(rng, 1), tokens(rng, 1)
        c.append([3], k, v)
        karr, varr = c.layer_arrays(0)
        block = c.export([3])[0][0, 0]
        np.testing.assert_array_equal(karr[block, :, 0, :], k[0])
        np.testing.assert_array_equal(varr[block, :, 0, :], v[0])
        assert not karr.flags.writeable


def test_binding_checks_happen_before_the_call(cache, rng):
    cache.add_request(1)
    before = cache.metrics()
    with pytest.raises(fd.FlashDecError) as e:
        cache.append([1], tokens(rng, 1, dtype=np.float16), tokens(rng, 1))
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "k" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:
        cache.append([1], tokens(rng, 2), tokens(rng, 2))
    assert "shape" in e.value.message
    for bad in (-1, 1 << 64):  # ctypes would silently wrap these
        with pytest.raises(fd.FlashDecError) as e:
            cache.add_request(bad)
        assert "request_id" in e.value.message
    assert cache.request_state((1 << 64) - 1) == fd.RequestState.UNKNOWN
    assert cache.metrics() == before


def test_metrics_dataclass_covers_every_c_field():
    import dataclasses

    from flashdec import _lib

    names = [f.name for f in dataclasses.fields(fd.Metrics)]
    assert names == [n for n, _ in _lib.METRICS_FIELDS if n not in ("struct_size", "reserved0")]
