"""CUDA caches from Python (issue 12, "Python API gaps met when serving a model
on the GPU"): zero-copy torch views of a CUDA cache's own K/V storage,
Cache.decode on a CUDA cache, and stream ordering of the binding's calls
(side-stream writes with a busy default stream; Engine.prefill from a side
stream whose inputs are still being produced).

Every value is checked against a CPU cache fed the same data (the CPU backend)
and against numpy attention. Runs only where torch sees a CUDA device and the
library was built with CUDA (skipped elsewhere, with the reason shown by
pytest -rs).
"""

from __future__ import annotations

import gc
import math
import weakref

import numpy as np
import pytest

import flashdec as fd

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
if fd.cuda_device_count() == 0:
    pytest.skip("libflashdec was built without CUDA", allow_module_level=True)

CUDA = fd.Device.cuda(0)
TORCH_DTYPE = {fd.DType.BF16: torch.bfloat16, fd.DType.F16: torch.float16}
# Spin cycles for torch.cuda._sleep: about 0.15-0.3 s on current GPUs, far
# longer than the Python calls queued behind it.
SLEEP_CYCLES = 400_000_000


def config(device, dtype=fd.DType.BF16, layout=fd.Layout.TOKEN_MAJOR, **kw):
    base = dict(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, max_blocks=32,
                dtype=dtype, layout=layout, device=device)
    base.update(kw)
    return fd.CacheConfig(**base)


def host_bits(x):
    """A torch f16/bf16 tensor (any device) as the numpy array the CPU backend
    takes: float16, or bf16 as uint16 bits."""
    x = x.detach().contiguous().cpu()
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(np.uint16)
    return x.numpy()


def as_f32(a):
    """numpy float16 or bf16 bits (uint16) -> float32."""
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def raw16(x):
    """Bits of a 2-byte float array (torch tensor on any device, or numpy) as
    a numpy int16 array, for bit-exact comparisons."""
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).view(np.int16)
    return x.detach().contiguous().cpu().view(torch.int16).numpy()


def fill_both(caches, lengths, seed, dtype=torch.bfloat16):
    """Commits tokens into every cache of ``caches`` (same config, same
    requests 1..n) until request i holds lengths[i] tokens; K/V are random,
    generated on the GPU, the same values for every cache. Returns
    {(request, position, layer): (k, v)} of the CUDA inputs [heads, dim]."""
    cfg = caches[0].config
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = list(range(1, len(lengths) + 1))
    for c in caches:
        for r in ids:
            c.add_request(r)
    written = {}
    for pos in range(max(lengths)):
        rows = [r for r, n in zip(ids, lengths) if pos < n]
        kv = [
            [torch.randn(len(rows), cfg.num_kv_heads, cfg.head_dim, generator=g, device="cuda").to(dtype)
             for _ in range(2)]
            for _ in range(cfg.num_layers)
        ]  # fmt: skip
        for c in caches:
            cuda = c.config.device.type == fd.DeviceType.CUDA
            with c.begin(rows) as tx:
                for layer, (k, v) in enumerate(kv):
                    if cuda:
                        tx.write_layer(layer, k, v)
                    else:
                        tx.write_layer(layer, host_bits(k), host_bits(v))
                tx.commit()
        for layer, (k, v) in enumerate(kv):
            for i, r in enumerate(rows):
                written[(r, pos, layer)] = (k[i], v[i])
    torch.cuda.synchronize()
    return written


def slot(view, layout, block, offset):
    """[heads, dim] of one token in a layer view."""
    if layout == fd.Layout.TOKEN_MAJOR:
        return view[block, :, offset, :]
    return view[block, :, :, offset]


