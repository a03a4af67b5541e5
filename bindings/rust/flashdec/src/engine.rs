//! Block-aware scheduler (S9), decode engine (S8) and workload drivers (S10).
use crate::cache::{row_counts, Cache};
use crate::error::{check, Error, Result};
use crate::types::{Element, KvElement};
use flashdec_sys as sys;
use std::ffi::{CStr, CString};
use std::mem::{size_of, MaybeUninit};
use std::ptr::{self, NonNull};

fn zeroed<T>() -> T {
    // SAFETY: only used for the header's plain-data structs, where all-zero
    // bytes (null pointers, None callbacks) are valid values.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// `fd_scheduler_config`; `Default` comes from `fd_scheduler_config_init`.
pub type SchedulerConfig = sys::fd_scheduler_config;

pub fn scheduler_config_default() -> SchedulerConfig {
    let mut c: SchedulerConfig = zeroed();
    unsafe { sys::fd_scheduler_config_init(&mut c) };
    c
}

/// What the scheduler knows about a request (`fd_request_spec`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpec {
    pub id: u64,
    pub initial_context_tokens: u32,
    pub max_new_tokens: u32,
    pub submission_order: u64,
    pub prefix_blocks: u32,
    pub prefix_id: Option<String>,
}

impl RequestSpec {
    pub fn new(id: u64, max_new_tokens: u32, submission_order: u64) -> RequestSpec {
        RequestSpec { id, initial_context_tokens: 0, max_new_tokens, submission_order, prefix_blocks: 0, prefix_id: None }
    }

    /// The C struct plus the owned prefix string it points into.
    fn to_raw(&self) -> Result<(sys::fd_request_spec, Option<CString>)> {
        let mut s: sys::fd_request_spec = zeroed();
        unsafe { sys::fd_request_spec_init(&mut s) };
        s.id = self.id;
        s.initial_context_tokens = self.initial_context_tokens;
        s.max_new_tokens = self.max_new_tokens;
        s.submission_order = self.submission_order;
        s.prefix_blocks = self.prefix_blocks;
        let owned = match &self.prefix_id {
            Some(p) => Some(CString::new(p.as_str()).map_err(|_| Error::invalid("prefix_id must not contain NUL"))?),
            None => None,
        };
        s.prefix_id = owned.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        Ok((s, owned))
    }
}

/// Block-aware planner. Immutable after creation: `Send + Sync`.
pub struct Scheduler {
    raw: NonNull<sys::fd_scheduler>,
}
unsafe impl Send for Scheduler {}
unsafe impl Sync for Scheduler {}

impl Scheduler {
    pub fn new(config: &SchedulerConfig) -> Result<Scheduler> {
        let mut c = *config;
        c.struct_size = size_of::<SchedulerConfig>() as u32;
        let mut out = ptr::null_mut();
        check(unsafe { sys::fd_scheduler_create(&c, &mut out) })?;
        Ok(Scheduler { raw: NonNull::new(out).expect("FD_OK with NULL scheduler") })
    }

    pub fn config(&self) -> Result<SchedulerConfig> {
        let mut c: SchedulerConfig = zeroed();
        c.struct_size = size_of::<SchedulerConfig>() as u32;
        check(unsafe { sys::fd_scheduler_get_config(self.raw.as_ptr(), &mut c) })?;
        Ok(c)
    }

    /// Plans one step (pure, deterministic).
    pub fn plan(&self, snapshot: &Snapshot) -> Result<Decision> {
        let mut out = ptr::null_mut();
        check(unsafe { sys::fd_scheduler_plan(self.raw.as_ptr(), snapshot.raw.as_ptr(), &mut out) })?;
        Ok(Decision { raw: NonNull::new(out).expect("FD_OK with NULL decision") })
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        unsafe { sys::fd_scheduler_destroy(self.raw.as_ptr()) }
    }
}

/// Pool-wide numbers of a snapshot (`fd_snapshot_info`).
pub type SnapshotInfo = sys::fd_snapshot_info;

