//! Stateless operations: paged decode, RoPE, dense reference, devices.
use crate::error::{check, Error, Result};
use crate::sizes::{elem_count, to_u32};
use crate::types::{Element, Layout};
use flashdec_sys as sys;
use std::mem::MaybeUninit;


/// Usable CUDA devices (0 without CUDA; not an error).
pub fn cuda_device_count() -> Result<i32> {
    let mut n = 0i32;
    check(unsafe { sys::fd_cuda_device_count(&mut n) })?;
    Ok(n)
}

/// `fd_decode_params` with defaults from `fd_decode_params_init`.
pub fn default_decode_params() -> sys::fd_decode_params {
    let mut p = MaybeUninit::<sys::fd_decode_params>::zeroed();
    unsafe { sys::fd_decode_params_init(p.as_mut_ptr()) };
    unsafe { p.assume_init() }
}

/// Runs `fd_decode` on raw parameters (device pointers, custom strides).
///
/// # Safety
/// Every pointer in `params` must be valid for the shapes it describes, on
/// `params.device`, for the duration of the call (CUDA: until the stream
/// reaches the work).
pub unsafe fn run_decode(params: &sys::fd_decode_params) -> Result<()> {
    check(sys::fd_decode(params))
}

/// Checks q/out/tables/lens lengths and fills the shared fields.
pub(crate) fn decode_params_base<T: Element>(
    q: &[T],
    num_q_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_tables: &[i32],
    seq_lens: &[i32],
    out: &mut [T],
) -> Result<sys::fd_decode_params> {
    let batch = seq_lens.len();
    if batch == 0 {
        return Err(Error::invalid("seq_lens: batch must be at least 1"));
    }
    let q_elems = elem_count(&[batch, num_q_heads as usize, head_dim as usize], "q/out")?;
    if q.len() != q_elems {
        return Err(Error::invalid(format!("q: expected {q_elems} elements ({batch} x {num_q_heads} x {head_dim}), got {}", q.len())));
    }
    if out.len() != q_elems {
        return Err(Error::invalid(format!("out: expected {q_elems} elements, got {}", out.len())));
    }
    if block_tables.is_empty() || block_tables.len() % batch != 0 {
        return Err(Error::invalid(format!("block_tables: {} entries is not a positive multiple of batch {batch}", block_tables.len())));
    }
    let mut p = default_decode_params();
    p.dtype = T::DTYPE.raw();
    p.batch = to_u32(batch, "seq_lens: batch")?;
    p.num_q_heads = num_q_heads;
    p.num_kv_heads = num_kv_heads;
    p.head_dim = head_dim;
    p.max_blocks_per_seq = to_u32(block_tables.len() / batch, "block_tables: entries per row")?;
    p.q = q.as_ptr().cast();
    p.block_tables = block_tables.as_ptr();
    p.seq_lens = seq_lens.as_ptr();
    p.out = out.as_mut_ptr().cast();
    Ok(p)
}

/// Paged K/V storage of one layer in host memory, packed in `layout`:
/// token-major [num_blocks, num_kv_heads, block_size, head_dim] or dim-major
/// [num_blocks, num_kv_heads, head_dim, block_size].
#[derive(Copy, Clone, Debug)]
pub struct PagedKv<'a, T: Element> {
    pub k: &'a [T],
    pub v: &'a [T],
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    pub layout: Layout,
}

/// Options of [`decode`]; `Default` = automatic scale/splits, all threads.
#[derive(Copy, Clone, Debug, Default)]
pub struct DecodeOptions {
    pub sm_scale: f32,
    pub num_splits: i32,
    pub cpu_threads: u32,
}

