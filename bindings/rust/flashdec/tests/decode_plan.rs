//! Decode plans on the CPU: plan + run gives fd_decode's bits, a run that
//! differs from its plan is refused, and mixed element types are served on
//! the CPU. Multi-token queries (`decode_multi`,
//! `DecodePlan::new_multi`): causal attention against an f64 reference, the
//! binding's length checks, the library's offset checks, and CUDA's need of
//! max_q_len_hint with q_indptr (raw parameters).
mod common;
use common::noise;
use flashdec::*;

const HQ: u32 = 4;
const HKV: u32 = 2;
const D: u32 = 8;
const BS: u32 = 4;
const NB: usize = 6;
const BLOCK: usize = (HKV * BS * D) as usize;
/// Three rows of 9, 0 and 5 tokens (three table slots each).
const TABLES: [i32; 9] = [4, 1, 0, -1, -1, -1, 5, 2, -1];
const LENS: [i32; 3] = [9, 0, 5];

/// q, k, v of one layer.
fn layer(seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut s = seed;
    let q = noise(&mut s, LENS.len() * (HQ * D) as usize);
    let k = noise(&mut s, NB * BLOCK);
    let v = noise(&mut s, NB * BLOCK);
    (q, k, v)
}

fn paged<'a, T: KvElement>(k: &'a [T], v: &'a [T]) -> PagedKv<'a, T> {
    PagedKv { k, v, num_kv_heads: HKV, head_dim: D, block_size: BS, layout: Layout::TokenMajor }
}

fn assert_send_sync<T: Send + Sync>() {}

/// The raw parameters of this file's problem (f32, no buffers yet).
fn raw_params() -> sys::fd_decode_params {
    let mut p = default_decode_params();
    p.batch = LENS.len() as u32;
    p.num_q_heads = HQ;
    p.num_kv_heads = HKV;
    p.head_dim = D;
    p.q_dtype = sys::FD_DTYPE_F32;
    p.kv_dtype = sys::FD_DTYPE_F32;
    p.out_dtype = sys::FD_DTYPE_F32;
    p.block_size = BS;
    p.num_blocks = NB as u32;
    p.max_blocks_per_seq = 3;
    p
}

#[test]
fn plan_run_equals_decode_bit_for_bit() {
    assert_send_sync::<DecodePlan>();
    let options = DecodeOptions { num_splits: 2, cpu_threads: 2, ..DecodeOptions::default() };
    let (q0, k0, v0) = layer(1);
    let out0 = vec![0f32; q0.len()];
    for host in [None, Some(&LENS[..])] {
        let plan = DecodePlan::new(&q0, HQ, &paged(&k0, &v0), &TABLES, &LENS, &out0, options, host).unwrap();
        plan.workspace_size().unwrap();
        for seed in [2, 3] {
            // one plan, several layers
            let (q, k, v) = layer(seed);
            let mut want = vec![0f32; q.len()];
            decode(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &mut want, options).unwrap();
            let mut got = vec![7f32; q.len()];
            plan.run(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &mut got).unwrap();
            assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            assert!(got[(HQ * D) as usize..(2 * HQ * D) as usize].iter().all(|&x| x == 0.0), "empty row");
        }
    }

    // Half types, through a plan shared by threads.
    let (q, k, v) = layer(4);
    let (q, k, v): (Vec<Bf16>, Vec<Bf16>, Vec<Bf16>) =
        (q.iter().map(|&x| Bf16::from_f32(x)).collect(), k.iter().map(|&x| Bf16::from_f32(x)).collect(), v.iter().map(|&x| Bf16::from_f32(x)).collect());
    let mut want = vec![Bf16(0); q.len()];
    decode(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &mut want, DecodeOptions::default()).unwrap();
    let plan = DecodePlan::new(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &want, DecodeOptions::default(), Some(&LENS)).unwrap();
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let mut got = vec![Bf16(0); q.len()];
                plan.run(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &mut got).unwrap();
                assert_eq!(got, want);
            });
        }
    });
}

