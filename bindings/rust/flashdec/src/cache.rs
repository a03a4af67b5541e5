//! The paged KV cache, transactions and shared prefixes.
use crate::error::{check, Error, Result};
use crate::ops::{check_sinks, decode_params_base, run_decode, DecodeOptions};
use crate::types::{DType, Device, Element, KvElement, Layout, RopeStyle};
use flashdec_sys as sys;
use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::mem::{size_of, MaybeUninit};
use std::ptr::{self, NonNull};

/// Parameters of [`Cache::new`] (`fd_cache_config`). `Default` takes the
/// library's defaults from `fd_cache_config_init`.
///
/// An FP8 cache (`dtype` [`DType::Fp8E4m3`] or [`DType::Fp8E5m2`]) stores
/// K/V in one byte and takes them (and Q, for RoPE writes) in `input_dtype`:
/// F16 or Bf16, or F32 on the CPU. Its per-layer scales are given to
/// [`Cache::with_kv_scales`] (all 1 with [`Cache::new`]) and changed with
/// [`Cache::set_kv_scales`].
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct CacheConfig {
    pub num_layers: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub block_size: u32,
    pub max_blocks: u32,
    pub prefix_cache_capacity_blocks: u32,
    pub dtype: DType,
    pub layout: Layout,
    pub device: Device,
    /// Type of the K, V and Q given to layer writes and of the engine's step
    /// tensors; `None` (default, C's -1): `dtype`.
    pub input_dtype: Option<DType>,
    /// RoPE convention of the cache's fused writes
    /// ([`Transaction::write_layer_rope`], and so the engine's steps and
    /// prefill); default [`RopeStyle::SplitHalf`].
    pub rope_style: RopeStyle,
}

impl Default for CacheConfig {
    fn default() -> Self {
        let mut c = MaybeUninit::<sys::fd_cache_config>::zeroed();
        // SAFETY: the init function writes every field of a valid pointer.
        unsafe { sys::fd_cache_config_init(c.as_mut_ptr()) };
        CacheConfig::from_raw(&unsafe { c.assume_init() })
    }
}

impl CacheConfig {
    fn from_raw(c: &sys::fd_cache_config) -> CacheConfig {
        CacheConfig {
            num_layers: c.num_layers,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: c.block_size,
            max_blocks: c.max_blocks,
            prefix_cache_capacity_blocks: c.prefix_cache_capacity_blocks,
            dtype: DType::from_raw(c.dtype).unwrap_or(DType::F16),
            layout: Layout::from_raw(c.layout).unwrap_or(Layout::TokenMajor),
            device: Device::from_raw(c.device),
            input_dtype: DType::from_raw(c.input_dtype),
            rope_style: RopeStyle::from_raw(c.rope_style).unwrap_or_default(),
        }
    }

    fn to_raw(&self) -> sys::fd_cache_config {
        let mut c = MaybeUninit::<sys::fd_cache_config>::zeroed();
        unsafe { sys::fd_cache_config_init(c.as_mut_ptr()) };
        let mut c = unsafe { c.assume_init() };
        c.num_layers = self.num_layers;
        c.num_kv_heads = self.num_kv_heads;
        c.head_dim = self.head_dim;
        c.block_size = self.block_size;
        c.max_blocks = self.max_blocks;
        c.prefix_cache_capacity_blocks = self.prefix_cache_capacity_blocks;
        c.dtype = self.dtype.raw();
        c.layout = self.layout.raw();
        c.device = self.device.raw();
        c.input_dtype = self.input_dtype.map_or(-1, DType::raw);
        c.rope_style = self.rope_style.raw();
        c
    }

    /// The type layer writes and engine steps take: `input_dtype`, else `dtype`.
    pub fn resolved_input_dtype(&self) -> DType {
        self.input_dtype.unwrap_or(self.dtype)
    }

    /// Elements of one token's K or V for one layer: num_kv_heads * head_dim.
    pub fn token_elems(&self) -> usize {
        self.num_kv_heads as usize * self.head_dim as usize
    }
}

/// Lifecycle state of a request id (`fd_request_state`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RequestState {
    Unknown,
    Active,
    Finished,
    Cancelled,
}

/// Counters and gauges of a cache (S7): the C struct, fields public.
pub type CacheMetrics = sys::fd_cache_metrics;

/// State of a resident prefix.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PrefixInfo {
    pub num_blocks: u32,
    pub ref_count: u32,
    pub last_use: u64,
    pub first_block: i32,
}

/// Summary of an open transaction.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TxInfo {
    pub batch: u32,
    pub next_layer: u32,
    pub max_blocks_per_seq: u32,
    pub new_block_count: u32,
    /// New tokens, the sum of the rows' token counts (= batch for
    /// [`Cache::begin`]): the first dimension of the layer writes' K, V and Q.
    pub token_count: u32,
}

