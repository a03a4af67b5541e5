//! Append primitives, external storage, async exports and the async error
//! query, on the CPU: slots written exactly, failures write nothing.
mod common;
use common::{noise, small};
use flashdec::*;

const H: u32 = 2;
const D: u32 = 8;
const BS: u32 = 4;
const NB: usize = 5;
const BLOCK: usize = (H * D * BS) as usize;

/// Token-major index of (block, head, offset, dim).
fn at(block: usize, h: usize, offset: usize, d: usize) -> usize {
    ((block * H as usize + h) * BS as usize + offset) * D as usize + d
}

fn token_of(cache: &[f32], block: usize, offset: usize) -> Vec<f32> {
    (0..H as usize).flat_map(|h| (0..D as usize).map(move |d| (h, d))).map(|(h, d)| cache[at(block, h, offset, d)]).collect()
}

fn pages<'a>(k: &'a mut [f32], v: &'a mut [f32]) -> PagedKvMut<'a, f32> {
    PagedKvMut { k, v, num_kv_heads: H, head_dim: D, block_size: BS, layout: Layout::TokenMajor }
}

#[test]
fn kv_append_writes_exactly_the_slots() {
    let (mut kc, mut vc) = (vec![0f32; NB * BLOCK], vec![0f32; NB * BLOCK]);
    let mut seed = 3;
    let tok = (H * D) as usize;
    let (k, v) = (noise(&mut seed, 3 * tok), noise(&mut seed, 3 * tok));
    let (ids, offs) = ([4, 0, 4], [3, 1, 0]);
    kv_append(&mut pages(&mut kc, &mut vc), &k, &v, &ids, &offs).unwrap();
    for i in 0..3 {
        assert_eq!(token_of(&kc, ids[i] as usize, offs[i] as usize), k[i * tok..(i + 1) * tok]);
        assert_eq!(token_of(&vc, ids[i] as usize, offs[i] as usize), v[i * tok..(i + 1) * tok]);
    }
    let written = kc.iter().filter(|x| **x != 0.0).count();
    assert_eq!(written, k.iter().filter(|x| **x != 0.0).count());
}

#[test]
fn rope_kv_append_matches_rope_apply() {
    let (mut kc, mut vc) = (vec![0f32; NB * BLOCK], vec![0f32; NB * BLOCK]);
    let mut seed = 4;
    let tok = (H * D) as usize;
    let (q, k, v) = (noise(&mut seed, 2 * 2 * tok), noise(&mut seed, 2 * tok), noise(&mut seed, 2 * tok));
    let positions = [7, 0];
    let mut q_out = vec![0f32; q.len()];
    rope_kv_append(&mut pages(&mut kc, &mut vc), &q, 2 * H, &k, &v, &[1, 2], &[0, 3], &positions, D, 500.0, &mut q_out).unwrap();
    let mut q_ref = q.clone();
    rope_apply(&mut q_ref, 2 * H, D, &positions, D, 500.0).unwrap();
    assert_eq!(q_out, q_ref);
    let mut k_ref = k.clone();
    rope_apply(&mut k_ref, H, D, &positions, D, 500.0).unwrap();
    assert_eq!(token_of(&kc, 1, 0), k_ref[..tok]);
    assert_eq!(token_of(&kc, 2, 3), k_ref[tok..]);
    assert_eq!(token_of(&vc, 2, 3), v[tok..]); // V raw
    assert_ne!(k_ref[..tok], k[..tok]);
}

