"""FP8 K/V from Python (issue 15, docs/semantics.md S1.1), on the CPU: FP8
caches (input_dtype, per-layer scales, set/get), the bytes transactions and
the append primitives store against a numpy implementation of the
quantisation rule, decode over FP8 K/V against attention over the
dequantised values, and the engine over an FP8 cache. numpy carries FP8 as
uint8 bits; torch float8 tensors (zero-copy) are tested at the end when torch
is installed. CUDA FP8 caches: test_torch_cuda_cache.py."""

from __future__ import annotations

import numpy as np
import pytest

import flashdec as fd

E4M3, E5M2 = fd.DType.FP8_E4M3, fd.DType.FP8_E5M2
NAN_CODE = 0x7F  # what a NaN of either sign stores
MAX_CODE = {E4M3: 0x7E, E5M2: 0x7B}  # largest finite: 448, 57344


def fp8_values(fmt: fd.DType) -> np.ndarray:
    """float64 [256]: the value of every code (NaN codes NaN, E5M2 infinities inf)."""
    code = np.arange(256)
    mant_bits, bias = (3, 7) if fmt == E4M3 else (2, 15)
    e = (code >> mant_bits) & ((1 << (7 - mant_bits)) - 1)
    m = (code & ((1 << mant_bits) - 1)) / (1 << mant_bits)
    mag = np.where(e == 0, m * 2.0 ** (1 - bias), (1 + m) * 2.0 ** (e - bias))
    top = (1 << (7 - mant_bits)) - 1
    if fmt == E4M3:
        mag = np.where((code & 0x7F) == 0x7F, np.nan, mag)
    else:
        mag = np.where(e == top, np.where(m == 0, np.inf, np.nan), mag)
    return np.where(code & 0x80, -mag, mag)


