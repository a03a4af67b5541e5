// Scheduler-managed mode of the engine: submission, prefixes, authoritative
// snapshots and decision application (docs/semantics.md S8, S9).
#include <cstring>

#include "cache/cache_handle.hpp"
#include "core/arg_checks.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"

namespace fd {

namespace {
using ull = unsigned long long;

void check(fd_status status, const char *prefix = nullptr) {
  if (status == FD_OK) return;
  std::string msg = fd_last_error_message();
  if (prefix != nullptr) msg = std::string(prefix) + msg;
  throw Error(status, msg);
}

// Takes the first `count` admissions of a failed apply back out of the cache
// and stores the cache's new state version in *version. Returns false when a
// request was not as an admission leaves it (an invariant violation).
bool discard_admissions(fd_cache *handle, const uint64_t *ids, uint32_t count,
                        uint64_t *version) noexcept {
  // The public API has no call that takes a request back out of the cache
  // (finish and cancel leave a permanent terminal record, which would make
  // the decision impossible to apply again), so this one step goes below
  // it, to the cache behind the handle. Nothing here allocates or throws:
  // records are erased in reverse order of admission, and the version is
  // read straight from the cache (a public call would clear the caller's
  // last error message).
  PagedCache &cache = handle->cache;
  bool all = true;
  for (uint32_t i = count; i-- > 0;) all = cache.discard_new_request(ids[i]) && all;
  *version = cache.state_version();
  return all;
}
}  // namespace

uint64_t Engine::prefix_blocks_of(const std::string &prefix_id) const {
  auto it = prefixes_.find(prefix_id);
  return it == prefixes_.end() ? 0 : it->second.num_blocks;
}

void Engine::submit(const fd_request_spec *in) {
  require_no_step("submit_request");
  // Filled below with prefix_blocks from the registered prefix, before the
  // spec checks.
  fd_request_spec filled = read_request_spec(in);
  if (!scheduler_managed_) {
    if (has_unscheduled_) {
      fail(FD_ERR_INVALID_STATE,
           "submit_request: the engine already holds unscheduled requests; the two modes "
           "cannot be mixed");
    }
    const fd_cache_metrics cm = cache_metrics();
    if (cm.active_request_count != 0 || cm.open_transaction_count != 0) {
      fail(FD_ERR_INVALID_STATE,
           "submit_request: scheduler-managed mode needs an empty cache (%llu active requests, "
           "%llu open transactions)",
           ull(cm.active_request_count), ull(cm.open_transaction_count));
    }
  }
  check_cache_version();
  if (filled.prefix_id != nullptr && filled.prefix_id[0] != '\0') {
    auto it = prefixes_.find(filled.prefix_id);
    if (it == prefixes_.end()) {
      fail(FD_ERR_NOT_FOUND,
           "submit_request: request %llu names prefix '%s', which was not registered through "
           "this engine",
           ull(filled.id), filled.prefix_id);
    }
    if (filled.prefix_blocks == 0) filled.prefix_blocks = it->second.num_blocks;
    if (filled.prefix_blocks != it->second.num_blocks) {
      fail(FD_ERR_INVALID_ARGUMENT,
           "submit_request: request %llu gives prefix_blocks %u but prefix '%s' has %u blocks",
           ull(filled.id), filled.prefix_blocks, filled.prefix_id, it->second.num_blocks);
    }
  }
  const RequestSpec spec = spec_from_public(&filled, cache_config_.block_size);
  if (requests_.count(spec.id) != 0) {
    fail(FD_ERR_ALREADY_EXISTS, "submit_request: request %llu already exists (%s)", ull(spec.id),
         request_state(spec.id) == FD_ENGINE_REQUEST_WAITING ? "waiting" : "known");
  }
  int32_t cache_state = FD_REQUEST_UNKNOWN;
  check(fd_cache_request_state(cache_, spec.id, &cache_state));
  if (cache_state != FD_REQUEST_UNKNOWN) {
    fail(FD_ERR_ALREADY_EXISTS, "submit_request: request id %llu was already used in the cache",
         ull(spec.id));
  }
  if (used_orders_.count(spec.submission_order) != 0) {
    fail(FD_ERR_ALREADY_EXISTS, "submit_request: submission_order %llu is already used",
         ull(spec.submission_order));
  }
  // Both insertions may throw bad_alloc: undo the first if the second does.
  EngineRequest &r = requests_[spec.id];
  try {
    used_orders_.insert(spec.submission_order);
  } catch (...) {
    requests_.erase(spec.id);
    throw;
  }
  r.scheduled = true;
  r.spec = spec;
  scheduler_managed_ = true;
  set_state(r, spec.id, FD_ENGINE_REQUEST_WAITING);
}

void Engine::prune_evicted_prefixes() {
  // Registration may evict unreferenced prefixes (LRU) inside the cache.
  for (auto it = prefixes_.begin(); it != prefixes_.end();) {
    fd_prefix_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    const fd_status s = fd_prefix_get_info(cache_, it->first.c_str(), &info);
    if (s == FD_ERR_NOT_FOUND) {
      it = prefixes_.erase(it);
    } else {
      check(s);
      ++it;
    }
  }
}

void Engine::register_prefix(const char *prefix_id, const void *k, const void *v, uint32_t n,
                             fd_stream stream) {
  require_no_step("register_prefix");
  if (scheduler_managed_) {
    fail(FD_ERR_INVALID_STATE,
         "register_prefix: prefixes must be registered before the first submission");
  }
  require_non_null(prefix_id, "prefix_id");
  // The engine's record is made first, so that nothing can fail once the
  // cache holds the prefix (and dropped again if the cache refuses it).
  const auto slot = prefixes_.try_emplace(prefix_id);
  const fd_status s = fd_prefix_register(cache_, prefix_id, k, v, n, stream);
  if (s != FD_OK && slot.second) prefixes_.erase(slot.first);
  check(s, "register_prefix: ");
  sync_cache_version();
  slot.first->second.num_blocks = n;
  prune_evicted_prefixes();
  bump();
}

void Engine::evict_prefix(const char *prefix_id) {
  require_no_step("evict_prefix");
  require_non_null(prefix_id, "prefix_id");
  const std::string key = prefix_id;  // allocated before the cache changes
  check_cache_version();
  const uint64_t busy = counts_[FD_ENGINE_REQUEST_WAITING] + counts_[FD_ENGINE_REQUEST_ACTIVE];
  if (busy != 0) {
    fail(FD_ERR_INVALID_STATE,
         "evict_prefix: %llu requests are waiting or active; evict prefixes only when none are",
         ull(busy));
  }
  check(fd_prefix_evict(cache_, prefix_id), "evict_prefix: ");
  sync_cache_version();
  prefixes_.erase(key);
  bump();
}

std::shared_ptr<Snapshot> Engine::build_snapshot(
    uint64_t step, const std::unordered_map<uint64_t, FairnessCounters> &fairness) const {
  const fd_cache_metrics cm = cache_metrics();
  auto snap = std::make_shared<Snapshot>();
  snap->block_size = cache_config_.block_size;
  snap->max_blocks = static_cast<uint32_t>(cm.max_blocks);
  snap->free_blocks = static_cast<uint32_t>(cm.free_blocks);
  snap->resident_prefix_blocks = static_cast<uint32_t>(cm.resident_prefix_blocks);
  snap->step = step;
  snap->version = state_version_;
  snap->waiting.reserve(waiting_by_order_.size());
  snap->active.reserve(active_by_order_.size());
  auto counters = [&](uint64_t id) {
    auto it = fairness.find(id);
    return it == fairness.end() ? FairnessCounters{} : it->second;
  };
  const uint32_t bs = cache_config_.block_size;
  for (const auto &entry : waiting_by_order_) {
    const EngineRequest &r = requests_.at(entry.second);
    const FairnessCounters c = counters(entry.second);
    snap->add_waiting(r.spec, c.wait_steps, c.skip_count);
  }
  for (const auto &entry : active_by_order_) {
    const EngineRequest &r = requests_.at(entry.second);
    const uint32_t physical = ceil_div(static_cast<uint64_t>(r.seq_len), bs);
    snap->add_active(r.spec, r.seq_len, physical, r.spec.prefix_blocks,
                     private_commitment(r.spec, bs), counters(entry.second).service_wait_steps);
  }
  return snap;
}

std::shared_ptr<Snapshot> Engine::snapshot(uint64_t step, const fd_request_fairness *fairness,
                                           uint32_t count) const {
  if (!scheduler_managed_) {
    fail(FD_ERR_INVALID_STATE,
         "snapshot: the engine is not scheduler-managed (submit a request first)");
  }
  require_no_step("snapshot");
  check_cache_version();
  if (count != 0) require_non_null(fairness, "fairness");
  require_aligned(fairness, alignof(fd_request_fairness), "fairness");
  std::unordered_map<uint64_t, FairnessCounters> map;
  map.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const fd_request_fairness &f = fairness[i];
    if (f.reserved0 != 0) fail(FD_ERR_INVALID_ARGUMENT, "fairness[%u].reserved0 must be 0", i);
    const EngineRequest *r = lookup(f.id);
    if (r == nullptr) {
      fail(FD_ERR_NOT_FOUND, "fairness[%u] names request %llu, unknown to the engine", i,
           ull(f.id));
    }
    if (!map.emplace(f.id, FairnessCounters{f.wait_steps, f.skip_count, f.service_wait_steps})
             .second) {
      fail(FD_ERR_INVALID_ARGUMENT, "fairness lists request %llu twice", ull(f.id));
    }
  }
  return build_snapshot(step, map);
}