pub fn snapshot_info_default() -> SnapshotInfo {
    let mut i: SnapshotInfo = zeroed();
    unsafe { sys::fd_snapshot_info_init(&mut i) };
    i
}

/// Scheduler input. Built with `&mut self`, read with `&self`: `Send + Sync`.
pub struct Snapshot {
    raw: NonNull<sys::fd_snapshot>,
}
unsafe impl Send for Snapshot {}
unsafe impl Sync for Snapshot {}

impl Snapshot {
    pub fn new(info: &SnapshotInfo) -> Result<Snapshot> {
        let mut i = *info;
        i.struct_size = size_of::<SnapshotInfo>() as u32;
        let mut out = ptr::null_mut();
        check(unsafe { sys::fd_snapshot_create(&i, &mut out) })?;
        Ok(Snapshot { raw: NonNull::new(out).expect("FD_OK with NULL snapshot") })
    }

    pub fn info(&self) -> Result<SnapshotInfo> {
        let mut i: SnapshotInfo = zeroed();
        i.struct_size = size_of::<SnapshotInfo>() as u32;
        check(unsafe { sys::fd_snapshot_get_info(self.raw.as_ptr(), &mut i) })?;
        Ok(i)
    }

    pub fn add_waiting(&mut self, spec: &RequestSpec, wait_steps: u32, skip_count: u32) -> Result<()> {
        let (s, _keep) = spec.to_raw()?;
        check(unsafe { sys::fd_snapshot_add_waiting(self.raw.as_ptr(), &s, wait_steps, skip_count) })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn add_active(
        &mut self,
        spec: &RequestSpec,
        seq_len: i32,
        physical_blocks: u32,
        shared_blocks: u32,
        committed_blocks: u32,
        service_wait_steps: u32,
    ) -> Result<()> {
        let (s, _keep) = spec.to_raw()?;
        check(unsafe {
            sys::fd_snapshot_add_active(self.raw.as_ptr(), &s, seq_len, physical_blocks, shared_blocks, committed_blocks, service_wait_steps)
        })
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        unsafe { sys::fd_snapshot_destroy(self.raw.as_ptr()) }
    }
}

/// Id lists of a decision.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DecisionList {
    Admit,
    Runnable,
    Deferred,
    Waiting,
    Rejected,
}

/// Numbers of a decision (`fd_decision_summary`).
pub type DecisionSummary = sys::fd_decision_summary;

/// Immutable scheduler output: `Send + Sync`.
pub struct Decision {
    raw: NonNull<sys::fd_decision>,
}
unsafe impl Send for Decision {}
unsafe impl Sync for Decision {}

impl Decision {
    pub fn ids(&self, list: DecisionList) -> Result<Vec<u64>> {
        let which = match list {
            DecisionList::Admit => sys::FD_DECISION_ADMIT,
            DecisionList::Runnable => sys::FD_DECISION_RUNNABLE,
            DecisionList::Deferred => sys::FD_DECISION_DEFERRED,
            DecisionList::Waiting => sys::FD_DECISION_WAITING,
            DecisionList::Rejected => sys::FD_DECISION_REJECTED,
        };
        let mut count = 0u32;
        check(unsafe { sys::fd_decision_ids(self.raw.as_ptr(), which, ptr::null_mut(), 0, &mut count) })?;
        let mut ids = vec![0u64; count as usize];
        check(unsafe { sys::fd_decision_ids(self.raw.as_ptr(), which, ids.as_mut_ptr(), count, &mut count) })?;
        ids.truncate(count as usize);
        Ok(ids)
    }

    pub fn summary(&self) -> Result<DecisionSummary> {
        let mut s: DecisionSummary = zeroed();
        s.struct_size = size_of::<DecisionSummary>() as u32;
        check(unsafe { sys::fd_decision_get_summary(self.raw.as_ptr(), &mut s) })?;
        Ok(s)
    }

