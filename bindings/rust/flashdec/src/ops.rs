//! Stateless operations: paged decode, RoPE, dense reference, devices.
use crate::error::{check, Error, Result};
use crate::sizes::{elem_count, to_u32};
use crate::types::{Element, KvElement, Layout, RopeStyle};
use flashdec_sys as sys;
use std::mem::MaybeUninit;
use std::ptr::NonNull;


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

/// Checks q/out/tables/lens lengths and fills the shared fields; the element
/// types are those of q (`q_dtype`) and out (`out_dtype`); `kv_dtype` is set
/// by the caller, which knows the K/V storage.
pub(crate) fn decode_params_base<Q: Element, O: Element>(
    q: &[Q],
    num_q_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_tables: &[i32],
    seq_lens: &[i32],
    out: &mut [O],
) -> Result<sys::fd_decode_params> {
    decode_params_queries(q, None, num_q_heads, num_kv_heads, head_dim, block_tables, seq_lens, out)
}

/// [`decode_params_base`] with multi-token queries: `q_indptr` (host
/// memory, borrowed by the returned params) gives the query tokens of q/out.
#[allow(clippy::too_many_arguments)]
fn decode_params_queries<Q: Element, O: Element>(
    q: &[Q],
    q_indptr: Option<&[i32]>,
    num_q_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_tables: &[i32],
    seq_lens: &[i32],
    out: &mut [O],
) -> Result<sys::fd_decode_params> {
    let mut p = decode_shape_base::<Q, O>(q.len(), q_indptr, num_q_heads, num_kv_heads, head_dim, block_tables, seq_lens, out.len())?;
    p.q = q.as_ptr().cast();
    p.block_tables = block_tables.as_ptr();
    p.seq_lens = seq_lens.as_ptr();
    p.out = out.as_mut_ptr().cast();
    Ok(p)
}

/// The checks and shape fields of [`decode_params_base`], buffer pointers
/// NULL but `q_indptr`'s. Without `q_indptr` q/out hold one token per row
/// (batch = seq_lens.len()); with it, `q_indptr[batch]` tokens: its length is
/// checked here, so the library reads `q_indptr` and q/out only within the
/// slices; its entries (q_indptr[0] = 0, every row from 1 to seq_len
/// tokens) are the library's to check.
#[allow(clippy::too_many_arguments)]
fn decode_shape_base<Q: Element, O: Element>(
    q_len: usize,
    q_indptr: Option<&[i32]>,
    num_q_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_tables: &[i32],
    seq_lens: &[i32],
    out_len: usize,
) -> Result<sys::fd_decode_params> {
    let batch = seq_lens.len();
    check_query_tokens(q_len, q_indptr, batch, num_q_heads, head_dim, out_len)?;
    if block_tables.is_empty() || block_tables.len() % batch != 0 {
        return Err(Error::invalid(format!("block_tables: {} entries is not a positive multiple of batch {batch}", block_tables.len())));
    }
    let mut p = default_decode_params();
    p.batch = to_u32(batch, "seq_lens: batch")?;
    p.num_q_heads = num_q_heads;
    p.num_kv_heads = num_kv_heads;
    p.head_dim = head_dim;
    p.q_dtype = Q::DTYPE.raw();
    p.out_dtype = O::DTYPE.raw();
    p.max_blocks_per_seq = to_u32(block_tables.len() / batch, "block_tables: entries per row")?;
    if let Some(indptr) = q_indptr {
        p.q_indptr = indptr.as_ptr();
    }
    Ok(p)
}

