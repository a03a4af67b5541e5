//! A short decode loop with the Rust binding: a two-layer f32 cache, three
//! requests, and per step one transaction (RoPE + append per layer, paged
//! decode over the transaction's rows, commit).
use flashdec::{Cache, CacheConfig, DType};

const LAYERS: u32 = 2;
const KV_HEADS: u32 = 2;
const Q_HEADS: u32 = 4;
const HEAD_DIM: u32 = 64;

fn noise(state: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn main() -> Result<(), flashdec::Error> {
    println!("libflashdec {}", flashdec::version());
    let mut cache = Cache::new(&CacheConfig {
        num_layers: LAYERS,
        num_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        block_size: 16,
        max_blocks: 64,
        dtype: DType::F32,
        ..CacheConfig::default()
    })?;
    let ids = [101u64, 102, 103];
    for id in ids {
        cache.add_request(id)?;
    }
    let mut rng = 7u64;
    let n = ids.len();
    let (qn, kvn) = (n * (Q_HEADS * HEAD_DIM) as usize, n * (KV_HEADS * HEAD_DIM) as usize);
    for step in 0..20 {
        let mut tx = cache.begin(&ids)?;
        let mut norms = Vec::new();
        for layer in 0..LAYERS {
            let (q, k, v) = (noise(&mut rng, qn), noise(&mut rng, kvn), noise(&mut rng, kvn));
            let mut q_rot = vec![0f32; qn];
            tx.write_layer_rope(layer, &q, Q_HEADS, &k, &v, HEAD_DIM, 10000.0, &mut q_rot)?;
            let (_, tables) = tx.block_tables(None)?;
            let lens = tx.rows()?.effective_seq_lens;
            let mut out = vec![0f32; qn];
            tx.cache().decode_layer(layer, &q_rot, Q_HEADS, &tables, &lens, &mut out, 0)?;
            norms.push(out.iter().map(|x| x * x).sum::<f32>().sqrt());
        }
        tx.commit().map_err(|(e, _)| e)?;
        if step % 5 == 4 {
            let m = cache.metrics()?;
            println!("step {step:2}: used_blocks={} active_tokens={} |out| per layer={norms:.3?}", m.used_blocks, m.active_tokens);
        }
    }
    cache.finish_request(101)?;
    cache.cancel_request(102)?;
    cache.validate()?;
    let m = cache.metrics()?;
    println!("done: commits={} free_blocks={}", m.transaction_commit_count, m.free_blocks);
    Ok(())
}
