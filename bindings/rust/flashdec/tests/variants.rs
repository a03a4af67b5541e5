//! Attention variants of decode (S2.3: `DecodeOptions::logit_softcap`,
//! `sliding_window`, `sinks`) through `decode`, `decode_multi`, `DecodePlan`
//! (`run`, `run_with`) and `Cache::decode_layer_with`: equal to
//! `reference_attention` with the same variants; -inf sinks give the plain
//! bits; NaN sinks and a wrong length are refused naming sinks.
mod common;
use common::{noise, small};
use flashdec::*;

const HQ: u32 = 4;
const HKV: u32 = 2;
const D: u32 = 8;
const BS: u32 = 4;
const LENS: [i32; 2] = [21, 9];
const INDPTR: [i32; 3] = [0, 3, 5];
const MBPS: usize = 6; // blocks per row in the tables
const DENSE: usize = MBPS * BS as usize; // dense max_seq_len
const SINKS: [f32; 4] = [0.5, -1.0, 2.0, 0.0];

struct Problem {
    k: Vec<f32>,
    v: Vec<f32>,
    tables: Vec<i32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    q: Vec<f32>,
}

/// Paged K/V of rows of 21 and 9 tokens (blocks in a scrambled order) and
/// the same K/V laid out densely, [batch, HKV, DENSE, D]; q of 5 tokens.
fn problem() -> Problem {
    let mut seed = 11;
    let nb = 12usize;
    let k = noise(&mut seed, nb * (HKV * BS * D) as usize);
    let v = noise(&mut seed, k.len());
    let order = [7, 2, 10, 0, 5, 9, 3, 11, 1, 4, 6, 8];
    let tables: Vec<i32> = order.iter().map(|&b| b as i32).collect();
    let (mut dk, mut dv) = (vec![0f32; 2 * HKV as usize * DENSE * D as usize], vec![0f32; 2 * HKV as usize * DENSE * D as usize]);
    let d = D as usize;
    for r in 0..2 {
        for t in 0..DENSE {
            let b = tables[r * MBPS + t / BS as usize] as usize;
            for h in 0..HKV as usize {
                let src = ((b * HKV as usize + h) * BS as usize + t % BS as usize) * d;
                let dst = ((r * HKV as usize + h) * DENSE + t) * d;
                dk[dst..dst + d].copy_from_slice(&k[src..src + d]);
                dv[dst..dst + d].copy_from_slice(&v[src..src + d]);
            }
        }
    }
    let q = noise(&mut seed, 5 * (HQ * D) as usize).iter().map(|x| x * 4.0).collect();
    Problem { k, v, tables, dk, dv, q }
}

impl Problem {
    fn kv(&self) -> PagedKv<'_, f32> {
        PagedKv { k: &self.k, v: &self.v, num_kv_heads: HKV, head_dim: D, block_size: BS, layout: Layout::TokenMajor }
    }

    fn reference(&self, q: &[f32], indptr: Option<&[i32]>, o: &DecodeOptions<'_>) -> Vec<f32> {
        let mut out = vec![0f32; q.len()];
        let ro = ReferenceOptions { sm_scale: o.sm_scale, logit_softcap: o.logit_softcap, sliding_window: o.sliding_window, sinks: o.sinks };
        reference_attention(q, indptr, HQ, &self.dk, &self.dv, HKV, D, &LENS, &ro, &mut out).unwrap();
        out
    }

    /// The last query token of each row: one token per row.
    fn last_tokens(&self) -> Vec<f32> {
        let n = (HQ * D) as usize;
        [2usize, 4].iter().flat_map(|&t| self.q[t * n..(t + 1) * n].to_vec()).collect()
    }
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-5 + 1e-5 * b.abs(), "{what}: [{i}] {a} vs {b}");
    }
}

fn variants() -> Vec<DecodeOptions<'static>> {
    let o = DecodeOptions::default();
    vec![
        DecodeOptions { logit_softcap: 2.0, ..o },
        DecodeOptions { sliding_window: 1, ..o },
        DecodeOptions { sliding_window: 5, ..o },
        DecodeOptions { sliding_window: 8, num_splits: 3, ..o },
        DecodeOptions { sinks: Some(&SINKS), ..o },
        DecodeOptions { logit_softcap: 3.0, sliding_window: 6, sinks: Some(&SINKS), cpu_threads: 2, ..o },
    ]
}

