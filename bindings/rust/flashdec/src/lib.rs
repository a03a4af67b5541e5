//! Safe Rust API of libflashdec: paged-KV decode attention over the C ABI.
//!
//! Handles free themselves in `Drop`; every fallible call returns
//! `Result<_, Error>` carrying the status and the library's message. Thread
//! contracts follow the header: a [`Cache`] and an [`Engine`] are `Send` but
//! not `Sync` (externally synchronised); [`Scheduler`], [`Snapshot`] and
//! [`Decision`] are `Send + Sync`. The raw declarations live in `flashdec-sys`,
//! re-exported as [`sys`].
//!
//! ```no_run
//! use flashdec::{Cache, CacheConfig, DType};
//! let mut cache = Cache::new(&CacheConfig { num_layers: 1, num_kv_heads: 2, head_dim: 8,
//!     dtype: DType::F32, ..CacheConfig::default() })?;
//! cache.add_request(1)?;
//! let mut tx = cache.begin(&[1])?;
//! tx.write_layer(0, &[0.0f32; 16], &[0.0f32; 16])?;
//! tx.commit().map_err(|(e, _)| e)?;
//! # Ok::<(), flashdec::Error>(())
//! ```

pub use flashdec_sys as sys;

mod append;
mod cache;
mod engine;
mod error;
mod ops;
mod sizes;
mod types;

pub use append::{
    default_kv_append_params, kv_append, kv_append_scaled, rope_kv_append, rope_kv_append_scaled, rope_kv_append_style, run_kv_append, run_rope_kv_append, PagedKvMut,
};
pub use cache::{Cache, CacheConfig, CacheMetrics, Export, ExternalStorage, PrefixInfo, RequestState, Transaction, TxInfo, TxRows, TxTokens};
pub use engine::{
    engine_config_default, run_workload, run_workload_with_progress, scheduler_config_default, snapshot_info_default, workload_cases, Decision,
    DecisionList, DecisionSummary, Engine, EngineConfig, EngineMetrics, EngineRequestState, Fairness, RequestSpec,
    Scheduler, SchedulerConfig, Snapshot, SnapshotInfo, Step, StepOutcome, TracePoint, WorkloadReport,
};
pub use error::{status_string, Error, Result, Status};
pub use ops::{
    cuda_device_count, decode, decode_multi, default_decode_params, default_reference_params, reference_attention,
    reference_attention_dense, rope_apply, rope_apply_style, run_decode, DecodeOptions, DecodePlan, PagedKv, ReferenceOptions,
};
pub use types::{Bf16, DType, Device, Element, Fp8E4m3, Fp8E5m2, KvElement, Layout, RopeStyle, F16};

/// Turns a raw status from a `sys` call into a Result (reads the
/// thread-local message: call it right after the C call, on the same thread).
pub fn check_status(raw: sys::fd_status) -> Result<()> {
    error::check(raw)
}

/// Runtime version "MAJOR.MINOR.PATCH".
pub fn version() -> &'static str {
    // SAFETY: static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(sys::fd_version_string()) }.to_str().unwrap_or("?")
}

/// Runtime version as major * 10000 + minor * 100 + patch.
pub fn version_number() -> u32 {
    unsafe { sys::fd_version_number() }
}

/// The header's compatibility rule: runtime at least as new, same major
/// version and, while the major is 0 (a 0.x minor may change the ABI), the
/// same minor version too.
pub fn is_compatible(runtime: u32) -> bool {
    let same = if sys::FD_VERSION_MAJOR == 0 {
        runtime / 100 == sys::FD_VERSION_NUMBER / 100
    } else {
        runtime / 10000 == sys::FD_VERSION_MAJOR
    };
    same && runtime >= sys::FD_VERSION_NUMBER
}
