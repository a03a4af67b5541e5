#include "engine/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/arg_checks.hpp"
#include "core/error.hpp"

namespace fd {

namespace {

using ull = unsigned long long;

// Turns a failed public call into an fd::Error with the callee's message.
void check(fd_status status, const char *prefix = nullptr) {
  if (status == FD_OK) return;
  std::string msg = fd_last_error_message();
  if (prefix != nullptr) msg = std::string(prefix) + msg;
  throw Error(status, msg);
}

const char *state_name(int32_t s) {
  switch (s) {
    case FD_ENGINE_REQUEST_WAITING: return "waiting";
    case FD_ENGINE_REQUEST_ACTIVE: return "active";
    case FD_ENGINE_REQUEST_FINISHED: return "finished";
    case FD_ENGINE_REQUEST_CANCELLED: return "cancelled";
    case FD_ENGINE_REQUEST_REJECTED: return "rejected";
    default: return "unknown";
  }
}

bool terminal(int32_t s) {
  return s == FD_ENGINE_REQUEST_FINISHED || s == FD_ENGINE_REQUEST_CANCELLED ||
         s == FD_ENGINE_REQUEST_REJECTED;
}

}  // namespace

Engine::Engine(fd_cache *cache, const fd_engine_config &config) : cache_(cache) {
  require_non_null(cache, "cache");
  cache_config_.struct_size = sizeof cache_config_;
  check(fd_cache_get_config(cache, &cache_config_));
  input_dtype_ = cache_config_.input_dtype == -1 ? cache_config_.dtype : cache_config_.input_dtype;
  const uint32_t kv = cache_config_.num_kv_heads, d = cache_config_.head_dim;
  num_q_heads_ = config.num_q_heads == 0 ? kv : config.num_q_heads;
  if (num_q_heads_ % kv != 0) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "config->num_q_heads %u must be a positive multiple of the cache's num_kv_heads %u",
         num_q_heads_, kv);
  }
  rotary_dim_ = config.rotary_dim == 0 ? d : config.rotary_dim;
  if (rotary_dim_ % 2 != 0 || rotary_dim_ > d) {
    fail(FD_ERR_INVALID_ARGUMENT, "config->rotary_dim %u must be even and <= head_dim %u",
         rotary_dim_, d);
  }
  if (!std::isfinite(config.rope_base) || config.rope_base <= 0.f) {
    fail(FD_ERR_INVALID_ARGUMENT, "config->rope_base must be finite and > 0, got %g",
         static_cast<double>(config.rope_base));
  }
  if (!std::isfinite(config.sm_scale) || config.sm_scale < 0.f) {
    fail(FD_ERR_INVALID_ARGUMENT, "config->sm_scale must be finite and >= 0, got %g",
         static_cast<double>(config.sm_scale));
  }
  rope_base_ = config.rope_base;
  sm_scale_ = config.sm_scale;
  cpu_threads_ = config.cpu_threads;
  if (cache_metrics().open_transaction_count != 0) {
    fail(FD_ERR_INVALID_STATE, "the cache has an open transaction; commit or abort it first");
  }
  // Storage pointers are stable for the cache's lifetime: look them up once.
  for (uint32_t l = 0; l < cache_config_.num_layers; ++l) {
    void *k = nullptr, *v = nullptr;
    check(fd_cache_layer_storage(cache, l, &k, &v, strides_));
    layer_k_.push_back(k);
    layer_v_.push_back(v);
  }
  layer_k_scales_.assign(cache_config_.num_layers, 1.f);
  layer_v_scales_.assign(cache_config_.num_layers, 1.f);
  if (cache_config_.device.type == FD_DEVICE_CUDA) create_device_scratch();
  sync_cache_version();
}

