//! FP8 K/V from Rust (issue 15, docs/semantics.md S1.1), on the CPU: the
//! bytes an FP8 cache stores (exactly representable values, saturation,
//! infinities, NaN of both signs, -0, per-layer scales), the append
//! primitives into FP8 pages, decode over an FP8 cache against the f32
//! reference over the dequantised K/V, set/get scales and their errors, and
//! the engine over an FP8 cache against the same step by hand.
mod common;
use common::noise;
use flashdec::*;

const H: u32 = 2;
const D: u32 = 8;
const BS: u32 = 4;
const TOKEN: usize = (H * D) as usize;

/// Inputs and the codes they store at scale 1, per format: exact values,
/// values between codes, saturation (infinity included), NaN of both signs
/// (0x7f), -0.
const VALUES: [f32; 16] = [1.0, 1.5, 500.0, 1e6, -1e9, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, -0.0, 0.0, 2.0, -448.0, 0.25, 3.0, 4.0];
const E4M3_CODES: [u8; 16] = [0x38, 0x3c, 0x7e, 0x7e, 0xfe, 0x7e, 0xfe, 0x7f, 0x7f, 0x80, 0x00, 0x40, 0xfe, 0x28, 0x44, 0x48];
const E5M2_CODES: [u8; 16] = [0x3c, 0x3e, 0x60, 0x7b, 0xfb, 0x7b, 0xfb, 0x7f, 0x7f, 0x80, 0x00, 0x40, 0xdf, 0x34, 0x42, 0x44];

fn fp8_config(dtype: DType, input: DType) -> CacheConfig {
    CacheConfig { num_layers: 2, num_kv_heads: H, head_dim: D, block_size: BS, max_blocks: 16, dtype, input_dtype: Some(input), ..CacheConfig::default() }
}

/// A copy of one layer's K and V bytes (packed storage) and the strides.
fn layer_bytes(cache: &Cache, layer: u32) -> (Vec<u8>, Vec<u8>, [i64; 4]) {
    let (k, v, strides) = cache.layer_storage(layer).unwrap();
    let n = strides[0] as usize * cache.config().max_blocks as usize;
    // SAFETY: the cache's own packed storage of this layer: max_blocks blocks of stride_block bytes.
    let copy = |p: *mut std::ffi::c_void| unsafe { std::slice::from_raw_parts(p as *const u8, n) }.to_vec();
    (copy(k), copy(v), strides)
}

/// The [H, D] bytes of the token at (block, offset).
fn token_bytes(bytes: &[u8], strides: [i64; 4], block: i32, offset: i32) -> Vec<u8> {
    let mut out = Vec::new();
    for h in 0..H as i64 {
        for d in 0..D as i64 {
            out.push(bytes[(block as i64 * strides[0] + h * strides[1] + offset as i64 * strides[2] + d * strides[3]) as usize]);
        }
    }
    out
}

#[test]
fn fp8_bits_to_f32() {
    assert_eq!(Fp8E4m3(0x7e).to_f32(), 448.0);
    assert_eq!(Fp8E4m3(0xfe).to_f32(), -448.0);
    assert_eq!(Fp8E4m3(0x38).to_f32(), 1.0);
    assert_eq!(Fp8E4m3(0x01).to_f32(), 2f32.powi(-9));
    assert!(Fp8E4m3(0x7f).to_f32().is_nan() && Fp8E4m3(0xff).to_f32().is_nan());
    assert_eq!(Fp8E5m2(0x7b).to_f32(), 57344.0);
    assert_eq!(Fp8E5m2(0x01).to_f32(), 2f32.powi(-16));
    assert_eq!(Fp8E5m2(0x7c).to_f32(), f32::INFINITY);
    assert!(Fp8E5m2(0x7d).to_f32().is_nan());
    for (i, &x) in VALUES.iter().enumerate() {
        let (a, b) = (Fp8E4m3(E4M3_CODES[i]).to_f32(), Fp8E5m2(E5M2_CODES[i]).to_f32());
        if x.is_nan() {
            assert!(a.is_nan() && b.is_nan());
        } else if x.abs() <= 4.0 || x == -448.0 {
            assert_eq!((a, b.to_bits() == x.to_bits() || b == x), (x, true), "{x}"); // exactly representable
        }
    }
    assert_eq!((DType::Fp8E4m3.size(), DType::Fp8E5m2.raw()), (1, 4));
    assert!(DType::Fp8E4m3.is_fp8() && !DType::Bf16.is_fp8());
}

