//! Parity scenario through the Rust binding; prints exactly what
//! bindings/parity/parity.c prints.
use flashdec::sys::FieldValue;
use flashdec::{Cache, CacheConfig, DType, Error};

const LAYERS: u32 = 2;
const KV_HEADS: u32 = 2;
const Q_HEADS: u32 = 4;
const HEAD_DIM: u32 = 8;
const BLOCK: u32 = 4;
const MAX_BLOCKS: u32 = 16;
const SEED: u64 = 20240601;

struct SplitMix64(u64);
impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    fn fill(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| ((self.next() >> 40) as i32 - 8388608) as f32 / 8388608.0).collect()
    }
}

fn fnv1a(x: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for v in x {
        for b in v.to_bits().to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
    h
}

fn ints(label: &str, xs: &[i32]) -> String {
    format!(" {label}={}", xs.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","))
}

fn error_line(what: &str, e: &Error) -> String {
    format!("error {what} status={} {} | {}", e.status.raw(), e.status.name(), e.message)
}

fn main() -> Result<(), Error> {
    let mut rng = SplitMix64(SEED);
    println!("version {} {}", flashdec::version(), flashdec::version_number());
    let cfg = CacheConfig {
        num_layers: LAYERS,
        num_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        block_size: BLOCK,
        max_blocks: MAX_BLOCKS,
        dtype: DType::F32,
        ..CacheConfig::default()
    };
    let mut cache = Cache::new(&cfg)?;
    for id in [11, 22, 33] {
        cache.add_request(id)?;
    }
    let kv = (KV_HEADS * HEAD_DIM) as usize;
    let qn = (Q_HEADS * HEAD_DIM) as usize;
    for step in 0..6 {
        let ids: &[u64] = if step % 3 == 2 { &[11, 33] } else { &[11, 22, 33] };
        let n = ids.len();
        let mut tx = cache.begin(ids)?;
        let rows = tx.rows()?;
        println!(
            "step {step} tx={} rows={n}{}{}{}{}",
            tx.id(),
            ints("positions", &rows.positions),
            ints("blocks", &rows.block_ids),
            ints("offsets", &rows.offsets),
            ints("effective", &rows.effective_seq_lens)
        );
        for layer in 0..LAYERS {
            let k = rng.fill(n * kv);
            let v = rng.fill(n * kv);
            tx.write_layer(layer, &k, &v)?;
        }
        tx.commit().map_err(|(e, _)| e)?;
        let stride = cache.max_blocks_per_seq(ids)?;
        let ex = cache.export(ids, Some(stride))?;
        println!("export stride={stride}{}{}", ints("lens", &ex.seq_lens), ints("tables", &ex.block_tables));
        for layer in 0..LAYERS {
            let q = rng.fill(n * qn);
            let mut out = vec![0f32; n * qn];
            cache.decode_layer(layer, &q, Q_HEADS, &ex.block_tables, &ex.seq_lens, &mut out, 1)?;
            println!(
                "decode step={step} layer={layer} hash={:016x} first={:08x} last={:08x}",
                fnv1a(&out),
                out[0].to_bits(),
                out[out.len() - 1].to_bits()
            );
        }
    }

    let tx = cache.begin(&[11])?;
    let raw_tx = tx.raw();
    let (k, v) = (rng.fill(kv), rng.fill(kv));
    let mut tx = tx;
    if let Err(e) = tx.write_layer(1, &k, &v) {
        println!("{}", error_line("write_layer", &e));
    }
    tx.abort()?;
    // A second abort of the same handle: only reachable through the raw API,
    // since the safe Transaction is consumed by abort().
    if let Err(e) = flashdec::check_status(unsafe { flashdec::sys::fd_tx_abort(cache.as_raw(), raw_tx) }) {
        println!("{}", error_line("abort", &e));
    }
    cache.add_request(99)?;
    cache.finish_request(99)?;
    if let Err(e) = cache.add_request(99) {
        println!("{}", error_line("add_request", &e));
    }
    cache.finish_request(22)?;
    cache.cancel_request(33)?;
    let mut states = String::from("states");
    for id in [11u64, 22, 33, 99, 44] {
        let s = match cache.request_state(id)? {
            flashdec::RequestState::Unknown => 0,
            flashdec::RequestState::Active => 1,
            flashdec::RequestState::Finished => 2,
            flashdec::RequestState::Cancelled => 3,
        };
        states += &format!(" {id}={s}");
    }
    println!("{states}");
    for (name, value) in cache.metrics()?.named_fields() {
        match value {
            FieldValue::U64(x) => println!("metric {name} {x}"),
            FieldValue::F64(x) => println!("metric {name} {x:.6}"),
        }
    }
    match cache.validate() {
        Ok(()) => println!("validate ok"),
        Err(e) => println!("validate {}", e.message),
    }
    drop(cache);
    println!("done");
    Ok(())
}