void Engine::create_device_scratch() {
  // Rows of a step are bounded by max_blocks (each row's new token lies in a
  // private block) and so is a row's table. Small caches get that bound at
  // once; larger ones start at these sizes and grow (engine_device.hpp).
  constexpr uint32_t kInitialRows = 256;
  constexpr uint64_t kInitialTableEntries = uint64_t{1} << 20;  // 4 MiB
  constexpr size_t kMaxWorkspaceBytes = size_t{128} << 20;
  const uint32_t max_blocks = cache_config_.max_blocks;
  DeviceScratchSizes sizes;
  sizes.ordinal = cache_config_.device.ordinal;
  sizes.q_row_bytes = size_t{num_q_heads_} * cache_config_.head_dim * element_size();
  sizes.prefill_q_bytes =
      size_t{cache_config_.num_kv_heads} * cache_config_.head_dim * element_size();
  sizes.max_rows = max_blocks;
  sizes.max_tokens = uint64_t{max_blocks} * cache_config_.block_size;
  sizes.max_table_entries = uint64_t{max_blocks} * max_blocks;
  sizes.initial_rows = std::min(max_blocks, kInitialRows);
  sizes.initial_table_entries = std::min(sizes.max_table_entries, kInitialTableEntries);
  device_ = std::make_unique<DeviceScratch>(sizes);
  // Split-KV workspace: what fd_decode would use for one row and for a full
  // initial batch at the longest context the cache can hold, capped. With
  // less, fd_decode chooses fewer splits (never an error).
  const uint64_t longest = uint64_t{max_blocks} * cache_config_.block_size;
  size_t bytes = 0;
  for (uint32_t batch : {1u, sizes.initial_rows}) {
    fd_decode_params p = decode_params(batch);
    p.max_blocks_per_seq = max_blocks;
    p.max_seq_len_hint = static_cast<int32_t>(std::min<uint64_t>(longest, INT32_MAX));
    size_t need = 0;
    check(fd_decode_workspace_size(&p, &need), "sizing the engine's split-KV workspace: ");
    bytes = std::max(bytes, need);
  }
  device_->allocate_workspace(std::min(bytes, kMaxWorkspaceBytes));
}

fd_decode_params Engine::decode_params(uint32_t batch) const {
  fd_decode_params p;
  fd_decode_params_init(&p);
  p.batch = batch;
  p.num_q_heads = num_q_heads_;
  p.num_kv_heads = cache_config_.num_kv_heads;
  p.head_dim = cache_config_.head_dim;
  // q and out in the cache's input type, over K/V as stored (S1.1).
  p.q_dtype = input_dtype_;
  p.kv_dtype = cache_config_.dtype;
  p.out_dtype = input_dtype_;
  p.layout = cache_config_.layout;
  p.block_size = cache_config_.block_size;
  p.num_blocks = cache_config_.max_blocks;
  p.max_blocks_per_seq = table_stride_;
  p.stride_block = strides_[0];
  p.stride_head = strides_[1];
  p.stride_token = strides_[2];
  p.stride_dim = strides_[3];
  p.sm_scale = sm_scale_;
  p.max_seq_len_hint = max_effective_len_;
  p.cpu_threads = cpu_threads_;
  p.device = cache_config_.device;
  if (on_cuda()) {
    p.workspace = device_->workspace();
    p.workspace_size = device_->workspace_size();
  }
  return p;
}

// Plans the step's decode from the exact effective lengths (the internal
// form of fd_decode_plan_create, into a value: no allocation); every layer's
// step_layer then only runs it (the internal form of fd_decode_run).
void Engine::plan_step() {
  fd_decode_params p = decode_params(static_cast<uint32_t>(step_ids_.size()));
  if (step_multi()) p.max_q_len_hint = max_q_len_;
  const DecodeProblem problem = resolve_decode_params(&p, DecodeUse::plan);
  step_plan_ = plan_decode(problem, step_effective_lens_.data(), on_cuda());
}

void Engine::require_device(const void *p, const char *what) const {
  DeviceScratch::require_device_pointer(p, cache_config_.device.ordinal, what);
}

Engine::~Engine() {
  // Leave the cache without a dangling transaction.
  if (step_open_) (void)fd_tx_abort(cache_, step_tx_);
}

fd_cache_metrics Engine::cache_metrics() const {
  fd_cache_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  check(fd_cache_metrics_get(cache_, &m));
  return m;
}

void Engine::sync_cache_version() {
  check(fd_cache_state_version(cache_, &cache_version_));
}

void Engine::check_cache_version() const {
  if (!scheduler_managed_) return;
  uint64_t now = 0;
  check(fd_cache_state_version(cache_, &now));
  if (now != cache_version_) {
    fail(FD_ERR_INVALID_STATE,
         "the cache was changed outside the engine (cache state version %llu, the engine last "
         "saw %llu); a scheduler-managed engine refuses to continue",
         ull(now), ull(cache_version_));
  }
}

void Engine::require_no_step(const char *what) const {
  if (step_open_) {
    fail(FD_ERR_INVALID_STATE, "%s is not allowed while a step is open (transaction %llu)", what,
         ull(step_tx_.id));
  }
}