/// Per-row view of an open transaction, in begin's row order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxRows {
    pub request_ids: Vec<u64>,
    pub positions: Vec<i32>,
    pub block_ids: Vec<i32>,
    pub offsets: Vec<i32>,
    pub effective_seq_lens: Vec<i32>,
}

/// Per-token view of an open transaction, in packed order (row 0's new
/// tokens by position, then row 1's, ...): the order of the layer writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxTokens {
    pub positions: Vec<i32>,
    pub block_ids: Vec<i32>,
    pub offsets: Vec<i32>,
}

/// Committed block tables (row-major, padded with -1) and seq_lens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    pub table_stride: u32,
    pub block_tables: Vec<i32>,
    pub seq_lens: Vec<i32>,
}

/// Caller-owned K/V memory for [`Cache::with_storage`]
/// (`fd_cache_config.k_storage` and the stride fields). Strides are in
/// elements; the four block/head/token/dim strides are all 0 (packed storage
/// of the config's layout) or all > 0 with the layout's contiguous axis at 1;
/// `stride_layer` 0 means max_blocks * stride_block.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ExternalStorage {
    pub k: *mut c_void,
    pub v: *mut c_void,
    pub stride_layer: i64,
    pub stride_block: i64,
    pub stride_head: i64,
    pub stride_token: i64,
    pub stride_dim: i64,
}

impl ExternalStorage {
    /// Packed storage of the config's layout at `k` and `v`.
    pub fn packed(k: *mut c_void, v: *mut c_void) -> ExternalStorage {
        ExternalStorage { k, v, stride_layer: 0, stride_block: 0, stride_head: 0, stride_token: 0, stride_dim: 0 }
    }
}

/// A paged KV cache (`fd_cache`).
///
/// The C handle is externally synchronised: `Cache` is `Send` (it may move
/// to another thread) but not `Sync` (no shared use from two threads);
/// mutating calls take `&mut self`. Dropping it destroys the cache.
pub struct Cache {
    raw: NonNull<sys::fd_cache>,
    config: CacheConfig,
    external: bool,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the cache has no thread affinity; the C contract only forbids
// concurrent use, which the missing Sync impl rules out.
unsafe impl Send for Cache {}

fn u32_len(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::invalid(format!("{what}: {n} entries do not fit in uint32")))
}

/// `counts` as the per-row array of a call on `rows` rows (token_counts,
/// keep_counts): one entry per row.
pub(crate) fn row_counts(counts: &[u32], rows: usize, what: &str) -> Result<u32> {
    if counts.len() != rows {
        return Err(Error::invalid(format!("{what}: expected {rows} entries (one per row), got {}", counts.len())));
    }
    u32_len(rows, what)
}

/// Per-layer scale arrays of a call on a cache of `num_layers` layers: C
/// reads num_layers entries of each (their values are the library's to check).
fn check_scales(k_scales: &[f32], v_scales: &[f32], num_layers: u32) -> Result<()> {
    for (s, what) in [(k_scales, "k_scales"), (v_scales, "v_scales")] {
        if s.len() != num_layers as usize {
            return Err(Error::invalid(format!("{what}: expected {num_layers} entries (one per layer), got {}", s.len())));
        }
    }
    Ok(())
}

fn prefix_cstring(id: &str) -> Result<CString> {
    CString::new(id).map_err(|_| Error::invalid("prefix_id must not contain NUL characters"))
}

impl Cache {
    /// Creates a cache with zero-initialised storage.
    pub fn new(config: &CacheConfig) -> Result<Cache> {
        Cache::create(&config.to_raw())
    }

    /// Creates an FP8 cache with per-layer K and V dequantisation scales
    /// (`fd_cache_config.k_scales` / `v_scales`, num_layers each, each finite
    /// and positive, copied): writes store saturate(x / scale) rounded to
    /// nearest even (docs/semantics.md S1.1). A bad entry is
    /// `InvalidArgument` naming it; scales for a cache that is not FP8 too.
    pub fn with_kv_scales(config: &CacheConfig, k_scales: &[f32], v_scales: &[f32]) -> Result<Cache> {
        check_scales(k_scales, v_scales, config.num_layers)?;
        let mut c = config.to_raw();
        c.k_scales = k_scales.as_ptr();
        c.v_scales = v_scales.as_ptr();
        Cache::create(&c)
    }

