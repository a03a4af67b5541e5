//! Several tokens per row (0.2): multi-token transactions, keep, truncate
//! (S5, S5.2, S5.3), engine multi-token steps and bulk prefill (S8), and
//! the dense reference with query tokens and variants (S2.2, S2.3).
mod common;
use common::{noise, small};
use flashdec::*;

/// A small(2) cache with requests 1 and 2.
fn two_requests() -> Cache {
    let mut c = Cache::new(&small(2)).unwrap();
    c.add_request(1).unwrap();
    c.add_request(2).unwrap();
    c
}

/// Writes every layer of `tx` with `tokens` packed tokens of noise.
fn write_all(tx: &mut Transaction<'_>, layers: u32, tokens: usize, seed: &mut u64) {
    for layer in 0..layers {
        tx.write_layer(layer, &noise(seed, tokens * 16), &noise(seed, tokens * 16)).unwrap();
    }
}

/// A request's committed K and V of every layer (f32 CPU cache), token by
/// token: [layers][k/v][seq_len * heads * dim].
fn stored(cache: &Cache, id: u64) -> Vec<[Vec<f32>; 2]> {
    let cfg = *cache.config();
    let ex = cache.export(&[id], None).unwrap();
    let (bs, hkv, d) = (cfg.block_size as usize, cfg.num_kv_heads as usize, cfg.head_dim as usize);
    (0..cfg.num_layers)
        .map(|layer| {
            let (k, v, s) = cache.layer_storage(layer).unwrap();
            let read = |base: *mut std::ffi::c_void| {
                let mut out = Vec::new();
                for t in 0..ex.seq_lens[0] as usize {
                    let b = ex.block_tables[t / bs] as i64;
                    for h in 0..hkv as i64 {
                        for x in 0..d as i64 {
                            let at = b * s[0] + h * s[1] + (t % bs) as i64 * s[2] + x * s[3];
                            // SAFETY: an in-range element of the cache's own f32 storage.
                            out.push(unsafe { *base.cast::<f32>().offset(at as isize) });
                        }
                    }
                }
                out
            };
            [read(k), read(v)]
        })
        .collect()
}

#[test]
fn begin_multi_positions_blocks_and_token_indptr() {
    let mut c = two_requests();
    let mut seed = 1;
    let mut tx = c.begin(&[1]).unwrap();
    write_all(&mut tx, 2, 1, &mut seed);
    tx.commit().map_err(|(e, _)| e).unwrap();

    let (needed, _) = c.blocks_needed_multi(&[1, 2], &[4, 2]).unwrap();
    assert_eq!(needed, 2);
    let e = c.blocks_needed_multi(&[1, 2], &[4]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    let mut tx = c.begin_multi(&[1, 2], &[4, 2]).unwrap();
    let info = tx.info().unwrap();
    assert_eq!((info.batch, info.token_count, info.new_block_count, info.max_blocks_per_seq), (2, 6, 2, 2));
    let rows = tx.rows().unwrap();
    assert_eq!((rows.positions, rows.effective_seq_lens), (vec![1, 0], vec![5, 2]));
    let toks = tx.tokens().unwrap();
    assert_eq!(toks.positions, vec![1, 2, 3, 4, 0, 1]);
    assert_eq!(toks.offsets, vec![1, 2, 3, 0, 0, 1]);
    let (stride, tables) = tx.block_tables(None).unwrap();
    let want: Vec<i32> =
        [0usize, 0, 0, 0, 1, 1].iter().zip(&toks.positions).map(|(&r, &p)| tables[r * stride as usize + p as usize / 4]).collect();
    assert_eq!(toks.block_ids, want);
    let mut indptr = vec![-7i32; 3];
    // SAFETY: a CPU cache writes batch + 1 host int32 before returning.
    unsafe { tx.token_indptr_async(indptr.as_mut_ptr(), std::ptr::null_mut()) }.unwrap();
    assert_eq!(indptr, vec![0, 4, 6]);
    let e = unsafe { tx.token_indptr_async(std::ptr::null_mut(), std::ptr::null_mut()) }.unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("token_indptr"), "{}", e.message);
    // The layer writes take the 6 packed tokens, not one per row.
    let e = tx.write_layer(0, &noise(&mut seed, 32), &noise(&mut seed, 32)).unwrap_err();
    assert!(e.message.contains("expected 96 elements (6 x 2 x 8)"), "{}", e.message);
    write_all(&mut tx, 2, 6, &mut seed);
    tx.commit().map_err(|(e, _)| e).unwrap();
    assert_eq!(c.export(&[1, 2], None).unwrap().seq_lens, vec![5, 2]);
    c.validate().unwrap();
}