#[test]
fn run_that_differs_from_its_plan_is_refused() {
    let (q, k, v) = layer(5);
    let mut out = vec![7f32; q.len()];
    let plan = DecodePlan::new(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &out, DecodeOptions::default(), Some(&LENS)).unwrap();
    // Two query heads instead of four.
    let e = plan.run(&q[..q.len() / 2], HQ / 2, &paged(&k, &v), &TABLES, &LENS, &mut out[..q.len() / 2]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("num_q_heads"), "{}", e.message);
    // Two rows instead of three.
    let rows = (2 * HQ * D) as usize;
    let e = plan.run(&q[..rows], HQ, &paged(&k, &v), &TABLES[..6], &LENS[..2], &mut out[..rows]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("batch"), "{}", e.message);
    // Raw parameters: another head_dim than planned.
    let mut p = raw_params();
    let raw_plan = unsafe { DecodePlan::from_params(&p, Some(&LENS)) }.unwrap();
    p.q = q.as_ptr().cast();
    p.k_cache = k.as_ptr().cast();
    p.v_cache = v.as_ptr().cast();
    p.block_tables = TABLES.as_ptr();
    p.seq_lens = LENS.as_ptr();
    p.out = out.as_mut_ptr().cast();
    p.head_dim = D / 2;
    let e = unsafe { raw_plan.run_raw(&p) }.unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("head_dim"), "{}", e.message);
    p.head_dim = D;
    assert!(out.iter().all(|&x| x == 7.0), "a refused run wrote out");
    let e = unsafe { DecodePlan::from_params(&p, Some(&LENS[..2])) }.unwrap_err();
    assert!(e.message.contains("host_seq_lens"), "{}", e.message);
}

/// Multi-token queries: two rows of 5 and 3 K/V tokens whose last 2 and 3
/// tokens are queries (rows of 2 table slots over the blocks of `layer`).
const MT_TABLES: [i32; 4] = [4, 1, 5, -1];
const MT_LENS: [i32; 2] = [5, 3];
const MT_INDPTR: [i32; 3] = [0, 2, 5];