/// Writes VALUES (K) and their negation (V) as the only token of request 1
/// into both layers, layer 1 multiplied by its scales, and checks the bytes.
fn check_stored_codes<T: Element>(dtype: DType, input: DType, codes: &[u8; 16], conv: impl Fn(f32) -> T) {
    let (k_scales, v_scales) = ([1.0f32, 2.0], [1.0f32, 0.25]);
    let mut cache = Cache::with_kv_scales(&fp8_config(dtype, input), &k_scales, &v_scales).unwrap();
    assert_eq!(cache.config().input_dtype, Some(input));
    assert_eq!(cache.kv_scales().unwrap(), (k_scales.to_vec(), v_scales.to_vec()));
    cache.add_request(1).unwrap();
    let mut tx = cache.begin(&[1]).unwrap();
    let rows = tx.rows().unwrap();
    for layer in 0..2 {
        // (x * s) / s == x in FP32 for every value here: layer 1 stores layer 0's codes.
        let k: Vec<T> = VALUES.iter().map(|&x| conv(x * k_scales[layer])).collect();
        let v: Vec<T> = VALUES.iter().map(|&x| conv(-x * v_scales[layer])).collect();
        tx.write_layer(layer as u32, &k, &v).unwrap();
    }
    tx.commit().map_err(|(e, _)| e).unwrap();
    let neg: Vec<u8> = codes.iter().map(|&c| if c == 0x7f { c } else { c ^ 0x80 }).collect();
    for layer in 0..2 {
        let (kb, vb, strides) = layer_bytes(&cache, layer);
        assert_eq!(token_bytes(&kb, strides, rows.block_ids[0], rows.offsets[0]), codes.to_vec(), "{dtype:?} {input:?} layer {layer} K");
        assert_eq!(token_bytes(&vb, strides, rows.block_ids[0], rows.offsets[0]), neg, "{dtype:?} {input:?} layer {layer} V");
    }
}

#[test]
fn fp8_cache_stores_the_quantised_bytes() {
    check_stored_codes(DType::Fp8E4m3, DType::F32, &E4M3_CODES, |x| x);
    check_stored_codes(DType::Fp8E5m2, DType::F32, &E5M2_CODES, |x| x);
    check_stored_codes(DType::Fp8E4m3, DType::Bf16, &E4M3_CODES, Bf16::from_f32);
    // f16: 1e6 and -1e9 are f16 infinities, which saturate as well.
    check_stored_codes(DType::Fp8E5m2, DType::F16, &E5M2_CODES, F16::from_f32);
}