/// Checks q's and out's lengths against the query tokens of `batch` rows:
/// one per row, or `q_indptr[batch]` (`q_indptr` of batch + 1 entries).
fn check_query_tokens(q_len: usize, q_indptr: Option<&[i32]>, batch: usize, num_q_heads: u32, head_dim: u32, out_len: usize) -> Result<()> {
    if batch == 0 {
        return Err(Error::invalid("seq_lens: batch must be at least 1"));
    }
    let tokens = match q_indptr {
        None => batch,
        Some(indptr) => {
            if indptr.len() != batch + 1 {
                return Err(Error::invalid(format!("q_indptr: expected {} entries (batch + 1), got {}", batch + 1, indptr.len())));
            }
            let total = indptr[batch];
            usize::try_from(total).map_err(|_| Error::invalid(format!("q_indptr: q_indptr[{batch}] = {total} query tokens in all is negative")))?
        }
    };
    let q_elems = elem_count(&[tokens, num_q_heads as usize, head_dim as usize], "q/out")?;
    if q_len != q_elems {
        return Err(Error::invalid(match q_indptr {
            None => format!("q: expected {q_elems} elements ({batch} x {num_q_heads} x {head_dim}), got {q_len}"),
            Some(_) => format!("q: expected {q_elems} elements ({tokens} query tokens (q_indptr[{batch}]) x {num_q_heads} x {head_dim}), got {q_len}"),
        }));
    }
    if out_len != q_elems {
        return Err(Error::invalid(format!("out: expected {q_elems} elements, got {out_len}")));
    }
    Ok(())
}

/// Paged K/V storage of one layer in host memory, packed in `layout`:
/// token-major [num_blocks, num_kv_heads, block_size, head_dim] or dim-major
/// [num_blocks, num_kv_heads, head_dim, block_size].
///
/// `T` may be an FP8 type ([`crate::Fp8E4m3`], [`crate::Fp8E5m2`]): the
/// stored bytes, read as stored x `DecodeOptions::k_scale` / `v_scale`.
#[derive(Copy, Clone, Debug)]
pub struct PagedKv<'a, T: KvElement> {
    pub k: &'a [T],
    pub v: &'a [T],
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    pub layout: Layout,
}

impl<T: KvElement> PagedKv<'_, T> {
    /// Checks k/v against the block shape (before anything else, so an
    /// overflowing block is reported as such); returns the block count.
    fn num_blocks(&self) -> Result<u32> {
        let block_elems = elem_count(&[self.num_kv_heads as usize, self.block_size as usize, self.head_dim as usize], "k: a block")?;
        if block_elems == 0 || self.k.len() % block_elems != 0 || self.k.is_empty() {
            return Err(Error::invalid(format!("k: {} elements is not a positive multiple of a block ({block_elems})", self.k.len())));
        }
        if self.v.len() != self.k.len() {
            return Err(Error::invalid(format!("v: expected {} elements like k, got {}", self.k.len(), self.v.len())));
        }
        u32::try_from(self.k.len() / block_elems).map_err(|_| Error::invalid("k: too many blocks"))
    }

    /// Fills the K/V view of `p`: `kv_dtype`, layout, block size, block
    /// count (from [`PagedKv::num_blocks`]) and the pointers.
    fn fill(&self, p: &mut sys::fd_decode_params, num_blocks: u32) {
        p.num_blocks = num_blocks;
        p.kv_dtype = T::DTYPE.raw();
        p.layout = self.layout.raw();
        p.block_size = self.block_size;
        p.k_cache = self.k.as_ptr().cast();
        p.v_cache = self.v.as_ptr().cast();
    }
}

