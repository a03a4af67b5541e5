//! The checked append primitives `fd_kv_append` / `fd_rope_kv_append`
//! (S3.2): K/V of new tokens written at explicit (block, offset) slots of
//! caller-owned paged storage, with no allocator or request state.
use crate::error::{check, Error, Result};
use crate::sizes::elem_count;
use crate::types::{Element, KvElement, Layout, RopeStyle};
use flashdec_sys as sys;
use std::mem::MaybeUninit;

/// Writable paged K/V storage of one layer in host memory, packed in
/// `layout`: token-major [num_blocks, num_kv_heads, block_size, head_dim] or
/// dim-major [num_blocks, num_kv_heads, head_dim, block_size]. For custom
/// strides or device memory fill `sys::fd_kv_append_params` and call
/// [`run_kv_append`]. `T` is the K/V type of the new tokens or an FP8 type
/// ([`crate::Fp8E4m3`], [`crate::Fp8E5m2`]: the append quantises).
#[derive(Debug)]
pub struct PagedKvMut<'a, T: KvElement> {
    pub k: &'a mut [T],
    pub v: &'a mut [T],
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    pub layout: Layout,
}

/// `fd_kv_append_params` with defaults from `fd_kv_append_params_init`.
pub fn default_kv_append_params() -> sys::fd_kv_append_params {
    let mut p = MaybeUninit::<sys::fd_kv_append_params>::zeroed();
    // SAFETY: the init function writes every field of a valid pointer.
    unsafe { sys::fd_kv_append_params_init(p.as_mut_ptr()) };
    unsafe { p.assume_init() }
}

/// Runs `fd_kv_append` on raw parameters (device memory, custom strides).
///
/// # Safety
/// Every pointer in `params` must be valid for the shapes and strides it
/// describes, on `params.device`, until the call returns (CUDA: until the
/// stream reaches the work).
pub unsafe fn run_kv_append(params: &sys::fd_kv_append_params) -> Result<()> {
    check(sys::fd_kv_append(params))
}

/// Runs `fd_rope_kv_append` on raw parameters.
///
/// # Safety
/// As [`run_kv_append`]; `q` and `q_out` must be valid too.
pub unsafe fn run_rope_kv_append(params: &sys::fd_kv_append_params) -> Result<()> {
    check(sys::fd_rope_kv_append(params))
}

fn u32_of(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::invalid(format!("{what}: {n} does not fit in uint32")))
}

/// Checks the slices against each other and fills the shared fields. The
/// token count is block_ids.len(); `dtype` is the inputs' type, `cache_dtype`
/// the pages'.
fn base_params<T: Element, C: KvElement>(
    pages: &mut PagedKvMut<'_, C>,
    k: &[T],
    v: &[T],
    block_ids: &[i32],
    offsets: &[i32],
    scales: (f32, f32),
) -> Result<sys::fd_kv_append_params> {
    let n = block_ids.len();
    if n == 0 {
        return Err(Error::invalid("block_ids: at least one token is needed"));
    }
    if offsets.len() != n {
        return Err(Error::invalid(format!("offsets: expected {n} entries (one per token), got {}", offsets.len())));
    }
    let kv_elems = elem_count(&[n, pages.num_kv_heads as usize, pages.head_dim as usize], "k/v")?;
    if k.len() != kv_elems || v.len() != kv_elems {
        return Err(Error::invalid(format!(
            "k/v: expected {} elements ({n} x {} x {}), got {} and {}",
            kv_elems,
            pages.num_kv_heads,
            pages.head_dim,
            k.len(),
            v.len()
        )));
    }
    let block = elem_count(
        &[pages.num_kv_heads as usize, pages.head_dim as usize, pages.block_size as usize],
        "pages: a block",
    )?;
    if block == 0 || pages.k.is_empty() || pages.k.len() % block != 0 {
        return Err(Error::invalid(format!(
            "pages.k: {} elements is not a positive multiple of a block ({block})",
            pages.k.len()
        )));
    }
    if pages.v.len() != pages.k.len() {
        return Err(Error::invalid(format!("pages.v: expected {} elements like pages.k, got {}", pages.k.len(), pages.v.len())));
    }
    let mut p = default_kv_append_params();
    p.dtype = T::DTYPE.raw();
    p.cache_dtype = C::DTYPE.raw();
    (p.k_scale, p.v_scale) = scales;
    p.layout = pages.layout.raw();
    p.num_tokens = u32_of(n, "num_tokens")?;
    p.num_kv_heads = pages.num_kv_heads;
    p.head_dim = pages.head_dim;
    p.block_size = pages.block_size;
    p.num_blocks = u32_of(pages.k.len() / block, "num_blocks")?;
    p.k = k.as_ptr().cast();
    p.v = v.as_ptr().cast();
    p.k_cache = pages.k.as_mut_ptr().cast();
    p.v_cache = pages.v.as_mut_ptr().cast();
    p.block_ids = block_ids.as_ptr();
    p.offsets = offsets.as_ptr();
    Ok(p)
}