#[test]
fn fp8_cache_refuses_other_element_types_and_bad_configs() {
    let mut cache = Cache::new(&fp8_config(DType::Fp8E4m3, DType::F16)).unwrap();
    assert_eq!(cache.kv_scales().unwrap(), (vec![1.0, 1.0], vec![1.0, 1.0])); // no scales given: all 1
    cache.add_request(1).unwrap();
    let mut tx = cache.begin(&[1]).unwrap();
    let e = tx.write_layer(0, &[0f32; TOKEN], &[0f32; TOKEN]).unwrap_err();
    assert!(e.status == Status::InvalidArgument && e.message.contains("does not match the cache's F16"), "{e}");
    drop(tx);
    let e = Cache::new(&CacheConfig { input_dtype: None, ..fp8_config(DType::Fp8E4m3, DType::F16) }).err().unwrap();
    assert!(e.status == Status::InvalidArgument && e.message.contains("input_dtype"), "{e}");
    let e = Cache::with_kv_scales(&fp8_config(DType::Fp8E5m2, DType::Bf16), &[1.0, -2.0], &[1.0, 1.0]).err().unwrap();
    assert!(e.status == Status::InvalidArgument && e.message.contains("k_scales[1]"), "{e}");
    let e = Cache::with_kv_scales(&fp8_config(DType::Fp8E5m2, DType::Bf16), &[1.0], &[1.0, 1.0]).err().unwrap();
    assert!(e.status == Status::InvalidArgument && e.message.contains("k_scales: expected 2 entries"), "{e}");
    let f16 = CacheConfig { dtype: DType::F16, input_dtype: None, ..fp8_config(DType::F16, DType::F16) };
    let e = Cache::with_kv_scales(&f16, &[1.0, 1.0], &[1.0, 1.0]).err().unwrap(); // scales only for FP8
    assert!(e.status == Status::InvalidArgument && e.message.contains("k_scales"), "{e}");
}

#[test]
fn set_and_get_kv_scales() {
    let mut cache = Cache::new(&fp8_config(DType::Fp8E4m3, DType::F32)).unwrap();
    cache.set_kv_scales(&[0.25, 4.0], &[2.0, 0.5]).unwrap();
    assert_eq!(cache.kv_scales().unwrap(), (vec![0.25, 4.0], vec![2.0, 0.5]));
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let e = cache.set_kv_scales(&[1.0, bad], &[1.0, 1.0]).unwrap_err();
        assert!(e.status == Status::InvalidArgument && e.message.contains("k_scales[1]"), "{bad}: {e}");
        let e = cache.set_kv_scales(&[1.0, 1.0], &[bad, 1.0]).unwrap_err();
        assert!(e.status == Status::InvalidArgument && e.message.contains("v_scales[0]"), "{bad}: {e}");
    }
    let e = cache.set_kv_scales(&[1.0, 1.0, 1.0], &[1.0, 1.0]).unwrap_err();
    assert!(e.status == Status::InvalidArgument && e.message.contains("k_scales: expected 2 entries"), "{e}");
    assert_eq!(cache.kv_scales().unwrap(), (vec![0.25, 4.0], vec![2.0, 0.5])); // nothing changed
    // Later writes quantise with the new scales: 3 / 0.25 = 12 (0x54), 3 / 2 = 1.5 (0x3c).
    cache.add_request(1).unwrap();
    let mut tx = cache.begin(&[1]).unwrap();
    let rows = tx.rows().unwrap();
    tx.write_layer(0, &[3f32; TOKEN], &[3f32; TOKEN]).unwrap();
    tx.write_layer(1, &[3f32; TOKEN], &[3f32; TOKEN]).unwrap();
    tx.commit().map_err(|(e, _)| e).unwrap();
    let (kb, vb, strides) = layer_bytes(&cache, 0);
    assert_eq!(token_bytes(&kb, strides, rows.block_ids[0], rows.offsets[0]), vec![0x54; TOKEN]);
    assert_eq!(token_bytes(&vb, strides, rows.block_ids[0], rows.offsets[0]), vec![0x3c; TOKEN]);
    let mut f16 = Cache::new(&CacheConfig { dtype: DType::F16, input_dtype: None, ..fp8_config(DType::F16, DType::F16) }).unwrap();
    assert_eq!(f16.kv_scales().unwrap(), (vec![1.0, 1.0], vec![1.0, 1.0])); // not FP8: all 1
    let e = f16.set_kv_scales(&[1.0, 1.0], &[1.0, 1.0]).unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "{e}");
}