/// Options of [`decode`], [`decode_multi`] and [`DecodePlan`]; `Default` =
/// automatic scale/splits, all threads, no bound on query tokens per row,
/// K/V scales 1, no attention variant.
#[derive(Copy, Clone, Debug)]
pub struct DecodeOptions<'a> {
    pub sm_scale: f32,
    pub num_splits: i32,
    pub cpu_threads: u32,
    /// Upper bound of `seq_lens` (0: max_blocks_per_seq * block_size).
    pub max_seq_len_hint: i32,
    /// Upper bound of query tokens per row (0: none given); a longer row of
    /// [`decode_multi`] is `Status::InvalidArgument`. With `q_indptr` on
    /// CUDA (raw parameters, device memory) it is required and sizes the
    /// launch (a row of more query tokens than one tile holds runs as
    /// several query tiles).
    pub max_q_len_hint: i32,
    /// Dequantisation scale of the stored K (docs/semantics.md S1.1):
    /// attention reads K as stored x k_scale. Finite and > 0 (else
    /// `Status::InvalidArgument` naming the field); any K/V type takes it.
    /// Not planned: a [`DecodePlan`] run uses the run's options.
    pub k_scale: f32,
    /// Dequantisation scale of the stored V, as `k_scale`.
    pub v_scale: f32,
    /// Attention variants (docs/semantics.md S2.3), each off by default and
    /// combinable; the library checks the values (`Status::InvalidArgument`
    /// naming the field). Not planned: a [`DecodePlan`] run takes the run's
    /// ([`DecodePlan::run_with`]), so layers may alternate windows.
    ///
    /// Scores become cap * tanh(s / cap) (0: none; finite and >= 0).
    pub logit_softcap: f32,
    /// A query at position p sees p - w + 1 ..= p only (0: none; >= 0).
    pub sliding_window: i32,
    /// `[num_q_heads]` sink logits joining each head's softmax denominator
    /// (`None`: none; -inf: none for that head; NaN is refused naming the
    /// entry). Host memory: the slice-taking calls serve the CPU backend
    /// (device sinks go in raw params, [`run_decode`]); a length other than
    /// num_q_heads is `Status::InvalidArgument` from the binding.
    pub sinks: Option<&'a [f32]>,
}

impl Default for DecodeOptions<'_> {
    fn default() -> Self {
        DecodeOptions {
            sm_scale: 0.0,
            num_splits: 0,
            cpu_threads: 0,
            max_seq_len_hint: 0,
            max_q_len_hint: 0,
            k_scale: 1.0,
            v_scale: 1.0,
            logit_softcap: 0.0,
            sliding_window: 0,
            sinks: None,
        }
    }
}

/// Checks that `sinks` has one logit per query head.
pub(crate) fn check_sinks(sinks: Option<&[f32]>, num_q_heads: u32) -> Result<()> {
    match sinks {
        Some(s) if s.len() != num_q_heads as usize => {
            Err(Error::invalid(format!("sinks: expected {num_q_heads} entries (num_q_heads), got {}", s.len())))
        }
        _ => Ok(()),
    }
}

impl DecodeOptions<'_> {
    /// Fills p's option fields; `sinks` must have been checked against
    /// p.num_q_heads ([`check_sinks`]) and outlive the use of p.
    pub(crate) fn fill(&self, p: &mut sys::fd_decode_params) {
        p.logit_softcap = self.logit_softcap;
        p.sliding_window = self.sliding_window;
        p.sinks = self.sinks.map_or(std::ptr::null(), |s| s.as_ptr());
        p.k_scale = self.k_scale;
        p.v_scale = self.v_scale;
        p.sm_scale = self.sm_scale;
        p.num_splits = self.num_splits;
        p.cpu_threads = self.cpu_threads;
        p.max_seq_len_hint = self.max_seq_len_hint;
        p.max_q_len_hint = self.max_q_len_hint;
    }
}

/// Paged decode attention (S2) on the CPU backend over host slices, one
/// query token per row (see [`decode_multi`] for more).
/// q, out: [batch, num_q_heads, head_dim], batch = seq_lens.len();
/// block_tables: [batch, max_blocks_per_seq].
///
/// The element types are the slices' (`q_dtype`, `kv_dtype`, `out_dtype`):
/// the CPU backend serves q and out each f32, F16 or Bf16 over K/V of any
/// type (f32, F16, Bf16, [`crate::Fp8E4m3`], [`crate::Fp8E5m2`], read with
/// `options.k_scale` / `v_scale`); another combination is
/// `Status::Unsupported` with a message naming the field.
pub fn decode<Q: Element, KV: KvElement, O: Element>(
    q: &[Q],
    num_q_heads: u32,
    kv: &PagedKv<'_, KV>,
    block_tables: &[i32],
    seq_lens: &[i32],
    out: &mut [O],
    options: DecodeOptions<'_>,
) -> Result<()> {
    decode_queries(q, None, num_q_heads, kv, block_tables, seq_lens, out, options)
}

