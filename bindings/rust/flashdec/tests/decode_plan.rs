//! Decode plans on the CPU: plan + run gives fd_decode's bits, a run that
//! differs from its plan is refused, and the 0.2 parameters that are not
//! served (q_indptr, mixed element types) are `Unsupported` naming the field.
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

fn noise(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// q, k, v of one layer.
fn layer(seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut s = seed;
    let q = noise(&mut s, LENS.len() * (HQ * D) as usize);
    let k = noise(&mut s, NB * BLOCK);
    let v = noise(&mut s, NB * BLOCK);
    (q, k, v)
}

fn paged<'a, T: Element>(k: &'a [T], v: &'a [T]) -> PagedKv<'a, T> {
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

#[test]
fn q_indptr_is_unsupported() {
    let (q, k, v) = layer(6);
    let mut out = vec![7f32; q.len()];
    let indptr = [0i32, 1, 2, 3];
    let mut p = raw_params();
    p.q = q.as_ptr().cast();
    p.k_cache = k.as_ptr().cast();
    p.v_cache = v.as_ptr().cast();
    p.block_tables = TABLES.as_ptr();
    p.seq_lens = LENS.as_ptr();
    p.out = out.as_mut_ptr().cast();
    unsafe { run_decode(&p) }.unwrap();
    out.fill(7.0);
    p.q_indptr = indptr.as_ptr();
    let e = unsafe { run_decode(&p) }.unwrap_err();
    assert_eq!(e.status, Status::Unsupported);
    assert!(e.message.contains("q_indptr"), "{}", e.message);
    let e = unsafe { DecodePlan::from_params(&p, None) }.unwrap_err();
    assert_eq!(e.status, Status::Unsupported);
    assert!(e.message.contains("q_indptr"), "{}", e.message);
    assert!(out.iter().all(|&x| x == 7.0));
    // More than one query token per row is not served either.
    let options = DecodeOptions { max_q_len_hint: 2, ..DecodeOptions::default() };
    let e = decode(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &mut out, options).unwrap_err();
    assert_eq!(e.status, Status::Unsupported);
    assert!(e.message.contains("max_q_len_hint"), "{}", e.message);
}

#[test]
fn mixed_element_types_are_unsupported() {
    let (q, k, v) = layer(7);
    let q: Vec<Bf16> = q.iter().map(|&x| Bf16::from_f32(x)).collect();
    let (k, v): (Vec<F16>, Vec<F16>) = (k.iter().map(|&x| F16::from_f32(x)).collect(), v.iter().map(|&x| F16::from_f32(x)).collect());
    let mut out = vec![Bf16(7); q.len()];
    let e = decode(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &mut out, DecodeOptions::default()).unwrap_err();
    assert_eq!(e.status, Status::Unsupported);
    assert!(e.message.contains("kv_dtype"), "{}", e.message);
    assert!(out.iter().all(|&x| x == Bf16(7)));
    let e = DecodePlan::new(&q, HQ, &paged(&k, &v), &TABLES, &LENS, &out, DecodeOptions::default(), None).unwrap_err();
    assert_eq!(e.status, Status::Unsupported);
    assert!(e.message.contains("kv_dtype"), "{}", e.message);
}