#[test]
fn append_primitives_quantise_into_fp8_pages() {
    let nb = 3;
    let (mut kc, mut vc) = (vec![Fp8E4m3(0); nb * BS as usize * TOKEN], vec![Fp8E4m3(0); nb * BS as usize * TOKEN]);
    let k: Vec<f32> = VALUES.iter().map(|&x| x * 0.5).collect();
    let v: Vec<f32> = VALUES.iter().map(|&x| x * 4.0).collect();
    let mut pages = PagedKvMut { k: &mut kc, v: &mut vc, num_kv_heads: H, head_dim: D, block_size: BS, layout: Layout::TokenMajor };
    kv_append_scaled(&mut pages, &k, &v, &[2], &[1], 0.5, 4.0).unwrap();
    let e = kv_append_scaled(&mut pages, &k, &v, &[0], &[0], 0.0, 1.0).unwrap_err(); // nothing written
    assert!(e.status == Status::InvalidArgument && e.message.contains("k_scale"), "{e}");
    let bytes = |x: &[Fp8E4m3], block: usize, offset: usize| -> Vec<u8> {
        (0..TOKEN).map(|i| x[block * BS as usize * TOKEN + (i / D as usize) * (BS * D) as usize + offset * D as usize + i % D as usize].0).collect()
    };
    assert_eq!(bytes(&kc, 2, 1), E4M3_CODES.to_vec());
    assert_eq!(bytes(&vc, 2, 1), E4M3_CODES.to_vec());
    assert!(kc[..2 * BS as usize * TOKEN].iter().all(|b| b.0 == 0));
    let mut f32_pages = (vec![0f32; nb * BS as usize * TOKEN], vec![0f32; nb * BS as usize * TOKEN]);
    let mut pages = PagedKvMut { k: &mut f32_pages.0, v: &mut f32_pages.1, num_kv_heads: H, head_dim: D, block_size: BS, layout: Layout::TokenMajor };
    let e = kv_append_scaled(&mut pages, &k, &v, &[0], &[0], 1.0, 2.0).unwrap_err(); // scales only into FP8
    assert!(e.status == Status::InvalidArgument && e.message.contains("v_scale"), "{e}");
}

/// The cache's committed tokens of `ids` dequantised with the layer's
/// scales, dense [batch, H, max_len, D] f32, and the lengths.
fn dense_kv(cache: &Cache, layer: u32, ids: &[u64]) -> (Vec<f32>, Vec<f32>, Vec<i32>) {
    let ex = cache.export(ids, None).unwrap();
    let (kb, vb, strides) = layer_bytes(cache, layer);
    let (ks, vs) = cache.kv_scales().unwrap();
    let max_len = *ex.seq_lens.iter().max().unwrap() as usize;
    let (mut k, mut v) = (vec![0f32; ids.len() * TOKEN * max_len], vec![0f32; ids.len() * TOKEN * max_len]);
    for (b, &n) in ex.seq_lens.iter().enumerate() {
        for t in 0..n as usize {
            let block = ex.block_tables[b * ex.table_stride as usize + t / BS as usize];
            let (kt, vt) = (token_bytes(&kb, strides, block, (t % BS as usize) as i32), token_bytes(&vb, strides, block, (t % BS as usize) as i32));
            for h in 0..H as usize {
                for d in 0..D as usize {
                    let at = ((b * H as usize + h) * max_len + t) * D as usize + d;
                    k[at] = Fp8E4m3(kt[h * D as usize + d]).to_f32() * ks[layer as usize];
                    v[at] = Fp8E4m3(vt[h * D as usize + d]).to_f32() * vs[layer as usize];
                }
            }
        }
    }
    (k, v, ex.seq_lens)
}

/// Worst over rows of max |got - want| / max |want|.
fn worst_row_error(got: &[f32], want: &[f32]) -> f32 {
    got.chunks(D as usize)
        .zip(want.chunks(D as usize))
        .map(|(g, w)| {
            let den = w.iter().fold(0f32, |m, x| m.max(x.abs()));
            g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / den
        })
        .fold(0f32, f32::max)
}