/// Paged attention of multi-token queries (`fd_decode_params.q_indptr`) on
/// the CPU backend over host slices (CUDA: raw parameters with a device
/// `q_indptr` and `max_q_len_hint`, [`run_decode`]): row r (of batch = seq_lens.len()) has
/// the query tokens `q_indptr[r]..q_indptr[r + 1]` of q and out, at least one
/// and at most `seq_lens[r]`: they are the row's last tokens (already in the
/// cache), and attention is causal, query j of a row of n sees K/V positions
/// `0..=seq_lens[r] - n + j`.
///
/// q, out: [q_indptr[batch], num_q_heads, head_dim]; q_indptr: batch + 1
/// offsets, q_indptr[0] = 0; block_tables: [batch, max_blocks_per_seq].
/// Lengths are checked here (`Status::InvalidArgument` naming the argument);
/// the offsets themselves are checked by the library before anything runs
/// (`Status::InvalidArgument` with its message naming the row). One token
/// per row through `q_indptr` gives the bits of [`decode`]. Element types as
/// in [`decode`].
#[allow(clippy::too_many_arguments)]
pub fn decode_multi<Q: Element, KV: KvElement, O: Element>(
    q: &[Q],
    q_indptr: &[i32],
    num_q_heads: u32,
    kv: &PagedKv<'_, KV>,
    block_tables: &[i32],
    seq_lens: &[i32],
    out: &mut [O],
    options: DecodeOptions<'_>,
) -> Result<()> {
    decode_queries(q, Some(q_indptr), num_q_heads, kv, block_tables, seq_lens, out, options)
}

#[allow(clippy::too_many_arguments)]
fn decode_queries<Q: Element, KV: KvElement, O: Element>(
    q: &[Q],
    q_indptr: Option<&[i32]>,
    num_q_heads: u32,
    kv: &PagedKv<'_, KV>,
    block_tables: &[i32],
    seq_lens: &[i32],
    out: &mut [O],
    options: DecodeOptions<'_>,
) -> Result<()> {
    let num_blocks = kv.num_blocks()?;
    check_sinks(options.sinks, num_q_heads)?;
    let mut p = decode_params_queries(q, q_indptr, num_q_heads, kv.num_kv_heads, kv.head_dim, block_tables, seq_lens, out)?;
    kv.fill(&mut p, num_blocks);
    options.fill(&mut p);
    // Split-KV partials need scratch: size it and own it for the call.
    let mut bytes = 0usize;
    check(unsafe { sys::fd_decode_workspace_size(&p, &mut bytes) })?;
    let mut workspace = vec![0u64; bytes.div_ceil(8)];
    if bytes > 0 {
        p.workspace = workspace.as_mut_ptr().cast();
        p.workspace_size = bytes;
    }
    // SAFETY: all slices were checked against the shapes (q_indptr has
    // batch + 1 entries and q/out q_indptr[batch] tokens); host block ids,
    // seq_lens and query offsets are range-checked by the library before it
    // reads K/V or q.
    unsafe { run_decode(&p) }
}

/// A decode plan (`fd_decode_plan`): the split-KV work list of one step,
/// made once on the host and used by every layer's [`DecodePlan::run`].
/// Immutable and thread-safe (`Send + Sync`: runs may share it, each with
/// its own buffers); freed in `Drop`. It holds no device memory.
///
/// A plan of multi-token queries ([`DecodePlan::new_multi`]) keeps a copy of
/// the step's `q_indptr`, which every [`DecodePlan::run`] uses; a plan keeps
/// a copy of its options' `sinks`.
#[derive(Debug)]
pub struct DecodePlan {
    raw: NonNull<sys::fd_decode_plan>,
    /// The planning options, `sinks` taken out (held in `sinks`).
    options: DecodeOptions<'static>,
    sinks: Option<Box<[f32]>>,
    q_indptr: Option<Box<[i32]>>,
}