#[test]
fn decode_variants_match_reference() {
    let p = problem();
    for o in variants() {
        let want = p.reference(&p.q, Some(&INDPTR), &o);
        let mut got = vec![0f32; p.q.len()];
        decode_multi(&p.q, &INDPTR, HQ, &p.kv(), &p.tables, &LENS, &mut got, o).unwrap();
        assert_close(&got, &want, &format!("decode_multi {o:?}"));
        // Through a plan made with the variants.
        let plan = DecodePlan::new_multi(&p.q, &INDPTR, HQ, &p.kv(), &p.tables, &LENS, &got, o, Some(&LENS)).unwrap();
        let mut planned = vec![0f32; p.q.len()];
        plan.run(&p.q, HQ, &p.kv(), &p.tables, &LENS, &mut planned).unwrap();
        assert_close(&planned, &want, &format!("plan {o:?}"));
        // One query token per row.
        let q1 = p.last_tokens();
        let want1 = p.reference(&q1, None, &o);
        let mut got1 = vec![0f32; q1.len()];
        decode(&q1, HQ, &p.kv(), &p.tables, &LENS, &mut got1, o).unwrap();
        assert_close(&got1, &want1, &format!("decode {o:?}"));
    }
}

#[test]
fn plan_runs_take_their_own_variants() {
    let p = problem();
    let planned = DecodeOptions { sliding_window: 4, ..DecodeOptions::default() };
    let mut out = vec![0f32; p.q.len()];
    let plan = DecodePlan::new_multi(&p.q, &INDPTR, HQ, &p.kv(), &p.tables, &LENS, &out, planned, Some(&LENS)).unwrap();
    assert_eq!(plan.options().sliding_window, 4);
    for o in [
        DecodeOptions { sliding_window: 0, ..plan.options() },
        DecodeOptions { sliding_window: 16, logit_softcap: 5.0, ..plan.options() },
        DecodeOptions { sinks: Some(&SINKS), ..plan.options() },
    ] {
        plan.run_with(&p.q, HQ, &p.kv(), &p.tables, &LENS, &mut out, o).unwrap();
        assert_close(&out, &p.reference(&p.q, Some(&INDPTR), &o), &format!("run_with {o:?}"));
    }
    // max_q_len_hint is planned: the library refuses another, naming it.
    let e = plan.run_with(&p.q, HQ, &p.kv(), &p.tables, &LENS, &mut out, DecodeOptions { max_q_len_hint: 3, ..plan.options() }).unwrap_err();
    assert!(e.status == Status::InvalidArgument && e.message.contains("max_q_len_hint"), "{}", e.message);
    // A plan keeps its own copy of the sinks.
    let sinks = SINKS.to_vec();
    let plan = DecodePlan::new_multi(&p.q, &INDPTR, HQ, &p.kv(), &p.tables, &LENS, &out, DecodeOptions { sinks: Some(&sinks), ..DecodeOptions::default() }, None).unwrap();
    drop(sinks);
    plan.run(&p.q, HQ, &p.kv(), &p.tables, &LENS, &mut out).unwrap();
    assert_close(&out, &p.reference(&p.q, Some(&INDPTR), &DecodeOptions { sinks: Some(&SINKS), ..DecodeOptions::default() }), "plan sinks");
}

#[test]
fn bf16_variants_match_reference() {
    let p = problem();
    let round = |x: &[f32]| x.iter().map(|&a| Bf16::from_f32(a)).collect::<Vec<_>>();
    let back = |x: &[Bf16]| x.iter().map(|a| a.to_f32()).collect::<Vec<_>>();
    let (q, k, v) = (round(&p.q), round(&p.k), round(&p.v));
    let o = DecodeOptions { logit_softcap: 3.0, sliding_window: 6, sinks: Some(&SINKS), ..DecodeOptions::default() };
    let mut got = vec![Bf16(0); q.len()];
    let kv = PagedKv { k: &k, v: &v, num_kv_heads: HKV, head_dim: D, block_size: BS, layout: Layout::TokenMajor };
    decode_multi(&q, &INDPTR, HQ, &kv, &p.tables, &LENS, &mut got, o).unwrap();
    let (dk, dv) = (back(&round(&p.dk)), back(&round(&p.dv)));
    let mut want = vec![0f32; q.len()];
    let ro = ReferenceOptions { logit_softcap: 3.0, sliding_window: 6, sinks: Some(&SINKS), ..ReferenceOptions::default() };
    reference_attention(&back(&q), Some(&INDPTR), HQ, &dk, &dv, HKV, D, &LENS, &ro, &mut want).unwrap();
    let got = back(&got);
    for (g, w) in got.chunks(D as usize).zip(want.chunks(D as usize)) {
        let num: f32 = g.iter().zip(w).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt();
        let den: f32 = w.iter().map(|b| b * b).sum::<f32>().sqrt().max(1e-30);
        assert!(num / den <= 5e-3, "row error {}", num / den);
    }
}

#[test]
fn minus_inf_sinks_and_long_window_give_the_plain_bits() {
    let p = problem();
    let mut plain = vec![0f32; p.q.len()];
    decode_multi(&p.q, &INDPTR, HQ, &p.kv(), &p.tables, &LENS, &mut plain, DecodeOptions::default()).unwrap();
    let none = [f32::NEG_INFINITY; 4];
    for o in [
        DecodeOptions { sinks: Some(&none), ..DecodeOptions::default() },
        DecodeOptions { sliding_window: 21, ..DecodeOptions::default() },
        DecodeOptions { sliding_window: 1000, ..DecodeOptions::default() },
    ] {
        let mut got = vec![0f32; p.q.len()];
        decode_multi(&p.q, &INDPTR, HQ, &p.kv(), &p.tables, &LENS, &mut got, o).unwrap();
        assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), plain.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{o:?}");
    }
}