const EngineRequest *Engine::lookup(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

EngineRequest &Engine::find(uint64_t id, const char *what) {
  auto it = requests_.find(id);
  if (it == requests_.end()) fail(FD_ERR_NOT_FOUND, "%s: unknown request %llu", what, ull(id));
  return it->second;
}

void Engine::set_state(EngineRequest &r, uint64_t id, int32_t state) {
  if (r.scheduled) {
    // Only entering waiting or active from no list allocates (a map node),
    // and it happens before any change. Waiting -> active moves the node and
    // leaving a list frees it: those transitions cannot fail, which
    // apply_decision relies on.
    auto list_of = [&](int32_t st) -> std::map<uint64_t, uint64_t> * {
      if (st == FD_ENGINE_REQUEST_WAITING) return &waiting_by_order_;
      if (st == FD_ENGINE_REQUEST_ACTIVE) return &active_by_order_;
      return nullptr;
    };
    std::map<uint64_t, uint64_t> *from = list_of(r.state), *to = list_of(state);
    const uint64_t order = r.spec.submission_order;
    if (from != to) {
      if (from != nullptr && to != nullptr) {
        to->insert(from->extract(order));
      } else if (from != nullptr) {
        from->erase(order);
      } else {
        (*to)[order] = id;
      }
    }
  }
  if (r.state != FD_ENGINE_REQUEST_UNKNOWN) counts_[r.state] -= 1;
  r.state = state;
  counts_[state] += 1;
  bump();
}

int32_t Engine::request_state(uint64_t id) const {
  const EngineRequest *r = lookup(id);
  return r == nullptr ? FD_ENGINE_REQUEST_UNKNOWN : r->state;
}

int32_t Engine::seq_len_of(uint64_t id) const {
  int32_t len = 0;
  check(fd_cache_export(cache_, &id, 1, 0, nullptr, &len));
  return len;
}

// ---------------------------------------------------------------------------
// Unscheduled lifecycle

void Engine::add_request(uint64_t id) {
  require_no_step("add_request");
  if (scheduler_managed_) {
    fail(FD_ERR_INVALID_STATE,
         "add_request: the engine is scheduler-managed; use fd_engine_submit_request");
  }
  const EngineRequest *r = lookup(id);
  if (r != nullptr) {
    if (terminal(r->state)) {
      fail(FD_ERR_INVALID_STATE, "add_request: request %llu is %s", ull(id), state_name(r->state));
    }
    return;  // waiting or active: no-op
  }
  int32_t cache_state = FD_REQUEST_UNKNOWN;
  check(fd_cache_request_state(cache_, id, &cache_state));
  if (cache_state == FD_REQUEST_FINISHED || cache_state == FD_REQUEST_CANCELLED) {
    fail(FD_ERR_INVALID_STATE, "add_request: request %llu is %s in the cache", ull(id),
         cache_state == FD_REQUEST_FINISHED ? "finished" : "cancelled");
  }
  EngineRequest &created = requests_[id];
  has_unscheduled_ = true;
  set_state(created, id, FD_ENGINE_REQUEST_WAITING);
}

void Engine::admit(uint64_t id) {
  require_no_step("admit");
  if (scheduler_managed_) {
    fail(FD_ERR_INVALID_STATE,
         "admit: the engine is scheduler-managed; admission happens through "
         "fd_engine_apply_decision");
  }
  EngineRequest &r = find(id, "admit");
  if (r.state == FD_ENGINE_REQUEST_ACTIVE) return;
  if (r.state != FD_ENGINE_REQUEST_WAITING) {
    fail(FD_ERR_INVALID_STATE, "admit: request %llu is %s", ull(id), state_name(r.state));
  }
  check(fd_cache_add_request(cache_, id), "admit: ");
  sync_cache_version();
  set_state(r, id, FD_ENGINE_REQUEST_ACTIVE);
}

void Engine::finish(uint64_t id, bool cancelled) {
  const char *what = cancelled ? "cancel" : "finish";
  require_no_step(what);
  check_cache_version();
  EngineRequest &r = find(id, what);
  if (terminal(r.state)) {
    fail(FD_ERR_INVALID_STATE, "%s: request %llu is already %s", what, ull(id),
         state_name(r.state));
  }
  if (r.state == FD_ENGINE_REQUEST_ACTIVE) {
    check(cancelled ? fd_cache_cancel_request(cache_, id) : fd_cache_finish_request(cache_, id),
          cancelled ? "cancel: " : "finish: ");
    sync_cache_version();
    // The last decision counted this request's blocks: a new plan is needed.
    decision_unused_ = false;
    authorised_runnable_.clear();
  }
  set_state(r, id, cancelled ? FD_ENGINE_REQUEST_CANCELLED : FD_ENGINE_REQUEST_FINISHED);
}

// ---------------------------------------------------------------------------
// Steps

uint64_t Engine::check_token_counts(const uint64_t *ids, const uint32_t *token_counts,
                                    uint32_t count) {
  step_counts_.assign(count, 1);
  if (token_counts == nullptr) return count;
  require_aligned(token_counts, alignof(uint32_t), "token_counts");
  uint64_t tokens = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t k = token_counts[i];
    if (k == 0) {
      fail(FD_ERR_INVALID_ARGUMENT,
           "token_counts[%u] is 0: each row of a step appends at least one token", i);
    }
    if (scheduler_managed_) {
      // A scheduled request never grows past its commitment.
      const EngineRequest &r = requests_.at(ids[i]);
      const uint64_t total = uint64_t{r.spec.initial_context_tokens} + r.spec.max_new_tokens;
      if (static_cast<uint64_t>(r.seq_len) + k > total) {
        fail(FD_ERR_INVALID_ARGUMENT,
             "token_counts[%u] = %u would take request %llu from %d to more than its %llu "
             "tokens (initial_context_tokens + max_new_tokens)",
             i, k, ull(ids[i]), r.seq_len, ull(total));
      }
    }
    step_counts_[i] = k;
    tokens += k;
  }
  if (tokens > static_cast<uint64_t>(INT32_MAX)) {
    fail(FD_ERR_INVALID_ARGUMENT, "token_counts add up to %llu tokens, more than %d", ull(tokens),
         INT32_MAX);
  }
  return tokens;
}