    /// Creates a cache that manages blocks inside caller memory instead of
    /// allocating its own (the cache does not clear it).
    ///
    /// # Safety
    /// `storage.k` and `storage.v` must each address every element the
    /// strides reach for num_layers layers and max_blocks blocks, in the
    /// config's device memory, and stay valid and otherwise unused while the
    /// cache (and anything built on it) lives.
    pub unsafe fn with_storage(config: &CacheConfig, storage: &ExternalStorage) -> Result<Cache> {
        let mut c = config.to_raw();
        c.k_storage = storage.k;
        c.v_storage = storage.v;
        c.stride_layer = storage.stride_layer;
        c.stride_block = storage.stride_block;
        c.stride_head = storage.stride_head;
        c.stride_token = storage.stride_token;
        c.stride_dim = storage.stride_dim;
        Cache::create(&c)
    }

    fn create(c: &sys::fd_cache_config) -> Result<Cache> {
        let mut out = ptr::null_mut();
        check(unsafe { sys::fd_cache_create(c, &mut out) })?;
        let raw = NonNull::new(out).expect("fd_cache_create returned FD_OK and NULL");
        let mut cache = Cache { raw, config: CacheConfig::from_raw(c), external: false, _not_sync: PhantomData };
        let resolved = cache.read_config()?;
        cache.config = CacheConfig::from_raw(&resolved);
        cache.external = !resolved.k_storage.is_null();
        Ok(cache)
    }

    fn read_config(&self) -> Result<sys::fd_cache_config> {
        let mut c: sys::fd_cache_config = unsafe { MaybeUninit::zeroed().assume_init() };
        c.struct_size = size_of::<sys::fd_cache_config>() as u32;
        check(unsafe { sys::fd_cache_get_config(self.raw.as_ptr(), &mut c) })?;
        Ok(c)
    }

    /// True when K/V live in caller memory ([`Cache::with_storage`]).
    pub fn has_external_storage(&self) -> bool {
        self.external
    }