    /// Raw `fd_schedule_reason` values in the fixed order.
    pub fn reasons(&self) -> Result<Vec<i32>> {
        let mut r = [0i32; 8];
        let mut n = 0u32;
        check(unsafe { sys::fd_decision_reasons(self.raw.as_ptr(), r.as_mut_ptr(), r.len() as u32, &mut n) })?;
        Ok(r[..n as usize].to_vec())
    }

    pub fn config(&self) -> Result<SchedulerConfig> {
        let mut c: SchedulerConfig = zeroed();
        c.struct_size = size_of::<SchedulerConfig>() as u32;
        check(unsafe { sys::fd_decision_get_config(self.raw.as_ptr(), &mut c) })?;
        Ok(c)
    }

    pub fn snapshot(&self) -> Result<Snapshot> {
        let mut out = ptr::null_mut();
        check(unsafe { sys::fd_decision_copy_snapshot(self.raw.as_ptr(), &mut out) })?;
        Ok(Snapshot { raw: NonNull::new(out).expect("FD_OK with NULL snapshot") })
    }
}

impl Drop for Decision {
    fn drop(&mut self) {
        unsafe { sys::fd_decision_destroy(self.raw.as_ptr()) }
    }
}

/// `fd_engine_config`; see [`engine_config_default`].
pub type EngineConfig = sys::fd_engine_config;
/// `fd_engine_metrics`.
pub type EngineMetrics = sys::fd_engine_metrics;
/// Caller-kept fairness counters (`fd_request_fairness`).
pub type Fairness = sys::fd_request_fairness;

pub fn engine_config_default() -> EngineConfig {
    let mut c: EngineConfig = zeroed();
    unsafe { sys::fd_engine_config_init(&mut c) };
    c
}

/// Request state in an engine.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum EngineRequestState {
    Unknown,
    Waiting,
    Active,
    Finished,
    Cancelled,
    Rejected,
}

/// Decode engine over a CPU cache. Borrows the cache mutably for its whole
/// life (the C engine must not outlive it, and both share one thread
/// contract): `Send`, not `Sync`.
pub struct Engine<'c> {
    raw: NonNull<sys::fd_engine>,
    cache: &'c mut Cache,
}
unsafe impl Send for Engine<'_> {}

/// Result of [`Engine::begin_step`].
pub enum StepOutcome<'e, 'c> {
    Opened(Step<'e, 'c>),
    Backpressure { needed_blocks: u32, free_blocks: u32 },
}

impl<'c> Engine<'c> {
    pub fn new(cache: &'c mut Cache, config: &EngineConfig) -> Result<Engine<'c>> {
        let mut c = *config;
        c.struct_size = size_of::<EngineConfig>() as u32;
        let mut out = ptr::null_mut();
        check(unsafe { sys::fd_engine_create(cache.as_raw(), &c, &mut out) })?;
        Ok(Engine { raw: NonNull::new(out).expect("FD_OK with NULL engine"), cache })
    }

    /// The cache, read-only (metrics, export).
    pub fn cache(&self) -> &Cache {
        self.cache
    }

    pub fn add_request(&mut self, id: u64) -> Result<()> {
        check(unsafe { sys::fd_engine_add_request(self.raw.as_ptr(), id) })
    }
    pub fn admit(&mut self, id: u64) -> Result<()> {
        check(unsafe { sys::fd_engine_admit(self.raw.as_ptr(), id) })
    }
    pub fn finish(&mut self, id: u64) -> Result<()> {
        check(unsafe { sys::fd_engine_finish(self.raw.as_ptr(), id) })
    }
    pub fn cancel(&mut self, id: u64) -> Result<()> {
        check(unsafe { sys::fd_engine_cancel(self.raw.as_ptr(), id) })
    }

    pub fn request_state(&self, id: u64) -> Result<EngineRequestState> {
        let mut s = 0i32;
        check(unsafe { sys::fd_engine_get_request_state(self.raw.as_ptr(), id, &mut s) })?;
        Ok(match s {
            sys::FD_ENGINE_REQUEST_WAITING => EngineRequestState::Waiting,
            sys::FD_ENGINE_REQUEST_ACTIVE => EngineRequestState::Active,
            sys::FD_ENGINE_REQUEST_FINISHED => EngineRequestState::Finished,
            sys::FD_ENGINE_REQUEST_CANCELLED => EngineRequestState::Cancelled,
            sys::FD_ENGINE_REQUEST_REJECTED => EngineRequestState::Rejected,
            _ => EngineRequestState::Unknown,
        })
    }

    /// Opens a step for one token of each request.
    pub fn begin_step<'e>(&'e mut self, ids: &[u64]) -> Result<StepOutcome<'e, 'c>> {
        let mut s: sys::fd_engine_step = zeroed();
        s.struct_size = size_of::<sys::fd_engine_step>() as u32;
        let n = u32::try_from(ids.len()).map_err(|_| Error::invalid("request_ids: too many"))?;
        check(unsafe { sys::fd_engine_begin_step(self.raw.as_ptr(), ids.as_ptr(), n, &mut s) })?;
        Ok(self.step_outcome(s, n))
    }