/// Causal attention in f64 over the paged token-major K/V: query j of a row
/// of n queries and len tokens sees positions 0..=len - n + j.
fn causal_reference(q: &[f32], k: &[f32], v: &[f32], tables: &[i32], lens: &[i32], indptr: &[i32]) -> Vec<f64> {
    let (hq, hkv, d, bs) = (HQ as usize, HKV as usize, D as usize, BS as usize);
    let slots = tables.len() / lens.len();
    let at = |r: usize, h: usize, t: usize| {
        let block = tables[r * slots + t / bs] as usize;
        ((block * hkv + h) * bs + t % bs) * d
    };
    let mut out = vec![0f64; q.len()];
    for r in 0..lens.len() {
        let (first, n, len) = (indptr[r] as usize, (indptr[r + 1] - indptr[r]) as usize, lens[r] as usize);
        for j in 0..n {
            let visible = len - n + j + 1;
            for h in 0..hq {
                let kh = h / (hq / hkv);
                let qv = &q[((first + j) * hq + h) * d..][..d];
                let s: Vec<f64> = (0..visible)
                    .map(|t| (0..d).map(|i| qv[i] as f64 * k[at(r, kh, t) + i] as f64).sum::<f64>() / (d as f64).sqrt())
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let sum: f64 = w.iter().sum();
                for i in 0..d {
                    out[((first + j) * hq + h) * d + i] = (0..visible).map(|t| w[t] * v[at(r, kh, t) + i] as f64).sum::<f64>() / sum;
                }
            }
        }
    }
    out
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn multi_token_queries_match_a_causal_reference() {
    let (_, k, v) = layer(8);
    let q = noise(&mut 9, MT_INDPTR[2] as usize * (HQ * D) as usize);
    let want = causal_reference(&q, &k, &v, &MT_TABLES, &MT_LENS, &MT_INDPTR);
    let mut out = vec![7f32; q.len()];
    decode_multi(&q, &MT_INDPTR, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, &mut out, DecodeOptions::default()).unwrap();
    for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
        assert!((got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "out[{i}] = {got}, reference {want}");
    }
    // The last row's first query sees position 0 only: V there.
    let (hd, d) = ((HQ * D) as usize, D as usize);
    for h in 0..HQ as usize {
        let v0 = &v[((5 * HKV as usize + h / 2) * BS as usize) * d..][..d];
        assert_eq!(&out[2 * hd + h * d..][..d], v0);
    }
    // The same bits for other thread counts, a hint, and through a plan.
    for options in [
        DecodeOptions { cpu_threads: 3, ..DecodeOptions::default() },
        DecodeOptions { max_q_len_hint: 3, num_splits: 2, ..DecodeOptions::default() },
    ] {
        let mut got = vec![7f32; q.len()];
        decode_multi(&q, &MT_INDPTR, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, &mut got, options).unwrap();
        assert_eq!(bits(&got), bits(&out));
        let plan = DecodePlan::new_multi(&q, &MT_INDPTR, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, &got, options, Some(&MT_LENS)).unwrap();
        assert_eq!(plan.q_indptr(), Some(&MT_INDPTR[..]));
        got.fill(7.0);
        plan.run(&q, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, &mut got).unwrap();
        assert_eq!(bits(&got), bits(&out));
    }
}

#[test]
fn one_token_rows_through_q_indptr_equal_decode() {
    let (q, k, v) = layer(10);
    let lens = [9, 1, 5];
    let tables = [4, 1, 0, 3, -1, -1, 5, 2, -1];
    let mut want = vec![0f32; q.len()];
    decode(&q, HQ, &paged(&k, &v), &tables, &lens, &mut want, DecodeOptions::default()).unwrap();
    let mut got = vec![7f32; q.len()];
    let indptr = [0, 1, 2, 3];
    decode_multi(&q, &indptr, HQ, &paged(&k, &v), &tables, &lens, &mut got, DecodeOptions::default()).unwrap();
    assert_eq!(bits(&got), bits(&want));
    let plan = DecodePlan::new(&q, HQ, &paged(&k, &v), &tables, &lens, &got, DecodeOptions { max_q_len_hint: 1, ..DecodeOptions::default() }, None).unwrap();
    assert_eq!(plan.q_indptr(), None);
    got.fill(7.0);
    plan.run(&q, HQ, &paged(&k, &v), &tables, &lens, &mut got).unwrap();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn multi_token_lengths_are_checked_by_the_binding() {
    let (_, k, v) = layer(11);
    let q = noise(&mut 12, 5 * (HQ * D) as usize);
    let mut out = vec![7f32; q.len()];
    let row = (HQ * D) as usize;
    let o = DecodeOptions::default();
    let cases: [(&[f32], &[i32], usize, &str); 5] = [
        (&q, &MT_INDPTR[..2], q.len(), "q_indptr: expected 3 entries (batch + 1), got 2"),
        (&q, &[0, 2, 5, 6], q.len(), "q_indptr: expected 3 entries (batch + 1), got 4"),
        (&q, &[0, 2, 4], q.len(), "q: expected 128 elements (4 query tokens (q_indptr[2]) x 4 x 8), got 160"),
        (&q[..4 * row], &MT_INDPTR, 4 * row, "q: expected 160 elements"),
        (&q, &[0, 2, -1], q.len(), "q_indptr: q_indptr[2] = -1"),
    ];
    for (q, indptr, out_len, message) in cases {
        let e = decode_multi(q, indptr, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, &mut out[..out_len], o).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.message.contains(message), "{}", e.message);
        let e = DecodePlan::new_multi(q, indptr, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, &out[..out_len], o, None).unwrap_err();
        assert!(e.message.contains(message), "{}", e.message);
    }
    let e = decode_multi(&q, &MT_INDPTR, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, &mut out[..4 * row], o).unwrap_err();
    assert!(e.message.contains("out: expected 160 elements, got 128"), "{}", e.message);
    // A plan's run checks q and out against its q_indptr.
    let plan = DecodePlan::new_multi(&q, &MT_INDPTR, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, &out, o, None).unwrap();
    let e = plan.run(&q[..2 * row], HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, &mut out[..2 * row]).unwrap_err();
    assert!(e.message.contains("q: expected 160 elements"), "{}", e.message);
    assert!(out.iter().all(|&x| x == 7.0), "a refused call wrote out");
}

#[test]
fn bad_query_offsets_are_the_library_invalid_argument() {
    let (_, k, v) = layer(13);
    let row = (HQ * D) as usize;
    let q = noise(&mut 14, 6 * row);
    let mut out = vec![7f32; q.len()];
    let cases: [(&[i32], usize, i32, &str); 4] = [
        // Row 1 has 3 K/V tokens: 4 query tokens cannot all be among them.
        (&[0, 2, 6], 6, 0, "row 1 has 4 query tokens but seq_lens[1] = 3"),
        (&[1, 2, 5], 5, 0, "q_indptr[0] must be 0"),
        (&[0, 0, 5], 5, 0, "q_indptr must increase"),
        (&MT_INDPTR, 5, 2, "row 1 has 3 query tokens, more than max_q_len_hint = 2"),
    ];
    for (indptr, tokens, hint, message) in cases {
        let options = DecodeOptions { max_q_len_hint: hint, ..DecodeOptions::default() };
        let (q, out) = (&q[..tokens * row], &mut out[..tokens * row]);
        let e = decode_multi(q, indptr, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, out, options).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.message.contains(message), "{}", e.message);
        let plan = DecodePlan::new_multi(q, indptr, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, out, options, Some(&MT_LENS)).unwrap();
        let e = plan.run(q, HQ, &paged(&k, &v), &MT_TABLES, &MT_LENS, out).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.message.contains(message), "{}", e.message);
    }
    assert!(out.iter().all(|&x| x == 7.0), "a refused call wrote out");
}