    /// The configuration with defaults resolved.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The raw handle, for calls this crate does not wrap. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::fd_cache {
        self.raw.as_ptr()
    }

    pub fn add_request(&mut self, id: u64) -> Result<()> {
        check(unsafe { sys::fd_cache_add_request(self.raw.as_ptr(), id) })
    }
    pub fn finish_request(&mut self, id: u64) -> Result<()> {
        check(unsafe { sys::fd_cache_finish_request(self.raw.as_ptr(), id) })
    }
    pub fn cancel_request(&mut self, id: u64) -> Result<()> {
        check(unsafe { sys::fd_cache_cancel_request(self.raw.as_ptr(), id) })
    }

    pub fn request_state(&self, id: u64) -> Result<RequestState> {
        let mut s = -1;
        check(unsafe { sys::fd_cache_request_state(self.raw.as_ptr(), id, &mut s) })?;
        Ok(match s {
            sys::FD_REQUEST_ACTIVE => RequestState::Active,
            sys::FD_REQUEST_FINISHED => RequestState::Finished,
            sys::FD_REQUEST_CANCELLED => RequestState::Cancelled,
            _ => RequestState::Unknown,
        })
    }

    /// (blocks needed to grow every listed request by one token, free blocks).
    pub fn blocks_needed(&self, ids: &[u64]) -> Result<(u32, u32)> {
        let (mut needed, mut free) = (0u32, 0u32);
        let n = u32_len(ids.len(), "request_ids")?;
        check(unsafe { sys::fd_cache_blocks_needed(self.raw.as_ptr(), ids.as_ptr(), n, &mut needed, &mut free) })?;
        Ok((needed, free))
    }

    /// (blocks needed to grow request `ids[i]` by `token_counts[i] >= 1` tokens,
    /// as `begin_multi` with the same lists would, free blocks).
    pub fn blocks_needed_multi(&self, ids: &[u64], token_counts: &[u32]) -> Result<(u32, u32)> {
        let (mut needed, mut free) = (0u32, 0u32);
        let n = row_counts(token_counts, ids.len(), "token_counts")?;
        check(unsafe {
            sys::fd_cache_blocks_needed_multi(self.raw.as_ptr(), ids.as_ptr(), token_counts.as_ptr(), n, &mut needed, &mut free)
        })?;
        Ok((needed, free))
    }

    pub fn max_blocks_per_seq(&self, ids: &[u64]) -> Result<u32> {
        let mut m = 0u32;
        let n = u32_len(ids.len(), "request_ids")?;
        check(unsafe { sys::fd_cache_max_blocks_per_seq(self.raw.as_ptr(), ids.as_ptr(), n, &mut m) })?;
        Ok(m)
    }

    /// Committed block tables and seq_lens; `table_stride` None = the smallest
    /// valid stride (at least 1).
    pub fn export(&self, ids: &[u64], table_stride: Option<u32>) -> Result<Export> {
        let stride = match table_stride {
            Some(s) => s,
            None => self.max_blocks_per_seq(ids)?.max(1),
        };
        let n = u32_len(ids.len(), "request_ids")?;
        let mut tables = vec![0i32; ids.len() * stride as usize];
        let mut lens = vec![0i32; ids.len()];
        check(unsafe {
            sys::fd_cache_export(self.raw.as_ptr(), ids.as_ptr(), n, stride, tables.as_mut_ptr(), lens.as_mut_ptr())
        })?;
        Ok(Export { table_stride: stride, block_tables: tables, seq_lens: lens })
    }

    pub fn state_version(&self) -> Result<u64> {
        let mut v = 0u64;
        check(unsafe { sys::fd_cache_state_version(self.raw.as_ptr(), &mut v) })?;
        Ok(v)
    }

    /// Raw K/V base pointers and element strides (block, head, token, dim) of
    /// `layer`; owned by the cache, valid while it lives.
    pub fn layer_storage(&self, layer: u32) -> Result<(*mut c_void, *mut c_void, [i64; 4])> {
        let (mut k, mut v) = (ptr::null_mut(), ptr::null_mut());
        let mut strides = [0i64; 4];
        check(unsafe {
            sys::fd_cache_layer_storage(self.raw.as_ptr(), layer, &mut k, &mut v, strides.as_mut_ptr())
        })?;
        Ok((k, v, strides))
    }

    /// Replaces an FP8 cache's per-layer K and V scales
    /// (`fd_cache_set_kv_scales`): later writes quantise with them and stored
    /// tokens are read with them (their bytes do not change). `InvalidState`
    /// for a cache that is not FP8 or while a transaction is open (which the
    /// borrow of a [`Transaction`] already rules out); `InvalidArgument`
    /// naming a bad entry. Nothing changes on Err.
    pub fn set_kv_scales(&mut self, k_scales: &[f32], v_scales: &[f32]) -> Result<()> {
        check_scales(k_scales, v_scales, self.config.num_layers)?;
        check(unsafe { sys::fd_cache_set_kv_scales(self.raw.as_ptr(), k_scales.as_ptr(), v_scales.as_ptr()) })
    }

    /// The per-layer (K, V) dequantisation scales (`fd_cache_get_kv_scales`);
    /// all 1 for a cache that is not FP8.
    pub fn kv_scales(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = self.config.num_layers as usize;
        let (mut k, mut v) = (vec![0f32; n], vec![0f32; n]);
        check(unsafe { sys::fd_cache_get_kv_scales(self.raw.as_ptr(), k.as_mut_ptr(), v.as_mut_ptr()) })?;
        Ok((k, v))
    }

    /// Checks K/V (or Q) of `rows` tokens given to a layer write: the
    /// cache's input type, host memory, the token shape.
    fn check_tokens<T: KvElement>(&self, x: &[T], rows: usize, what: &str) -> Result<()> {
        self.check_elems(x, self.config.resolved_input_dtype(), rows, what)
    }

    fn check_elems<T: KvElement>(&self, x: &[T], dtype: DType, rows: usize, what: &str) -> Result<()> {
        if T::DTYPE != dtype {
            return Err(Error::invalid(format!("{what}: element type {:?} does not match the cache's {:?}", T::DTYPE, dtype)));
        }
        if self.config.device != Device::Cpu {
            return Err(Error::invalid(format!("{what}: host slices need a CPU cache; use the sys crate for device memory")));
        }
        let want = rows * self.config.token_elems();
        if x.len() != want {
            return Err(Error::invalid(format!(
                "{what}: expected {want} elements ({rows} x {} x {}), got {}",
                self.config.num_kv_heads,
                self.config.head_dim,
                x.len()
            )));
        }
        Ok(())
    }

    /// Legacy single-layer append (num_layers == 1): one token per request,
    /// k and v in the cache's input type.
    pub fn append<T: Element>(&mut self, ids: &[u64], k: &[T], v: &[T]) -> Result<()> {
        self.check_tokens(k, ids.len(), "k")?;
        self.check_tokens(v, ids.len(), "v")?;
        let n = u32_len(ids.len(), "request_ids")?;
        check(unsafe {
            sys::fd_cache_append(
                self.raw.as_ptr(),
                ids.as_ptr(),
                n,
                k.as_ptr().cast(),
                v.as_ptr().cast(),
                ptr::null_mut(),
            )
        })
    }

    pub fn metrics(&self) -> Result<CacheMetrics> {
        let mut m: CacheMetrics = unsafe { MaybeUninit::zeroed().assume_init() };
        m.struct_size = size_of::<CacheMetrics>() as u32;
        check(unsafe { sys::fd_cache_metrics_get(self.raw.as_ptr(), &mut m) })?;
        Ok(m)
    }

    /// Checks every invariant (S7); Err(Invariant) names the first violation.
    pub fn validate(&self) -> Result<()> {
        check(unsafe { sys::fd_cache_validate(self.raw.as_ptr()) })
    }

    /// The first asynchronous device fault of work this cache enqueued
    /// (`fd_cache_async_error`): Err(Device) naming the CUDA error. Never
    /// blocks; a CPU cache always returns Ok.
    pub fn async_error(&self) -> Result<()> {
        check(unsafe { sys::fd_cache_async_error(self.raw.as_ptr()) })
    }

    /// [`Cache::export`] into caller buffers (`fd_cache_export_async`): for a
    /// CUDA cache, device memory written on `stream` without host
    /// synchronisation; for a CPU cache, host memory written before return.
    /// Either destination may be null. On Err nothing is written or enqueued.
    ///
    /// # Safety
    /// `block_tables` must be valid for ids.len() * table_stride int32 and
    /// `seq_lens` for ids.len() int32 writes, in the cache's device memory,
    /// until `stream` reaches the copy; `stream` must be a valid CUDA stream
    /// or null.
    pub unsafe fn export_async(
        &self,
        ids: &[u64],
        table_stride: u32,
        block_tables: *mut i32,
        seq_lens: *mut i32,
        stream: sys::fd_stream,
    ) -> Result<()> {
        let n = u32_len(ids.len(), "request_ids")?;
        check(sys::fd_cache_export_async(self.raw.as_ptr(), ids.as_ptr(), n, table_stride, block_tables, seq_lens, stream))
    }

    /// Opens a transaction for one token of each listed request. The
    /// transaction borrows the cache mutably; dropping it uncommitted aborts it.
    pub fn begin(&mut self, ids: &[u64]) -> Result<Transaction<'_>> {
        let mut tx = sys::fd_tx { id: 0, cache_version: 0 };
        let n = u32_len(ids.len(), "request_ids")?;
        check(unsafe { sys::fd_tx_begin(self.raw.as_ptr(), ids.as_ptr(), n, &mut tx) })?;
        Ok(Transaction { cache: self, tx, finished: false })
    }

    /// Opens a transaction of `token_counts[i] >= 1` new tokens for request
    /// `ids[i]` (`fd_tx_begin_multi`, S5): a prompt chunk or speculative
    /// draft tokens. The layer writes then take [`TxInfo::token_count`]
    /// tokens packed in row order. As [`Cache::begin`] otherwise.
    pub fn begin_multi(&mut self, ids: &[u64], token_counts: &[u32]) -> Result<Transaction<'_>> {
        let mut tx = sys::fd_tx { id: 0, cache_version: 0 };
        let n = row_counts(token_counts, ids.len(), "token_counts")?;
        check(unsafe { sys::fd_tx_begin_multi(self.raw.as_ptr(), ids.as_ptr(), token_counts.as_ptr(), n, &mut tx) })?;
        Ok(Transaction { cache: self, tx, finished: false })
    }

    /// Shortens committed requests to `seq_lens` (`fd_cache_truncate`, S5.3):
    /// each at most the request's seq_len and not into an attached prefix;
    /// blocks past the new lengths return to the free list. All or nothing.
    pub fn truncate(&mut self, ids: &[u64], seq_lens: &[i32]) -> Result<()> {
        if seq_lens.len() != ids.len() {
            return Err(Error::invalid(format!("seq_lens: expected {} entries (one per request), got {}", ids.len(), seq_lens.len())));
        }
        let n = u32_len(ids.len(), "request_ids")?;
        check(unsafe { sys::fd_cache_truncate(self.raw.as_ptr(), ids.as_ptr(), seq_lens.as_ptr(), n) })
    }

    fn prefix_shape_elems(&self, k: usize, what: &str) -> Result<u32> {
        let per_block = self.config.num_layers as usize * self.config.token_elems() * self.config.block_size as usize;
        if k == 0 || k % per_block != 0 {
            return Err(Error::invalid(format!(
                "{what}: {k} elements is not a positive multiple of num_layers * num_kv_heads * block_size * head_dim = {per_block}"
            )));
        }
        u32_len(k / per_block, what)
    }

    /// Registers a shared prefix: k_blocks/v_blocks are
    /// [num_layers, n, num_kv_heads, block_size, head_dim] (n inferred), in
    /// the cache's storage type (FP8 bytes for an FP8 cache).
    pub fn register_prefix<T: KvElement>(&mut self, id: &str, k_blocks: &[T], v_blocks: &[T]) -> Result<()> {
        let rows = k_blocks.len() / self.config.token_elems().max(1);
        self.check_elems(k_blocks, self.config.dtype, rows, "k_blocks")?;
        let n = self.prefix_shape_elems(k_blocks.len(), "k_blocks")?;
        if v_blocks.len() != k_blocks.len() {
            return Err(Error::invalid(format!("v_blocks: expected {} elements, got {}", k_blocks.len(), v_blocks.len())));
        }
        let cid = prefix_cstring(id)?;
        check(unsafe {
            sys::fd_prefix_register(
                self.raw.as_ptr(),
                cid.as_ptr(),
                k_blocks.as_ptr().cast(),
                v_blocks.as_ptr().cast(),
                n,
                ptr::null_mut(),
            )
        })
    }

    pub fn attach_prefix(&mut self, request_id: u64, prefix_id: &str) -> Result<()> {
        let cid = prefix_cstring(prefix_id)?;
        check(unsafe { sys::fd_prefix_attach(self.raw.as_ptr(), request_id, cid.as_ptr()) })
    }

    pub fn evict_prefix(&mut self, prefix_id: &str) -> Result<()> {
        let cid = prefix_cstring(prefix_id)?;
        check(unsafe { sys::fd_prefix_evict(self.raw.as_ptr(), cid.as_ptr()) })
    }

    pub fn prefix_info(&self, prefix_id: &str) -> Result<PrefixInfo> {
        let cid = prefix_cstring(prefix_id)?;
        let mut i: sys::fd_prefix_info = unsafe { MaybeUninit::zeroed().assume_init() };
        i.struct_size = size_of::<sys::fd_prefix_info>() as u32;
        check(unsafe { sys::fd_prefix_get_info(self.raw.as_ptr(), cid.as_ptr(), &mut i) })?;
        Ok(PrefixInfo { num_blocks: i.num_blocks, ref_count: i.ref_count, last_use: i.last_use, first_block: i.first_block })
    }

    /// Decode attention of `q` ([rows, num_q_heads, head_dim]) over `layer`
    /// of this CPU cache, with the given block tables and seq_lens (from
    /// [`Cache::export`] or [`Transaction::block_tables`]). `out` has q's
    /// shape. q and out are each f32, F16 or Bf16 (the CPU backend converts),
    /// whatever the cache's type; the K/V are read with the layer's scales
    /// ([`Cache::kv_scales`]). [`Cache::decode_layer_with`] takes the
    /// attention variants and the other options.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_layer<Q: Element, O: Element>(
        &self,
        layer: u32,
        q: &[Q],
        num_q_heads: u32,
        block_tables: &[i32],
        seq_lens: &[i32],
        out: &mut [O],
        cpu_threads: u32,
    ) -> Result<()> {
        let options = DecodeOptions { cpu_threads, ..DecodeOptions::default() };
        self.decode_layer_with(layer, q, num_q_heads, block_tables, seq_lens, out, options)
    }

    /// [`Cache::decode_layer`] with [`DecodeOptions`]: `sm_scale`,
    /// `num_splits` (the workspace is allocated for the call), `cpu_threads`,
    /// `max_seq_len_hint` and the attention variants (`logit_softcap`,
    /// `sliding_window`, `sinks`: host `[num_q_heads]`, per call, so per
    /// layer). The K/V are read with the layer's scales: `options.k_scale` /
    /// `v_scale` are not used. One query token per row.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_layer_with<Q: Element, O: Element>(
        &self,
        layer: u32,
        q: &[Q],
        num_q_heads: u32,
        block_tables: &[i32],
        seq_lens: &[i32],
        out: &mut [O],
        options: DecodeOptions<'_>,
    ) -> Result<()> {
        let cfg = self.config;
        if cfg.device != Device::Cpu {
            return Err(Error::invalid("decode_layer needs a CPU cache"));
        }
        check_sinks(options.sinks, num_q_heads)?;
        let (k, v, strides) = self.layer_storage(layer)?;
        let (k_scales, v_scales) = self.kv_scales()?;
        let mut p = decode_params_base(q, num_q_heads, cfg.num_kv_heads, cfg.head_dim, block_tables, seq_lens, out)?;
        options.fill(&mut p);
        p.k_scale = k_scales[layer as usize];
        p.v_scale = v_scales[layer as usize];
        p.kv_dtype = cfg.dtype.raw();
        p.layout = cfg.layout.raw();
        p.block_size = cfg.block_size;
        p.num_blocks = cfg.max_blocks;
        p.k_cache = k;
        p.v_cache = v;
        p.stride_block = strides[0];
        p.stride_head = strides[1];
        p.stride_token = strides[2];
        p.stride_dim = strides[3];
        // Split-KV partials need scratch: size it and own it for the call.
        let mut bytes = 0usize;
        check(unsafe { sys::fd_decode_workspace_size(&p, &mut bytes) })?;
        let mut workspace = vec![0u64; bytes.div_ceil(8)];
        if bytes > 0 {
            p.workspace = workspace.as_mut_ptr().cast();
            p.workspace_size = bytes;
        }
        // SAFETY: every slice length was checked against the shapes in p
        // (sinks against num_q_heads), the storage pointers belong to this
        // cache (borrowed for the call), and block ids/seq_lens of host
        // memory are always checked by the library.
        unsafe { run_decode(&p) }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        unsafe { sys::fd_cache_destroy(self.raw.as_ptr()) }
    }
}

