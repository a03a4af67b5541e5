//! Safe API behaviour: errors carry status and message, failures change
//! nothing, decode agrees with the dense reference, engine and scheduler work.
mod common;
use common::{noise, small};
use flashdec::*;

fn assert_send<T: Send>() {}

#[test]
fn version_and_compatibility() {
    assert_eq!(version_number(), sys::FD_VERSION_NUMBER);
    assert!(is_compatible(version_number()));
    assert!(!is_compatible(version_number() + 10000));
    assert!(is_compatible(version_number() + 1)); // newer patch
    // A newer minor: before 1.0 it may have changed the ABI, so it must match.
    assert_eq!(is_compatible(version_number() + 100), sys::FD_VERSION_MAJOR != 0);
    if sys::FD_VERSION_NUMBER % 10000 >= 100 {
        assert!(!is_compatible(sys::FD_VERSION_NUMBER - 100)); // older minor
    }
    assert!(version().starts_with("0."));
    assert!(cuda_device_count().unwrap() >= 0);
    assert_send::<Cache>();
    assert_send::<Engine<'static>>();
}

#[test]
fn invalid_config_is_an_error_with_message() {
    let e = Cache::new(&CacheConfig { num_layers: 0, ..small(1) }).err().unwrap();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("num_layers"), "{}", e.message);
    assert!(e.to_string().starts_with("FD_ERR_INVALID_ARGUMENT"));
}

#[test]
fn transaction_commit_and_export() {
    let mut c = Cache::new(&small(2)).unwrap();
    c.add_request(1).unwrap();
    c.add_request(2).unwrap();
    let mut seed = 1;
    for _ in 0..5 {
        let mut tx = c.begin(&[1, 2]).unwrap();
        for layer in 0..2 {
            tx.write_layer(layer, &noise(&mut seed, 32), &noise(&mut seed, 32)).unwrap();
        }
        tx.commit().map_err(|(e, _)| e).unwrap();
    }
    let ex = c.export(&[2, 1], None).unwrap();
    assert_eq!(ex.seq_lens, vec![5, 5]);
    assert_eq!(ex.table_stride, 2);
    let m = c.metrics().unwrap();
    assert_eq!((m.used_blocks, m.active_tokens, m.transaction_commit_count), (4, 10, 5));
    c.validate().unwrap();
}

#[test]
fn wrong_layer_and_early_commit_change_nothing() {
    let mut c = Cache::new(&small(2)).unwrap();
    c.add_request(1).unwrap();
    let mut seed = 2;
    let mut tx = c.begin(&[1]).unwrap();
    let e = tx.write_layer(1, &noise(&mut seed, 16), &noise(&mut seed, 16)).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("layer 0") && e.message.contains("layer 1"), "{}", e.message);
    assert_eq!(tx.info().unwrap().next_layer, 0);
    tx.write_layer(0, &noise(&mut seed, 16), &noise(&mut seed, 16)).unwrap();
    let (e, tx) = tx.commit().unwrap_err();
    assert_eq!(e.status, Status::InvalidState);
    assert_eq!(tx.info().unwrap().next_layer, 1);
    drop(tx); // aborts
    let m = c.metrics().unwrap();
    assert_eq!((m.open_transaction_count, m.transaction_abort_count, m.used_blocks), (0, 1, 0));
    assert_eq!(c.export(&[1], None).unwrap().seq_lens, vec![0]);
}

#[test]
fn binding_checks_refuse_bad_slices() {
    let mut c = Cache::new(&small(1)).unwrap();
    c.add_request(1).unwrap();
    let e = c.append(&[1], &[0f32; 15], &[0f32; 16]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("k"));
    let e = c.append(&[1], &[F16(0); 16], &[F16(0); 16]).unwrap_err();
    assert!(e.message.contains("element type"));
    assert_eq!(c.metrics().unwrap().allocation_count, 0);
    let e = c.attach_prefix(1, "a\0b").unwrap_err();
    assert!(e.message.contains("NUL"));
}

#[test]
fn decode_matches_dense_reference() {
    let (hq, hkv, d, bs) = (4u32, 2u32, 8u32, 4u32);
    let mut seed = 3;
    let nb = 4usize;
    let k = noise(&mut seed, nb * (hkv * bs * d) as usize);
    let v = noise(&mut seed, k.len());
    let q = noise(&mut seed, 2 * (hq * d) as usize);
    let tables = [2, 0, 1, 3];
    let lens = [6, 3];
    let mut out = vec![0f32; q.len()];
    let kv = PagedKv { k: &k, v: &v, num_kv_heads: hkv, head_dim: d, block_size: bs, layout: Layout::TokenMajor };
    decode(&q, hq, &kv, &tables, &lens, &mut out, DecodeOptions::default()).unwrap();
    // dense copy [batch, hkv, 8, d]
    let mut dk = vec![0f32; 2 * (hkv * 8 * d) as usize];
    let mut dv = dk.clone();
    for r in 0..2 {
        for j in 0..2 {
            let b = tables[r * 2 + j] as usize;
            for h in 0..hkv as usize {
                for t in 0..bs as usize {
                    for x in 0..d as usize {
                        let src = ((b * hkv as usize + h) * bs as usize + t) * d as usize + x;
                        let dst = ((r * hkv as usize + h) * 8 + j * bs as usize + t) * d as usize + x;
                        dk[dst] = k[src];
                        dv[dst] = v[src];
                    }
                }
            }
        }
    }
    let mut want = vec![0f32; q.len()];
    reference_attention_dense(&q, hq, &dk, &dv, hkv, d, &lens, 0.0, &mut want).unwrap();
    for (a, b) in out.iter().zip(&want) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    let bad = [9, 0, 1, 3];
    let e = decode(&q, hq, &kv, &bad, &lens, &mut out, DecodeOptions::default()).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
}