#[test]
fn append_failures_write_nothing() {
    let (mut kc, mut vc) = (vec![0f32; NB * BLOCK], vec![0f32; NB * BLOCK]);
    let mut seed = 5;
    let tok = (H * D) as usize;
    let (k, v) = (noise(&mut seed, 2 * tok), noise(&mut seed, 2 * tok));
    let e = kv_append(&mut pages(&mut kc, &mut vc), &k, &v, &[0, NB as i32], &[0, 0]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("block_ids[1] = 5 is out of range"), "{}", e.message);
    let e = kv_append(&mut pages(&mut kc, &mut vc), &k, &v, &[0, 1], &[0, BS as i32]).unwrap_err();
    assert!(e.message.contains("offsets[1] = 4 is out of range"), "{}", e.message);
    let q = noise(&mut seed, 2 * tok);
    let mut q_out = vec![7f32; q.len()];
    let e = rope_kv_append(&mut pages(&mut kc, &mut vc), &q, H, &k, &v, &[0, 1], &[0, 0], &[3, -2], D, 1e4, &mut q_out).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("positions[1] = -2 must be >= 0"), "{}", e.message);
    let e = rope_kv_append(&mut pages(&mut kc, &mut vc), &q, H, &k, &v, &[0, 1], &[0, 0], &[3, 2], 3, 1e4, &mut q_out).unwrap_err();
    assert!(e.message.contains("rotary_dim"), "{}", e.message);
    // Binding checks name the argument.
    let e = kv_append(&mut pages(&mut kc, &mut vc), &k, &v, &[0], &[0, 1]).unwrap_err();
    assert!(e.message.contains("offsets: expected 1 entries"), "{}", e.message);
    let e = kv_append(&mut pages(&mut kc[..BLOCK + 1], &mut vc[..BLOCK + 1]), &k, &v, &[0, 1], &[0, 1]).unwrap_err();
    assert!(e.message.contains("pages.k"), "{}", e.message);
    assert!(kc.iter().chain(vc.iter()).all(|x| *x == 0.0));
    assert!(q_out.iter().all(|x| *x == 7.0));
}

#[test]
fn external_storage_receives_the_writes() {
    let cfg = small(2);
    let elems = 2 * 8 * BLOCK;
    let (mut ks, mut vs) = (vec![0f32; elems], vec![0f32; elems]);
    let storage = ExternalStorage::packed(ks.as_mut_ptr().cast(), vs.as_mut_ptr().cast());
    // SAFETY: both vectors hold the packed layers and outlive the cache.
    let mut c = unsafe { Cache::with_storage(&cfg, &storage) }.unwrap();
    assert!(c.has_external_storage());
    c.add_request(1).unwrap();
    let mut seed = 6;
    let k = noise(&mut seed, (H * D) as usize);
    let mut tx = c.begin(&[1]).unwrap();
    let row = tx.rows().unwrap();
    tx.write_layer(0, &k, &k).unwrap();
    tx.write_layer(1, &k, &k).unwrap();
    tx.commit().map_err(|(e, _)| e).unwrap();
    let (b, o) = (row.block_ids[0] as usize, row.offsets[0] as usize);
    drop(c);
    assert_eq!(token_of(&ks[8 * BLOCK..], b, o), k); // layer 1
    assert_eq!(token_of(&vs, b, o), k); // layer 0
    assert!(!Cache::new(&cfg).unwrap().has_external_storage());
}

#[test]
fn external_storage_errors_name_the_field() {
    let mut ks = vec![0f32; 8 * BLOCK];
    let one_sided = ExternalStorage { v: std::ptr::null_mut(), ..ExternalStorage::packed(ks.as_mut_ptr().cast(), std::ptr::null_mut()) };
    let e = unsafe { Cache::with_storage(&small(1), &one_sided) }.err().unwrap();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("config.k_storage and config.v_storage must both be set"), "{}", e.message);
    let bad = ExternalStorage { stride_block: 64, stride_head: 32, stride_token: 8, stride_dim: 2, ..ExternalStorage::packed(ks.as_mut_ptr().cast(), ks.as_mut_ptr().cast()) };
    let e = unsafe { Cache::with_storage(&small(1), &bad) }.err().unwrap();
    assert!(e.message.contains("config.stride_dim must be 1"), "{}", e.message);
    assert!(ks.iter().all(|x| *x == 0.0));
}