// SAFETY: the header documents a plan as immutable and thread-safe.
unsafe impl Send for DecodePlan {}
unsafe impl Sync for DecodePlan {}

impl DecodePlan {
    /// Plans the host-slice calls of one step, given the slices of one of
    /// them as [`decode`] takes them: only their lengths and element types
    /// are read, never their contents. With `host_seq_lens` (the step's
    /// exact K/V lengths, one per row; typically `Some(seq_lens)`) the
    /// split-KV layout is chosen from them; with `None`, from
    /// `options.max_seq_len_hint`, as [`decode`] does.
    #[allow(clippy::too_many_arguments)]
    pub fn new<Q: Element, KV: KvElement, O: Element>(
        q: &[Q],
        num_q_heads: u32,
        kv: &PagedKv<'_, KV>,
        block_tables: &[i32],
        seq_lens: &[i32],
        out: &[O],
        options: DecodeOptions<'_>,
        host_seq_lens: Option<&[i32]>,
    ) -> Result<DecodePlan> {
        Self::plan_queries(q, None, num_q_heads, kv, block_tables, seq_lens, out, options, host_seq_lens)
    }

    /// Plans the multi-token calls of one step, given the slices of one of
    /// them as [`decode_multi`] takes them (lengths and element types only,
    /// and `q_indptr[batch]`), plus `host_seq_lens` as in [`DecodePlan::new`].
    /// `q_indptr` is copied into the plan: every [`DecodePlan::run`] takes
    /// q and out of `q_indptr[batch]` tokens and attends as [`decode_multi`]
    /// does.
    #[allow(clippy::too_many_arguments)]
    pub fn new_multi<Q: Element, KV: KvElement, O: Element>(
        q: &[Q],
        q_indptr: &[i32],
        num_q_heads: u32,
        kv: &PagedKv<'_, KV>,
        block_tables: &[i32],
        seq_lens: &[i32],
        out: &[O],
        options: DecodeOptions<'_>,
        host_seq_lens: Option<&[i32]>,
    ) -> Result<DecodePlan> {
        Self::plan_queries(q, Some(q_indptr), num_q_heads, kv, block_tables, seq_lens, out, options, host_seq_lens)
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_queries<Q: Element, KV: KvElement, O: Element>(
        q: &[Q],
        q_indptr: Option<&[i32]>,
        num_q_heads: u32,
        kv: &PagedKv<'_, KV>,
        block_tables: &[i32],
        seq_lens: &[i32],
        out: &[O],
        options: DecodeOptions<'_>,
        host_seq_lens: Option<&[i32]>,
    ) -> Result<DecodePlan> {
        let num_blocks = kv.num_blocks()?;
        check_sinks(options.sinks, num_q_heads)?;
        let mut p = decode_shape_base::<Q, O>(q.len(), q_indptr, num_q_heads, kv.num_kv_heads, kv.head_dim, block_tables, seq_lens, out.len())?;
        kv.fill(&mut p, num_blocks);
        options.fill(&mut p);
        // SAFETY: plan creation reads no buffer of p (the K/V and q_indptr
        // pointers only for their alignment); the host lengths' count is checked.
        let mut plan = unsafe { Self::from_params(&p, host_seq_lens) }?;
        plan.options = DecodeOptions { sinks: None, ..options };
        plan.sinks = options.sinks.map(Box::from);
        plan.q_indptr = q_indptr.map(Box::from);
        Ok(plan)
    }

    /// The query offsets every run uses (`None`: one query token per row).
    pub fn q_indptr(&self) -> Option<&[i32]> {
        self.q_indptr.as_deref()
    }

    /// The options every [`DecodePlan::run`] uses: the planning options
    /// (`sinks` a copy); the defaults for a plan from raw parameters.
    pub fn options(&self) -> DecodeOptions<'_> {
        DecodeOptions { sinks: self.sinks.as_deref(), ..self.options }
    }