#[test]
fn begin_multi_refusals() {
    let mut c = two_requests();
    let e = c.begin_multi(&[1, 2], &[3, 0]).err().unwrap();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("token_counts[1] is 0: each row appends at least one token"), "{}", e.message);
    let e = c.begin_multi(&[1, 2], &[3]).err().unwrap(); // the binding's check
    assert!(e.message.contains("token_counts: expected 2 entries"), "{}", e.message);
    let e = c.begin_multi(&[1, 2], &[30, 3]).err().unwrap();
    assert_eq!(e.status, Status::OutOfBlocks);
    let m = c.metrics().unwrap();
    assert_eq!((m.capacity_failure_count, m.open_transaction_count, m.free_blocks), (1, 0, 8));
    let tx = c.begin_multi(&[1], &[2]).unwrap();
    tx.abort().unwrap();
}

#[test]
fn commit_keep_drops_tokens_and_their_blocks() {
    let mut c = two_requests();
    let mut seed = 2;
    let mut tx = c.begin_multi(&[1, 2], &[5, 3]).unwrap();
    assert_eq!(tx.info().unwrap().new_block_count, 3);
    write_all(&mut tx, 2, 8, &mut seed);
    let (e, tx) = tx.commit_keep(&[6, 3]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("keep_counts[0]"), "{}", e.message);
    let (e, tx) = tx.commit_keep(&[1]).unwrap_err(); // not the batch: the library's check
    assert_eq!(e.status, Status::InvalidArgument);
    assert_eq!(tx.info().unwrap().next_layer, 2); // still open, unchanged
    let raw = tx.raw();
    tx.commit_keep(&[2, 3]).map_err(|(e, _)| e).unwrap();
    let ex = c.export(&[1, 2], Some(2)).unwrap();
    assert_eq!(ex.seq_lens, vec![2, 3]);
    assert_eq!((ex.block_tables[1], ex.block_tables[3]), (-1, -1));
    let m = c.metrics().unwrap();
    assert_eq!((m.free_blocks, m.used_blocks, m.transaction_rollback_block_count, m.transaction_commit_count), (6, 2, 1, 1));
    // The handle is finished: a second keep is the library's INVALID_STATE.
    let again = unsafe { sys::fd_tx_commit_keep(c.as_raw(), raw, [2u32, 3].as_ptr(), 2) };
    assert_eq!(check_status(again).unwrap_err().status, Status::InvalidState);
    c.validate().unwrap();
}

#[test]
fn truncate_shortens_releases_and_refuses() {
    let mut c = two_requests();
    let mut seed = 3;
    let mut tx = c.begin_multi(&[1, 2], &[7, 2]).unwrap();
    write_all(&mut tx, 2, 9, &mut seed);
    tx.commit().map_err(|(e, _)| e).unwrap();
    let before = c.metrics().unwrap();
    c.truncate(&[1, 2], &[3, 2]).unwrap();
    let ex = c.export(&[1, 2], Some(2)).unwrap();
    assert_eq!((ex.seq_lens.clone(), ex.block_tables[1]), (vec![3, 2], -1));
    let m = c.metrics().unwrap();
    assert_eq!((m.free_blocks, m.free_count), (before.free_blocks + 1, before.free_count + 1));
    let version = c.state_version().unwrap();
    c.truncate(&[1], &[3]).unwrap(); // the current length: nothing changes
    let cases: [(&[u64], &[i32], Status, &str); 3] = [
        (&[1], &[4], Status::InvalidArgument, "seq_lens[0] = 4 is outside [0, 3]"),
        (&[9], &[0], Status::NotFound, "9"),
        (&[1, 2], &[0], Status::InvalidArgument, "seq_lens: expected 2 entries"),
    ];
    for (ids, lens, status, message) in cases {
        let e = c.truncate(ids, lens).unwrap_err();
        assert_eq!(e.status, status);
        assert!(e.message.contains(message), "{}", e.message);
    }
    assert_eq!(c.state_version().unwrap(), version);
    let tx = c.begin(&[2]).unwrap();
    drop(tx);
    c.truncate(&[1], &[0]).unwrap();
    assert_eq!(c.metrics().unwrap().free_blocks, 7);

    let mut p = Cache::new(&CacheConfig { prefix_cache_capacity_blocks: 2, ..small(2) }).unwrap();
    p.register_prefix("sys", &[0f32; 2 * 64], &[0f32; 2 * 64]).unwrap();
    p.add_request(1).unwrap();
    p.attach_prefix(1, "sys").unwrap();
    let mut tx = p.begin(&[1]).unwrap();
    write_all(&mut tx, 2, 1, &mut seed);
    tx.commit().map_err(|(e, _)| e).unwrap();
    let e = p.truncate(&[1], &[3]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("would cut into the attached prefix"), "{}", e.message);
    p.truncate(&[1], &[4]).unwrap();
}

