//! Helpers shared by the test files (each `mod common;`; not every file uses
//! every helper).
#![allow(dead_code)]
use flashdec::{CacheConfig, DType};

/// An f32 CPU cache of `layers` layers: 2 KV heads, head_dim 8, blocks of 4
/// tokens, 8 blocks.
pub fn small(layers: u32) -> CacheConfig {
    CacheConfig { num_layers: layers, num_kv_heads: 2, head_dim: 8, block_size: 4, max_blocks: 8, dtype: DType::F32, ..CacheConfig::default() }
}

/// `n` deterministic values in [-0.5, 0.5) from `seed` (an LCG).
pub fn noise(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}
