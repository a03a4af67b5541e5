"""fd_kv_append / fd_rope_kv_append on host arrays: slots written exactly,
RoPE as fd_rope_apply, strided pages, and failures that write nothing."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

from conftest import tokens

H, D, BS, NB = 2, 8, 4, 5


def empty_pages(dtype=np.float32, layout=fd.Layout.TOKEN_MAJOR):
    shape = (NB, H, BS, D) if layout == fd.Layout.TOKEN_MAJOR else (NB, H, D, BS)
    return np.zeros(shape, dtype), np.zeros(shape, dtype)


def slot(cache, block, offset, layout=fd.Layout.TOKEN_MAJOR):
    """[H, D] of one token, whatever the layout."""
    return cache[block, :, offset] if layout == fd.Layout.TOKEN_MAJOR else cache[block, :, :, offset]


def assert_fails(call, status, substring):
    with pytest.raises(fd.FlashDecError) as e:
        call()
    assert e.value.status == status
    assert substring in e.value.message, e.value.message


@pytest.mark.parametrize("layout", [fd.Layout.TOKEN_MAJOR, fd.Layout.DIM_MAJOR])
def test_kv_append_writes_exactly_the_slots(rng, layout):
    kc, vc = empty_pages(layout=layout)
    k, v = tokens(rng, 3), tokens(rng, 3)
    ids, offs = [4, 0, 4], [3, 1, 0]
    fd.kv_append(k, v, kc, vc, ids, offs, layout=layout)
    for i, (b, o) in enumerate(zip(ids, offs)):
        np.testing.assert_array_equal(slot(kc, b, o, layout), k[i])
        np.testing.assert_array_equal(slot(vc, b, o, layout), v[i])
        slot(kc, b, o, layout)[...] = 0
        slot(vc, b, o, layout)[...] = 0
    assert not kc.any() and not vc.any()  # nothing else was touched


def test_kv_append_into_strided_nhd_pages(rng):
    # vLLM-style NHD pages [blocks, block_size, heads, dim], seen token-major
    # through a transposed view: the binding passes the view's strides.
    k_nhd = np.zeros((NB, BS, H, D), np.float16)
    v_nhd = np.zeros_like(k_nhd)
    k, v = tokens(rng, 2, dtype=np.float16), tokens(rng, 2, dtype=np.float16)
    fd.kv_append(k, v, k_nhd.transpose(0, 2, 1, 3), v_nhd.transpose(0, 2, 1, 3), [2, 1], [1, 3])
    np.testing.assert_array_equal(k_nhd[2, 1], k[0])
    np.testing.assert_array_equal(v_nhd[1, 3], v[1])
    assert np.count_nonzero(k_nhd) == np.count_nonzero(k)


def test_kv_append_bf16_bits(rng):
    kc, vc = empty_pages(np.uint16)
    k = rng.integers(1, 0x7F00, size=(1, H, D), dtype=np.uint16)
    fd.kv_append(k, k, kc, vc, [3], [2])
    np.testing.assert_array_equal(kc[3, :, 2], k[0])
    np.testing.assert_array_equal(vc[3, :, 2], k[0])


def test_rope_kv_append_matches_rope_apply(rng):
    kc, vc = empty_pages()
    q, k, v = tokens(rng, 2, heads=4), tokens(rng, 2), tokens(rng, 2)
    positions = [7, 0]
    q_out = fd.rope_kv_append(q, k, v, kc, vc, [1, 2], [0, 3], positions, rotary_dim=D, rope_base=500.0)
    np.testing.assert_array_equal(q_out, fd.rope_apply(q.copy(), positions, D, 500.0))
    k_rot = fd.rope_apply(k.copy(), positions, D, 500.0)
    np.testing.assert_array_equal(kc[1, :, 0], k_rot[0])
    np.testing.assert_array_equal(kc[2, :, 3], k_rot[1])
    np.testing.assert_array_equal(vc[2, :, 3], v[1])  # V is stored raw
    assert not np.array_equal(k_rot[0], k[0])


def test_rope_kv_append_in_place_q(rng):
    kc, vc = empty_pages()
    q, k, v = tokens(rng, 1, heads=2), tokens(rng, 1), tokens(rng, 1)
    expected = fd.rope_apply(q.copy(), [5], 4)
    assert fd.rope_kv_append(q, k, v, kc, vc, [0], [0], [5], rotary_dim=4, q_out=q) is q
    np.testing.assert_array_equal(q, expected)


def test_bad_block_id_writes_nothing(rng):
    kc, vc = empty_pages()
    k, v = tokens(rng, 2), tokens(rng, 2)
    assert_fails(lambda: fd.kv_append(k, v, kc, vc, [0, NB], [0, 0]), fd.Status.INVALID_ARGUMENT,
                 f"block_ids[1] = {NB} is out of range")
    assert_fails(lambda: fd.kv_append(k, v, kc, vc, [0, 1], [0, -1]), fd.Status.INVALID_ARGUMENT,
                 "offsets[1] = -1 is out of range")
    assert not kc.any() and not vc.any()


def test_bad_position_writes_nothing_not_even_q_out(rng):
    kc, vc = empty_pages()
    q, k, v = tokens(rng, 2, heads=2), tokens(rng, 2), tokens(rng, 2)
    q_out = np.full_like(q, 7.0)
    assert_fails(lambda: fd.rope_kv_append(q, k, v, kc, vc, [0, 1], [0, 0], [3, -2], rotary_dim=D, q_out=q_out),
                 fd.Status.INVALID_ARGUMENT, "positions[1] = -2 must be >= 0")
    assert_fails(lambda: fd.rope_kv_append(q, k, v, kc, vc, [0, 1], [0, 0], [3, 2], rotary_dim=3, q_out=q_out),
                 fd.Status.INVALID_ARGUMENT, "rotary_dim")
    assert not kc.any() and not vc.any()
    assert (q_out == 7.0).all()


def test_q_out_overlapping_k_is_refused(rng):
    kc, vc = empty_pages()
    k, v = tokens(rng, 1), tokens(rng, 1)
    q = k.copy()
    before = k.copy()
    assert_fails(lambda: fd.rope_kv_append(q, k, v, kc, vc, [0], [0], [1], rotary_dim=D, q_out=k),
                 fd.Status.INVALID_ARGUMENT, "q_out must not overlap k or v")
    np.testing.assert_array_equal(k, before)
    assert not kc.any()


def test_binding_checks_name_the_parameter(rng):
    kc, vc = empty_pages()
    k = tokens(rng, 2)
    assert_fails(lambda: fd.kv_append(k, k, kc, vc, [0], [0, 1]), fd.Status.INVALID_ARGUMENT,
                 "block_ids: expected 2 entries")
    assert_fails(lambda: fd.kv_append(k, tokens(rng, 1), kc, vc, [0, 1], [0, 1]), fd.Status.INVALID_ARGUMENT,
                 "v: expected shape")
    assert_fails(lambda: fd.kv_append(tokens(rng, 2, heads=3), tokens(rng, 2, heads=3), kc, vc, [0, 1], [0, 1]),
                 fd.Status.INVALID_ARGUMENT, "k_cache: 2 heads")
    frozen = kc.copy()
    frozen.flags.writeable = False
    assert_fails(lambda: fd.kv_append(k, k, frozen, vc, [0, 1], [0, 1]), fd.Status.INVALID_ARGUMENT,
                 "k_cache: array is read-only")
    assert_fails(lambda: fd.kv_append(k, k, kc.astype(np.float16), vc, [0, 1], [0, 1]),
                 fd.Status.INVALID_ARGUMENT, "k_cache: element type F16")
    assert_fails(lambda: fd.kv_append(k, k, kc, vc, [-1, 0], [0, 1]), fd.Status.INVALID_ARGUMENT,
                 "block_ids[0] = -1")
    assert not kc.any() and not vc.any()