@pytest.mark.parametrize("layout", [fd.Layout.TOKEN_MAJOR, fd.Layout.DIM_MAJOR])
@pytest.mark.parametrize("dtype", [fd.DType.BF16, fd.DType.F16])
def test_layer_arrays_of_a_cuda_cache_are_zero_copy_views(dtype, layout):
    lengths = [1, 17, 40]
    with fd.Cache(config(CUDA, dtype, layout)) as gpu, fd.Cache(config(fd.Device.cpu(), dtype, layout)) as cpu:
        written = fill_both([gpu, cpu], lengths, seed=11, dtype=TORCH_DTYPE[dtype])
        tables, lens = gpu.export([1, 2, 3])
        cpu_tables, cpu_lens = cpu.export([1, 2, 3])
        assert tables.tolist() == cpu_tables.tolist() and lens.tolist() == lengths == cpu_lens.tolist()
        cfg = gpu.config
        for layer in range(cfg.num_layers):
            k, v = gpu.layer_arrays(layer)
            st = gpu.layer_storage(layer)
            for view, addr in ((k, st.k), (v, st.v)):
                assert isinstance(view, torch.Tensor)
                assert view.device == torch.device("cuda", 0)
                assert view.dtype == TORCH_DTYPE[dtype]
                assert view.data_ptr() == addr  # zero-copy
                inner = (cfg.block_size, cfg.head_dim) if layout == fd.Layout.TOKEN_MAJOR else (cfg.head_dim, cfg.block_size)
                assert tuple(view.shape) == (cfg.max_blocks, cfg.num_kv_heads) + inner
            # Every written token, bit for bit, where the export says it is.
            for (r, pos, l), (kin, vin) in written.items():
                if l != layer:
                    continue
                b, o = int(tables[r - 1, pos // cfg.block_size]), pos % cfg.block_size
                assert torch.equal(slot(k, layout, b, o).view(torch.int16), kin.view(torch.int16)), (r, pos, l)
                assert torch.equal(slot(v, layout, b, o).view(torch.int16), vin.view(torch.int16)), (r, pos, l)
            # The whole layer equals the CPU cache's (same blocks, zeros elsewhere).
            ck, cv = cpu.layer_arrays(layer)
            np.testing.assert_array_equal(raw16(k), raw16(ck))
            np.testing.assert_array_equal(raw16(v), raw16(cv))
        print(f"cuda layer views {dtype.name} {layout.name}: {len(written)} token-layers bit-exact, "
              f"layers equal to the CPU cache's")


def _one_token(c, value):
    c.add_request(1)
    x = torch.full((1, 2, 64), value, dtype=torch.bfloat16, device="cuda")
    with c.begin([1]) as tx:  # (a Transaction holds its cache: keep it local)
        tx.write_layer(0, x, x)
        tx.write_layer(1, x, x)
        tx.commit()
    return int(c.export([1])[0][0, 0])


def test_layer_view_keeps_the_cache_alive():
    c = fd.Cache(config(CUDA))
    block = _one_token(c, 1.5)
    alive = weakref.ref(c)
    k, v = c.layer_arrays(1)
    del c
    gc.collect()
    assert alive() is not None  # the views hold the cache
    assert float(k[block, :, 0].float().min()) == 1.5
    del k
    gc.collect()
    assert alive() is not None  # v still does
    del v
    gc.collect()
    assert alive() is None


def numpy_attention(q, k_layer, v_layer, tables, lens, block_size, layout):
    """FP32 paged attention over a layer's K/V (numpy float32 arrays in the
    layout's axis order); q [rows, hq, d] float32."""
    rows, hq, d = q.shape
    hkv = k_layer.shape[1]
    group = hq // hkv
    out = np.zeros((rows, hq, d), np.float32)
    for r in range(rows):
        n = int(lens[r])
        if n == 0:
            continue
        toks = [(int(tables[r, t // block_size]), t % block_size) for t in range(n)]
        if layout == fd.Layout.TOKEN_MAJOR:
            k = np.stack([k_layer[b, :, o, :] for b, o in toks], axis=1)  # [hkv, n, d]
            v = np.stack([v_layer[b, :, o, :] for b, o in toks], axis=1)
        else:
            k = np.stack([k_layer[b, :, :, o] for b, o in toks], axis=1)
            v = np.stack([v_layer[b, :, :, o] for b, o in toks], axis=1)
        for h in range(hq):
            s = k[h // group] @ q[r, h] / math.sqrt(d)
            p = np.exp(s - s.max())
            out[r, h] = (p / p.sum()) @ v[h // group]
    return out


def worst_rel_error(out, ref):
    num = np.linalg.norm(out - ref, axis=-1)
    den = np.maximum(np.linalg.norm(ref, axis=-1), 1e-30)
    return float((num / den).max())


@pytest.mark.parametrize("layout", [fd.Layout.TOKEN_MAJOR, fd.Layout.DIM_MAJOR])
def test_cache_decode_on_a_cuda_cache_matches_cpu_and_numpy(layout):
    lengths = [0, 1, 17, 100, 300]
    hq = 8
    ids = [1, 2, 3, 4, 5]
    tol = 5e-3  # bf16, as test_torch_cuda.py
    with fd.Cache(config(CUDA, layout=layout)) as gpu, fd.Cache(config(fd.Device.cpu(), layout=layout)) as cpu:
        fill_both([gpu, cpu], lengths, seed=5)
        cfg = gpu.config
        g = torch.Generator(device="cuda").manual_seed(9)
        q = (2.0 * torch.randn(len(ids), hq, cfg.head_dim, generator=g, device="cuda")).to(torch.bfloat16)
        tables, lens = cpu.export(ids)
        for layer in range(cfg.num_layers):
            ck, cv = cpu.layer_arrays(layer)
            ref = numpy_attention(as_f32(host_bits(q)), as_f32(ck), as_f32(cv), tables, lens, cfg.block_size, layout)
            out_cpu = as_f32(cpu.decode(layer, host_bits(q), ids, cpu_threads=1))
            out_gpu = gpu.decode(layer, q, ids)  # torch's current stream
            assert isinstance(out_gpu, torch.Tensor) and out_gpu.dtype == torch.bfloat16 and out_gpu.is_cuda
            torch.cuda.synchronize()
            g_err = worst_rel_error(out_gpu.float().cpu().numpy(), ref)
            c_err = worst_rel_error(out_cpu, ref)
            gc_err = worst_rel_error(out_gpu.float().cpu().numpy(), out_cpu)
            print(f"Cache.decode cuda {layout.name} layer {layer} lens={lengths}: gpu/numpy {g_err:.2e}, "
                  f"cpu/numpy {c_err:.2e}, gpu/cpu {gc_err:.2e} (tol {tol})")
            assert g_err <= tol and c_err <= tol and gc_err <= 2 * tol
            assert float(out_gpu[0].float().abs().max()) == 0.0  # the empty row
            # On a side stream, into a caller's out, with forced splits.
            side = torch.cuda.Stream()
            out2 = torch.full_like(out_gpu, float("nan"))
            side.wait_stream(torch.cuda.current_stream())  # q and out2 ready
            got = gpu.decode(layer, q, ids, out=out2, stream=side, num_splits=4)
            assert got is out2
            side.synchronize()
            assert worst_rel_error(out2.float().cpu().numpy(), ref) <= tol
        # Inside a transaction: the rows' new token is included.
        new_k = torch.randn(len(ids), 2, cfg.head_dim, generator=g, device="cuda").to(torch.bfloat16)
        new_v = torch.randn(len(ids), 2, cfg.head_dim, generator=g, device="cuda").to(torch.bfloat16)
        with gpu.begin(ids) as gtx, cpu.begin(ids) as ctx:
            for layer in range(cfg.num_layers):
                gtx.write_layer(layer, new_k, new_v)
                ctx.write_layer(layer, host_bits(new_k), host_bits(new_v))
            out_gpu = gpu.decode(1, q, tx=gtx)
            out_cpu = as_f32(cpu.decode(1, host_bits(q), tx=ctx, cpu_threads=1))
            torch.cuda.synchronize()
            ck, cv = cpu.layer_arrays(1)
            rows = ctx.rows()
            ref = numpy_attention(as_f32(host_bits(q)), as_f32(ck), as_f32(cv), ctx.block_tables(),
                                  rows.effective_seq_lens, cfg.block_size, layout)
            assert rows.effective_seq_lens.tolist() == [n + 1 for n in lengths]
            assert worst_rel_error(out_gpu.float().cpu().numpy(), ref) <= tol
            assert worst_rel_error(out_cpu, ref) <= tol
            gtx.commit()
            ctx.commit()
        # q on the wrong device or with the wrong row count is refused.
        with pytest.raises(fd.FlashDecError) as e:
            gpu.decode(0, host_bits(q), ids)
        assert e.value.status == fd.Status.INVALID_ARGUMENT and "expected cuda:0" in e.value.message
        with pytest.raises(fd.FlashDecError) as e:
            gpu.decode(0, q[:2], ids)
        assert "expected 5 rows" in e.value.message


def busy(stream):
    """Queues a long spin kernel on ``stream`` and returns at once."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(SLEEP_CYCLES)


@pytest.mark.parametrize("fmt", [fd.DType.FP8_E4M3, fd.DType.FP8_E5M2])
@pytest.mark.parametrize("layout", [fd.Layout.TOKEN_MAJOR, fd.Layout.DIM_MAJOR])
def test_fp8_cuda_cache_views_and_decode(layout, fmt):
    """An FP8 CUDA cache, E4M3 or E5M2 (bf16 input, per-layer scales, issue
    15): the layer views are zero-copy torch.float8_e4m3fn / float8_e5m2
    tensors holding the CPU backend's bytes, and Cache.decode (bf16 q and
    out) agrees with attention over the dequantised cache within 5e-3."""
    from test_fp8 import dequantise

    lengths = [1, 17, 100]
    ids = [1, 2, 3]
    tdt = torch.float8_e4m3fn if fmt == fd.DType.FP8_E4M3 else torch.float8_e5m2
    fp8 = dict(dtype=fmt, input_dtype=fd.DType.BF16, layout=layout)
    scales = dict(k_scales=[0.5, 0.03125], v_scales=[2.0, 0.25])
    with fd.Cache(config(CUDA, **fp8), **scales) as gpu, fd.Cache(config(fd.Device.cpu(), **fp8), **scales) as cpu:
        fill_both([gpu, cpu], lengths, seed=3)
        cfg = gpu.config
        g = torch.Generator(device="cuda").manual_seed(4)
        q = (3.0 * torch.randn(len(ids), 8, cfg.head_dim, generator=g, device="cuda")).to(torch.bfloat16)
        tables, lens = cpu.export(ids)
        for layer in range(cfg.num_layers):
            k, v = gpu.layer_arrays(layer)
            st = gpu.layer_storage(layer)
            assert k.dtype == v.dtype == tdt and (k.data_ptr(), v.data_ptr()) == (st.k, st.v)
            ck, cv = cpu.layer_arrays(layer)
            np.testing.assert_array_equal(k.view(torch.uint8).cpu().numpy(), ck)
            np.testing.assert_array_equal(v.view(torch.uint8).cpu().numpy(), cv)
            ks, vs = (float(x[layer]) for x in gpu.kv_scales())
            ref = numpy_attention(as_f32(host_bits(q)), dequantise(ck, cfg.dtype, ks), dequantise(cv, cfg.dtype, vs),
                                  tables, lens, cfg.block_size, layout)
            out = gpu.decode(layer, q, ids)
            assert out.dtype == torch.bfloat16 and out.is_cuda
            torch.cuda.synchronize()
            err = worst_rel_error(out.float().cpu().numpy(), ref)
            print(f"FP8 {fmt.name} Cache.decode cuda {layout.name} layer {layer}: worst row error {err:.2e}")
            assert err <= 5e-3


@pytest.mark.parametrize("how", ["current", "explicit"])
def test_side_stream_writes_with_a_busy_default_stream(how):
    # Issue 11/12 reproduction: work pending on the default (legacy) stream
    # while a cache is created and 20 tokens are written and committed on a
    # side stream through the binding; read back on that side stream.
    ids, steps = [1, 2, 3, 4], 5
    cfg = config(CUDA, head_dim=128)
    g = torch.Generator(device="cuda").manual_seed(3)
    inputs = [[torch.randn(len(ids), 2, 128, generator=g, device="cuda").to(torch.bfloat16) for _ in range(4)]
              for _ in range(steps)]
    torch.cuda.synchronize()  # inputs ready before the load starts
    side = torch.cuda.Stream()
    busy(torch.cuda.default_stream())
    with fd.Cache(cfg) as c:
        for r in ids:
            c.add_request(r)
        with torch.cuda.stream(side if how == "current" else torch.cuda.current_stream()):
            explicit = side if how == "explicit" else None
            for step in range(steps):
                k0, v0, k1, v1 = inputs[step]
                with c.begin(ids) as tx:
                    tx.write_layer(0, k0, v0, stream=explicit)
                    tx.write_layer(1, k1, v1, stream=explicit)
                    tx.commit()
        still_busy = not torch.cuda.default_stream().query()
        tables, lens = c.export(ids)
        assert lens.tolist() == [steps] * len(ids)
        with torch.cuda.stream(side):  # read back where the writes ran
            views = [c.layer_arrays(layer) for layer in range(2)]
            blocks = torch.tensor([[int(tables[r, 0])] * steps for r in range(len(ids))], device="cuda")
            offs = torch.arange(steps, device="cuda").expand(len(ids), steps)
            got = [(k[blocks, :, offs].clone(), v[blocks, :, offs].clone()) for k, v in views]  # [rows, steps, H, D]
        side.synchronize()
        intact = 0
        for r in range(len(ids)):
            for t in range(steps):
                k0, v0, k1, v1 = inputs[t]
                ok = all(
                    torch.equal(got[layer][which][r, t].view(torch.int16), x[r].view(torch.int16))
                    for layer, which, x in ((0, 0, k0), (0, 1, v0), (1, 0, k1), (1, 1, v1))
                )
                intact += ok
        print(f"busy default stream ({how} side stream): {intact}/{len(ids) * steps} tokens intact, "
              f"default stream still busy after the writes: {still_busy}")
        assert intact == len(ids) * steps
    torch.cuda.synchronize()


@pytest.mark.parametrize("how", ["current", "explicit"])
def test_engine_prefill_from_a_side_stream_waits_for_its_inputs(how):
    # k/v of each prompt token are produced by a copy queued on a side stream
    # behind a long spin; Engine.prefill (whose C call reads on the legacy
    # default stream) must see the produced values, not the stale buffers.
    cfg = config(CUDA, head_dim=128)
    layers, heads, d = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    g = torch.Generator(device="cuda").manual_seed(21)
    tokens = 3
    src_k = torch.randn(tokens, layers, heads, d, generator=g, device="cuda").to(torch.bfloat16)
    src_v = torch.randn(tokens, layers, heads, d, generator=g, device="cuda").to(torch.bfloat16)
    stale = torch.full((layers, heads, d), -7.0, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with fd.Cache(cfg) as c, fd.Engine(c, num_q_heads=8) as e:
        e.add_request(1)
        e.admit(1)
        keep = []
        for t in range(tokens):
            k = stale.clone()
            v = stale.clone()
            torch.cuda.synchronize()  # the stale values are in place
            with torch.cuda.stream(side):
                torch.cuda._sleep(SLEEP_CYCLES)
                k.copy_(src_k[t])
                v.copy_(src_v[t])
            if how == "current":
                with torch.cuda.stream(side):
                    e.prefill(1, k, v)
            else:
                e.prefill(1, k, v, stream=side)
            keep.append((k, v))
        # Ready for any stream on return: read on the default stream, no sync.
        tables, lens = c.export([1])
        assert lens.tolist() == [tokens]
        block = int(tables[0, 0])
        for layer in range(layers):
            kview, vview = c.layer_arrays(layer)
            got_v = vview[block, :, :tokens].permute(1, 0, 2).clone()  # [tokens, heads, d]
            got_k = kview[block, :, :tokens].permute(1, 0, 2).float().cpu().numpy()
            assert torch.equal(got_v.view(torch.int16), src_v[:, layer].contiguous().view(torch.int16)), layer
            # K is stored rotated at its position (RoPE over all of head_dim).
            want_k = np.stack([
                fd.rope_apply(src_k[t, layer].float().cpu().numpy()[None].copy(), [t], d)[0]
                for t in range(tokens)
            ])  # fmt: skip
            np.testing.assert_allclose(got_k, want_k, atol=2e-2, rtol=2e-2)
        print(f"engine prefill from a side stream ({how}): {tokens} tokens x {layers} layers stored as produced")
        e.validate()
    torch.cuda.synchronize()


def test_multi_token_transaction_on_a_cuda_cache_matches_cpu():
    """fd_tx_begin_multi on a CUDA cache: token offsets copied into a CUDA
    tensor on a side stream (fd_tx_token_indptr_async), packed layer writes
    of CUDA tensors, keep-commit; the stored K/V equal a CPU cache's."""
    g = torch.Generator(device="cuda").manual_seed(5)
    with fd.Cache(config(CUDA)) as gpu, fd.Cache(config(fd.Device.cpu())) as cpu:
        cfg = gpu.config
        kv = [[torch.randn(7, cfg.num_kv_heads, cfg.head_dim, generator=g, device="cuda").to(torch.bfloat16)
               for _ in range(2)] for _ in range(cfg.num_layers)]  # fmt: skip
        side = torch.cuda.Stream()
        for c in (gpu, cpu):
            for r in (1, 2):
                c.add_request(r)
            with c.begin([1, 2], token_counts=[4, 3]) as tx:
                assert tx.info().token_count == 7
                if c is gpu:
                    indptr = torch.full((3,), -1, dtype=torch.int32, device="cuda")
                    tables = torch.full((2, 1), -1, dtype=torch.int32, device="cuda")
                    # The fills run on the current stream: the side stream waits for them
                    # (without this the copies could land first and be overwritten).
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        tx.token_indptr_async(indptr)  # torch's current stream: side
                        tx.block_tables_async(tables)
                    side.synchronize()
                    assert indptr.cpu().tolist() == [0, 4, 7]
                    assert tables.cpu().tolist() == tx.block_tables().tolist()
                    with pytest.raises(fd.FlashDecError) as e:
                        tx.token_indptr_async(np.zeros(3, np.int32))  # host memory for a CUDA cache
                    assert e.value.status == fd.Status.INVALID_ARGUMENT and "token_indptr" in e.value.message
                for layer, (k, v) in enumerate(kv):
                    if c is gpu:
                        tx.write_layer(layer, k, v)
                    else:
                        tx.write_layer(layer, host_bits(k), host_bits(v))
                tx.commit(keep_counts=[2, 3])
        torch.cuda.synchronize()
        tables, lens = gpu.export([1, 2])
        assert lens.tolist() == [2, 3] == cpu.export([1, 2])[1].tolist()
        for layer in range(cfg.num_layers):
            gk, _ = gpu.layer_arrays(layer)
            ck, _ = cpu.layer_arrays(layer)
            for r, (first, n) in enumerate(((0, 2), (4, 3))):
                for t in range(n):
                    b = int(tables[r, 0])
                    assert (raw16(slot(gk, cfg.layout, b, t)) == raw16(slot(ck, cfg.layout, b, t))).all()
                    assert (raw16(slot(gk, cfg.layout, b, t)) == raw16(kv[layer][0][first + t])).all()