fn fill(cache: &mut Cache, ids: &[u64], steps: usize, seed: &mut u64) {
    for &id in ids {
        cache.add_request(id).unwrap();
    }
    for _ in 0..steps {
        let mut tx = cache.begin(ids).unwrap();
        for layer in 0..2 {
            let k: Vec<Bf16> = noise(seed, ids.len() * TOKEN).iter().map(|&x| Bf16::from_f32(6.0 * x)).collect();
            let v: Vec<Bf16> = noise(seed, ids.len() * TOKEN).iter().map(|&x| Bf16::from_f32(6.0 * x)).collect();
            tx.write_layer(layer, &k, &v).unwrap();
        }
        tx.commit().map_err(|(e, _)| e).unwrap();
    }
}

#[test]
fn decode_over_an_fp8_cache_matches_the_reference_over_dequantised_values() {
    const HQ: u32 = 4;
    let ids = [1u64, 2, 3];
    let mut seed = 17;
    let mut cache = Cache::with_kv_scales(&fp8_config(DType::Fp8E4m3, DType::Bf16), &[0.5, 2.0], &[1.5, 0.25]).unwrap();
    fill(&mut cache, &ids, 9, &mut seed);
    let q: Vec<f32> = noise(&mut seed, ids.len() * (HQ * D) as usize).iter().map(|&x| 6.0 * x).collect(); // ~3 N(0,1) in spread
    let ex = cache.export(&ids, None).unwrap();
    for layer in 0..2 {
        let (k, v, lens) = dense_kv(&cache, layer, &ids);
        let mut want = vec![0f32; q.len()];
        reference_attention(&q, None, HQ, &k, &v, H, D, &lens, &ReferenceOptions::default(), &mut want).unwrap();
        let mut out = vec![0f32; q.len()];
        cache.decode_layer(layer, &q, HQ, &ex.block_tables, &ex.seq_lens, &mut out, 1).unwrap();
        let err = worst_row_error(&out, &want);
        assert!(err <= 5e-3, "f32 q/out layer {layer}: {err}");
        let qb: Vec<Bf16> = q.iter().map(|&x| Bf16::from_f32(x)).collect();
        let mut outb = vec![Bf16(0); q.len()];
        cache.decode_layer(layer, &qb, HQ, &ex.block_tables, &ex.seq_lens, &mut outb, 1).unwrap();
        let qb32: Vec<f32> = qb.iter().map(|x| x.to_f32()).collect();
        reference_attention(&qb32, None, HQ, &k, &v, H, D, &lens, &ReferenceOptions::default(), &mut want).unwrap();
        let err = worst_row_error(&outb.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), &want);
        assert!(err <= 5e-3, "bf16 q/out layer {layer}: {err}");
        // The same call by hand over the FP8 bytes with the layer's scales, and through a plan.
        let (kb, vb, _) = layer_bytes(&cache, layer);
        let (kf, vf): (Vec<Fp8E4m3>, Vec<Fp8E4m3>) = (kb.iter().map(|&b| Fp8E4m3(b)).collect(), vb.iter().map(|&b| Fp8E4m3(b)).collect());
        let paged = PagedKv { k: &kf, v: &vf, num_kv_heads: H, head_dim: D, block_size: BS, layout: Layout::TokenMajor };
        let (ks, vs) = cache.kv_scales().unwrap();
        let options = DecodeOptions { k_scale: ks[layer as usize], v_scale: vs[layer as usize], cpu_threads: 1, ..DecodeOptions::default() };
        let mut by_hand = vec![0f32; q.len()];
        decode(&q, HQ, &paged, &ex.block_tables, &ex.seq_lens, &mut by_hand, options).unwrap();
        assert_eq!(by_hand, out);
        let plan = DecodePlan::new(&q, HQ, &paged, &ex.block_tables, &ex.seq_lens, &by_hand, DecodeOptions::default(), None).unwrap();
        let mut planned = vec![0f32; q.len()];
        plan.run_scaled(&q, HQ, &paged, &ex.block_tables, &ex.seq_lens, &mut planned, ks[layer as usize], vs[layer as usize]).unwrap();
        assert_eq!(planned, out);
        let e = decode(&q, HQ, &paged, &ex.block_tables, &ex.seq_lens, &mut by_hand, DecodeOptions { v_scale: -1.0, ..options }).unwrap_err();
        assert!(e.status == Status::InvalidArgument && e.message.contains("v_scale"), "{e}");
    }
}