fn engine_config() -> EngineConfig {
    let mut ec = engine_config_default();
    ec.num_q_heads = 4;
    ec.rotary_dim = 8;
    ec.cpu_threads = 1;
    ec
}

fn opened<'e, 'c>(o: StepOutcome<'e, 'c>) -> Step<'e, 'c> {
    match o {
        StepOutcome::Opened(s) => s,
        StepOutcome::Backpressure { .. } => panic!("expected an opened step"),
    }
}

#[test]
fn engine_multi_token_step_equals_one_token_steps() {
    let (mut ca, mut cb) = (Cache::new(&small(2)).unwrap(), Cache::new(&small(2)).unwrap());
    let mut seed = 4;
    let ctx = noise(&mut seed, 2 * 32); // two context tokens: [layers, heads, dim] each
    // Per layer: q, k, v of 5 tokens packed in row order (row 1's 3, row 2's 2).
    let inputs: Vec<[Vec<f32>; 3]> = (0..2).map(|_| [noise(&mut seed, 5 * 32), noise(&mut seed, 80), noise(&mut seed, 80)]).collect();
    let mut want = vec![vec![0f32; 5 * 32]; 2];
    {
        let mut eng = Engine::new(&mut ca, &engine_config()).unwrap();
        for id in [1, 2] {
            eng.add_request(id).unwrap();
            eng.admit(id).unwrap();
        }
        for t in 0..2 {
            eng.prefill(1, &ctx[t * 32..(t + 1) * 32], &ctx[t * 32..(t + 1) * 32]).unwrap();
        }
        let mut step = opened(eng.begin_step_multi(&[1, 2], &[3, 2]).unwrap());
        assert_eq!((step.batch(), step.token_count()), (2, 5));
        for (layer, [q, k, v]) in inputs.iter().enumerate() {
            step.layer(layer as u32, q, k, v, &mut want[layer]).unwrap();
        }
        step.commit().unwrap();
        assert_eq!(eng.metrics().unwrap().appended_token_count, 5);
    }
    let mut eng = Engine::new(&mut cb, &engine_config()).unwrap();
    for id in [1, 2] {
        eng.add_request(id).unwrap();
        eng.admit(id).unwrap();
    }
    for t in 0..2 {
        eng.prefill(1, &ctx[t * 32..(t + 1) * 32], &ctx[t * 32..(t + 1) * 32]).unwrap();
    }
    // One-token step s: the packed indices of its rows' tokens.
    for idx in [vec![0usize, 3], vec![1, 4], vec![2]] {
        let ids = &[1u64, 2][..idx.len()];
        let mut step = opened(eng.begin_step(ids).unwrap());
        assert_eq!(step.token_count(), idx.len() as u32);
        for (layer, x) in inputs.iter().enumerate() {
            let pick = |a: &Vec<f32>, w: usize| idx.iter().flat_map(|&i| a[i * w..(i + 1) * w].to_vec()).collect::<Vec<f32>>();
            let mut out = vec![0f32; idx.len() * 32];
            step.layer(layer as u32, &pick(&x[0], 32), &pick(&x[1], 16), &pick(&x[2], 16), &mut out).unwrap();
            for (a, b) in out.iter().zip(pick(&want[layer], 32)) {
                assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "{a} vs {b}");
            }
        }
        step.commit().unwrap();
    }
    drop(eng);
    assert_eq!(ca.export(&[1, 2], None).unwrap().seq_lens, cb.export(&[1, 2], None).unwrap().seq_lens);
    for id in [1, 2] {
        assert_eq!(stored(&ca, id), stored(&cb, id));
    }
}

