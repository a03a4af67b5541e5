"""RoPE conventions (fd_rope_style, S3.1): RopeStyle, rope_apply(style=),
CacheConfig.rope_style and rope_kv_append(style=)."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

from conftest import small_config, tokens

H, D = 2, 8


def interleaved(x: np.ndarray, positions, rotary_dim: int, base: float) -> np.ndarray:
    """The interleaved form in float64: pair i is (2i, 2i + 1) at angle
    p * base^(-2i / rotary_dim); dims from rotary_dim on unchanged."""
    y = x.astype(np.float64)
    inv = base ** (-np.arange(rotary_dim // 2) * 2.0 / rotary_dim)
    for t, p in enumerate(positions):
        c, s = np.cos(p * inv), np.sin(p * inv)
        even, odd = x[t, :, 0:rotary_dim:2].astype(np.float64), x[t, :, 1:rotary_dim:2].astype(np.float64)
        y[t, :, 0:rotary_dim:2] = even * c - odd * s
        y[t, :, 1:rotary_dim:2] = odd * c + even * s
    return y


def assert_fails(call, substring):
    with pytest.raises(fd.FlashDecError) as e:
        call()
    assert e.value.status == fd.Status.INVALID_ARGUMENT
    assert substring in e.value.message, e.value.message


def test_enum_values_and_defaults():
    assert (fd.RopeStyle.SPLIT_HALF, fd.RopeStyle.INTERLEAVED) == (0, 1)
    assert fd.CacheConfig().rope_style is fd.RopeStyle.SPLIT_HALF
    with fd.Cache(small_config()) as c:
        assert c.config.rope_style is fd.RopeStyle.SPLIT_HALF


@pytest.mark.parametrize("rotary_dim", [8, 6])
def test_interleaved_matches_the_formula(rng, rotary_dim):
    x = rng.standard_normal((3, H, D)).astype(np.float32)
    pos = [0, 1, 9]
    y = fd.rope_apply(x.copy(), pos, rotary_dim, 100.0, style=fd.RopeStyle.INTERLEAVED)
    np.testing.assert_allclose(y, interleaved(x, pos, rotary_dim, 100.0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(y[:, :, rotary_dim:], x[:, :, rotary_dim:])  # the tail passes through
    np.testing.assert_array_equal(y[0], x[0])  # position 0: no rotation
    assert not np.allclose(y, fd.rope_apply(x.copy(), pos, rotary_dim, 100.0))  # not split-half


def test_worked_example():
    """rotary_dim 4, base 10000, position 1: pair 0 turns by 1 rad, pair 1 by 0.01 rad."""
    x = np.array([[[1, 0, 1, 0, 5, 6]]], np.float32)
    y = fd.rope_apply(x.copy(), [1], 4, style=fd.RopeStyle.INTERLEAVED)
    expected = [np.cos(1), np.sin(1), np.cos(0.01), np.sin(0.01), 5, 6]
    np.testing.assert_allclose(y[0, 0], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_split_half_default_unchanged(rng, dtype):
    """The default is split-half: the same bits as an explicit SPLIT_HALF and
    as fd_rope_apply_style(..., FD_ROPE_SPLIT_HALF) called directly."""
    from flashdec import _lib

    x = rng.standard_normal((2, H, D)).astype(dtype)
    pos = np.array([3, 11], np.int32)
    default = fd.rope_apply(x.copy(), pos, 6)
    np.testing.assert_array_equal(default, fd.rope_apply(x.copy(), pos, 6, style=fd.RopeStyle.SPLIT_HALF))
    raw = x.copy()
    dt = fd.DType.F32 if dtype == np.float32 else fd.DType.F16
    assert _lib.fd_rope_apply_style(int(dt), raw.ctypes.data, 2, H, D, pos.ctypes.data, 6, 10000.0,
                                    _lib.FD_ROPE_SPLIT_HALF) == 0
    np.testing.assert_array_equal(default.view(np.uint8), raw.view(np.uint8))


def test_interleaved_cache_stores_k_rotated_interleaved(rng):
    """A fused RoPE layer write of an interleaved cache rotates Q and K as
    rope_apply(style=INTERLEAVED), partial rotary_dim included; V stays raw."""
    with fd.Cache(small_config(rope_style=fd.RopeStyle.INTERLEAVED)) as c:
        assert c.config.rope_style is fd.RopeStyle.INTERLEAVED
        c.add_request(1)
        for step in range(3):  # positions 0, 1, 2
            with c.begin([1]) as tx:
                rows = tx.rows()
                pos, blk, off = int(rows.positions[0]), int(rows.block_ids[0]), int(rows.offsets[0])
                q, k, v = tokens(rng, 1, heads=4), tokens(rng, 1), tokens(rng, 1)
                tx.write_layer(0, k, v)
                q_out = tx.write_layer_rope(1, q, k, v, rotary_dim=6, rope_base=500.0)
                tx.commit()
            assert pos == step
            style = fd.RopeStyle.INTERLEAVED
            np.testing.assert_array_equal(q_out, fd.rope_apply(q.copy(), [pos], 6, 500.0, style=style))
            sk, sv = c.layer_arrays(1)
            np.testing.assert_array_equal(sk[blk, :, off], fd.rope_apply(k.copy(), [pos], 6, 500.0, style=style)[0])
            np.testing.assert_array_equal(sv[blk, :, off], v[0])
        assert not np.array_equal(sk[blk, :, off], fd.rope_apply(k.copy(), [pos], 6, 500.0)[0])


def test_rope_kv_append_style(rng):
    q, k, v = tokens(rng, 2, heads=4), tokens(rng, 2), tokens(rng, 2)
    positions = [7, 2]
    for style in (fd.RopeStyle.SPLIT_HALF, fd.RopeStyle.INTERLEAVED):
        kc, vc = np.zeros((3, H, 4, D), np.float32), np.zeros((3, H, 4, D), np.float32)
        kw = {} if style == fd.RopeStyle.SPLIT_HALF else {"style": style}  # split-half: the default
        q_out = fd.rope_kv_append(q, k, v, kc, vc, [1, 2], [0, 3], positions, rotary_dim=6, rope_base=500.0, **kw)
        np.testing.assert_array_equal(q_out, fd.rope_apply(q.copy(), positions, 6, 500.0, style=style))
        k_rot = fd.rope_apply(k.copy(), positions, 6, 500.0, style=style)
        np.testing.assert_array_equal(kc[1, :, 0], k_rot[0])
        np.testing.assert_array_equal(kc[2, :, 3], k_rot[1])
        np.testing.assert_array_equal(vc[2, :, 3], v[1])


def test_unknown_style_is_refused_and_writes_nothing(rng):
    x = tokens(rng, 1)
    before = x.copy()
    assert_fails(lambda: fd.rope_apply(x, [3], D, style=2), "rope_style 2 is not an fd_rope_style")
    assert_fails(lambda: fd.rope_apply(x, [3], D, style=-1), "rope_style -1 is not an fd_rope_style")
    assert_fails(lambda: fd.rope_apply(x, [3], D, style=1 << 32), "rope_style must fit in int32")
    np.testing.assert_array_equal(x, before)

    q, k, v = tokens(rng, 1, heads=2), tokens(rng, 1), tokens(rng, 1)
    kc, vc = np.zeros((2, H, 4, D), np.float32), np.zeros((2, H, 4, D), np.float32)
    q_out = np.full_like(q, 7.0)
    assert_fails(lambda: fd.rope_kv_append(q, k, v, kc, vc, [0], [0], [1], rotary_dim=D, q_out=q_out, style=5),
                 "params->rope_style 5")
    assert not kc.any() and not vc.any() and (q_out == 7.0).all()

    assert_fails(lambda: fd.Cache(small_config(rope_style=3)), "config.rope_style 3")