    /// Opens a step of `token_counts[i] >= 1` tokens for request `ids[i]`
    /// (`fd_engine_begin_step_multi`: speculative verify, a prompt chunk whose
    /// attention is needed). The step's layers take [`Step::token_count`]
    /// tokens packed in row order, each attending causally.
    pub fn begin_step_multi<'e>(&'e mut self, ids: &[u64], token_counts: &[u32]) -> Result<StepOutcome<'e, 'c>> {
        let mut s: sys::fd_engine_step = zeroed();
        s.struct_size = size_of::<sys::fd_engine_step>() as u32;
        let n = row_counts(token_counts, ids.len(), "token_counts")?;
        check(unsafe { sys::fd_engine_begin_step_multi(self.raw.as_ptr(), ids.as_ptr(), token_counts.as_ptr(), n, &mut s) })?;
        // The library refused a sum above INT32_MAX, so this fits.
        let tokens = token_counts.iter().map(|&c| c as u64).sum::<u64>() as u32;
        Ok(self.step_outcome(s, tokens))
    }

    fn step_outcome<'e>(&'e mut self, s: sys::fd_engine_step, tokens: u32) -> StepOutcome<'e, 'c> {
        if s.outcome == sys::FD_STEP_BACKPRESSURE {
            return StepOutcome::Backpressure { needed_blocks: s.needed_blocks, free_blocks: s.free_blocks };
        }
        StepOutcome::Opened(Step { engine: self, raw: s, tokens, finished: false })
    }

    /// Replaces the FP8 cache's per-layer K and V scales between steps
    /// ([`Cache::set_kv_scales`]; the engine reads them at every
    /// `begin_step`, so they apply from the next step on).
    pub fn set_kv_scales(&mut self, k_scales: &[f32], v_scales: &[f32]) -> Result<()> {
        self.cache.set_kv_scales(k_scales, v_scales)
    }

    /// One prompt token through every layer: k, v [num_layers, num_kv_heads,
    /// head_dim] in the cache's input type.
    pub fn prefill<T: Element>(&mut self, id: u64, k: &[T], v: &[T]) -> Result<()> {
        let cfg = *self.cache.config();
        let want = cfg.num_layers as usize * cfg.token_elems();
        let dtype = cfg.resolved_input_dtype();
        if T::DTYPE != dtype || k.len() != want || v.len() != want {
            return Err(Error::invalid(format!("k/v: expected {want} {dtype:?} elements, got {} and {} {:?}", k.len(), v.len(), T::DTYPE)));
        }
        check(unsafe { sys::fd_engine_prefill_request_layers(self.raw.as_ptr(), id, k.as_ptr().cast(), v.as_ptr().cast()) })
    }

    /// Prompt tokens through every layer in one cache transaction
    /// (`fd_engine_prefill_request_tokens`): k, v [num_layers, n,
    /// num_kv_heads, head_dim] (n inferred), token j rotated at position
    /// seq_len + j; all published at once or none.
    pub fn prefill_tokens<T: Element>(&mut self, id: u64, k: &[T], v: &[T]) -> Result<()> {
        let cfg = *self.cache.config();
        let per_token = cfg.num_layers as usize * cfg.token_elems();
        let dtype = cfg.resolved_input_dtype();
        if T::DTYPE != dtype || per_token == 0 || k.is_empty() || k.len() % per_token != 0 || v.len() != k.len() {
            return Err(Error::invalid(format!(
                "k/v: need equal positive multiples of num_layers * num_kv_heads * head_dim = {per_token} {:?} elements, got {} and {} {:?}",
                dtype,
                k.len(),
                v.len(),
                T::DTYPE
            )));
        }
        let n = u32::try_from(k.len() / per_token).map_err(|_| Error::invalid("k: too many tokens"))?;
        check(unsafe { sys::fd_engine_prefill_request_tokens(self.raw.as_ptr(), id, n, k.as_ptr().cast(), v.as_ptr().cast()) })
    }

    pub fn submit(&mut self, spec: &RequestSpec) -> Result<()> {
        let (s, _keep) = spec.to_raw()?;
        check(unsafe { sys::fd_engine_submit_request(self.raw.as_ptr(), &s) })
    }

    /// As [`crate::Cache::register_prefix`]: blocks in the cache's storage type.
    pub fn register_prefix<T: KvElement>(&mut self, id: &str, k_blocks: &[T], v_blocks: &[T]) -> Result<()> {
        let cfg = *self.cache.config();
        let per_block = cfg.num_layers as usize * cfg.token_elems() * cfg.block_size as usize;
        if T::DTYPE != cfg.dtype || per_block == 0 || k_blocks.is_empty() || k_blocks.len() % per_block != 0 || v_blocks.len() != k_blocks.len() {
            return Err(Error::invalid(format!("k_blocks/v_blocks: need equal positive multiples of {per_block} {:?} elements", cfg.dtype)));
        }
        let cid = CString::new(id).map_err(|_| Error::invalid("prefix_id must not contain NUL"))?;
        let n = (k_blocks.len() / per_block) as u32;
        check(unsafe {
            sys::fd_engine_register_prefix(self.raw.as_ptr(), cid.as_ptr(), k_blocks.as_ptr().cast(), v_blocks.as_ptr().cast(), n, ptr::null_mut())
        })
    }

    pub fn evict_prefix(&mut self, id: &str) -> Result<()> {
        let cid = CString::new(id).map_err(|_| Error::invalid("prefix_id must not contain NUL"))?;
        check(unsafe { sys::fd_engine_evict_prefix(self.raw.as_ptr(), cid.as_ptr()) })
    }

    pub fn snapshot(&self, step: u64, fairness: &[Fairness]) -> Result<Snapshot> {
        let mut out = ptr::null_mut();
        let n = u32::try_from(fairness.len()).map_err(|_| Error::invalid("fairness: too many"))?;
        let p = if fairness.is_empty() { ptr::null() } else { fairness.as_ptr() };
        check(unsafe { sys::fd_engine_snapshot(self.raw.as_ptr(), step, p, n, &mut out) })?;
        Ok(Snapshot { raw: NonNull::new(out).expect("FD_OK with NULL snapshot") })
    }

    pub fn apply_decision(&mut self, scheduler: &Scheduler, decision: &Decision) -> Result<()> {
        check(unsafe { sys::fd_engine_apply_decision(self.raw.as_ptr(), scheduler.raw.as_ptr(), decision.raw.as_ptr()) })
    }

    pub fn metrics(&self) -> Result<EngineMetrics> {
        let mut m: EngineMetrics = zeroed();
        m.struct_size = size_of::<EngineMetrics>() as u32;
        check(unsafe { sys::fd_engine_metrics_get(self.raw.as_ptr(), &mut m) })?;
        Ok(m)
    }

    pub fn validate(&self) -> Result<()> {
        check(unsafe { sys::fd_engine_validate(self.raw.as_ptr()) })
    }
}