    /// Plans from raw parameters (`fd_decode_plan_create`): every field but
    /// the buffer pointers and the stream is part of the plan. Run it with
    /// [`DecodePlan::run_raw`].
    ///
    /// # Safety
    /// `host_seq_lens`, when given, must hold `params.batch` entries (it is
    /// checked); nothing else of `params` is dereferenced.
    pub unsafe fn from_params(params: &sys::fd_decode_params, host_seq_lens: Option<&[i32]>) -> Result<DecodePlan> {
        let lens = match host_seq_lens {
            Some(l) if l.len() != params.batch as usize => {
                return Err(Error::invalid(format!("host_seq_lens: expected {} entries (batch), got {}", params.batch, l.len())));
            }
            Some(l) => l.as_ptr(),
            None => std::ptr::null(),
        };
        let mut raw = std::ptr::null_mut();
        check(sys::fd_decode_plan_create(params, lens, &mut raw))?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::invalid("fd_decode_plan_create returned NULL"))?;
        Ok(DecodePlan { raw, options: DecodeOptions::default(), sinks: None, q_indptr: None })
    }

    /// The raw handle, for `sys` calls; owned by this plan.
    pub fn as_ptr(&self) -> *const sys::fd_decode_plan {
        self.raw.as_ptr()
    }

    /// Workspace bytes every run needs (`fd_decode_plan_workspace_size`).
    pub fn workspace_size(&self) -> Result<usize> {
        let mut bytes = 0usize;
        check(unsafe { sys::fd_decode_plan_workspace_size(self.raw.as_ptr(), &mut bytes) })?;
        Ok(bytes)
    }

    /// One decode call with this plan (`fd_decode_run`) over host slices, as
    /// [`decode`] takes them (as [`decode_multi`] with the plan's
    /// `q_indptr`, for a plan from [`DecodePlan::new_multi`]), with the
    /// plan's options; the workspace is allocated for the call. The slices
    /// must give the planned shape and element types: a call that differs in
    /// a planned field (for example more K/V blocks) is
    /// `Status::InvalidArgument` naming the field.
    pub fn run<Q: Element, KV: KvElement, O: Element>(
        &self,
        q: &[Q],
        num_q_heads: u32,
        kv: &PagedKv<'_, KV>,
        block_tables: &[i32],
        seq_lens: &[i32],
        out: &mut [O],
    ) -> Result<()> {
        self.run_with(q, num_q_heads, kv, block_tables, seq_lens, out, self.options())
    }

    /// [`DecodePlan::run`] with this run's K/V dequantisation scales instead
    /// of the plan's options' (scales are not planned: each layer of an FP8
    /// cache has its own).
    #[allow(clippy::too_many_arguments)]
    pub fn run_scaled<Q: Element, KV: KvElement, O: Element>(
        &self,
        q: &[Q],
        num_q_heads: u32,
        kv: &PagedKv<'_, KV>,
        block_tables: &[i32],
        seq_lens: &[i32],
        out: &mut [O],
        k_scale: f32,
        v_scale: f32,
    ) -> Result<()> {
        self.run_with(q, num_q_heads, kv, block_tables, seq_lens, out, DecodeOptions { k_scale, v_scale, ..self.options() })
    }

    /// [`DecodePlan::run`] with this run's options instead of the plan's:
    /// the library takes from each run everything but the planned fields,
    /// so `sm_scale`, `cpu_threads`, `max_seq_len_hint`, the K/V scales and
    /// the attention variants (`logit_softcap`, `sliding_window`, `sinks`:
    /// a run with a longer window than planned, or none, is exact, only
    /// slower) may differ per run (`num_splits` is the plan's); a different
    /// `max_q_len_hint` is planned, so refused (`Status::InvalidArgument`
    /// naming it). Start from [`DecodePlan::options`] to change one field.
    #[allow(clippy::too_many_arguments)]
    pub fn run_with<Q: Element, KV: KvElement, O: Element>(
        &self,
        q: &[Q],
        num_q_heads: u32,
        kv: &PagedKv<'_, KV>,
        block_tables: &[i32],
        seq_lens: &[i32],
        out: &mut [O],
        options: DecodeOptions<'_>,
    ) -> Result<()> {
        let num_blocks = kv.num_blocks()?;
        check_sinks(options.sinks, num_q_heads)?;
        let mut p = decode_params_queries(q, self.q_indptr(), num_q_heads, kv.num_kv_heads, kv.head_dim, block_tables, seq_lens, out)?;
        kv.fill(&mut p, num_blocks);
        options.fill(&mut p);
        let bytes = self.workspace_size()?;
        let mut workspace = vec![0u64; bytes.div_ceil(8)];
        if bytes > 0 {
            p.workspace = workspace.as_mut_ptr().cast();
            p.workspace_size = bytes;
        }
        // SAFETY: as in `decode`: every slice was checked against the shapes.
        unsafe { self.run_raw(&p) }
    }

    /// `fd_decode_run` on raw parameters (device pointers, custom strides,
    /// the caller's workspace).
    ///
    /// # Safety
    /// As [`run_decode`]: every pointer in `params` must be valid for the
    /// shapes it describes, on `params.device`, for the duration of the call.
    pub unsafe fn run_raw(&self, params: &sys::fd_decode_params) -> Result<()> {
        check(sys::fd_decode_run(self.raw.as_ptr(), params))
    }
}