#[test]
fn engine_step_over_an_fp8_cache_equals_the_step_by_hand() {
    const HQ: u32 = 4;
    let config = fp8_config(DType::Fp8E4m3, DType::Bf16);
    let (mut engine_cache, mut twin) = (
        Cache::with_kv_scales(&config, &[0.5, 2.0], &[1.5, 0.25]).unwrap(),
        Cache::with_kv_scales(&config, &[0.5, 2.0], &[1.5, 0.25]).unwrap(),
    );
    let mut seed = 5;
    let bf = |seed: &mut u64, n: usize| -> Vec<Bf16> { noise(seed, n).iter().map(|&x| Bf16::from_f32(6.0 * x)).collect() };
    let mut ec = engine_config_default();
    ec.num_q_heads = HQ;
    ec.rotary_dim = D;
    ec.cpu_threads = 1;
    let mut eng = Engine::new(&mut engine_cache, &ec).unwrap();
    for id in [1, 2] {
        eng.add_request(id).unwrap();
        eng.admit(id).unwrap();
        twin.add_request(id).unwrap();
    }
    for step_no in 0..2 {
        if step_no == 1 {
            // A scale change between steps applies to the next.
            eng.set_kv_scales(&[1.0, 0.125], &[3.0, 1.0]).unwrap();
            twin.set_kv_scales(&[1.0, 0.125], &[3.0, 1.0]).unwrap();
        }
        let inputs: Vec<[Vec<Bf16>; 3]> = (0..2).map(|_| [bf(&mut seed, 2 * (HQ * D) as usize), bf(&mut seed, 2 * TOKEN), bf(&mut seed, 2 * TOKEN)]).collect();
        let mut got = vec![vec![Bf16(0); 2 * (HQ * D) as usize]; 2];
        let StepOutcome::Opened(mut step) = eng.begin_step(&[1, 2]).unwrap() else { panic!("backpressure") };
        for (layer, [q, k, v]) in inputs.iter().enumerate() {
            step.layer(layer as u32, q, k, v, &mut got[layer]).unwrap();
        }
        step.commit().unwrap();
        let mut tx = twin.begin(&[1, 2]).unwrap();
        for (layer, [q, k, v]) in inputs.iter().enumerate() {
            let mut q_rot = vec![Bf16(0); q.len()];
            tx.write_layer_rope(layer as u32, q, HQ, k, v, D, 10000.0, &mut q_rot).unwrap();
            let (stride, tables) = tx.block_tables(None).unwrap();
            assert!(stride >= 1);
            let lens = tx.rows().unwrap().effective_seq_lens;
            let mut want = vec![Bf16(0); q.len()];
            tx.cache().decode_layer(layer as u32, &q_rot, HQ, &tables, &lens, &mut want, 1).unwrap();
            assert_eq!(got[layer], want, "step {step_no} layer {layer}");
        }
        tx.commit().map_err(|(e, _)| e).unwrap();
        for layer in 0..2 {
            assert_eq!(layer_bytes(eng.cache(), layer), layer_bytes(&twin, layer), "step {step_no} layer {layer}: stored bytes");
        }
    }
}