/// New tokens for a batch (one per row from [`Cache::begin`], several from
/// [`Cache::begin_multi`]), written layer by layer (`fd_tx`). Holds the cache
/// mutably; [`Transaction::commit`] or [`Transaction::abort`] consume it and
/// dropping it while open aborts it (errors ignored).
pub struct Transaction<'c> {
    cache: &'c mut Cache,
    tx: sys::fd_tx,
    finished: bool,
}

impl<'c> Transaction<'c> {
    pub fn id(&self) -> u64 {
        self.tx.id
    }
    pub fn raw(&self) -> sys::fd_tx {
        self.tx
    }
    /// The cache, read-only (for decode while the transaction is open).
    pub fn cache(&self) -> &Cache {
        self.cache
    }

    pub fn info(&self) -> Result<TxInfo> {
        let mut i: sys::fd_tx_info = unsafe { MaybeUninit::zeroed().assume_init() };
        i.struct_size = size_of::<sys::fd_tx_info>() as u32;
        check(unsafe { sys::fd_tx_get_info(self.cache.raw.as_ptr(), self.tx, &mut i) })?;
        Ok(TxInfo {
            batch: i.batch,
            next_layer: i.next_layer,
            max_blocks_per_seq: i.max_blocks_per_seq,
            new_block_count: i.new_block_count,
            token_count: i.token_count,
        })
    }