#[test]
fn export_async_on_cpu_matches_export_and_fails_cleanly() {
    let mut c = Cache::new(&small(1)).unwrap();
    c.add_request(1).unwrap();
    c.add_request(2).unwrap();
    let mut seed = 7;
    for _ in 0..5 {
        c.append(&[1, 2], &noise(&mut seed, 2 * (H * D) as usize), &noise(&mut seed, 2 * (H * D) as usize)).unwrap();
    }
    let ex = c.export(&[2, 1], Some(3)).unwrap();
    let (mut t, mut l) = (vec![99i32; 6], vec![99i32; 2]);
    // SAFETY: CPU cache: host buffers of the right lengths.
    unsafe { c.export_async(&[2, 1], 3, t.as_mut_ptr(), l.as_mut_ptr(), std::ptr::null_mut()) }.unwrap();
    assert_eq!((t.clone(), l.clone()), (ex.block_tables, ex.seq_lens));
    let (mut t1, mut l1) = (vec![99i32; 2], vec![99i32; 2]);
    let e = unsafe { c.export_async(&[2, 1], 1, t1.as_mut_ptr(), l1.as_mut_ptr(), std::ptr::null_mut()) }.unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("more than table_stride 1"), "{}", e.message);
    let e = unsafe { c.export_async(&[9], 3, std::ptr::null_mut(), l1.as_mut_ptr(), std::ptr::null_mut()) }.unwrap_err();
    assert_eq!(e.status, Status::NotFound);
    assert!(t1.iter().chain(l1.iter()).all(|x| *x == 99));
    c.async_error().unwrap();

    let tx = c.begin(&[1]).unwrap();
    let mut lens = [0i32; 1];
    let mut tables = [0i32; 2];
    unsafe { tx.block_tables_async(2, tables.as_mut_ptr(), lens.as_mut_ptr(), std::ptr::null_mut()) }.unwrap();
    assert_eq!(lens, [6]);
    assert_eq!(tables.to_vec(), tx.block_tables(Some(2)).unwrap().1);
}

/// Sizes whose products overflow usize are refused by the wrapper (with the
/// invalid-argument status) instead of panicking or wrapping.
#[test]
fn size_products_do_not_wrap() {
    let mut k = vec![0f32; 64];
    let mut v = vec![0f32; 64];
    let k0 = k.clone();
    let big = PagedKvMut { k: &mut k, v: &mut v, num_kv_heads: u32::MAX, head_dim: u32::MAX, block_size: u32::MAX, layout: Layout::TokenMajor };
    let mut pages = big;
    let e = kv_append(&mut pages, &[0f32; 16], &[0f32; 16], &[0, 1], &[0, 0]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.to_string().contains("overflow"), "{e}");
    pages.num_kv_heads = H;
    pages.head_dim = D;
    pages.block_size = BS;
    let mut q_out = vec![0f32; 16];
    let e = rope_kv_append(&mut pages, &[0f32; 16], u32::MAX, &[0f32; 16], &[0f32; 16], &[0], &[0], &[0], D, 10000.0, &mut q_out)
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    drop(pages);
    assert_eq!(k, k0);

    let mut x = vec![0f32; 16];
    let e = rope_apply(&mut x, u32::MAX, u32::MAX, &[0, 1, 2], 2, 10000.0).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
    let e = reference_attention_dense(&[0f32; 4], u32::MAX, &[0f32; 4], &[0f32; 4], u32::MAX, u32::MAX, &[1, 1], 0.0, &mut [0f32; 4])
        .unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
    let kv = PagedKv { k: &k, v: &v, num_kv_heads: u32::MAX, head_dim: u32::MAX, block_size: u32::MAX, layout: Layout::TokenMajor };
    let e = decode(&[0f32; 4], u32::MAX, &kv, &[0], &[1], &mut [0f32; 4], DecodeOptions::default()).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
}