#[test]
fn half_conversions_round_trip() {
    for x in [0.0f32, 1.0, -2.5, 65504.0, 1e-7, 0.333] {
        assert!((F16::from_f32(x).to_f32() - x).abs() <= x.abs() * 1e-3 + 1e-7, "{x}");
        assert!((Bf16::from_f32(x).to_f32() - x).abs() <= x.abs() * 1e-2, "{x}");
    }
    assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
}

#[test]
fn rope_rejects_odd_rotary_dim_without_writing() {
    let mut x = vec![1f32; 16];
    let e = rope_apply(&mut x, 2, 8, &[3], 3, 10000.0).unwrap_err();
    assert!(e.message.contains("rotary_dim"), "{}", e.message);
    assert!(x.iter().all(|&v| v == 1.0));
    rope_apply(&mut x, 2, 8, &[3], 8, 10000.0).unwrap();
    assert!(x.iter().any(|&v| v != 1.0));
}

#[test]
fn scheduler_plans_fifo() {
    let mut cfg = scheduler_config_default();
    cfg.max_active_requests = 2;
    cfg.max_batch_requests = 2;
    let s = Scheduler::new(&cfg).unwrap();
    let mut info = snapshot_info_default();
    info.block_size = 4;
    info.max_blocks = 8;
    info.free_blocks = 8;
    let mut snap = Snapshot::new(&info).unwrap();
    for i in 0..3u64 {
        snap.add_waiting(&RequestSpec::new(10 + i, 4, i), 0, 0).unwrap();
    }
    let e = snap.add_waiting(&RequestSpec::new(10, 4, 9), 0, 0).unwrap_err();
    assert_eq!(e.status, Status::AlreadyExists);
    let d = s.plan(&snap).unwrap();
    assert_eq!(d.ids(DecisionList::Admit).unwrap(), vec![10, 11]);
    assert_eq!(d.ids(DecisionList::Waiting).unwrap(), vec![12]);
    assert_eq!(d.summary().unwrap().committed_blocks_after, 2);
    assert!(d.reasons().unwrap().contains(&sys::FD_REASON_ADMITTED));
}

#[test]
fn engine_unscheduled_step_and_backpressure() {
    let mut cache = Cache::new(&CacheConfig { max_blocks: 1, ..small(2) }).unwrap();
    let mut ec = engine_config_default();
    ec.num_q_heads = 4;
    ec.cpu_threads = 1;
    let mut eng = Engine::new(&mut cache, &ec).unwrap();
    for id in [1, 2] {
        eng.add_request(id).unwrap();
        eng.admit(id).unwrap();
    }
    let mut seed = 4;
    match eng.begin_step(&[1, 2]).unwrap() {
        StepOutcome::Backpressure { needed_blocks, free_blocks } => assert_eq!((needed_blocks, free_blocks), (2, 1)),
        StepOutcome::Opened(_) => panic!("expected backpressure"),
    }
    match eng.begin_step(&[1]).unwrap() {
        StepOutcome::Opened(mut step) => {
            for layer in 0..2 {
                let mut out = vec![0f32; 32];
                step.layer(layer, &noise(&mut seed, 32), &noise(&mut seed, 16), &noise(&mut seed, 16), &mut out).unwrap();
                assert!(out.iter().any(|&x| x != 0.0));
            }
            step.commit().unwrap();
        }
        StepOutcome::Backpressure { .. } => panic!("expected a step"),
    }
    let m = eng.metrics().unwrap();
    assert_eq!((m.completed_step_count, m.backpressure_count), (1, 1));
    eng.validate().unwrap();
    assert_eq!(eng.request_state(1).unwrap(), EngineRequestState::Active);
}

#[test]
fn workloads_boundary_deadlock() {
    let cases = workload_cases(sys::FD_WORKLOAD_SCHEDULER).unwrap();
    assert!(cases.iter().any(|c| c == "boundary_deadlock"));
    let runs = run_workload(sys::FD_WORKLOAD_SCHEDULER, "boundary_deadlock", 0, 1).unwrap();
    assert_eq!(runs.len(), 3);
    let lifetime = runs.iter().find(|(r, _)| r.policy == sys::FD_POLICY_LIFETIME).unwrap();
    assert_eq!(lifetime.0.requests_completed, 2);
    assert!(!lifetime.1.is_empty());
    let e = run_workload(sys::FD_WORKLOAD_SCHEDULER, "no_such_case", 0, 1).unwrap_err();
    assert_eq!(e.status, Status::NotFound);
}

#[test]
fn workload_progress_callback() {
    let (mut calls, mut last, mut total) = (0u64, 0u64, 0u64);
    let mut monotone = true;
    let mut progress = |done: u64, t: u64| {
        calls += 1;
        monotone &= done >= last && done <= t;
        last = done;
        total = t;
    };
    let runs = run_workload_with_progress(sys::FD_WORKLOAD_SCHEDULER, "boundary_deadlock", 0, 1, Some(&mut progress)).unwrap();
    assert_eq!(runs.len(), 3);
    assert!(calls > 0 && monotone && last == total, "{calls} calls, last {last} of {total}");
    // A panic in the callback is re-raised after the run, not unwound through C.
    let mut seen = 0;
    let mut panicking = |_: u64, _: u64| {
        seen += 1;
        panic!("stop here");
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_workload_with_progress(sys::FD_WORKLOAD_SCHEDULER, "boundary_deadlock", 0, 1, Some(&mut panicking))
    }));
    let p = r.unwrap_err();
    assert_eq!(p.downcast_ref::<&str>(), Some(&"stop here"));
    assert_eq!(seen, 1);
}