    pub fn rows(&self) -> Result<TxRows> {
        let n = self.info()?.batch as usize;
        let mut r = TxRows {
            request_ids: vec![0; n],
            positions: vec![0; n],
            block_ids: vec![0; n],
            offsets: vec![0; n],
            effective_seq_lens: vec![0; n],
        };
        check(unsafe {
            sys::fd_tx_get_rows(
                self.cache.raw.as_ptr(),
                self.tx,
                n as u32,
                r.request_ids.as_mut_ptr(),
                r.positions.as_mut_ptr(),
                r.block_ids.as_mut_ptr(),
                r.offsets.as_mut_ptr(),
                r.effective_seq_lens.as_mut_ptr(),
            )
        })?;
        Ok(r)
    }

    /// Every new token's position, block and offset (`fd_tx_get_tokens`).
    pub fn tokens(&self) -> Result<TxTokens> {
        let n = self.info()?.token_count as usize;
        let mut t = TxTokens { positions: vec![0; n], block_ids: vec![0; n], offsets: vec![0; n] };
        check(unsafe {
            sys::fd_tx_get_tokens(
                self.cache.raw.as_ptr(),
                self.tx,
                n as u32,
                t.positions.as_mut_ptr(),
                t.block_ids.as_mut_ptr(),
                t.offsets.as_mut_ptr(),
            )
        })?;
        Ok(t)
    }