void Engine::apply(const SchedulerConfig &config, const Decision &decision) {
  // Every refusal counts as a stale decision and changes nothing else (the
  // header: "any refusal"): the engine's state forbids applying any decision
  // (FD_ERR_INVALID_STATE: not scheduler-managed, a step is open, the cache
  // was changed behind the engine) ...
  try {
    if (!scheduler_managed_) {
      fail(FD_ERR_INVALID_STATE, "apply_decision: the engine is not scheduler-managed");
    }
    require_no_step("apply_decision");
    check_cache_version();
  } catch (const Error &e) {
    if (e.status() == FD_ERR_INVALID_STATE) stale_decisions_ += 1;
    throw;
  }
  const Snapshot &given = *decision.snapshot;
  // ... or this decision does not match the engine (FD_ERR_STALE_HANDLE).
  auto refuse = [&](const std::string &why) {
    stale_decisions_ += 1;
    throw Error(FD_ERR_STALE_HANDLE, "apply_decision refused: " + why);
  };
  if (given.version != state_version_) {
    refuse(
        format("the decision was planned from engine state version %llu; the engine is at "
               "%llu",
               ull(given.version), ull(state_version_)));
  }
  // The authoritative snapshot, with the caller's fairness counters.
  std::unordered_map<uint64_t, FairnessCounters> fairness;
  fairness.reserve(given.waiting.size() + given.active.size());
  for (const WaitingEntry &w : given.waiting) {
    fairness[w.spec.id] = FairnessCounters{w.wait_steps, w.skip_count, 0};
  }
  for (const ActiveEntry &a : given.active) {
    fairness[a.spec.id] = FairnessCounters{0, 0, a.service_wait_steps};
  }
  std::shared_ptr<Snapshot> truth = build_snapshot(given.step, fairness);
  const std::string snap_diff = snapshot_difference(given, *truth);
  if (!snap_diff.empty()) refuse("its snapshot differs from the engine's: " + snap_diff);
  if (!(config == decision.config)) {
    refuse("the scheduler's configuration differs from the one the decision was planned with");
  }
  Decision replanned;
  try {
    replanned = plan(config, truth);
  } catch (const Error &e) {
    refuse(std::string("re-planning failed: ") + e.what());
  }
  const std::string plan_diff = decision_outcome_difference(decision, replanned);
  if (!plan_diff.empty()) refuse("it differs from the re-planned decision: " + plan_diff);

  // Validated. All or nothing: first everything that can fail, which
  // touches only the cache (each admitted request is added, and attached to
  // its prefix); then the engine's own changes, none of which can fail. A
  // failing cache call takes back the admissions made so far, so the call
  // fails having changed nothing (the cache's state version moves on; the
  // engine re-reads it).
  std::vector<uint64_t> runnable = decision.runnable;  // copied before any change
  const uint32_t num_admit = static_cast<uint32_t>(decision.admit.size());
  for (uint32_t i = 0; i < num_admit; ++i) {
    const uint64_t id = decision.admit[i];
    const EngineRequest &r = requests_.at(id);
    const char *call = "fd_cache_add_request";
    uint32_t added = i;  // admissions whose cache request exists
    fd_status s = fd_cache_add_request(cache_, id);
    if (s == FD_OK && !r.spec.prefix_id.empty()) {
      added = i + 1;
      call = "fd_prefix_attach";
      s = fd_prefix_attach(cache_, id, r.spec.prefix_id.c_str());
    }
    if (s == FD_OK) continue;
    const bool undone = discard_admissions(cache_, decision.admit.data(), added, &cache_version_);
    // The undo touched no public call, so the cache's message is still there.
    // From here on only building the message can fail (out of host memory),
    // and the state is already back.
    const std::string cause = fd_last_error_message();
    // Out of host memory is the one failure the validation above cannot rule
    // out; anything else contradicts it.
    const fd_status status = (s == FD_ERR_OUT_OF_MEMORY && undone) ? s : FD_ERR_INVARIANT;
    throw Error(status, format("apply_decision: admission %u of %u (request %llu) failed in %s: "
                               "%s; %s",
                               i + 1, num_admit, ull(id), call, cause.c_str(),
                               undone ? "the decision was not applied (nothing changed)"
                                      : "the decision was not applied, and taking back the "
                                        "admissions made before it failed did not succeed "
                                        "(the cache and the engine may now disagree)"));
  }
  sync_cache_version();  // fails only for NULL arguments

  // The engine's changes. set_state cannot fail here: a rejected request
  // leaves the waiting list and an admitted one moves its node from the
  // waiting list to the active one (no allocation).
  for (uint64_t id : decision.rejected) {
    set_state(requests_.at(id), id, FD_ENGINE_REQUEST_REJECTED);
  }
  for (uint64_t id : decision.admit) {
    EngineRequest &r = requests_.at(id);
    r.seq_len = r.spec.prefix_id.empty()
                    ? 0
                    : static_cast<int32_t>(r.spec.prefix_blocks * cache_config_.block_size);
    set_state(r, id, FD_ENGINE_REQUEST_ACTIVE);
  }
  authorised_runnable_.swap(runnable);
  decision_unused_ = true;
  applied_decisions_ += 1;
  bump();
}

}  // namespace fd