#[test]
fn bad_variants_are_refused() {
    let p = problem();
    let nan = [0.0, 0.0, f32::NAN, 0.0];
    let short = [0.0f32; 3];
    let cases: [(DecodeOptions<'_>, &str); 5] = [
        (DecodeOptions { sinks: Some(&nan), ..DecodeOptions::default() }, "sinks[2]"), // the library's
        (DecodeOptions { sliding_window: -1, ..DecodeOptions::default() }, "sliding_window"),
        (DecodeOptions { logit_softcap: -1.0, ..DecodeOptions::default() }, "logit_softcap"),
        (DecodeOptions { logit_softcap: f32::INFINITY, ..DecodeOptions::default() }, "logit_softcap"),
        (DecodeOptions { sinks: Some(&short), ..DecodeOptions::default() }, "sinks: expected 4 entries (num_q_heads), got 3"), // the binding's
    ];
    let plan = DecodePlan::new_multi(&p.q, &INDPTR, HQ, &p.kv(), &p.tables, &LENS, &p.q, DecodeOptions::default(), None).unwrap();
    for (o, message) in cases {
        let mut out = vec![7f32; p.q.len()];
        let e = decode_multi(&p.q, &INDPTR, HQ, &p.kv(), &p.tables, &LENS, &mut out, o).unwrap_err();
        assert!(e.status == Status::InvalidArgument && e.message.contains(message), "{o:?}: {}", e.message);
        assert!(out.iter().all(|&x| x == 7.0), "{o:?}: written");
        let e = plan.run_with(&p.q, HQ, &p.kv(), &p.tables, &LENS, &mut out, o).unwrap_err();
        assert!(e.message.contains(message), "run_with {o:?}: {}", e.message);
    }
    let e = DecodePlan::new(&p.q[..64], HQ, &p.kv(), &p.tables, &LENS, &p.q[..64], DecodeOptions { sinks: Some(&short), ..DecodeOptions::default() }, None).unwrap_err();
    assert!(e.message.contains("sinks: expected 4 entries"), "{}", e.message);
}

#[test]
fn cache_decode_layer_with_variants() {
    let mut cache = Cache::new(&small(2)).unwrap();
    let mut seed = 5;
    for id in [1u64, 2] {
        cache.add_request(id).unwrap();
    }
    for step in 0..7 {
        let ids: &[u64] = if step < 4 { &[1, 2] } else { &[1] };
        let mut tx = cache.begin(ids).unwrap();
        for layer in 0..2 {
            let k = noise(&mut seed, ids.len() * 16);
            let v = noise(&mut seed, ids.len() * 16);
            tx.write_layer(layer, &k, &v).unwrap();
        }
        tx.commit().map_err(|(e, _)| e).unwrap();
    }
    let ex = cache.export(&[1, 2], None).unwrap();
    let q = noise(&mut seed, 2 * 4 * 8);
    let sinks = [1.0, -0.5, 0.0, 3.0];
    let o = DecodeOptions { logit_softcap: 4.0, sliding_window: 3, sinks: Some(&sinks), ..DecodeOptions::default() };
    let (mut got, mut plain) = (vec![0f32; q.len()], vec![0f32; q.len()]);
    cache.decode_layer_with(1, &q, 4, &ex.block_tables, &ex.seq_lens, &mut got, o).unwrap();
    cache.decode_layer(1, &q, 4, &ex.block_tables, &ex.seq_lens, &mut plain, 0).unwrap();
    assert_ne!(got, plain);
    // Against decode over the layer's storage, read back densely.
    let (ks, vs, strides) = cache.layer_storage(1).unwrap();
    assert_eq!(strides, [64, 32, 8, 1]); // packed token-major
    // SAFETY: the cache's own packed f32 storage of layer 1: max_blocks blocks of 64 elements.
    let copy = |p: *mut std::ffi::c_void| unsafe { std::slice::from_raw_parts(p as *const f32, 8 * 64) }.to_vec();
    let (k, v) = (copy(ks), copy(vs));
    let kv = PagedKv { k: &k, v: &v, num_kv_heads: 2, head_dim: 8, block_size: 4, layout: Layout::TokenMajor };
    let mut want = vec![0f32; q.len()];
    decode(&q, 4, &kv, &ex.block_tables, &ex.seq_lens, &mut want, o).unwrap();
    assert_eq!(got, want);
    let short = [0.0f32; 2];
    let e = cache.decode_layer_with(1, &q, 4, &ex.block_tables, &ex.seq_lens, &mut got, DecodeOptions { sinks: Some(&short), ..o }).unwrap_err();
    assert!(e.message.contains("sinks: expected 4 entries"), "{}", e.message);
}