/// Writes token i's K and V ([n, num_kv_heads, head_dim], n =
/// block_ids.len()) into slot (block_ids\[i\], offsets\[i\]) of `pages`,
/// of k's type or FP8 (stored as saturate(x) rounded to nearest even: see
/// [`kv_append_scaled`] for scales). Every index is checked first: on Err
/// nothing is written.
pub fn kv_append<T: Element, C: KvElement>(pages: &mut PagedKvMut<'_, C>, k: &[T], v: &[T], block_ids: &[i32], offsets: &[i32]) -> Result<()> {
    kv_append_scaled(pages, k, v, block_ids, offsets, 1.0, 1.0)
}

/// [`kv_append`] with quantisation scales (`fd_kv_append_params.k_scale` /
/// `v_scale`): K is stored as saturate(k / k_scale), V likewise
/// (docs/semantics.md S1.1). Each finite and > 0, other than 1 only into FP8
/// pages, else `InvalidArgument` naming the field.
pub fn kv_append_scaled<T: Element, C: KvElement>(
    pages: &mut PagedKvMut<'_, C>,
    k: &[T],
    v: &[T],
    block_ids: &[i32],
    offsets: &[i32],
    k_scale: f32,
    v_scale: f32,
) -> Result<()> {
    let p = base_params(pages, k, v, block_ids, offsets, (k_scale, v_scale))?;
    // SAFETY: every slice was checked against the shapes in p (packed
    // strides), and the library range-checks the host index arrays.
    unsafe { run_kv_append(&p) }
}

/// Fused RoPE + append: rotates q ([n, num_q_heads, head_dim]) and k of
/// token i at positions\[i\], writes rotated K and raw V into
/// (block_ids\[i\], offsets\[i\]) and the rotated Q into `q_out` (q's length).
/// On Err nothing is written, `q_out` included. Pages of k's type or FP8
/// (the rotated K quantised from its FP32 value; scales:
/// [`rope_kv_append_scaled`]).
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_append<T: Element, C: KvElement>(
    pages: &mut PagedKvMut<'_, C>,
    q: &[T],
    num_q_heads: u32,
    k: &[T],
    v: &[T],
    block_ids: &[i32],
    offsets: &[i32],
    positions: &[i32],
    rotary_dim: u32,
    rope_base: f32,
    q_out: &mut [T],
) -> Result<()> {
    rope_kv_append_scaled(pages, q, num_q_heads, k, v, block_ids, offsets, positions, rotary_dim, rope_base, q_out, 1.0, 1.0)
}

/// [`rope_kv_append`] with quantisation scales, as [`kv_append_scaled`].
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_append_scaled<T: Element, C: KvElement>(
    pages: &mut PagedKvMut<'_, C>,
    q: &[T],
    num_q_heads: u32,
    k: &[T],
    v: &[T],
    block_ids: &[i32],
    offsets: &[i32],
    positions: &[i32],
    rotary_dim: u32,
    rope_base: f32,
    q_out: &mut [T],
    k_scale: f32,
    v_scale: f32,
) -> Result<()> {
    rope_kv_append_style(pages, q, num_q_heads, k, v, block_ids, offsets, positions, rotary_dim, rope_base, RopeStyle::SplitHalf, q_out, k_scale, v_scale)
}

/// [`rope_kv_append_scaled`] in the RoPE convention `style`
/// (`fd_kv_append_params.rope_style`, as [`crate::rope_apply_style`]); the
/// other forms rotate split-half.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_append_style<T: Element, C: KvElement>(
    pages: &mut PagedKvMut<'_, C>,
    q: &[T],
    num_q_heads: u32,
    k: &[T],
    v: &[T],
    block_ids: &[i32],
    offsets: &[i32],
    positions: &[i32],
    rotary_dim: u32,
    rope_base: f32,
    style: RopeStyle,
    q_out: &mut [T],
    k_scale: f32,
    v_scale: f32,
) -> Result<()> {
    let mut p = base_params(pages, k, v, block_ids, offsets, (k_scale, v_scale))?;
    let n = block_ids.len();
    if positions.len() != n {
        return Err(Error::invalid(format!("positions: expected {n} entries (one per token), got {}", positions.len())));
    }
    let want = elem_count(&[n, num_q_heads as usize, pages.head_dim as usize], "q/q_out")?;
    if q.len() != want || q_out.len() != want {
        return Err(Error::invalid(format!("q/q_out: expected {want} elements, got {} and {}", q.len(), q_out.len())));
    }
    p.num_q_heads = num_q_heads;
    p.q = q.as_ptr().cast();
    p.q_out = q_out.as_mut_ptr().cast();
    p.positions = positions.as_ptr();
    p.rotary_dim = rotary_dim;
    p.rope_base = rope_base;
    p.rope_style = style.raw();
    // SAFETY: as kv_append; q and q_out have the checked length and cannot
    // alias (a shared and a mutable borrow).
    unsafe { run_rope_kv_append(&p) }
}