    /// Block tables including the new blocks; stride None = smallest valid.
    pub fn block_tables(&self, table_stride: Option<u32>) -> Result<(u32, Vec<i32>)> {
        let info = self.info()?;
        let stride = table_stride.unwrap_or(info.max_blocks_per_seq.max(1));
        let mut t = vec![0i32; info.batch as usize * stride as usize];
        check(unsafe { sys::fd_tx_block_tables(self.cache.raw.as_ptr(), self.tx, stride, t.as_mut_ptr()) })?;
        Ok((stride, t))
    }

    /// [`Transaction::block_tables`] and the rows' effective_seq_lens into
    /// caller buffers (`fd_tx_block_tables_async`), as [`Cache::export_async`].
    ///
    /// # Safety
    /// `block_tables` must be valid for batch * table_stride and
    /// `effective_seq_lens` for batch int32 writes (or be null), in the cache's
    /// device memory, until `stream` reaches the copy.
    pub unsafe fn block_tables_async(
        &self,
        table_stride: u32,
        block_tables: *mut i32,
        effective_seq_lens: *mut i32,
        stream: sys::fd_stream,
    ) -> Result<()> {
        check(sys::fd_tx_block_tables_async(self.cache.raw.as_ptr(), self.tx, table_stride, block_tables, effective_seq_lens, stream))
    }