impl Drop for Engine<'_> {
    fn drop(&mut self) {
        unsafe { sys::fd_engine_destroy(self.raw.as_ptr()) }
    }
}

/// An open engine step; dropping it uncommitted aborts it.
pub struct Step<'e, 'c> {
    engine: &'e mut Engine<'c>,
    raw: sys::fd_engine_step,
    tokens: u32,
    finished: bool,
}

impl Step<'_, '_> {
    pub fn batch(&self) -> u32 {
        self.raw.batch
    }
    /// The step's new tokens: batch, or the sum of the token counts of
    /// [`Engine::begin_step_multi`].
    pub fn token_count(&self) -> u32 {
        self.tokens
    }
    pub fn needed_blocks(&self) -> u32 {
        self.raw.needed_blocks
    }

    /// Runs `layer` (RoPE, append, decode); `out` receives the attention
    /// output with q's shape [token_count, num_q_heads, head_dim] (k, v:
    /// [token_count, num_kv_heads, head_dim]; the tokens packed in row order,
    /// token_count = batch for [`Engine::begin_step`]). A failure aborts the
    /// whole step (library contract). All four are of the cache's input type
    /// (its dtype, or what an FP8 cache takes: F16, Bf16 or F32 on the CPU;
    /// the engine reads the layer scales at `begin_step`).
    pub fn layer<T: Element>(&mut self, layer: u32, q: &[T], k: &[T], v: &[T], out: &mut [T]) -> Result<()> {
        let cfg = *self.engine.cache.config();
        let rows = self.tokens as usize;
        let kv = rows * cfg.token_elems();
        let dtype = cfg.resolved_input_dtype();
        if T::DTYPE != dtype {
            return Err(Error::invalid(format!("element type {:?} does not match the cache's input type {:?}", T::DTYPE, dtype)));
        }
        if k.len() != kv || v.len() != kv {
            return Err(Error::invalid(format!("k/v: expected {kv} elements, got {} and {}", k.len(), v.len())));
        }
        let qrow = rows * cfg.head_dim as usize;
        if q.is_empty() || q.len() % qrow != 0 || out.len() != q.len() {
            return Err(Error::invalid(format!("q/out: need equal positive multiples of {qrow} elements, got {} and {}", q.len(), out.len())));
        }
        let r = check(unsafe {
            sys::fd_engine_step_layer(
                self.engine.raw.as_ptr(),
                self.raw.tx,
                layer,
                q.as_ptr().cast(),
                k.as_ptr().cast(),
                v.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                ptr::null_mut(),
            )
        });
        if r.is_err() {
            self.finished = true; // the engine aborted the step
        }
        r
    }