def quantise(x: np.ndarray, fmt: fd.DType, scale: float = 1.0) -> np.ndarray:
    """The rule of S1.1: x / scale in FP32, rounded to the nearest FP8 value
    (ties to the even code), saturated to the largest finite value (infinity
    too), NaN to 0x7f."""
    y = (np.asarray(x, np.float32) / np.float32(scale)).astype(np.float64).ravel()
    grid = fp8_values(fmt)[: MAX_CODE[fmt] + 1]  # ascending non-negative finite values
    a = np.minimum(np.abs(y), grid[-1])
    hi = np.clip(np.searchsorted(grid, a), 0, len(grid) - 1)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - grid[lo], grid[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = code | np.where(np.signbit(y), 0x80, 0)
    code = np.where(np.isnan(y), NAN_CODE, code)
    return code.astype(np.uint8).reshape(np.shape(x))


def dequantise(bits: np.ndarray, fmt: fd.DType, scale: float = 1.0) -> np.ndarray:
    return (fp8_values(fmt)[bits] * np.float64(scale)).astype(np.float32)


def to_input(x: np.ndarray, dtype: fd.DType) -> np.ndarray:
    """float32 values as an array of ``dtype`` (bf16 as uint16 bits, rounded to nearest even)."""
    x = np.asarray(x, np.float32)
    if dtype == fd.DType.BF16:  # rounding that would carry a NaN's payload into infinity keeps it NaN
        u = x.view(np.uint32).astype(np.uint64)
        nan = np.isnan(x)
        bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return np.where(nan, (u >> 16).astype(np.uint16) | 0x40, bits).astype(np.uint16)
    with np.errstate(over="ignore"):  # 1e6 and -1e9 become f16 infinities: meant
        return x.astype(np.float16 if dtype == fd.DType.F16 else np.float32)


def as_f32(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a.astype(np.float32)


def test_fp8_value_table_matches_the_formats():
    assert fp8_values(E4M3)[0x7E] == 448 and fp8_values(E5M2)[0x7B] == 57344
    assert fp8_values(E4M3)[0x01] == 2.0**-9 and fp8_values(E5M2)[0x01] == 2.0**-16
    np.testing.assert_array_equal(quantise(np.array([500, -1e9, 1.0, -0.0]), E4M3), [0x7E, 0xFE, 0x38, 0x80])


H, D, BS = 2, 8, 4
SPECIALS = np.array([1e6, -1e9, np.inf, -np.inf, np.nan, -np.nan, 1e-9, -0.0], np.float32)


def fp8_cache(fmt=E4M3, input_dtype=fd.DType.F32, layout=fd.Layout.TOKEN_MAJOR, k_scales=(0.5, 2.0),
              v_scales=(1.5, 0.25)) -> fd.Cache:
    return fd.Cache(num_layers=2, num_kv_heads=H, head_dim=D, block_size=BS, max_blocks=16, dtype=fmt,
                    input_dtype=input_dtype, layout=layout, k_scales=k_scales, v_scales=v_scales)


def stored(cache: fd.Cache, layer: int, block: int, offset: int):
    """(K, V) bytes of one token slot, [heads, dim] each."""
    k, v = cache.layer_arrays(layer)
    if cache.config.layout == fd.Layout.TOKEN_MAJOR:
        return k[block, :, offset, :], v[block, :, offset, :]
    return k[block, :, :, offset], v[block, :, :, offset]


def kv_tokens(rng, n: int, specials: bool = True) -> np.ndarray:
    x = (3 * rng.standard_normal((n, H, D))).astype(np.float32)
    if specials:
        x[0, 0, : len(SPECIALS)] = SPECIALS
    return x


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
@pytest.mark.parametrize("input_dtype", [fd.DType.F32, fd.DType.F16, fd.DType.BF16])
@pytest.mark.parametrize("layout", [fd.Layout.TOKEN_MAJOR, fd.Layout.DIM_MAJOR])
def test_transaction_stores_the_quantised_bytes(rng, fmt, input_dtype, layout):
    with fp8_cache(fmt, input_dtype, layout) as c:
        cfg = c.config
        assert (cfg.dtype, cfg.input_dtype, cfg.resolved_input_dtype) == (fmt, input_dtype, input_dtype)
        k_scales, v_scales = c.kv_scales()
        np.testing.assert_array_equal(k_scales, [0.5, 2.0])
        for rid in (1, 2):
            c.add_request(rid)
        with c.begin([1, 2], token_counts=[3, 2]) as tx:  # 5 tokens over two rows
            toks = tx.tokens()
            written = []
            for layer in range(2):
                k, v = to_input(kv_tokens(rng, 5), input_dtype), to_input(kv_tokens(rng, 5), input_dtype)
                tx.write_layer(layer, k, v)
                written.append((k, v))
            tx.commit()
        for layer, (k, v) in enumerate(written):
            for i in range(5):
                sk, sv = stored(c, layer, toks.block_ids[i], toks.offsets[i])
                np.testing.assert_array_equal(sk, quantise(as_f32(k[i]), fmt, k_scales[layer]))
                np.testing.assert_array_equal(sv, quantise(as_f32(v[i]), fmt, v_scales[layer]))
        k0, _ = stored(c, 0, toks.block_ids[0], toks.offsets[0])
        assert k0[0, 2] == k0[0, 0] == MAX_CODE[fmt] and k0[0, 3] == k0[0, 1] == MAX_CODE[fmt] | 0x80  # saturated
        assert k0[0, 4] == k0[0, 5] == NAN_CODE  # NaN of either sign, in its own element
        assert k0[0, 7] == 0x80  # -0 keeps its sign
        with pytest.raises(fd.FlashDecError) as e:  # layer writes take input_dtype, not FP8 bits
            with c.begin([1]) as tx:
                tx.write_layer(0, np.zeros((1, H, D), np.uint8), np.zeros((1, H, D), np.uint8))
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "k:" in e.value.message


def test_rope_write_quantises_the_fp32_rotation(rng):
    with fp8_cache(input_dtype=fd.DType.F32) as c:
        c.add_request(1)
        for _ in range(2):  # position 1: a real rotation
            with c.begin([1]) as tx:
                pos, blk, off = (int(x[0]) for x in (tx.rows().positions, tx.rows().block_ids, tx.rows().offsets))
                q, k, v = kv_tokens(rng, 1, False), kv_tokens(rng, 1, False), kv_tokens(rng, 1, False)
                tx.write_layer(0, k, v)
                q_out = tx.write_layer_rope(1, q, k, v, rotary_dim=D)
                tx.commit()
        assert q_out.dtype == np.float32
        np.testing.assert_array_equal(q_out, fd.rope_apply(q.copy(), [pos], D))
        sk, sv = stored(c, 1, blk, off)
        np.testing.assert_array_equal(sk, quantise(fd.rope_apply(k.copy(), [pos], D)[0], E4M3, 2.0))
        np.testing.assert_array_equal(sv, quantise(v[0], E4M3, 0.25))


def reference(q, k, v, lens, sm_scale=None):
    """float64 attention of one query token per row: q [batch, hq, d], k/v
    [batch, hkv, max_len, d] (dequantised values)."""
    batch, hq, d = q.shape
    group = hq // k.shape[1]
    out = np.zeros((batch, hq, d))
    scale = 1 / np.sqrt(d) if sm_scale is None else sm_scale
    for b in range(batch):
        for h in range(hq):
            kk, vv = k[b, h // group, : lens[b]].astype(np.float64), v[b, h // group, : lens[b]].astype(np.float64)
            s = kk @ q[b, h].astype(np.float64) * scale
            w = np.exp(s - s.max())
            out[b, h] = w @ vv / w.sum()
    return out


def worst_row_error(got, want) -> float:
    got = as_f32(np.asarray(got)).astype(np.float64)
    return float(max(np.abs(g - w).max() / np.abs(w).max() for g, w in zip(got.reshape(-1, D), want.reshape(-1, D))))


def fill(cache: fd.Cache, rng, ids, steps: int) -> None:
    for rid in ids:
        cache.add_request(rid)
    idt = cache.config.resolved_input_dtype
    for _ in range(steps):
        with cache.begin(ids) as tx:
            for layer in range(cache.config.num_layers):
                tx.write_layer(layer, to_input(kv_tokens(rng, len(ids), False), idt),
                               to_input(kv_tokens(rng, len(ids), False), idt))
            tx.commit()


def dense_kv(cache: fd.Cache, layer: int, ids):
    """The committed tokens of ``ids`` dequantised with the layer's scales:
    k, v [batch, heads, max_len, dim] float32 and the lengths."""
    cfg = cache.config
    tables, lens = cache.export(ids)
    ks, vs = cache.layer_arrays(layer)
    scales = [s[layer] for s in cache.kv_scales()]
    out = np.zeros((2, len(ids), cfg.num_kv_heads, int(lens.max()), cfg.head_dim), np.float32)
    for b, n in enumerate(lens):
        for t in range(n):
            blk, off = tables[b, t // cfg.block_size], t % cfg.block_size
            for i, arr in enumerate((ks, vs)):
                page = arr[blk, :, off, :] if cfg.layout == fd.Layout.TOKEN_MAJOR else arr[blk, :, :, off]
                out[i, b, :, t] = dequantise(page, cfg.dtype, scales[i])
    return out[0], out[1], lens


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
@pytest.mark.parametrize("q_dtype", [fd.DType.F32, fd.DType.F16, fd.DType.BF16])
def test_decode_over_an_fp8_cache_matches_attention_over_the_dequantised_values(rng, fmt, q_dtype):
    with fp8_cache(fmt, fd.DType.BF16, fd.Layout.DIM_MAJOR) as c:
        ids = [1, 2, 3]
        fill(c, rng, ids, 11)
        q32 = (3 * rng.standard_normal((3, 4, D))).astype(np.float32)
        q = to_input(q32, q_dtype)
        for layer in range(2):
            k, v, lens = dense_kv(c, layer, ids)
            want = reference(as_f32(q), k, v, lens)
            for out_dtype in (fd.DType.F32, fd.DType.BF16):
                got = c.decode(layer, q, ids, out_dtype=out_dtype)
                assert got.dtype == fd._arrays.NUMPY_DTYPE[out_dtype]
                assert worst_row_error(got, want) <= 5e-3
            # The same call by hand: the storage's uint8 bits, named by kv_dtype, and the layer's scales.
            kb, vb = c.layer_arrays(layer)
            tables, lens = c.export(ids)
            ks, vs = c.kv_scales()
            by_hand = fd.decode(q, kb, vb, tables, lens, layout=fd.Layout.DIM_MAJOR, kv_dtype=fmt,
                                k_scale=ks[layer], v_scale=vs[layer])
            np.testing.assert_array_equal(by_hand, c.decode(layer, q, ids))
            with fd.DecodePlan(q, kb, vb, tables, lens, layout=fd.Layout.DIM_MAJOR, kv_dtype=fmt) as plan:
                run = plan.run(q, kb, vb, tables, lens, k_scale=ks[layer], v_scale=vs[layer])
                np.testing.assert_array_equal(run, by_hand)
        with pytest.raises(fd.FlashDecError) as e:  # uint8 bits without their format
            fd.decode(q, kb, vb, tables, lens, layout=fd.Layout.DIM_MAJOR)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "kv_dtype" in e.value.message
        with pytest.raises(fd.FlashDecError) as e:  # the library checks the scales
            c.decode(0, q, ids, k_scale=0.0)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "k_scale" in e.value.message


def test_decode_scales_scale_a_bf16_cache_too(rng):
    """k_scale / v_scale apply to any kv_dtype: v_scale 2 doubles the output."""
    with fd.Cache(num_layers=1, num_kv_heads=H, head_dim=D, block_size=BS, max_blocks=8, dtype=fd.DType.F32) as c:
        fill(c, rng, [1, 2], 5)
        q = rng.standard_normal((2, 4, D)).astype(np.float32)
        base = c.decode(0, q, [1, 2])
        np.testing.assert_allclose(c.decode(0, q, [1, 2], v_scale=2.0), 2 * base, rtol=1e-6)
        np.testing.assert_allclose(c.decode(0, q, [1, 2], k_scale=0.5), c.decode(0, q, [1, 2], sm_scale=0.5 / np.sqrt(D)),
                                   rtol=1e-6)
        np.testing.assert_array_equal(c.kv_scales()[0], [1.0])  # not FP8: all 1


def test_set_and_get_kv_scales(rng):
    with fp8_cache(input_dtype=fd.DType.F16, k_scales=None, v_scales=None) as c:
        for s in c.kv_scales():
            np.testing.assert_array_equal(s, [1, 1])  # NULL at creation: all 1
        c.set_kv_scales([0.25, 4.0], np.array([2.0, 0.5]))
        k, v = c.kv_scales()
        np.testing.assert_array_equal(k, [0.25, 4.0])
        np.testing.assert_array_equal(v, [2.0, 0.5])
        assert c.config.input_dtype == fd.DType.F16  # get_config: as given
        for bad in (0.0, -1.0, np.nan, np.inf):
            with pytest.raises(fd.FlashDecError) as e:
                c.set_kv_scales([1.0, bad], [1.0, 1.0])
            assert e.value.status == fd.Status.INVALID_ARGUMENT and "k_scales[1]" in e.value.message
        with pytest.raises(fd.FlashDecError) as e:
            c.set_kv_scales([1.0, 1.0], [bad, 1.0])
        assert "v_scales[0]" in e.value.message
        with pytest.raises(fd.FlashDecError) as e:  # one entry per layer: the binding's check
            c.set_kv_scales([1.0], [1.0, 1.0])
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "k_scales" in e.value.message
        np.testing.assert_array_equal(c.kv_scales()[0], [0.25, 4.0])  # nothing changed
        # Later writes quantise with the new scales; stored bytes stay as they were.
        c.add_request(1)
        x = np.full((1, H, D), 3.0, np.float16)
        with c.begin([1]) as tx:
            tx.write_layer(0, x, x)
            tx.write_layer(1, x, x)
            rows = tx.rows()
            with pytest.raises(fd.FlashDecError) as e:  # refused while a transaction is open
                c.set_kv_scales([1.0, 1.0], [1.0, 1.0])
            assert e.value.status == fd.Status.INVALID_STATE
            tx.commit()
        sk, sv = stored(c, 0, rows.block_ids[0], rows.offsets[0])
        assert (sk == quantise(12.0, E4M3)).all() and (sv == quantise(1.5, E4M3)).all()
        c.set_kv_scales([1.0, 1.0], [1.0, 1.0])
        assert (stored(c, 0, rows.block_ids[0], rows.offsets[0])[0] == quantise(12.0, E4M3)).all()
    with fd.Cache(num_layers=2, num_kv_heads=H, head_dim=D, block_size=BS, max_blocks=8, dtype=fd.DType.F16) as c:
        with pytest.raises(fd.FlashDecError) as e:
            c.set_kv_scales([1.0, 1.0], [1.0, 1.0])
        assert e.value.status == fd.Status.INVALID_STATE


def test_fp8_cache_creation_errors():
    cases = [
        (dict(input_dtype=None), "input_dtype"),  # an FP8 cache needs a compute input type
        (dict(input_dtype=fd.DType.FP8_E5M2), "input_dtype"),
        (dict(k_scales=[1.0, -2.0]), "k_scales[1]"),
        (dict(v_scales=[np.nan, 1.0]), "v_scales[0]"),
    ]
    for kw, field in cases:
        with pytest.raises(fd.FlashDecError) as e:
            fp8_cache(**{"input_dtype": fd.DType.BF16, **kw})
        assert e.value.status == fd.Status.INVALID_ARGUMENT and field in e.value.message, (kw, e.value.message)
    with pytest.raises(fd.FlashDecError) as e:  # scales for a cache that is not FP8
        fd.Cache(num_layers=1, dtype=fd.DType.F16, k_scales=[1.0])
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "k_scales" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:  # one entry per layer: the binding's check
        fp8_cache(input_dtype=fd.DType.BF16, k_scales=[1.0, 2.0, 3.0])
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "k_scales: expected 2 entries" in e.value.message


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_append_primitives_quantise_into_fp8_pages(rng, fmt):
    nb = 3
    kc, vc = np.zeros((nb, H, BS, D), np.uint8), np.zeros((nb, H, BS, D), np.uint8)
    k, v = kv_tokens(rng, 2), kv_tokens(rng, 2)
    k16, v16 = to_input(k, fd.DType.F16), to_input(v, fd.DType.F16)
    fd.kv_append(k16, v16, kc, vc, [2, 0], [1, 3], cache_dtype=fmt, k_scale=0.5, v_scale=4.0)
    for i, (blk, off) in enumerate([(2, 1), (0, 3)]):
        np.testing.assert_array_equal(kc[blk, :, off], quantise(k16[i], fmt, 0.5))
        np.testing.assert_array_equal(vc[blk, :, off], quantise(v16[i], fmt, 4.0))
    q = kv_tokens(rng, 1, False)
    q_out = fd.rope_kv_append(q, k[:1], v[:1], kc, vc, [1], [0], [5], rotary_dim=D, cache_dtype=fmt, v_scale=2.0)
    assert q_out.dtype == np.float32
    np.testing.assert_array_equal(q_out, fd.rope_apply(q.copy(), [5], D))
    np.testing.assert_array_equal(kc[1, :, 0], quantise(fd.rope_apply(k[:1].copy(), [5], D)[0], fmt))
    np.testing.assert_array_equal(vc[1, :, 0], quantise(v[0], fmt, 2.0))
    before = kc.copy()
    with pytest.raises(fd.FlashDecError) as e:  # uint8 pages without their format
        fd.kv_append(k, v, kc, vc, [0, 1], [0, 0])
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "cache_dtype" in e.value.message
    with pytest.raises(fd.FlashDecError) as e:  # the library checks the scales, writing nothing
        fd.kv_append(k, v, kc, vc, [0, 1], [0, 0], cache_dtype=fmt, k_scale=-1.0)
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "k_scale" in e.value.message
    f32_pages = np.zeros((nb, H, BS, D), np.float32)
    with pytest.raises(fd.FlashDecError) as e:  # a scale other than 1 only into an FP8 cache
        fd.kv_append(k, v, f32_pages, f32_pages.copy(), [0, 1], [0, 0], v_scale=2.0)
    assert e.value.status == fd.Status.INVALID_ARGUMENT and "v_scale" in e.value.message
    np.testing.assert_array_equal(kc, before)
    assert not f32_pages.any()


@pytest.mark.parametrize("input_dtype", [fd.DType.F16, fd.DType.BF16])
def test_engine_step_over_an_fp8_cache_equals_the_step_by_hand(rng, input_dtype):
    """The engine's step (RoPE, quantised append, decode with the layer's
    scales) on one FP8 cache; the same by hand on a twin: write_layer_rope,
    then Cache.decode over the transaction. Same attention, same bytes."""
    engine_cache, twin = fp8_cache(input_dtype=input_dtype), fp8_cache(input_dtype=input_dtype)
    eng = fd.Engine(engine_cache, num_q_heads=4, cpu_threads=1)
    ctx = to_input(kv_tokens(rng, 6, False).reshape(2, 3, H, D), input_dtype)  # [k/v, 3 context tokens]
    for rid in (1, 2):
        eng.add_request(rid)
        eng.admit(rid)
        twin.add_request(rid)
    eng.prefill_tokens(1, np.stack([ctx[0]] * 2), np.stack([ctx[1]] * 2))  # [layers, n, heads, dim]
    with twin.begin([1], token_counts=[3]) as tx:
        for layer in range(2):
            tx.write_layer_rope(layer, np.zeros((3, 4, D), ctx.dtype), ctx[0], ctx[1], rotary_dim=D)
        tx.commit()
    for step_no in range(2):
        if step_no == 1:  # a scale change between steps applies to the next
            for c in (engine_cache, twin):
                c.set_kv_scales([1.0, 0.125], [3.0, 1.0])
        inputs = [tuple(to_input(3 * rng.standard_normal((2, h, D)), input_dtype) for h in (4, H, H)) for _ in range(2)]
        with eng.begin_step([1, 2]) as step:
            got = [step.layer(layer, *x) for layer, x in enumerate(inputs)]
            step.commit()
        with twin.begin([1, 2]) as tx:
            for layer, (q, k, v) in enumerate(inputs):
                q_rot = tx.write_layer_rope(layer, q, k, v, rotary_dim=D)
                want = twin.decode(layer, q_rot, tx=tx)
                assert got[layer].dtype == want.dtype == q.dtype
                np.testing.assert_array_equal(got[layer], want)
            tx.commit()
        for layer in range(2):
            for a, b in zip(engine_cache.layer_arrays(layer), twin.layer_arrays(layer)):
                np.testing.assert_array_equal(a, b)
            # and against float64 attention over the dequantised cache
            q_rot = as_f32(fd.rope_apply(inputs[layer][0].copy(), engine_cache.export([1, 2])[1] - 1, D))
            k, v, lens = dense_kv(engine_cache, layer, [1, 2])
            assert worst_row_error(got[layer], reference(q_rot, k, v, lens)) <= 5e-3
    eng.close()
    engine_cache.close()
    twin.close()


# -- torch float8 tensors (CPU), zero-copy ------------------------------------


def _torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8 types")
    return torch


def test_torch_float8_tensors_are_kv_and_append_caches(rng):
    torch = _torch()
    with fp8_cache(input_dtype=fd.DType.F32) as c:
        ids = [1, 2]
        fill(c, rng, ids, 6)
        kb, vb = c.layer_arrays(1)
        tk = torch.from_numpy(np.array(kb)).view(torch.float8_e4m3fn)  # float8 tensors of the same bits
        tv = torch.from_numpy(np.array(vb)).view(torch.float8_e4m3fn)
        tables, lens = c.export(ids)
        q = torch.from_numpy((3 * rng.standard_normal((2, 4, D))).astype(np.float32)).bfloat16()
        got = fd.decode(q, tk, tv, torch.from_numpy(tables), torch.from_numpy(lens), k_scale=2.0, v_scale=0.25)
        assert got.dtype == torch.bfloat16
        want = c.decode(1, q.view(torch.int16).numpy().view(np.uint16), ids)
        np.testing.assert_array_equal(got.view(torch.int16).numpy().view(np.uint16), want)
        with pytest.raises(fd.FlashDecError) as e:  # kv_dtype names the tensors' own type or nothing
            fd.decode(q, tk, tv, torch.from_numpy(tables), torch.from_numpy(lens), kv_dtype=E5M2)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "k_cache" in e.value.message
        with pytest.raises(fd.FlashDecError) as e:  # FP8 is a K/V type only: the library's check
            fd.decode(tk[:2, :, 0, :].repeat_interleave(2, 0).reshape(2, 4, D), tk, tv,
                      torch.from_numpy(tables), torch.from_numpy(lens))
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "q_dtype" in e.value.message
    for fmt, tdt in ((E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)):
        pages = torch.zeros((3, H, BS, D), dtype=tdt)
        vpages = torch.zeros_like(pages)
        ptr = pages.data_ptr()
        k = torch.from_numpy(kv_tokens(rng, 2, False)).half()
        fd.kv_append(k, k, pages, vpages, [2, 0], [1, 3], k_scale=0.5)  # the type comes from the tensors
        assert pages.data_ptr() == ptr  # written in place
        bits = pages.view(torch.uint8).numpy()
        np.testing.assert_array_equal(bits[2, :, 1], quantise(k[0].numpy(), fmt, 0.5))
        np.testing.assert_array_equal(bits[2, :, 1], (k[0].float() / 0.5).to(tdt).view(torch.uint8).numpy())
        np.testing.assert_array_equal(vpages.view(torch.uint8).numpy()[0, :, 3], quantise(k[1].numpy(), fmt))