fd_engine_step Engine::begin_step(const uint64_t *ids, const uint32_t *token_counts,
                                  uint32_t count) {
  require_no_step("begin_step");
  require_non_null(ids, "request_ids");
  require_aligned(ids, alignof(uint64_t), "request_ids");
  if (count == 0) fail(FD_ERR_INVALID_ARGUMENT, "count must be > 0");
  check_cache_version();
  // Duplicates: each record is marked with this list's number (one lookup
  // per id, no hash set). A repeated id was found at its first occurrence,
  // so the errors come in the same order as with a set.
  const uint64_t mark = ++id_check_mark_;
  for (uint32_t i = 0; i < count; ++i) {
    auto it = requests_.find(ids[i]);
    if (it == requests_.end())
      fail(FD_ERR_NOT_FOUND, "begin_step: unknown request %llu", ull(ids[i]));
    EngineRequest *r = &it->second;
    if (r->id_check_mark == mark) {
      fail(FD_ERR_INVALID_ARGUMENT, "request %llu appears twice in request_ids", ull(ids[i]));
    }
    r->id_check_mark = mark;
    if (r->state != FD_ENGINE_REQUEST_ACTIVE) {
      fail(FD_ERR_INVALID_STATE, "begin_step: request %llu is %s, not active", ull(ids[i]),
           state_name(r->state));
    }
  }
  if (scheduler_managed_) {
    if (!decision_unused_) {
      fail(FD_ERR_INVALID_STATE,
           "begin_step: no applied decision authorises a step; plan and apply one first");
    }
    if (count != authorised_runnable_.size()) {
      fail(FD_ERR_INVALID_ARGUMENT,
           "begin_step: the step must use the %zu runnable ids of the last applied decision, "
           "got %u ids",
           authorised_runnable_.size(), count);
    }
    for (uint32_t i = 0; i < count; ++i) {
      if (ids[i] != authorised_runnable_[i]) {
        fail(FD_ERR_INVALID_ARGUMENT,
             "begin_step: row %u must be request %llu (runnable ids of the last applied "
             "decision, in order), got %llu",
             i, ull(authorised_runnable_[i]), ull(ids[i]));
      }
      const EngineRequest &r = requests_.at(ids[i]);
      if (static_cast<uint32_t>(r.seq_len) < r.spec.initial_context_tokens) {
        fail(FD_ERR_INVALID_STATE,
             "begin_step: request %llu holds %d of its %u context tokens; prefill it first",
             ull(ids[i]), r.seq_len, r.spec.initial_context_tokens);
      }
    }
  }
  const uint64_t tokens = check_token_counts(ids, token_counts, count);
  uint32_t needed = 0, free_blocks = 0;
  check(fd_cache_blocks_needed_multi(cache_, ids, token_counts, count, &needed, &free_blocks),
        "begin_step: ");
  const uint32_t max_count = *std::max_element(step_counts_.begin(), step_counts_.end());
  fd_engine_step out;
  std::memset(&out, 0, sizeof out);
  out.struct_size = sizeof out;
  out.batch = count;
  out.needed_blocks = needed;
  out.free_blocks = free_blocks;
  if (needed > free_blocks) {
    if (scheduler_managed_) {
      fail(FD_ERR_INVARIANT,
           "scheduler-managed step needs %u new blocks but only %u are free: the scheduler's "
           "lifetime commitment was broken",
           needed, free_blocks);
    }
    backpressure_ += 1;
    out.outcome = FD_STEP_BACKPRESSURE;
    return out;
  }
  // Scratch is sized before the transaction opens, so nothing can fail
  // between begin and the bookkeeping below (a failing call changes nothing,
  // not even the cache's begin/abort counters). A row's table grows by at
  // most the blocks its new tokens may need.
  const uint64_t growth =
      (uint64_t{max_count} + cache_config_.block_size - 1) / cache_config_.block_size + 1;
  uint32_t longest = 0;
  check(fd_cache_max_blocks_per_seq(cache_, ids, count, &longest), "begin_step: ");
  if (on_cuda()) {
    device_->reserve(count, tokens, uint64_t{count} * (uint64_t{longest} + growth));
  } else {
    q_rotated_.resize(static_cast<size_t>(tokens) * num_q_heads_ * cache_config_.head_dim *
                      element_size());
    step_tables_.reserve(size_t{count} * static_cast<size_t>(longest + growth));
  }
  check(fd_cache_get_kv_scales(cache_, layer_k_scales_.data(), layer_v_scales_.data()),
        "begin_step: ");
  step_ids_.assign(ids, ids + count);
  step_effective_lens_.resize(count);
  step_indptr_.resize(size_t{count} + 1);
  step_indptr_[0] = 0;
  for (uint32_t i = 0; i < count; ++i) step_indptr_[i + 1] = step_indptr_[i] + step_counts_[i];
  max_q_len_ = static_cast<int32_t>(max_count);
  fd_tx tx{0, 0};
  check(step_multi() ? fd_tx_begin_multi(cache_, ids, step_counts_.data(), count, &tx)
                     : fd_tx_begin(cache_, ids, count, &tx),
        "begin_step: ");
  try {
    fd_tx_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    check(fd_tx_get_info(cache_, tx, &info));
    table_stride_ = info.max_blocks_per_seq;
    if (on_cuda()) {
      // The tables go to the device in the first step_layer, on its stream
      // (reserved above; this cannot allocate).
      device_->reserve(count, tokens, uint64_t{count} * table_stride_);
    } else {
      step_tables_.resize(size_t{count} * table_stride_);
      check(fd_tx_block_tables(cache_, tx, table_stride_, step_tables_.data()));
    }
    check(fd_tx_get_rows(cache_, tx, count, nullptr, nullptr, nullptr, nullptr,
                         step_effective_lens_.data()));
    max_effective_len_ =
        *std::max_element(step_effective_lens_.begin(), step_effective_lens_.end());
    plan_step();
  } catch (...) {
    (void)fd_tx_abort(cache_, tx);
    // begin and abort moved the cache's version: a scheduler-managed engine
    // would otherwise take its own abort for an outside change.
    sync_cache_version();
    throw;
  }
  step_open_ = true;
  step_tx_ = tx;
  next_layer_ = 0;
  decision_unused_ = false;  // one decision authorises one step
  sync_cache_version();
  bump();
  out.outcome = FD_STEP_OPENED;
  out.tx = tx;
  return out;
}