/// On CUDA the host cannot read the device's q_indptr: it plans from
/// max_q_len_hint, which q_indptr requires there (raw parameters; refused
/// before the device is looked at, so this runs without a GPU).
#[test]
fn cuda_device_needs_max_q_len_hint_with_q_indptr() {
    let (_, k, v) = layer(15);
    let q = noise(&mut 16, 5 * (HQ * D) as usize);
    let mut out = vec![7f32; q.len()];
    let mut p = raw_params();
    p.batch = 2;
    p.max_blocks_per_seq = 2;
    p.q = q.as_ptr().cast();
    p.q_indptr = MT_INDPTR.as_ptr();
    p.k_cache = k.as_ptr().cast();
    p.v_cache = v.as_ptr().cast();
    p.block_tables = MT_TABLES.as_ptr();
    p.seq_lens = MT_LENS.as_ptr();
    p.out = out.as_mut_ptr().cast();
    unsafe { run_decode(&p) }.unwrap(); // the CPU needs no hint
    out.fill(7.0);
    p.device.type_ = sys::FD_DEVICE_CUDA;
    let e = unsafe { run_decode(&p) }.unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("max_q_len_hint must be > 0 with q_indptr on CUDA"), "{}", e.message);
    let e = unsafe { DecodePlan::from_params(&p, None) }.unwrap_err();
    assert!(e.message.contains("max_q_len_hint must be > 0 with q_indptr on CUDA"), "{}", e.message);
    assert!(out.iter().all(|&x| x == 7.0));
}

#[test]
fn mixed_element_types_on_the_cpu() {
    // The CPU backend serves q and out each f32/F16/Bf16 over any K/V type
    // (0.2, issue 15): the attention of f32 over the same values.
    let (q, k, v) = layer(7);
    let q: Vec<Bf16> = q.iter().map(|&x| Bf16::from_f32(x)).collect();
    let (k, v): (Vec<F16>, Vec<F16>) = (k.iter().map(|&x| F16::from_f32(x)).collect(), v.iter().map(|&x| F16::from_f32(x)).collect());
    let (q32, k32, v32): (Vec<f32>, Vec<f32>, Vec<f32>) =
        (q.iter().map(|x| x.to_f32()).collect(), k.iter().map(|x| x.to_f32()).collect(), v.iter().map(|x| x.to_f32()).collect());
    let mut want = vec![0f32; q.len()];
    decode(&q32, HQ, &paged(&k32, &v32), &TABLES, &LENS, &mut want, DecodeOptions::default()).unwrap();
    let mut out = vec![7f32; q.len()];
    decode(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &mut out, DecodeOptions::default()).unwrap();
    let mut planned = vec![7f32; q.len()];
    let plan = DecodePlan::new(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &planned, DecodeOptions::default(), None).unwrap();
    plan.run(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &mut planned).unwrap();
    for (got, w) in [(&out, &want), (&planned, &want)] {
        assert!(got.iter().zip(w.iter()).all(|(a, b)| (a - b).abs() <= 1e-6 + 1e-5 * b.abs()), "{got:?} vs {w:?}");
    }
}
