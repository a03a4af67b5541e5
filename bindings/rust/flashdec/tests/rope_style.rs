//! RoPE conventions (`fd_rope_style`, S3.1): `RopeStyle`, `rope_apply_style`,
//! `CacheConfig::rope_style` and `rope_kv_append_style`, on the CPU.
mod common;
use common::{noise, small};
use flashdec::*;

const H: u32 = 2;
const D: u32 = 8;

/// The interleaved form in f64: pair i is (2i, 2i + 1) at angle
/// p * base^(-2i / rotary_dim); dims from rotary_dim on unchanged.
fn interleaved(x: &[f32], heads: u32, positions: &[i32], rotary_dim: u32, base: f64) -> Vec<f64> {
    let (d, r) = (D as usize, rotary_dim as usize);
    let mut y: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (t, &p) in positions.iter().enumerate() {
        for h in 0..heads as usize {
            let row = (t * heads as usize + h) * d;
            for i in 0..r / 2 {
                let angle = p as f64 * base.powf(-2.0 * i as f64 / r as f64);
                let (s, c) = angle.sin_cos();
                let (a, b) = (x[row + 2 * i] as f64, x[row + 2 * i + 1] as f64);
                y[row + 2 * i] = a * c - b * s;
                y[row + 2 * i + 1] = b * c + a * s;
            }
        }
    }
    y
}

#[test]
fn enum_values_and_defaults() {
    assert_eq!(RopeStyle::SplitHalf.raw(), sys::FD_ROPE_SPLIT_HALF);
    assert_eq!(RopeStyle::Interleaved.raw(), 1);
    assert_eq!(RopeStyle::from_raw(1), Some(RopeStyle::Interleaved));
    assert_eq!(RopeStyle::from_raw(2), None);
    assert_eq!(RopeStyle::default(), RopeStyle::SplitHalf);
    assert_eq!(CacheConfig::default().rope_style, RopeStyle::SplitHalf);
    let cache = Cache::new(&small(1)).unwrap();
    assert_eq!(cache.config().rope_style, RopeStyle::SplitHalf);
}

#[test]
fn interleaved_matches_the_formula_full_and_partial() {
    let mut seed = 21;
    let positions = [0, 1, 9];
    let x = noise(&mut seed, 3 * (H * D) as usize);
    for rotary_dim in [8, 6] {
        let mut y = x.clone();
        rope_apply_style(&mut y, H, D, &positions, rotary_dim, 100.0, RopeStyle::Interleaved).unwrap();
        let want = interleaved(&x, H, &positions, rotary_dim, 100.0);
        for (i, (&got, &w)) in y.iter().zip(&want).enumerate() {
            assert!((got as f64 - w).abs() <= 1e-5 * w.abs() + 1e-6, "rotary_dim {rotary_dim}, element {i}: {got} vs {w}");
            if i % D as usize >= rotary_dim as usize {
                assert_eq!(got, x[i], "the tail from rotary_dim on passes through");
            }
        }
        let mut split = x.clone();
        rope_apply(&mut split, H, D, &positions, rotary_dim, 100.0).unwrap();
        assert_ne!(split, y);
    }
}

#[test]
fn split_half_is_the_default_and_rope_apply_unchanged() {
    let mut seed = 22;
    let x: Vec<F16> = noise(&mut seed, 2 * (H * D) as usize).into_iter().map(F16::from_f32).collect();
    let (mut a, mut b) = (x.clone(), x.clone());
    rope_apply(&mut a, H, D, &[3, 11], 6, 10000.0).unwrap();
    rope_apply_style(&mut b, H, D, &[3, 11], 6, 10000.0, RopeStyle::default()).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, x);
}

#[test]
fn interleaved_cache_stores_k_rotated_interleaved() {
    let cfg = CacheConfig { rope_style: RopeStyle::Interleaved, ..small(2) };
    let mut cache = Cache::new(&cfg).unwrap();
    assert_eq!(cache.config().rope_style, RopeStyle::Interleaved);
    cache.add_request(1).unwrap();
    let tok = (H * D) as usize;
    let mut seed = 23;
    for step in 0..3 {
        let (q, k, v) = (noise(&mut seed, 2 * tok), noise(&mut seed, tok), noise(&mut seed, tok));
        let mut q_out = vec![0f32; q.len()];
        let mut tx = cache.begin(&[1]).unwrap();
        let rows = tx.rows().unwrap();
        let (pos, blk, off) = (rows.positions[0], rows.block_ids[0], rows.offsets[0]);
        assert_eq!(pos, step);
        tx.write_layer(0, &k, &v).unwrap();
        tx.write_layer_rope(1, &q, 2 * H, &k, &v, 6, 500.0, &mut q_out).unwrap();
        tx.commit().map_err(|(e, _)| e).unwrap();

        let mut q_ref = q.clone();
        rope_apply_style(&mut q_ref, 2 * H, D, &[pos], 6, 500.0, RopeStyle::Interleaved).unwrap();
        assert_eq!(q_out, q_ref);
        let mut k_ref = k.clone();
        rope_apply_style(&mut k_ref, H, D, &[pos], 6, 500.0, RopeStyle::Interleaved).unwrap();
        let (ks, vs, st) = cache.layer_storage(1).unwrap();
        let (mut stored_k, mut stored_v) = (Vec::new(), Vec::new());
        for h in 0..H as i64 {
            for d in 0..D as i64 {
                let i = (blk as i64 * st[0] + h * st[1] + off as i64 * st[2] + d * st[3]) as usize;
                // SAFETY: an element of the cache's own f32 storage of layer 1, inside its strides.
                unsafe {
                    stored_k.push(*(ks as *const f32).add(i));
                    stored_v.push(*(vs as *const f32).add(i));
                }
            }
        }
        assert_eq!(stored_k, k_ref);
        assert_eq!(stored_v, v); // V raw
        if pos > 0 {
            let mut split = k.clone();
            rope_apply(&mut split, H, D, &[pos], 6, 500.0).unwrap();
            assert_ne!(stored_k, split);
        }
    }
}