void Engine::require_open_step(fd_tx tx, const char *what) const {
  if (!step_open_) fail(FD_ERR_INVALID_STATE, "%s: no step is open", what);
  if (tx.id != step_tx_.id || tx.cache_version != step_tx_.cache_version) {
    fail(FD_ERR_STALE_HANDLE,
         "%s: transaction %llu (version %llu) is not the open step (transaction %llu, version "
         "%llu)",
         what, ull(tx.id), ull(tx.cache_version), ull(step_tx_.id), ull(step_tx_.cache_version));
  }
}

void Engine::close_step() {
  step_open_ = false;
  next_layer_ = 0;
  sync_cache_version();
  bump();
}

void Engine::abort_and_rethrow(const char *during) {
  // Any failure inside a layer aborts the whole token (S8).
  (void)fd_tx_abort(cache_, step_tx_);
  step_aborts_ += 1;
  close_step();
  try {
    throw;
  } catch (const Error &e) {
    throw Error(e.status(), format("%s failed, step aborted: %s", during, e.what()));
  }
}

void Engine::step_layer(fd_tx tx, uint32_t layer, const void *q, const void *k, const void *v,
                        void *out, fd_stream stream) {
  require_open_step(tx, "step_layer");
  try {
    if (layer != next_layer_) {
      fail(FD_ERR_INVALID_ARGUMENT, "step requires layer %u, got layer %u", next_layer_, layer);
    }
    require_non_null(q, "q");
    require_non_null(k, "k");
    require_non_null(v, "v");
    require_non_null(out, "out_attention");
    require_aligned(q, element_size(), "q");
    require_aligned(k, element_size(), "k");
    require_aligned(v, element_size(), "v");
    require_aligned(out, element_size(), "out_attention");
    void *q_rot = q_rotated_.data();
    const int32_t *tables = step_tables_.data();
    const int32_t *lens = step_effective_lens_.data();
    const int32_t *indptr = step_indptr_.data();
    if (on_cuda()) {
      require_device(q, "q");
      require_device(k, "k");
      require_device(v, "v");
      require_device(out, "out_attention");
      if (layer == 0) {
        check(fd_tx_block_tables_async(cache_, tx, table_stride_, device_->tables(),
                                       device_->lens(), stream));
        if (step_multi()) check(fd_tx_token_indptr_async(cache_, tx, device_->indptr(), stream));
      }
      q_rot = device_->q_rotated();
      tables = device_->tables();
      lens = device_->lens();
      indptr = device_->indptr();
    }
    check(fd_tx_write_layer_rope(cache_, tx, layer, q, num_q_heads_, k, v, rotary_dim_, rope_base_,
                                 q_rot, stream));
    fd_decode_params p = decode_params(static_cast<uint32_t>(step_ids_.size()));
    p.q = q_rot;
    p.k_cache = layer_k_[layer];
    p.v_cache = layer_v_[layer];
    p.block_tables = tables;
    p.seq_lens = lens;
    p.out = out;
    p.stream = stream;
    p.k_scale = layer_k_scales_[layer];
    p.v_scale = layer_v_scales_[layer];
    if (step_multi()) {
      p.q_indptr = indptr;
      p.max_q_len_hint = max_q_len_;
    }
    run_decode(step_plan_, resolve_decode_params(&p));
  } catch (...) {
    abort_and_rethrow(format("step_layer(layer %u)", layer).c_str());
  }
  next_layer_ += 1;
  layer_steps_ += 1;
  sync_cache_version();
}