impl Drop for DecodePlan {
    fn drop(&mut self) {
        unsafe { sys::fd_decode_plan_destroy(self.raw.as_ptr()) }
    }
}

/// RoPE in place (S3.1), split-half (`fd_rope_apply`): x is
/// [positions.len(), num_heads, head_dim]. [`rope_apply_style`] takes the
/// convention.
pub fn rope_apply<T: Element>(x: &mut [T], num_heads: u32, head_dim: u32, positions: &[i32], rotary_dim: u32, rope_base: f32) -> Result<()> {
    let n = rope_tokens(x, num_heads, head_dim, positions)?;
    check(unsafe {
        sys::fd_rope_apply(T::DTYPE.raw(), x.as_mut_ptr().cast(), n, num_heads, head_dim, positions.as_ptr(), rotary_dim, rope_base)
    })
}

/// [`rope_apply`] in the RoPE convention `style` (`fd_rope_apply_style`):
/// [`RopeStyle::SplitHalf`] gives `rope_apply`'s bits,
/// [`RopeStyle::Interleaved`] rotates the pairs (2i, 2i + 1). Dims from
/// rotary_dim on stay unchanged in either style.
pub fn rope_apply_style<T: Element>(
    x: &mut [T],
    num_heads: u32,
    head_dim: u32,
    positions: &[i32],
    rotary_dim: u32,
    rope_base: f32,
    style: RopeStyle,
) -> Result<()> {
    let n = rope_tokens(x, num_heads, head_dim, positions)?;
    check(unsafe {
        sys::fd_rope_apply_style(
            T::DTYPE.raw(),
            x.as_mut_ptr().cast(),
            n,
            num_heads,
            head_dim,
            positions.as_ptr(),
            rotary_dim,
            rope_base,
            style.raw(),
        )
    })
}

/// Checks x against [positions.len(), num_heads, head_dim]; the token count.
fn rope_tokens<T: Element>(x: &[T], num_heads: u32, head_dim: u32, positions: &[i32]) -> Result<u32> {
    let want = elem_count(&[positions.len(), num_heads as usize, head_dim as usize], "x")?;
    if x.len() != want {
        return Err(Error::invalid(format!("x: expected {want} elements, got {}", x.len())));
    }
    u32::try_from(positions.len()).map_err(|_| Error::invalid("positions: too many tokens"))
}

