"""Shared prefixes."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

from conftest import small_config


def blocks(rng, n, cfg):
    shape = (cfg.num_layers, n, cfg.num_kv_heads, cfg.block_size, cfg.head_dim)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


def test_register_attach_info_evict(rng):
    cfg = small_config(prefix_cache_capacity_blocks=4)
    with fd.Cache(cfg) as c:
        k, v = blocks(rng, 2, cfg)
        c.register_prefix("sys", k, v)
        c.add_request(1)
        c.attach_prefix(1, "sys")
        info = c.prefix_info("sys")
        assert (info.num_blocks, info.ref_count) == (2, 1)
        assert c.export([1])[1].tolist() == [2 * cfg.block_size]
        karr, _ = c.layer_arrays(1)
        np.testing.assert_array_equal(karr[info.first_block], k[1, 0])
        with pytest.raises(fd.FlashDecError) as e:
            c.evict_prefix("sys")
        assert e.value.status == fd.Status.INVALID_STATE
        c.finish_request(1)
        c.evict_prefix("sys")
        with pytest.raises(fd.FlashDecError) as e:
            c.prefix_info("sys")
        assert e.value.status == fd.Status.NOT_FOUND
        m = c.metrics()
        assert m.prefix_registration_count == 1 and m.prefix_hit_count == 1 and m.prefix_eviction_count == 1


def test_prefix_errors(rng):
    cfg = small_config(prefix_cache_capacity_blocks=2)
    with fd.Cache(cfg) as c:
        k, v = blocks(rng, 1, cfg)
        c.register_prefix("a", k, v)
        with pytest.raises(fd.FlashDecError) as e:
            c.register_prefix("a", k, v)
        assert e.value.status == fd.Status.ALREADY_EXISTS
        c.add_request(1)
        with pytest.raises(fd.FlashDecError) as e:
            c.attach_prefix(1, "missing")
        assert e.value.status == fd.Status.NOT_FOUND
        assert c.metrics().prefix_miss_count == 1
        with pytest.raises(fd.FlashDecError) as e:
            c.register_prefix("bad", k[:, :, :1], v[:, :, :1])
        assert "k_blocks" in e.value.message
        with pytest.raises(fd.FlashDecError):
            c.register_prefix("nul\0id", k, v)
    with fd.Cache(small_config()) as c:
        with pytest.raises(fd.FlashDecError) as e:
            c.register_prefix("x", k, v)
        assert e.value.status == fd.Status.UNSUPPORTED