    pub fn commit(mut self) -> Result<()> {
        let r = check(unsafe { sys::fd_engine_commit_step(self.engine.raw.as_ptr(), self.raw.tx) });
        self.finished = r.is_ok();
        r
    }

    /// Publishes the first `keep_counts[i]` new tokens of row i and drops the
    /// rest (`fd_engine_commit_step_keep`: the accept step of speculative
    /// decoding). As [`Step::commit`], an error drops the step, which
    /// aborts it.
    pub fn commit_keep(mut self, keep_counts: &[u32]) -> Result<()> {
        let n = u32::try_from(keep_counts.len()).map_err(|_| Error::invalid("keep_counts: too many"))?;
        let r = check(unsafe { sys::fd_engine_commit_step_keep(self.engine.raw.as_ptr(), self.raw.tx, keep_counts.as_ptr(), n) });
        self.finished = r.is_ok();
        r
    }

    pub fn abort(mut self) -> Result<()> {
        self.finished = true;
        check(unsafe { sys::fd_engine_abort_step(self.engine.raw.as_ptr(), self.raw.tx) })
    }
}

impl Drop for Step<'_, '_> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = unsafe { sys::fd_engine_abort_step(self.engine.raw.as_ptr(), self.raw.tx) };
        }
    }
}

/// `fd_workload_report` / `fd_workload_trace_point`.
pub type WorkloadReport = sys::fd_workload_report;
pub type TracePoint = sys::fd_workload_trace_point;