/// max_seq_len of dense reference K/V of `k_len` and `v_len` elements,
/// [batch, num_kv_heads, max_seq_len, head_dim] each.
fn dense_max_seq_len(k_len: usize, v_len: usize, batch: usize, num_kv_heads: u32, head_dim: u32) -> Result<u32> {
    let per_row = elem_count(&[batch, num_kv_heads as usize, head_dim as usize], "k/v")?;
    if per_row == 0 || k_len % per_row != 0 || v_len != k_len {
        return Err(Error::invalid(format!("k/v: {k_len} and {v_len} elements do not form [batch, num_kv_heads, max_seq_len, head_dim]")));
    }
    to_u32(k_len / per_row, "k/v: max_seq_len")
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
    let max_seq_len = dense_max_seq_len(k.len(), v.len(), batch, num_kv_heads, head_dim)?;
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

/// `fd_reference_params` with defaults from `fd_reference_params_init`
/// (everything 0 or null, f32).
pub fn default_reference_params() -> sys::fd_reference_params {
    let mut p = MaybeUninit::<sys::fd_reference_params>::zeroed();
    unsafe { sys::fd_reference_params_init(p.as_mut_ptr()) };
    unsafe { p.assume_init() }
}

/// Options of [`reference_attention`]: the scale and the attention variants
/// (S2.3) of `fd_decode_params`; `Default` = 1/sqrt(head_dim), none.
#[derive(Copy, Clone, Debug, Default)]
pub struct ReferenceOptions<'a> {
    /// 0: 1/sqrt(head_dim).
    pub sm_scale: f32,
    /// Scores become cap * tanh(s / cap) (0: none).
    pub logit_softcap: f32,
    /// A query at position p sees p - w + 1 ..= p only (0: none).
    pub sliding_window: i32,
    /// [num_q_heads] sink logits joining each head's softmax denominator.
    pub sinks: Option<&'a [f32]>,
}

/// Dense CPU reference attention with query tokens and variants
/// (`fd_reference_attention`, S2, S2.2, S2.3): q, out [tokens, num_q_heads,
/// head_dim] with tokens = batch (`q_indptr` None: one per row) or
/// `q_indptr[batch]` (batch + 1 offsets, causal, as [`decode_multi`]);
/// k, v [batch, num_kv_heads, max_seq_len, head_dim] with batch =
/// seq_lens.len(). Lengths are checked here, values by the library
/// (`Status::InvalidArgument` naming the field).
#[allow(clippy::too_many_arguments)]
pub fn reference_attention<T: Element>(
    q: &[T],
    q_indptr: Option<&[i32]>,
    num_q_heads: u32,
    k: &[T],
    v: &[T],
    num_kv_heads: u32,
    head_dim: u32,
    seq_lens: &[i32],
    options: &ReferenceOptions<'_>,
    out: &mut [T],
) -> Result<()> {
    let batch = seq_lens.len();
    check_query_tokens(q.len(), q_indptr, batch, num_q_heads, head_dim, out.len())?;
    let max_seq_len = dense_max_seq_len(k.len(), v.len(), batch, num_kv_heads, head_dim)?;
    check_sinks(options.sinks, num_q_heads)?;
    let mut p = default_reference_params();
    p.dtype = T::DTYPE.raw();
    p.batch = to_u32(batch, "seq_lens: batch")?;
    p.num_q_heads = num_q_heads;
    p.num_kv_heads = num_kv_heads;
    p.head_dim = head_dim;
    p.max_seq_len = max_seq_len;
    p.q = q.as_ptr().cast();
    p.q_indptr = q_indptr.map_or(std::ptr::null(), |i| i.as_ptr());
    p.k = k.as_ptr().cast();
    p.v = v.as_ptr().cast();
    p.seq_lens = seq_lens.as_ptr();
    p.sinks = options.sinks.map_or(std::ptr::null(), |s| s.as_ptr());
    p.out = out.as_mut_ptr().cast();
    p.sm_scale = options.sm_scale;
    p.logit_softcap = options.logit_softcap;
    p.sliding_window = options.sliding_window;
    // SAFETY: every slice was checked against the shapes in p (q_indptr
    // has batch + 1 entries, q/out its last entry's tokens); host memory.
    check(unsafe { sys::fd_reference_attention(&p) })
}