void Engine::commit_step(fd_tx tx, const uint32_t *keep_counts, uint32_t count) {
  require_open_step(tx, "commit_step");
  if (next_layer_ != cache_config_.num_layers) {
    fail(FD_ERR_INVALID_STATE, "commit_step: the step has run %u of %u layers", next_layer_,
         cache_config_.num_layers);
  }
  if (keep_counts != nullptr && count != step_ids_.size()) {
    fail(FD_ERR_INVALID_ARGUMENT, "commit_step: count %u must equal the step's %zu rows", count,
         step_ids_.size());
  }
  // The cache checks keep_counts[i] <= token_counts[i] and changes nothing
  // when it refuses; the step then stays open.
  check(keep_counts == nullptr ? fd_tx_commit(cache_, tx)
                               : fd_tx_commit_keep(cache_, tx, keep_counts, count),
        "commit_step: ");
  completed_steps_ += 1;
  for (size_t i = 0; i < step_ids_.size(); ++i)
    appended_tokens_ += keep_counts == nullptr ? step_counts_[i] : keep_counts[i];
  close_step();
  if (!scheduler_managed_) return;
  // A scheduled request that generated its last token is done: its
  // commitment ends here.
  for (size_t i = 0; i < step_ids_.size(); ++i) {
    const uint64_t id = step_ids_[i];
    EngineRequest &r = requests_.at(id);
    r.seq_len += static_cast<int32_t>(keep_counts == nullptr ? step_counts_[i] : keep_counts[i]);
    const uint64_t total = uint64_t{r.spec.initial_context_tokens} + r.spec.max_new_tokens;
    if (static_cast<uint64_t>(r.seq_len) >= total) {
      check(fd_cache_finish_request(cache_, id), "commit_step: finishing a complete request: ");
      set_state(r, id, FD_ENGINE_REQUEST_FINISHED);
    }
  }
  sync_cache_version();
}