/// Paged decode attention (S2) on the CPU backend over host slices.
/// q, out: [batch, num_q_heads, head_dim], batch = seq_lens.len();
/// block_tables: [batch, max_blocks_per_seq].
pub fn decode<T: Element>(
    q: &[T],
    num_q_heads: u32,
    kv: &PagedKv<'_, T>,
    block_tables: &[i32],
    seq_lens: &[i32],
    out: &mut [T],
    options: DecodeOptions,
) -> Result<()> {
    let block_elems = elem_count(&[kv.num_kv_heads as usize, kv.block_size as usize, kv.head_dim as usize], "k: a block")?;
    if block_elems == 0 || kv.k.len() % block_elems != 0 || kv.k.is_empty() {
        return Err(Error::invalid(format!("k: {} elements is not a positive multiple of a block ({block_elems})", kv.k.len())));
    }
    if kv.v.len() != kv.k.len() {
        return Err(Error::invalid(format!("v: expected {} elements like k, got {}", kv.k.len(), kv.v.len())));
    }
    let num_blocks = u32::try_from(kv.k.len() / block_elems).map_err(|_| Error::invalid("k: too many blocks"))?;
    let mut p = decode_params_base(q, num_q_heads, kv.num_kv_heads, kv.head_dim, block_tables, seq_lens, out)?;
    p.layout = kv.layout.raw();
    p.block_size = kv.block_size;
    p.num_blocks = num_blocks;
    p.k_cache = kv.k.as_ptr().cast();
    p.v_cache = kv.v.as_ptr().cast();
    p.sm_scale = options.sm_scale;
    p.num_splits = options.num_splits;
    p.cpu_threads = options.cpu_threads;
    // Split-KV partials need scratch: size it and own it for the call.
    let mut bytes = 0usize;
    check(unsafe { sys::fd_decode_workspace_size(&p, &mut bytes) })?;
    let mut workspace = vec![0u64; bytes.div_ceil(8)];
    if bytes > 0 {
        p.workspace = workspace.as_mut_ptr().cast();
        p.workspace_size = bytes;
    }
    // SAFETY: all slices were checked against the shapes; host block ids and
    // seq_lens are range-checked by the library before it reads K/V.
    unsafe { run_decode(&p) }
}

/// RoPE in place (S3.1): x is [positions.len(), num_heads, head_dim].
pub fn rope_apply<T: Element>(x: &mut [T], num_heads: u32, head_dim: u32, positions: &[i32], rotary_dim: u32, rope_base: f32) -> Result<()> {
    let want = elem_count(&[positions.len(), num_heads as usize, head_dim as usize], "x")?;
    if x.len() != want {
        return Err(Error::invalid(format!("x: expected {want} elements, got {}", x.len())));
    }
    let n = u32::try_from(positions.len()).map_err(|_| Error::invalid("positions: too many tokens"))?;
    check(unsafe {
        sys::fd_rope_apply(T::DTYPE.raw(), x.as_mut_ptr().cast(), n, num_heads, head_dim, positions.as_ptr(), rotary_dim, rope_base)
    })
}

/// Dense reference attention: q [batch, hq, d], k/v [batch, hkv, max_seq_len, d].
#[allow(clippy::too_many_arguments)]
pub fn reference_attention_dense<T: Element>(
    q: &[T],
    num_q_heads: u32,
    k: &[T],
    v: &[T],
    num_kv_heads: u32,
    head_dim: u32,
    seq_lens: &[i32],
    sm_scale: f32,
    out: &mut [T],
) -> Result<()> {
    let batch = seq_lens.len();
    let per_row = elem_count(&[batch, num_kv_heads as usize, head_dim as usize], "k/v")?;
    if per_row == 0 || k.len() % per_row != 0 || v.len() != k.len() {
        return Err(Error::invalid(format!("k/v: {} and {} elements do not form [batch, num_kv_heads, max_seq_len, head_dim]", k.len(), v.len())));
    }
    let max_seq_len = to_u32(k.len() / per_row, "k/v: max_seq_len")?;
    let q_elems = elem_count(&[batch, num_q_heads as usize, head_dim as usize], "q/out")?;
    if q.len() != q_elems || out.len() != q_elems {
        return Err(Error::invalid(format!("q/out: expected {q_elems} elements, got {} and {}", q.len(), out.len())));
    }
    check(unsafe {
        sys::fd_reference_attention_dense(
            T::DTYPE.raw(),
            to_u32(batch, "seq_lens: batch")?,
            num_q_heads,
            num_kv_heads,
            head_dim,
            max_seq_len,
            q.as_ptr().cast(),
            k.as_ptr().cast(),
            v.as_ptr().cast(),
            seq_lens.as_ptr(),
            sm_scale,
            out.as_mut_ptr().cast(),
        )
    })
}