/// Case names of a workload kind (`sys::FD_WORKLOAD_*`).
pub fn workload_cases(kind: i32) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for index in 0.. {
        let mut name: *const std::os::raw::c_char = ptr::null();
        let s = unsafe { sys::fd_workload_case_name(kind, index, &mut name) };
        if s == sys::FD_ERR_NOT_FOUND {
            break;
        }
        check(s)?;
        names.push(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned());
    }
    Ok(names)
}

/// Runs a workload case; one (report, trace) per policy run.
pub fn run_workload(kind: i32, case_name: &str, seed: u64, cpu_threads: u32) -> Result<Vec<(WorkloadReport, Vec<TracePoint>)>> {
    run_workload_with_progress(kind, case_name, seed, cpu_threads, None)
}

/// What the progress trampoline reaches through `progress_user_data`.
struct ProgressState<'a> {
    callback: &'a mut dyn FnMut(u64, u64),
    panic: Option<Box<dyn std::any::Any + Send>>,
}

unsafe extern "C" fn progress_trampoline(user_data: *mut std::os::raw::c_void, done: u64, total: u64) {
    // SAFETY: user_data is the &mut ProgressState that run_workload_with_progress
    // lends for the duration of fd_workload_run, which calls back on its thread.
    let state = unsafe { &mut *(user_data as *mut ProgressState) };
    if state.panic.is_some() {
        return;
    }
    // A panic must not unwind into the library: keep it, re-raise after the run.
    let callback = &mut state.callback;
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(done, total))) {
        state.panic = Some(p);
    }
}

/// [`run_workload`] with a progress callback: `progress(done, total)` is
/// called now and then on the calling thread. A panic in it is re-raised
/// after the run has returned (the result is freed first).
pub fn run_workload_with_progress(
    kind: i32,
    case_name: &str,
    seed: u64,
    cpu_threads: u32,
    progress: Option<&mut dyn FnMut(u64, u64)>,
) -> Result<Vec<(WorkloadReport, Vec<TracePoint>)>> {
    let mut o: sys::fd_workload_options = zeroed();
    unsafe { sys::fd_workload_options_init(&mut o) };
    let name = CString::new(case_name).map_err(|_| Error::invalid("case_name must not contain NUL"))?;
    o.kind = kind;
    o.case_name = name.as_ptr();
    o.seed = seed;
    o.cpu_threads = cpu_threads;
    let mut state = progress.map(|callback| ProgressState { callback, panic: None });
    if let Some(state) = state.as_mut() {
        o.progress = Some(progress_trampoline);
        o.progress_user_data = state as *mut ProgressState as *mut std::os::raw::c_void;
    }
    let mut out = ptr::null_mut();
    let status = unsafe { sys::fd_workload_run(&o, &mut out) };
    struct Guard(*mut sys::fd_workload_result);
    impl Drop for Guard {
        fn drop(&mut self) {
            unsafe { sys::fd_workload_result_destroy(self.0) }
        }
    }
    let result = Guard(if status == sys::FD_OK { out } else { ptr::null_mut() });
    if let Some(p) = state.and_then(|s| s.panic) {
        drop(result);
        std::panic::resume_unwind(p);
    }
    check(status)?;
    let mut count = 0u32;
    check(unsafe { sys::fd_workload_result_count(result.0, &mut count) })?;
    let mut runs = Vec::new();
    for i in 0..count {
        let mut r: WorkloadReport = zeroed();
        r.struct_size = size_of::<WorkloadReport>() as u32;
        check(unsafe { sys::fd_workload_result_report(result.0, i, &mut r) })?;
        let mut n = 0u32;
        check(unsafe { sys::fd_workload_result_trace(result.0, i, ptr::null_mut(), 0, &mut n) })?;
        let mut trace: Vec<TracePoint> = (0..n).map(|_| zeroed()).collect();
        check(unsafe { sys::fd_workload_result_trace(result.0, i, trace.as_mut_ptr(), n, &mut n) })?;
        trace.truncate(n as usize);
        runs.push((r, trace));
    }
    Ok(runs)
}