    /// The rows' query-token offsets into caller memory
    /// (`fd_tx_token_indptr_async`): batch + 1 int32, entry i = the new
    /// tokens of rows 0..i-1, ready as `q_indptr` of [`crate::decode_multi`]
    /// over the transaction's tokens; as [`Cache::export_async`] (a CPU
    /// cache writes host memory before return). Null is `InvalidArgument`.
    ///
    /// # Safety
    /// `token_indptr` must be valid for batch + 1 int32 writes (or be null),
    /// in the cache's device memory, until `stream` reaches the copy.
    pub unsafe fn token_indptr_async(&self, token_indptr: *mut i32, stream: sys::fd_stream) -> Result<()> {
        check(sys::fd_tx_token_indptr_async(self.cache.raw.as_ptr(), self.tx, token_indptr, stream))
    }

    /// Writes `layer`'s K and V, each [token_count, num_kv_heads, head_dim]:
    /// the new tokens packed in row order (token_count = batch for [`Cache::begin`]),
    /// in the cache's input type (an FP8 cache quantises them with the layer's scales).
    pub fn write_layer<T: Element>(&mut self, layer: u32, k: &[T], v: &[T]) -> Result<()> {
        let rows = self.info()?.token_count as usize;
        self.cache.check_tokens(k, rows, "k")?;
        self.cache.check_tokens(v, rows, "v")?;
        check(unsafe {
            sys::fd_tx_write_layer(self.cache.raw.as_ptr(), self.tx, layer, k.as_ptr().cast(), v.as_ptr().cast(), ptr::null_mut())
        })
    }

    /// RoPE on q and k at each token's position, in the cache's
    /// [`CacheConfig::rope_style`]; writes rotated K and raw V;
    /// the rotated Q goes to `q_out` (same length as q, [token_count,
    /// num_q_heads, head_dim]).
    #[allow(clippy::too_many_arguments)]
    pub fn write_layer_rope<T: Element>(
        &mut self,
        layer: u32,
        q: &[T],
        num_q_heads: u32,
        k: &[T],
        v: &[T],
        rotary_dim: u32,
        rope_base: f32,
        q_out: &mut [T],
    ) -> Result<()> {
        let rows = self.info()?.token_count as usize;
        self.cache.check_tokens(k, rows, "k")?;
        self.cache.check_tokens(v, rows, "v")?;
        let want = rows * num_q_heads as usize * self.cache.config.head_dim as usize;
        if q.len() != want || q_out.len() != want {
            return Err(Error::invalid(format!("q/q_out: expected {want} elements, got {} and {}", q.len(), q_out.len())));
        }
        check(unsafe {
            sys::fd_tx_write_layer_rope(
                self.cache.raw.as_ptr(),
                self.tx,
                layer,
                q.as_ptr().cast(),
                num_q_heads,
                k.as_ptr().cast(),
                v.as_ptr().cast(),
                rotary_dim,
                rope_base,
                q_out.as_mut_ptr().cast(),
                ptr::null_mut(),
            )
        })
    }

    /// Publishes the tokens. On failure the transaction stays open and is
    /// returned with the error, so the caller can finish the layers or abort.
    pub fn commit(self) -> std::result::Result<(), (Error, Transaction<'c>)> {
        let r = check(unsafe { sys::fd_tx_commit(self.cache.raw.as_ptr(), self.tx) });
        self.finish_with(r)
    }

    /// Publishes the first `keep_counts[i]` new tokens of row i and drops the
    /// rest (`fd_tx_commit_keep`, S5.2: speculative verify); blocks holding
    /// only dropped tokens return to the free list. Failure as
    /// [`Transaction::commit`] (a bad count too, or `keep_counts.len()` not
    /// the batch: the transaction stays open).
    pub fn commit_keep(self, keep_counts: &[u32]) -> std::result::Result<(), (Error, Transaction<'c>)> {
        let r = u32_len(keep_counts.len(), "keep_counts").and_then(|n| {
            check(unsafe { sys::fd_tx_commit_keep(self.cache.raw.as_ptr(), self.tx, keep_counts.as_ptr(), n) })
        });
        self.finish_with(r)
    }

    fn finish_with(mut self, r: Result<()>) -> std::result::Result<(), (Error, Transaction<'c>)> {
        match r {
            Ok(()) => {
                self.finished = true;
                Ok(())
            }
            Err(e) => Err((e, self)),
        }
    }

    pub fn abort(mut self) -> Result<()> {
        self.finished = true;
        check(unsafe { sys::fd_tx_abort(self.cache.raw.as_ptr(), self.tx) })
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // Best effort: Drop cannot report an error.
            let _ = unsafe { sys::fd_tx_abort(self.cache.raw.as_ptr(), self.tx) };
        }
    }
}