void Engine::abort_step(fd_tx tx) {
  require_open_step(tx, "abort_step");
  check(fd_tx_abort(cache_, tx), "abort_step: ");
  step_aborts_ += 1;
  close_step();
}

void Engine::prefill(uint64_t id, uint32_t num_tokens, const void *k, const void *v,
                     const char *what) {
  require_no_step(what);
  require_non_null(k, "k");
  require_non_null(v, "v");
  require_aligned(k, element_size(), "k");
  require_aligned(v, element_size(), "v");
  if (num_tokens == 0) fail(FD_ERR_INVALID_ARGUMENT, "num_tokens must be > 0");
  check_cache_version();
  EngineRequest &r = find(id, what);
  if (r.state != FD_ENGINE_REQUEST_ACTIVE) {
    fail(FD_ERR_INVALID_STATE, "%s: request %llu is %s, not active", what, ull(id),
         state_name(r.state));
  }
  if (r.scheduled &&
      static_cast<uint64_t>(r.seq_len) + num_tokens > r.spec.initial_context_tokens) {
    if (static_cast<uint32_t>(r.seq_len) >= r.spec.initial_context_tokens) {
      fail(FD_ERR_INVALID_STATE, "%s: request %llu already holds its %u context tokens", what,
           ull(id), r.spec.initial_context_tokens);
    }
    fail(FD_ERR_INVALID_ARGUMENT,
         "%s: num_tokens %u would take request %llu from %d past its %u context tokens", what,
         num_tokens, ull(id), r.seq_len, r.spec.initial_context_tokens);
  }
  const std::string prefix = std::string(what) + ": ";
  // K is rotated at each token's position, as in step_layer, by the cache's
  // RoPE append (so it is rounded once, to the cache's type; an FP8 cache
  // quantises the FP32 rotation); the Q it also rotates is a zeroed dummy of
  // num_kv_heads heads per token, rotated in place and unused: host memory
  // for CPU caches (allocated here, before anything changes), the engine's
  // device scratch for CUDA caches.
  void *dummy_q = nullptr;
  if (on_cuda()) {
    require_device(k, "k");
    require_device(v, "v");
  } else {
    const int32_t first = r.scheduled ? r.seq_len : seq_len_of(id);
    if (static_cast<int64_t>(first) + num_tokens > INT32_MAX) {
      fail(FD_ERR_INVALID_ARGUMENT, "%s: request %llu cannot grow by %u tokens past %d", what,
           ull(id), num_tokens, first);
    }
    prefill_q_.assign(
        size_t{num_tokens} * cache_config_.num_kv_heads * cache_config_.head_dim * element_size(),
        0);
    dummy_q = prefill_q_.data();
  }
  // One transaction for the whole chunk: all of it is published, or none.
  fd_tx tx{0, 0};
  check(fd_tx_begin_multi(cache_, &id, &num_tokens, 1, &tx), prefix.c_str());
  try {
    if (on_cuda()) dummy_q = device_->prefill_q(num_tokens);
    // K and V are [num_layers, num_tokens, num_kv_heads, head_dim].
    const size_t layer_bytes =
        size_t{num_tokens} * cache_config_.num_kv_heads * cache_config_.head_dim * element_size();
    for (uint32_t l = 0; l < cache_config_.num_layers; ++l) {
      check(fd_tx_write_layer_rope(cache_, tx, l, dummy_q, cache_config_.num_kv_heads,
                                   static_cast<const unsigned char *>(k) + l * layer_bytes,
                                   static_cast<const unsigned char *>(v) + l * layer_bytes,
                                   rotary_dim_, rope_base_, dummy_q, nullptr));
    }
    // Prefill is off the step path: on CUDA, finishing here lets later steps
    // on any stream read the tokens and the caller reuse k and v at once.
    if (on_cuda()) DeviceScratch::synchronize_default_stream(cache_config_.device.ordinal);
    check(fd_tx_commit(cache_, tx));
  } catch (...) {
    (void)fd_tx_abort(cache_, tx);
    sync_cache_version();
    throw;
  }
  if (r.scheduled) r.seq_len += static_cast<int32_t>(num_tokens);
  prefill_tokens_ += num_tokens;
  sync_cache_version();
  bump();
}

// ---------------------------------------------------------------------------
// Metrics and validation