#[test]
fn engine_commit_step_keep_and_refusals() {
    let mut cache = Cache::new(&small(2)).unwrap();
    let mut eng = Engine::new(&mut cache, &engine_config()).unwrap();
    for id in [1, 2] {
        eng.add_request(id).unwrap();
        eng.admit(id).unwrap();
    }
    let e = eng.begin_step_multi(&[1, 2], &[0, 2]).err().unwrap();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("token_counts[0]"), "{}", e.message);
    let e = eng.begin_step_multi(&[1, 2], &[1, 2, 3]).err().unwrap();
    assert!(e.message.contains("token_counts: expected 2 entries"), "{}", e.message);
    let mut seed = 5;
    let mut step = opened(eng.begin_step_multi(&[1, 2], &[5, 2]).unwrap());
    assert_eq!(step.needed_blocks(), 3);
    let mut out = vec![0f32; 7 * 32];
    let e = step.layer(0, &noise(&mut seed, 64), &noise(&mut seed, 32), &noise(&mut seed, 32), &mut out[..64]).unwrap_err();
    assert!(e.message.contains("expected 112 elements"), "{}", e.message); // 7 tokens, not 2 rows
    for layer in 0..2 {
        step.layer(layer, &noise(&mut seed, 7 * 32), &noise(&mut seed, 112), &noise(&mut seed, 112), &mut out).unwrap();
    }
    step.commit_keep(&[3, 0]).unwrap();
    assert_eq!(eng.metrics().unwrap().appended_token_count, 3);
    assert_eq!(eng.cache().export(&[1, 2], None).unwrap().seq_lens, vec![3, 0]);
    let m = eng.cache().metrics().unwrap();
    assert_eq!((m.used_blocks, m.transaction_rollback_block_count), (1, 2));
    // A keep count above the row's tokens: the library's refusal; dropping
    // the step (as for commit) then aborts it.
    let mut step = opened(eng.begin_step_multi(&[1], &[2]).unwrap());
    for layer in 0..2 {
        step.layer(layer, &noise(&mut seed, 64), &noise(&mut seed, 32), &noise(&mut seed, 32), &mut out[..64]).unwrap();
    }
    let e = step.commit_keep(&[3]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("keep_counts[0]"), "{}", e.message);
    let m = eng.metrics().unwrap();
    assert_eq!((m.open_step_transaction_count, m.transaction_abort_count), (0, 1));
    eng.validate().unwrap();
}

#[test]
fn engine_prefill_tokens_equals_token_by_token() {
    let (mut ca, mut cb) = (Cache::new(&small(2)).unwrap(), Cache::new(&small(2)).unwrap());
    let mut seed = 6;
    // [layers, 5 tokens, heads, dim], and token by token [layers, heads, dim].
    let (k, v) = (noise(&mut seed, 2 * 5 * 16), noise(&mut seed, 2 * 5 * 16));
    let token = |x: &[f32], j: usize| (0..2).flat_map(|l| x[(l * 5 + j) * 16..(l * 5 + j + 1) * 16].to_vec()).collect::<Vec<f32>>();
    {
        let mut eng = Engine::new(&mut ca, &engine_config()).unwrap();
        eng.add_request(1).unwrap();
        eng.admit(1).unwrap();
        eng.prefill_tokens(1, &k, &v).unwrap();
        assert_eq!(eng.metrics().unwrap().prefill_token_count, 5);
        let e = eng.prefill_tokens(9, &k, &v).unwrap_err();
        assert_eq!(e.status, Status::NotFound);
        let e = eng.prefill_tokens(1, &k[..40], &v[..40]).unwrap_err(); // the binding's check
        assert!(e.message.contains("multiples of num_layers * num_kv_heads * head_dim = 32"), "{}", e.message);
    }
    let mut eng = Engine::new(&mut cb, &engine_config()).unwrap();
    eng.add_request(1).unwrap();
    eng.admit(1).unwrap();
    for j in 0..5 {
        eng.prefill(1, &token(&k, j), &token(&v, j)).unwrap();
    }
    drop(eng);
    assert_eq!(ca.export(&[1], None).unwrap().seq_lens, vec![5]);
    assert_eq!(stored(&ca, 1), stored(&cb, 1));
}