#[test]
fn rope_kv_append_style_matches_rope_apply_style() {
    const BS: u32 = 4;
    let tok = (H * D) as usize;
    let block = tok * BS as usize;
    let mut seed = 24;
    let (q, k, v) = (noise(&mut seed, 2 * 2 * tok), noise(&mut seed, 2 * tok), noise(&mut seed, 2 * tok));
    let positions = [7, 2];
    for style in [RopeStyle::SplitHalf, RopeStyle::Interleaved] {
        let (mut kc, mut vc) = (vec![0f32; 3 * block], vec![0f32; 3 * block]);
        let mut pages = PagedKvMut { k: &mut kc, v: &mut vc, num_kv_heads: H, head_dim: D, block_size: BS, layout: Layout::TokenMajor };
        let mut q_out = vec![0f32; q.len()];
        rope_kv_append_style(&mut pages, &q, 2 * H, &k, &v, &[1, 2], &[0, 3], &positions, 6, 500.0, style, &mut q_out, 1.0, 1.0).unwrap();
        let mut q_ref = q.clone();
        rope_apply_style(&mut q_ref, 2 * H, D, &positions, 6, 500.0, style).unwrap();
        assert_eq!(q_out, q_ref);
        let mut k_ref = k.clone();
        rope_apply_style(&mut k_ref, H, D, &positions, 6, 500.0, style).unwrap();
        let slot = |c: &[f32], b: usize, o: usize| -> Vec<f32> {
            (0..H as usize).flat_map(|h| c[b * block + (h * BS as usize + o) * D as usize..][..D as usize].to_vec()).collect()
        };
        assert_eq!(slot(&kc, 1, 0), k_ref[..tok]);
        assert_eq!(slot(&kc, 2, 3), k_ref[tok..]);
        assert_eq!(slot(&vc, 2, 3), v[tok..]);
        if style == RopeStyle::SplitHalf {
            // rope_kv_append (no style) is split-half
            let (mut kc2, mut vc2) = (vec![0f32; 3 * block], vec![0f32; 3 * block]);
            let mut p2 = PagedKvMut { k: &mut kc2, v: &mut vc2, num_kv_heads: H, head_dim: D, block_size: BS, layout: Layout::TokenMajor };
            let mut q2 = vec![0f32; q.len()];
            rope_kv_append(&mut p2, &q, 2 * H, &k, &v, &[1, 2], &[0, 3], &positions, 6, 500.0, &mut q2).unwrap();
            assert_eq!((q2, kc2), (q_out, kc));
        }
    }
}

#[test]
fn unknown_style_is_refused_and_writes_nothing() {
    // RopeStyle holds only known values; an unknown raw value reaches the
    // library through sys and the raw append parameters.
    let mut x = vec![1f32; (H * D) as usize];
    let pos = [3i32];
    let status = unsafe { sys::fd_rope_apply_style(DType::F32.raw(), x.as_mut_ptr().cast(), 1, H, D, pos.as_ptr(), D, 10000.0, 2) };
    let e = check_status(status).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("rope_style 2 is not an fd_rope_style"), "{}", e.message);
    assert!(x.iter().all(|&v| v == 1.0));

    let (k, v) = (vec![1f32; (H * D) as usize], vec![1f32; (H * D) as usize]);
    let q = vec![1f32; (H * D) as usize];
    let mut q_out = vec![7f32; q.len()];
    let (mut kc, mut vc) = (vec![0f32; (H * D * 4) as usize], vec![0f32; (H * D * 4) as usize]);
    let (ids, offs) = ([0i32], [0i32]);
    let mut p = default_kv_append_params();
    p.dtype = DType::F32.raw();
    p.cache_dtype = DType::F32.raw();
    (p.num_tokens, p.num_kv_heads, p.num_q_heads, p.head_dim, p.block_size, p.num_blocks) = (1, H, H, D, 4, 1);
    (p.k, p.v, p.q) = (k.as_ptr().cast(), v.as_ptr().cast(), q.as_ptr().cast());
    (p.k_cache, p.v_cache, p.q_out) = (kc.as_mut_ptr().cast(), vc.as_mut_ptr().cast(), q_out.as_mut_ptr().cast());
    (p.block_ids, p.offsets, p.positions) = (ids.as_ptr(), offs.as_ptr(), pos.as_ptr());
    p.rotary_dim = D;
    p.rope_style = 5;
    // SAFETY: every pointer is a live host buffer of the described shape.
    let e = unsafe { run_rope_kv_append(&p) }.unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("params->rope_style 5"), "{}", e.message);
    assert!(kc.iter().chain(&vc).all(|&x| x == 0.0) && q_out.iter().all(|&x| x == 7.0));
    p.rope_style = RopeStyle::Interleaved.raw();
    unsafe { run_rope_kv_append(&p) }.unwrap(); // the same call with a known style goes through
    assert!(kc.iter().any(|&x| x != 0.0));
}