fd_engine_metrics Engine::metrics() const {
  fd_engine_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  m.scheduler_managed = scheduler_managed_ ? 1u : 0u;
  m.waiting_request_count = counts_[FD_ENGINE_REQUEST_WAITING];
  m.active_request_count = counts_[FD_ENGINE_REQUEST_ACTIVE];
  m.finished_request_count = counts_[FD_ENGINE_REQUEST_FINISHED];
  m.cancelled_request_count = counts_[FD_ENGINE_REQUEST_CANCELLED];
  m.rejected_request_count = counts_[FD_ENGINE_REQUEST_REJECTED];
  m.completed_step_count = completed_steps_;
  m.appended_token_count = appended_tokens_;
  m.prefill_token_count = prefill_tokens_;
  m.backpressure_count = backpressure_;
  m.state_version = state_version_;
  m.cache_state_version = cache_version_;
  if (scheduler_managed_) {
    const fd_cache_metrics cm = cache_metrics();
    uint64_t committed = cm.resident_prefix_blocks;
    for (const auto &entry : active_by_order_) {
      committed += private_commitment(requests_.at(entry.second).spec, cache_config_.block_size);
    }
    m.committed_blocks = committed;
    m.committed_but_unallocated_blocks =
        committed > cm.used_blocks ? committed - cm.used_blocks : 0;
  }
  m.stale_decision_count = stale_decisions_;
  m.applied_decision_count = applied_decisions_;
  m.open_step_transaction_count = step_open_ ? 1u : 0u;
  m.transaction_layer_step_count = layer_steps_;
  m.transaction_abort_count = step_aborts_;
  return m;
}

void Engine::validate() const {
  check(fd_cache_validate(cache_), "cache: ");
  const fd_cache_metrics cm = cache_metrics();
  if ((cm.open_transaction_count != 0) != step_open_) {
    fail(FD_ERR_INVARIANT, "engine step open = %d but the cache has %llu open transactions",
         step_open_ ? 1 : 0, ull(cm.open_transaction_count));
  }
  uint64_t counted[6] = {0, 0, 0, 0, 0, 0};
  for (const auto &entry : requests_) {
    const uint64_t id = entry.first;
    const EngineRequest &r = entry.second;
    counted[r.state] += 1;
    int32_t cs = FD_REQUEST_UNKNOWN;
    check(fd_cache_request_state(cache_, id, &cs));
    int32_t want = FD_REQUEST_UNKNOWN;
    if (r.state == FD_ENGINE_REQUEST_ACTIVE) want = FD_REQUEST_ACTIVE;
    if (r.state == FD_ENGINE_REQUEST_FINISHED) want = FD_REQUEST_FINISHED;
    if (r.state == FD_ENGINE_REQUEST_CANCELLED) want = FD_REQUEST_CANCELLED;
    // A request cancelled or finished while waiting never reached the cache.
    const bool never_admitted = cs == FD_REQUEST_UNKNOWN && terminal(r.state);
    if (cs != want && !never_admitted) {
      fail(FD_ERR_INVARIANT, "request %llu is %s in the engine but has cache state %d", ull(id),
           state_name(r.state), cs);
    }
    if (r.scheduled && r.state == FD_ENGINE_REQUEST_ACTIVE) {
      const int32_t len = seq_len_of(id);
      if (len != r.seq_len) {
        fail(FD_ERR_INVARIANT, "request %llu: engine seq_len %d, cache seq_len %d", ull(id),
             r.seq_len, len);
      }
      const uint64_t total = uint64_t{r.spec.initial_context_tokens} + r.spec.max_new_tokens;
      if (static_cast<uint64_t>(len) >= total) {
        fail(FD_ERR_INVARIANT, "request %llu is active with seq_len %d >= its lifetime %llu",
             ull(id), len, ull(total));
      }
    }
  }
  for (int s = 1; s < 6; ++s) {
    if (counted[s] != counts_[s]) {
      fail(FD_ERR_INVARIANT, "%s count %llu differs from the %llu requests in that state",
           state_name(s), ull(counts_[s]), ull(counted[s]));
    }
  }
  if (scheduler_managed_) {
    if (cm.active_request_count != counts_[FD_ENGINE_REQUEST_ACTIVE]) {
      fail(FD_ERR_INVARIANT, "cache has %llu active requests, engine %llu",
           ull(cm.active_request_count), ull(counts_[FD_ENGINE_REQUEST_ACTIVE]));
    }
    const fd_engine_metrics m = metrics();
    if (m.committed_blocks < cm.used_blocks) {
      fail(FD_ERR_INVARIANT, "blocks in use %llu exceed the committed blocks %llu",
           ull(cm.used_blocks), ull(m.committed_blocks));
    }
  }
}

}  // namespace fd