#[test]
fn reference_attention_matches_paged_decode_multi() {
    let (hq, hkv, d, bs) = (4u32, 2u32, 8u32, 4u32);
    let mut seed = 7;
    let k = noise(&mut seed, 4 * (hkv * bs * d) as usize);
    let v = noise(&mut seed, k.len());
    let (tables, lens, indptr) = ([2, 0, 1, 3], [6, 3], [0, 4, 6]);
    let q = noise(&mut seed, 6 * (hq * d) as usize);
    let mut paged = vec![0f32; q.len()];
    let kv = PagedKv { k: &k, v: &v, num_kv_heads: hkv, head_dim: d, block_size: bs, layout: Layout::TokenMajor };
    decode_multi(&q, &indptr, hq, &kv, &tables, &lens, &mut paged, DecodeOptions::default()).unwrap();
    // The same K/V laid out densely: [batch, hkv, 8, d].
    let (mut dk, mut dv) = (vec![0f32; 2 * (hkv * 8 * d) as usize], vec![0f32; 2 * (hkv * 8 * d) as usize]);
    for r in 0..2 {
        for t in 0..8 {
            let b = tables[r * 2 + t / 4] as usize;
            for h in 0..hkv as usize {
                let src = ((b * hkv as usize + h) * bs as usize + t % 4) * d as usize;
                let dst = ((r * hkv as usize + h) * 8 + t) * d as usize;
                dk[dst..dst + d as usize].copy_from_slice(&k[src..src + d as usize]);
                dv[dst..dst + d as usize].copy_from_slice(&v[src..src + d as usize]);
            }
        }
    }
    let mut out = vec![0f32; q.len()];
    reference_attention(&q, Some(&indptr), hq, &dk, &dv, hkv, d, &lens, &ReferenceOptions::default(), &mut out).unwrap();
    for (a, b) in out.iter().zip(&paged) {
        assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "{a} vs {b}");
    }
    // A window of 1: each query sees only its own position, so out = V there.
    let window = ReferenceOptions { sliding_window: 1, ..ReferenceOptions::default() };
    reference_attention(&q, Some(&indptr), hq, &dk, &dv, hkv, d, &lens, &window, &mut out).unwrap();
    for (t, (r, pos)) in [(0usize, 2usize), (0, 3), (0, 4), (0, 5), (1, 1), (1, 2)].iter().enumerate() {
        for h in 0..hq as usize {
            let at = ((r * hkv as usize + h / 2) * 8 + pos) * d as usize;
            let got = &out[(t * hq as usize + h) * d as usize..][..d as usize];
            assert!(got.iter().zip(&dv[at..at + d as usize]).all(|(a, b)| (a - b).abs() < 1e-6));
        }
    }
    // One token per row and no variant: the bits of the dense reference.
    let (q1, mut a, mut b) = (&q[..2 * 32], vec![0f32; 64], vec![1f32; 64]);
    reference_attention(q1, None, hq, &dk, &dv, hkv, d, &lens, &ReferenceOptions::default(), &mut a).unwrap();
    reference_attention_dense(q1, hq, &dk, &dv, hkv, d, &lens, 0.0, &mut b).unwrap();
    assert_eq!(a, b);
    // Refusals: the library's (NaN sink, negative window) and the binding's.
    let sinks = [0.0, f32::NAN, 0.0, 0.0];
    let bad = ReferenceOptions { sinks: Some(&sinks), ..ReferenceOptions::default() };
    let e = reference_attention(&q, Some(&indptr), hq, &dk, &dv, hkv, d, &lens, &bad, &mut out).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("sinks"), "{}", e.message);
    let bad = ReferenceOptions { sliding_window: -1, ..ReferenceOptions::default() };
    let e = reference_attention(&q, Some(&indptr), hq, &dk, &dv, hkv, d, &lens, &bad, &mut out).unwrap_err();
    assert!(e.message.contains("sliding_window"), "{}", e.message);
    let short = ReferenceOptions { sinks: Some(&sinks[..3]), ..ReferenceOptions::default() };
    let e = reference_attention(&q, Some(&indptr), hq, &dk, &dv, hkv, d, &lens, &short, &mut out).unwrap_err();
    assert!(e.message.contains("sinks: expected 4 entries"), "{}", e.message);
    let e = reference_attention(&q, None, hq, &dk, &dv, hkv, d, &lens, &ReferenceOptions::default(), &mut out).unwrap_err();
    assert!(e.message.contains("q: expected 64 elements"), "{}", e.message);
}
