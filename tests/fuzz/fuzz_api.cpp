/* libFuzzer target over the public C API (issue 11, "Tools in the project").
 *
 * The input is read as a sequence of operations; every choice an operation
 * makes (which call, which ids, which layer, which bad argument) is one input
 * byte. The first byte picks one of two drivers:
 *
 *   even: the cache model driver of tests/test_cache_model.cpp
 *     (tests/model/cache_driver.hpp): a small cache with a configuration read
 *     from the input, requests, multi-layer transactions (commit, abort,
 *     wrong layers, stale/finished/unknown handles), legacy appends, shared
 *     prefixes (register, attach, evict, LRU eviction), exports and queries,
 *     plus calls outside the contract (NULL handles and out-pointers,
 *     too-small outputs and structs, huge block counts and layers, misaligned
 *     arrays once issue 11's fix is in). After every operation every result,
 *     the metrics, the exported tables, the prefixes and the open
 *     transaction's view are compared with the model in cache_model.hpp, and
 *     fd_cache_validate must pass; every 97 operations and at the end the
 *     whole K/V storage is compared with a shadow copy.
 *
 *   odd: an engine on a small cache, unscheduled or scheduler-managed:
 *     add/admit/finish/cancel, submissions, prefixes, steps (layers in and out
 *     of order, NULL data, stale handles, commit, abort), prefill, snapshot +
 *     plan + apply (fresh, stale and foreign-config decisions). The engine
 *     has no executable model; the target checks what the spec states:
 *     fd_engine_validate and fd_cache_validate after every call; a failing
 *     call changes no metric, state or version (S8, docs/abi.md rule 9) except the
 *     counters the header names; a valid step opens (or reports backpressure
 *     exactly when blocks_needed > free) and every row's seq_len grows by one
 *     on commit and stays on abort; the engine's counters equal the counts of
 *     the calls that moved them; request-state counts match the states; a
 *     fresh decision on an unchanged engine applies; a decision planned
 *     before a change is refused and counted; decisions keep the scheduler's
 *     guarantees (needed <= free, committed <= schedulable).
 *
 * Any disagreement prints what differed and aborts, so libFuzzer saves the
 * input. Deterministic: no clock, no global random state; one decode thread.
 * FD_FUZZ_TRACE=1 prints every operation (for a saved reproducer:
 *   FD_FUZZ_TRACE=1 build-fuzz/tests/fuzz/fuzz_api build-fuzz/artifacts/crash-...). */
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "flashdec.h"
#include "model/cache_driver.hpp"

namespace {

using fdmodel::dec;
using fdmodel::Rng;

/* Operations per input at most (inputs are capped by -max_len anyway). */
constexpr uint64_t kMaxOps = 4000;

bool trace_enabled() {
  static const bool on = [] {
    const char *s = std::getenv("FD_FUZZ_TRACE");
    return s != nullptr && *s != '\0' && *s != '0';
  }();
  return on;
}

[[noreturn]] void disagree(const std::string &what) {
  std::fprintf(stderr, "\nfuzz_api: MODEL DISAGREEMENT\n%s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/* ------------------------------------------------------------------------ */
/* Cache driver. */
void run_cache(Rng &rng) {
  fdmodel::Stats stats;
  fdmodel::Episode ep(0, 0, rng, stats, trace_enabled());
  ep.set_abuse(true);
  if (!ep.setup()) disagree(ep.failure());
  for (uint64_t i = 0; i < kMaxOps && !rng.exhausted(); ++i)
    if (!ep.run_op()) disagree(ep.failure());
  if (!ep.check_storage()) disagree(ep.failure());
}

/* ------------------------------------------------------------------------ */
/* Engine driver. */
class EngineRun {
 public:
  explicit EngineRun(Rng &rng) : rng_(rng), trace_(trace_enabled()) {}
  ~EngineRun() {
    fd_decision_destroy(last_decision_);
    fd_scheduler_destroy(sched_);
    fd_scheduler_destroy(other_sched_);
    fd_engine_destroy(engine_);
    fd_cache_destroy(cache_);
  }
  EngineRun(const EngineRun &) = delete;
  EngineRun &operator=(const EngineRun &) = delete;

  void setup() {
    fd_cache_config c;
    fd_cache_config_init(&c);
    c.num_layers = 1 + rng_.below32(3);
    c.num_kv_heads = 1 + rng_.below32(2);
    static const uint32_t kDims[] = {2, 4, 8};
    c.head_dim = kDims[rng_.below(3)];
    c.block_size = 1 + rng_.below32(4);
    c.max_blocks = 2 + rng_.below32(11);
    c.prefix_cache_capacity_blocks = rng_.chance(0.4) ? 0 : 1 + rng_.below32(c.max_blocks);
    static const int32_t kTypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
    c.dtype = kTypes[rng_.below(3)];
    c.layout = rng_.chance(0.5) ? FD_LAYOUT_TOKEN_MAJOR : FD_LAYOUT_DIM_MAJOR;
    cfg_ = c;
    desc_ = "fd_cache_create(layers " + dec(c.num_layers) + ", kv_heads " + dec(c.num_kv_heads) +
            ", head_dim " + dec(c.head_dim) + ", block_size " + dec(c.block_size) +
            ", max_blocks " + dec(c.max_blocks) + ", prefix_capacity " +
            dec(c.prefix_cache_capacity_blocks) + ", dtype " + std::to_string(c.dtype) + ")";
    if (fd_cache_create(&c, &cache_) != FD_OK) fail("create failed: " + last_error());
    fd_engine_config ec;
    fd_engine_config_init(&ec);
    ec.num_q_heads = c.num_kv_heads * (1 + rng_.below32(2));
    ec.cpu_threads = 1;
    hq_ = ec.num_q_heads;
    if (fd_engine_create(cache_, &ec, &engine_) != FD_OK)
      fail("fd_engine_create failed: " + last_error());
    scheduled_ = rng_.chance(0.6);
    if (scheduled_) {
      fd_scheduler_config sc;
      fd_scheduler_config_init(&sc);
      sc.max_active_requests = 1 + rng_.below32(4);
      sc.max_batch_requests = 1 + rng_.below32(sc.max_active_requests);
      sc.reserve_blocks = rng_.below32(2);
      reserve_ = sc.reserve_blocks;
      sc.aging_threshold_steps = 1 + rng_.below32(4);
      if (fd_scheduler_create(&sc, &sched_) != FD_OK) fail("fd_scheduler_create failed");
      sc.aging_threshold_steps += 1;  // an equal scheduler but for one field
      if (fd_scheduler_create(&sc, &other_sched_) != FD_OK) fail("fd_scheduler_create failed");
    }
    desc_ += scheduled_ ? " scheduled" : " unscheduled";
    if (trace_) std::printf("%s\n", desc_.c_str());
    read_state(now_);
    check();
  }

  /* One operation and the checks after it; false once the run should stop. */
  bool run_op() {
    read_state(before_);
    if (scheduled_ ? !op_scheduled() : !op_unscheduled()) return false;
    if (trace_) std::printf("  %s -> %s\n", desc_.c_str(), result_.c_str());
    read_state(now_);
    check();
    return true;
  }

 private:
  /* Everything observable that the checks compare. */
  struct State {
    fd_engine_metrics em;
    fd_cache_metrics cm;
    uint64_t cache_version;
    std::map<uint64_t, int32_t> states;    // every id used so far
    std::map<uint64_t, int32_t> seq_lens;  // cache seq_len of active ids
  };

  uint32_t L() const { return cfg_.num_layers; }
  size_t esize() const { return fdmodel::dtype_size(cfg_.dtype); }

  static std::string last_error() { return fd_last_error_message(); }

  [[noreturn]] void fail(const std::string &what) const {
    disagree("engine run: " + what + "\n  cache: " + desc_cfg() + "\n  call: " + desc_ +
             "\n  (rerun with FD_FUZZ_TRACE=1 for every operation)");
  }
  std::string desc_cfg() const {
    return "layers " + dec(cfg_.num_layers) + ", kv_heads " + dec(cfg_.num_kv_heads) +
           ", head_dim " + dec(cfg_.head_dim) + ", block_size " + dec(cfg_.block_size) +
           ", max_blocks " + dec(cfg_.max_blocks) + ", prefix_capacity " +
           dec(cfg_.prefix_cache_capacity_blocks) + ", dtype " + std::to_string(cfg_.dtype) +
           (scheduled_ ? ", scheduler-managed" : ", unscheduled");
  }

  void read_state(State &s) {
    std::memset(&s.em, 0, sizeof s.em);
    s.em.struct_size = sizeof s.em;
    if (fd_engine_metrics_get(engine_, &s.em) != FD_OK) fail("fd_engine_metrics_get failed");
    std::memset(&s.cm, 0, sizeof s.cm);
    s.cm.struct_size = sizeof s.cm;
    if (fd_cache_metrics_get(cache_, &s.cm) != FD_OK) fail("fd_cache_metrics_get failed");
    if (fd_cache_state_version(cache_, &s.cache_version) != FD_OK)
      fail("fd_cache_state_version failed");
    s.states.clear();
    s.seq_lens.clear();
    for (uint64_t id : used_) {
      int32_t st = -1;
      if (fd_engine_get_request_state(engine_, id, &st) != FD_OK)
        fail("fd_engine_get_request_state failed");
      s.states[id] = st;
      if (st == FD_ENGINE_REQUEST_ACTIVE) {
        int32_t len = -1;
        if (fd_cache_export(cache_, &id, 1, 0, nullptr, &len) != FD_OK)
          fail("fd_cache_export of active request " + dec(id) + ": " + last_error());
        s.seq_lens[id] = len;
      }
    }
  }

  /* Invariants after every operation. */
  void check() {
    fd_status s = fd_engine_validate(engine_);
    if (s != FD_OK) fail("fd_engine_validate: " + last_error());
    s = fd_cache_validate(cache_);
    if (s != FD_OK) fail("fd_cache_validate: " + last_error());
    const fd_engine_metrics &m = now_.em;
    uint64_t counts[6] = {};
    for (const auto &kv : now_.states)
      if (kv.second >= 0 && kv.second < 6) ++counts[kv.second];
    if (m.waiting_request_count != counts[FD_ENGINE_REQUEST_WAITING] ||
        m.active_request_count != counts[FD_ENGINE_REQUEST_ACTIVE] ||
        m.finished_request_count != counts[FD_ENGINE_REQUEST_FINISHED] ||
        m.cancelled_request_count != counts[FD_ENGINE_REQUEST_CANCELLED] ||
        m.rejected_request_count != counts[FD_ENGINE_REQUEST_REJECTED])
      fail("engine request counts (waiting/active/finished/cancelled/rejected) " +
           dec(m.waiting_request_count) + "/" + dec(m.active_request_count) + "/" +
           dec(m.finished_request_count) + "/" + dec(m.cancelled_request_count) + "/" +
           dec(m.rejected_request_count) + " differ from the request states " + dec(counts[1]) +
           "/" + dec(counts[2]) + "/" + dec(counts[3]) + "/" + dec(counts[4]) + "/" +
           dec(counts[5]));
    if (m.active_request_count != now_.cm.active_request_count)
      fail("engine active " + dec(m.active_request_count) + " != cache active " +
           dec(now_.cm.active_request_count));
    if (m.open_step_transaction_count != (step_open_ ? 1u : 0u) ||
        now_.cm.open_transaction_count != m.open_step_transaction_count)
      fail("open_step_transaction_count " + dec(m.open_step_transaction_count) +
           ", cache open_transaction_count " + dec(now_.cm.open_transaction_count) + ", expected " +
           dec(step_open_ ? 1 : 0));
    if (m.completed_step_count != steps_ || m.appended_token_count != appended_ ||
        m.transaction_layer_step_count != layer_steps_ ||
        m.transaction_abort_count != step_aborts_ || m.backpressure_count != backpressure_ ||
        m.applied_decision_count != applied_ || m.prefill_token_count != prefills_)
      fail(
          "engine counters (steps, appended, layer steps, aborts, backpressure, applied, "
          "prefill) = " +
          dec(m.completed_step_count) + ", " + dec(m.appended_token_count) + ", " +
          dec(m.transaction_layer_step_count) + ", " + dec(m.transaction_abort_count) + ", " +
          dec(m.backpressure_count) + ", " + dec(m.applied_decision_count) + ", " +
          dec(m.prefill_token_count) + "; expected " + dec(steps_) + ", " + dec(appended_) + ", " +
          dec(layer_steps_) + ", " + dec(step_aborts_) + ", " + dec(backpressure_) + ", " +
          dec(applied_) + ", " + dec(prefills_));
    if (m.stale_decision_count < stale_min_ || m.stale_decision_count > stale_max_)
      fail("stale_decision_count " + dec(m.stale_decision_count) + ", expected " +
           (stale_min_ == stale_max_ ? dec(stale_min_)
                                     : "in [" + dec(stale_min_) + ", " + dec(stale_max_) + "]"));
    stale_min_ = stale_max_ = m.stale_decision_count;
    if (m.scheduler_managed != (submitted_ ? 1u : 0u))
      fail("scheduler_managed " + dec(m.scheduler_managed));
    if (m.cache_state_version != now_.cache_version)
      fail("engine cache_state_version " + dec(m.cache_state_version) + " != cache version " +
           dec(now_.cache_version));
    if (m.state_version < before_.em.state_version) fail("engine state_version went back");
    if (submitted_) {
      const uint64_t held = now_.cm.used_blocks;
      if (m.committed_blocks < held ||
          m.committed_but_unallocated_blocks != m.committed_blocks - held)
        fail("committed_blocks " + dec(m.committed_blocks) + ", committed_but_unallocated " +
             dec(m.committed_but_unallocated_blocks) + ", used blocks " + dec(held));
      if (m.committed_blocks > cfg_.max_blocks)
        fail("committed_blocks " + dec(m.committed_blocks) + " > max_blocks");
    }
  }

  /* A failing call changes nothing but the named counters (docs/abi.md rule 9). */
  void expect_unchanged(const char *allowed = "") {
    read_state(now_);
    fd_engine_metrics a = before_.em, b = now_.em;
    const std::string allow = allowed;
    if (allow.find("stale") != std::string::npos) b.stale_decision_count = a.stale_decision_count;
    if (std::memcmp(&a, &b, sizeof a) != 0)
      fail("a failing call changed the engine metrics (state_version " + dec(a.state_version) +
           " -> " + dec(b.state_version) + ")");
    if (!same_cache()) fail("a failing call changed the cache");
    if (!same_requests()) fail("a failing call changed request states or seq_lens");
  }
  /* The cache is unchanged but for the failure counters a refused cache call
   * inside the engine call moves (S4.4, S5: capacity and transaction failures). */
  bool same_cache() const {
    fd_cache_metrics a = before_.cm, b = now_.cm;
    if (b.capacity_failure_count < a.capacity_failure_count ||
        b.transaction_failure_count < a.transaction_failure_count)
      return false;
    b.capacity_failure_count = a.capacity_failure_count;
    b.transaction_failure_count = a.transaction_failure_count;
    return std::memcmp(&a, &b, sizeof a) == 0 && before_.cache_version == now_.cache_version;
  }
  /* Ids first used by this call were not read before it: they must be unknown. */
  bool same_requests() const {
    for (const auto &kv : now_.states) {
      auto it = before_.states.find(kv.first);
      if (kv.second != (it == before_.states.end() ? FD_ENGINE_REQUEST_UNKNOWN : it->second))
        return false;
    }
    return before_.seq_lens == now_.seq_lens;
  }

  /* Records a status; `ok_expected`: the spec says this call succeeds. */
  bool settle(fd_status s, bool ok_expected, const char *allowed = "") {
    result_ = fd_status_string(s);
    if (s != FD_OK) result_ += std::string(" (") + last_error() + ")";
    if (ok_expected && s != FD_OK) fail("expected FD_OK, got " + result_);
    if (s != FD_OK) {
      if (last_error().empty()) fail("a failing call left no error message");
      expect_unchanged(allowed);
    }
    return s == FD_OK;
  }

  /* ---------------------------------------------------------------------- */
  uint64_t new_id() {
    const uint64_t id = next_id_++;
    used_.push_back(id);
    return id;
  }
  uint64_t pick_id() {
    if (used_.empty() || rng_.chance(0.08)) return new_id();  // unknown to the engine
    return used_[rng_.below(used_.size())];
  }
  std::vector<uint64_t> ids_in(int32_t state) const {
    std::vector<uint64_t> out;
    for (const auto &kv : before_.states)
      if (kv.second == state) out.push_back(kv.first);
    return out;
  }
  std::vector<float> values(size_t n, uint64_t salt) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = static_cast<float>(static_cast<int64_t>((i * 37 + salt * 11) % 17) - 8) * 0.125f;
    return v;
  }
  /* A host buffer of `n` elements of the cache dtype (values exact in all three). */
  std::vector<unsigned char> tensor(size_t n, uint64_t salt) {
    std::vector<unsigned char> b(std::max<size_t>(n, 1) * esize());
    const std::vector<float> v = values(n, salt);
    for (size_t i = 0; i < n; ++i) fdmodel::store_elem(b.data(), i, cfg_.dtype, v[i]);
    return b;
  }

  /* ---------------------------------------------------------------------- */
  /* Steps (both modes). */
  bool op_begin(const std::vector<uint64_t> &ids, bool must_open) {
    desc_ = "fd_engine_begin_step(" + fdmodel::ids_str(ids) + ")";
    fd_engine_step st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    const uint64_t dummy = 0;
    /* Unscheduled: valid ids open a step or report backpressure. */
    bool valid = !scheduled_ && !ids.empty() && !step_open_;
    std::vector<uint64_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) valid = false;
    for (uint64_t id : ids)
      if (before_.states.count(id) == 0 || before_.states.at(id) != FD_ENGINE_REQUEST_ACTIVE)
        valid = false;
    uint32_t needed = 0, freeb = 0;
    if (valid && fd_cache_blocks_needed(cache_, ids.data(), static_cast<uint32_t>(ids.size()),
                                        &needed, &freeb) != FD_OK)
      fail("fd_cache_blocks_needed failed: " + last_error());
    const fd_status s = fd_engine_begin_step(engine_, ids.empty() ? &dummy : ids.data(),
                                             static_cast<uint32_t>(ids.size()), &st);
    if (!settle(s, valid || must_open)) return true;
    if (st.outcome == FD_STEP_BACKPRESSURE) {
      result_ += " backpressure";
      if (scheduled_) fail("backpressure in scheduler-managed mode");
      if (valid && needed <= freeb) fail("backpressure with needed " + dec(needed) + " <= free");
      if (st.needed_blocks <= st.free_blocks)
        fail("backpressure reports needed " + dec(st.needed_blocks) + " <= free " +
             dec(st.free_blocks));
      ++backpressure_;
      expect_unchanged_but_backpressure();
      return true;
    }
    if (st.outcome != FD_STEP_OPENED) fail("unknown step outcome " + std::to_string(st.outcome));
    if (valid && needed > freeb) fail("step opened with needed " + dec(needed) + " > free");
    if (st.batch != ids.size()) fail("step batch " + dec(st.batch));
    step_open_ = true;
    step_tx_ = st.tx;
    step_ids_ = ids;
    next_layer_ = 0;
    step_seq_lens_ = before_.seq_lens;
    return true;
  }
  void expect_unchanged_but_backpressure() {
    read_state(now_);
    fd_engine_metrics a = before_.em, b = now_.em;
    b.backpressure_count = a.backpressure_count;
    b.state_version = a.state_version;
    if (std::memcmp(&a, &b, sizeof a) != 0 || !same_cache() || !same_requests())
      fail("backpressure changed more than backpressure_count");
  }

  bool op_step_layer() {
    const uint32_t batch = static_cast<uint32_t>(step_ids_.size());
    const size_t qn = size_t{batch} * hq_ * cfg_.head_dim,
                 kn = size_t{batch} * cfg_.num_kv_heads * cfg_.head_dim;
    uint32_t layer = next_layer_;
    fd_tx tx = step_tx_;
    int bad = 0;
    if (rng_.chance(0.15)) {
      bad = 1 + rng_.below32(4);
      if (bad == 1) layer = rng_.chance(0.5) ? next_layer_ + 1 + rng_.below32(2) : 0xffffffffu;
      if (bad == 4) tx.cache_version += 1 + rng_.below(3);
      if (bad == 1 && layer == next_layer_) bad = 0;
    }
    if (layer >= L() && bad == 0) bad = 1;  // every layer is written: a wrong layer
    const uint64_t salt = rng_.next() & 0xff;
    std::vector<unsigned char> q = tensor(qn, salt), k = tensor(kn, salt + 1),
                               v = tensor(kn, salt + 2), out(std::max<size_t>(qn, 1) * esize());
    desc_ = "fd_engine_step_layer(layer " + dec(layer) + (bad == 2 ? ", k NULL" : "") +
            (bad == 3 ? ", out NULL" : "") + (bad == 4 ? ", stale tx" : "") + ")";
    const fd_status s =
        fd_engine_step_layer(engine_, tx, layer, q.data(), bad == 2 ? nullptr : k.data(), v.data(),
                             bad == 3 ? nullptr : out.data(), nullptr);
    result_ = fd_status_string(s);
    if (bad == 0 && s != FD_OK) fail("valid step_layer failed: " + last_error());
    if (s == FD_OK) {
      if (bad != 0) fail("step_layer with a bad argument succeeded");
      ++layer_steps_;
      ++next_layer_;
      for (size_t i = 0; i < qn; ++i)
        if (!std::isfinite(fdmodel::load_elem(out.data(), i, cfg_.dtype)))
          fail("attention output not finite at " + dec(i));
      return true;
    }
    result_ += std::string(" (") + last_error() + ")";
    if (bad == 4) {  // a stale handle is refused; the step stays open (header)
      expect_unchanged();
      return true;
    }
    /* Any other failure aborts the whole step. */
    ++step_aborts_;
    step_open_ = false;
    read_state(now_);
    if (now_.seq_lens != step_seq_lens_) fail("a failed step_layer changed seq_lens");
    return true;
  }

  bool op_commit_or_abort(bool commit) {
    fd_tx tx = step_tx_;
    const bool stale = rng_.chance(0.1);
    if (stale) tx.id += 1 + rng_.below(2);
    desc_ = std::string(commit ? "fd_engine_commit_step" : "fd_engine_abort_step") +
            (stale ? "(wrong tx)" : "");
    const fd_status s =
        commit ? fd_engine_commit_step(engine_, tx) : fd_engine_abort_step(engine_, tx);
    const bool must = !stale && (!commit || next_layer_ == L());
    if (!settle(s, must)) return true;
    if (stale) fail("a wrong step handle was accepted");
    if (commit && next_layer_ != L()) fail("commit before every layer succeeded");
    step_open_ = false;
    read_state(now_);
    if (commit) {
      ++steps_;
      appended_ += step_ids_.size();
      for (uint64_t id : step_ids_) {
        auto it = now_.seq_lens.find(id);
        if (it != now_.seq_lens.end() && it->second != step_seq_lens_.at(id) + 1)
          fail("request " + dec(id) + " seq_len " + std::to_string(it->second) +
               " after commit, expected " + std::to_string(step_seq_lens_.at(id) + 1));
        /* Scheduler-managed requests may finish on their last token. */
        if (it == now_.seq_lens.end() &&
            (!scheduled_ || now_.states.at(id) != FD_ENGINE_REQUEST_FINISHED))
          fail("request " + dec(id) + " left active state at commit");
      }
    } else {
      ++step_aborts_;
      if (now_.seq_lens != step_seq_lens_) fail("abort changed seq_lens");
    }
    return true;
  }

  /* Step operations while a step is open; false: none applies. */
  bool op_in_step() {
    const double w = static_cast<double>(rng_.next()) * 0x1.0p-64;
    if (w < 0.75 && next_layer_ < L()) return op_step_layer();
    if (w < 0.80) return op_step_layer();
    if (w < 0.90) return op_commit_or_abort(true);
    if (w < 0.95) return op_commit_or_abort(false);
    /* Anything else is refused while a step is open (S8). */
    const uint64_t id = pick_id();
    desc_ = "fd_engine_finish(" + dec(id) + ") during a step";
    if (settle(fd_engine_finish(engine_, id), false)) fail("finish succeeded while a step is open");
    return true;
  }

  /* ---------------------------------------------------------------------- */
  bool op_unscheduled() {
    if (step_open_) return op_in_step();
    const std::vector<uint64_t> active = ids_in(FD_ENGINE_REQUEST_ACTIVE),
                                waiting = ids_in(FD_ENGINE_REQUEST_WAITING);
    switch (rng_.below(10)) {
      case 0:
      case 1: {
        const bool fresh = rng_.chance(0.7);
        const uint64_t id = fresh ? new_id() : pick_id();
        desc_ = "fd_engine_add_request(" + dec(id) + ")";
        const auto it = before_.states.find(id);
        const bool ok = it == before_.states.end() || it->second <= FD_ENGINE_REQUEST_ACTIVE;
        settle(fd_engine_add_request(engine_, id), ok);
        return true;
      }
      case 2:
      case 3: {
        const uint64_t id =
            !waiting.empty() && rng_.chance(0.8) ? waiting[rng_.below(waiting.size())] : pick_id();
        desc_ = "fd_engine_admit(" + dec(id) + ")";
        settle(fd_engine_admit(engine_, id), false);
        return true;
      }
      case 4: {
        const uint64_t id = pick_id();
        const bool finish = rng_.chance(0.5);
        desc_ = std::string(finish ? "fd_engine_finish(" : "fd_engine_cancel(") + dec(id) + ")";
        const auto it = before_.states.find(id);
        const bool ok = it != before_.states.end() && (it->second == FD_ENGINE_REQUEST_WAITING ||
                                                       it->second == FD_ENGINE_REQUEST_ACTIVE);
        settle(finish ? fd_engine_finish(engine_, id) : fd_engine_cancel(engine_, id), ok);
        return true;
      }
      case 5: return op_prefill(active);
      default: {
        std::vector<uint64_t> ids = active;
        for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng_.below(i)]);
        ids.resize(ids.empty() ? 0 : 1 + rng_.below(ids.size()));
        if (rng_.chance(0.1)) ids.push_back(ids.empty() ? pick_id() : ids.front());  // dup / bad
        return op_begin(ids, false);
      }
    }
  }

  bool op_prefill(const std::vector<uint64_t> &candidates) {
    const uint64_t id = !candidates.empty() && rng_.chance(0.85)
                            ? candidates[rng_.below(candidates.size())]
                            : pick_id();
    const size_t n = size_t{L()} * cfg_.num_kv_heads * cfg_.head_dim;
    const std::vector<unsigned char> k = tensor(n, id), v = tensor(n, id + 5);
    const bool null_k = rng_.chance(0.05);
    desc_ = "fd_engine_prefill_request_layers(" + dec(id) + (null_k ? ", k NULL" : "") + ")";
    const fd_status s =
        fd_engine_prefill_request_layers(engine_, id, null_k ? nullptr : k.data(), v.data());
    if (settle(s, false)) {
      if (null_k) fail("prefill with NULL k succeeded");
      ++prefills_;
      read_state(now_);
      if (now_.seq_lens.at(id) != before_.seq_lens.at(id) + 1)
        fail("prefill did not grow seq_len by one");
    }
    return true;
  }

  /* ---------------------------------------------------------------------- */
  bool op_scheduled() {
    if (step_open_) return op_in_step();
    switch (rng_.below(12)) {
      case 0:
      case 1: return op_submit();
      case 2: return op_register_prefix();
      case 3: {
        const std::string pid = "p" + dec(rng_.below(3));
        desc_ = "fd_engine_evict_prefix(\"" + pid + "\")";
        settle(fd_engine_evict_prefix(engine_, pid.c_str()), false);
        refresh_prefixes();
        return true;
      }
      case 4: {
        const uint64_t id = pick_id();
        const bool finish = rng_.chance(0.5);
        const std::vector<uint64_t> active = ids_in(FD_ENGINE_REQUEST_ACTIVE);
        const bool was_active = std::find(active.begin(), active.end(), id) != active.end();
        desc_ = std::string(finish ? "fd_engine_finish(" : "fd_engine_cancel(") + dec(id) + ")";
        if (settle(finish ? fd_engine_finish(engine_, id) : fd_engine_cancel(engine_, id), false)) {
          fairness_.erase(id);
          /* Finishing or cancelling an active request voids the applied
           * decision (docs/engine.md, "One decision authorises one step"). */
          if (was_active) decision_unused_ = false;
        }
        return true;
      }
      case 5:
      case 6: return op_plan_apply();
      case 7: return op_reapply();
      case 8: return op_prefill(ids_in(FD_ENGINE_REQUEST_ACTIVE));
      case 9: return op_outside_change();
      default: {
        /* The runnable ids of the last applied decision (must open when every
         * admitted context is prefilled), or something else. */
        std::vector<uint64_t> ids = runnable_;
        bool must = decision_unused_ && !ids.empty() && contexts_complete(ids);
        if (rng_.chance(0.15) && !ids.empty()) {
          std::reverse(ids.begin(), ids.end());
          if (ids.size() == 1) ids.push_back(ids.front());
          must = false;
        }
        const bool was_unused = decision_unused_;
        op_begin(ids, must);
        if (step_open_) {
          if (!was_unused) fail("a step opened without an unused applied decision");
          decision_unused_ = false;
        }
        return true;
      }
    }
  }

  bool contexts_complete(const std::vector<uint64_t> &ids) const {
    for (uint64_t id : ids) {
      auto it = before_.seq_lens.find(id);
      if (it == before_.seq_lens.end()) return false;
      if (static_cast<uint32_t>(it->second) < context_.at(id)) return false;
    }
    return true;
  }

  bool op_submit() {
    fd_request_spec spec;
    fd_request_spec_init(&spec);
    const bool fresh = rng_.chance(0.85);
    spec.id = fresh ? new_id() : pick_id();
    spec.submission_order =
        fresh && rng_.chance(0.95) ? next_order_++ : rng_.below(next_order_ + 1);
    spec.max_new_tokens = rng_.chance(0.05) ? 0 : 1 + rng_.below32(6);
    std::string pid;
    if (!prefixes_.empty() && rng_.chance(0.3)) {
      auto it = prefixes_.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng_.below(prefixes_.size())));
      pid = it->first;
      spec.initial_context_tokens = it->second * cfg_.block_size;
      spec.prefix_id = pid.c_str();
    } else {
      spec.initial_context_tokens = rng_.below32(2 * cfg_.block_size + 1);
    }
    desc_ = "fd_engine_submit_request(id " + dec(spec.id) + ", order " +
            dec(spec.submission_order) + ", context " + dec(spec.initial_context_tokens) +
            ", new " + dec(spec.max_new_tokens) + (pid.empty() ? "" : ", prefix " + pid) + ")";
    if (settle(fd_engine_submit_request(engine_, &spec), false)) {
      submitted_ = true;
      context_[spec.id] = spec.initial_context_tokens;
    }
    return true;
  }

  bool op_register_prefix() {
    const std::string pid = "p" + dec(rng_.below(3));
    const uint32_t n = 1 + rng_.below32(2);
    const size_t count = size_t{L()} * n * cfg_.num_kv_heads * cfg_.block_size * cfg_.head_dim;
    const std::vector<unsigned char> k = tensor(count, 3), v = tensor(count, 4);
    desc_ = "fd_engine_register_prefix(\"" + pid + "\", " + dec(n) + " blocks)";
    if (settle(fd_engine_register_prefix(engine_, pid.c_str(), k.data(), v.data(), n, nullptr),
               false)) {
      if (submitted_) fail("a prefix was registered after a submission");
      prefixes_[pid] = n;
    }
    refresh_prefixes();
    return true;
  }

  /* Registration may evict other prefixes (LRU): keep the list exact. */
  void refresh_prefixes() {
    for (auto it = prefixes_.begin(); it != prefixes_.end();) {
      fd_prefix_info info;
      std::memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      if (fd_prefix_get_info(cache_, it->first.c_str(), &info) != FD_OK)
        it = prefixes_.erase(it);
      else
        ++it;
    }
  }

  std::vector<fd_request_fairness> fairness_list() const {
    std::vector<fd_request_fairness> out;
    for (const auto &kv : fairness_) out.push_back(kv.second);
    return out;
  }

  /* Plans from the engine's own snapshot and applies; false: no decision. */
  bool plan(fd_decision **out) {
    const std::vector<fd_request_fairness> fair = fairness_list();
    fd_snapshot *snap = nullptr;
    fd_status s = fd_engine_snapshot(engine_, plan_step_, fair.empty() ? nullptr : fair.data(),
                                     static_cast<uint32_t>(fair.size()), &snap);
    if (s != FD_OK) {
      result_ = std::string("snapshot: ") + fd_status_string(s) + " (" + last_error() + ")";
      if (submitted_) fail("fd_engine_snapshot failed: " + result_);
      expect_unchanged();
      return false;
    }
    s = fd_scheduler_plan(sched_, snap, out);
    fd_snapshot_destroy(snap);
    if (s != FD_OK) {
      /* S9 step 1: resident prefix blocks must fit the schedulable blocks;
       * the engine registers prefixes without knowing the reserve. */
      if (before_.cm.resident_prefix_blocks > cfg_.max_blocks - reserve_) {
        result_ = std::string("plan: ") + fd_status_string(s) + " (" + last_error() + ")";
        expect_unchanged();
        return false;
      }
      fail("planning the engine's own snapshot failed: " + last_error());
    }
    fd_decision_summary sum;
    std::memset(&sum, 0, sizeof sum);
    sum.struct_size = sizeof sum;
    if (fd_decision_get_summary(*out, &sum) != FD_OK) fail("fd_decision_get_summary failed");
    if (sum.needed_physical_blocks_now > sum.free_blocks_before ||
        sum.committed_blocks_after > sum.schedulable_blocks ||
        sum.committed_blocks_before > sum.committed_blocks_after)
      fail("decision breaks the scheduler's guarantees: needed " +
           dec(sum.needed_physical_blocks_now) + ", free " + dec(sum.free_blocks_before) +
           ", committed " + dec(sum.committed_blocks_before) + " -> " +
           dec(sum.committed_blocks_after) + ", schedulable " + dec(sum.schedulable_blocks));
    return true;
  }

  std::vector<uint64_t> decision_list(const fd_decision *d, int32_t list) {
    uint32_t n = 0;
    if (fd_decision_ids(d, list, nullptr, 0, &n) != FD_OK) fail("fd_decision_ids(count) failed");
    std::vector<uint64_t> ids(n);
    if (n > 0 && fd_decision_ids(d, list, ids.data(), n, &n) != FD_OK)
      fail("fd_decision_ids failed: " + last_error());
    return ids;
  }

  bool op_plan_apply() {
    desc_ = "plan + fd_engine_apply_decision";
    fd_decision *d = nullptr;
    if (!plan(&d)) return true;
    const fd_status s = fd_engine_apply_decision(engine_, sched_, d);
    if (!settle(s, true)) return true;  // (settle failed the run)
    ++applied_;
    ++plan_step_;
    /* Fairness counters (S9): still-waiting +1; runnable reset, deferred +1. */
    runnable_ = decision_list(d, FD_DECISION_RUNNABLE);
    for (uint64_t id : decision_list(d, FD_DECISION_WAITING)) {
      fd_request_fairness &f = fairness_[id];
      f.id = id;
      ++f.wait_steps;
      ++f.skip_count;
    }
    for (uint64_t id : decision_list(d, FD_DECISION_ADMIT)) fairness_[id] = {id, 0, 0, 0, 0};
    for (uint64_t id : decision_list(d, FD_DECISION_DEFERRED)) {
      fairness_[id].id = id;
      ++fairness_[id].service_wait_steps;
    }
    for (uint64_t id : decision_list(d, FD_DECISION_REJECTED)) fairness_.erase(id);
    fd_decision_destroy(last_decision_);
    last_decision_ = d;
    decision_unused_ = true;
    return true;
  }

  /* Applies the last decision again (the engine changed since: stale), or a
   * fresh one with a scheduler of another configuration. */
  bool op_reapply() {
    if (rng_.chance(0.5) && last_decision_ != nullptr) {
      desc_ = "fd_engine_apply_decision(the last applied decision again)";
      const fd_status s = fd_engine_apply_decision(engine_, sched_, last_decision_);
      /* The applied decision changed the engine (unless it admitted and
       * rejected nothing: then applying it again is the same decision). */
      if (settle(s, false, "stale")) {
        ++applied_;
        decision_unused_ = true;
        return true;
      }
      count_refusal(s);
      return true;
    }
    desc_ = "fd_engine_apply_decision(scheduler of another configuration)";
    fd_decision *d = nullptr;
    if (!plan(&d)) return true;
    const fd_status s = fd_engine_apply_decision(engine_, other_sched_, d);
    fd_decision_destroy(d);
    if (settle(s, false, "stale")) fail("a decision was applied with another scheduler config");
    count_refusal(s);
    return true;
  }
  void count_refusal(fd_status s) {
    ++stale_max_;
    if (s == FD_ERR_STALE_HANDLE) stale_min_ = stale_max_;
  }

  /* A decision planned before a change to the cache behind the engine must be
   * refused and counted (S8, S9; issue 11 bug 5). The run stops there: the
   * cache then holds a request the engine does not know. */
  bool op_outside_change() {
    if (rng_.chance(0.7)) return op_plan_apply();
    fd_decision *d = nullptr;
    desc_ = "plan, then fd_cache_add_request behind the engine, then apply";
    if (!plan(&d)) return true;
    if (fd_cache_add_request(cache_, next_id_ + 1000000) != FD_OK)
      fail("fd_cache_add_request failed: " + last_error());
    const fd_status s = fd_engine_apply_decision(engine_, sched_, d);
    fd_decision_destroy(d);
    result_ = fd_status_string(s);
    if (s == FD_OK) fail("a decision planned before a change behind the engine was applied");
    fd_engine_metrics m;
    std::memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    if (fd_engine_metrics_get(engine_, &m) != FD_OK) fail("fd_engine_metrics_get failed");
    const uint64_t was = before_.em.stale_decision_count;
    if (m.stale_decision_count != was + 1)
      fail("stale_decision_count " + dec(was) + " -> " + dec(m.stale_decision_count) +
           " after a refused decision (" + result_ + ": " + last_error() + ")");
    if (trace_) std::printf("  %s -> %s\n", desc_.c_str(), result_.c_str());
    return false;
  }

  Rng &rng_;
  bool trace_;
  fd_cache_config cfg_{};
  fd_cache *cache_ = nullptr;
  fd_engine *engine_ = nullptr;
  fd_scheduler *sched_ = nullptr, *other_sched_ = nullptr;
  fd_decision *last_decision_ = nullptr;
  uint32_t hq_ = 1, reserve_ = 0;
  bool scheduled_ = false, submitted_ = false;
  State before_{}, now_{};
  std::string desc_, result_;
  std::vector<uint64_t> used_;
  uint64_t next_id_ = 1, next_order_ = 0, plan_step_ = 0;
  std::map<uint64_t, uint32_t> context_;
  std::map<std::string, uint32_t> prefixes_;
  std::map<uint64_t, fd_request_fairness> fairness_;
  std::vector<uint64_t> runnable_;
  bool decision_unused_ = false;
  /* Open step. */
  bool step_open_ = false;
  fd_tx step_tx_{};
  std::vector<uint64_t> step_ids_;
  uint32_t next_layer_ = 0;
  std::map<uint64_t, int32_t> step_seq_lens_;
  /* Counters the engine must agree with. */
  uint64_t steps_ = 0, appended_ = 0, layer_steps_ = 0, step_aborts_ = 0, backpressure_ = 0,
           applied_ = 0, prefills_ = 0, stale_min_ = 0, stale_max_ = 0;
};

void run_engine(Rng &rng) {
  EngineRun run(rng);
  run.setup();
  for (uint64_t i = 0; i < kMaxOps && !rng.exhausted(); ++i)
    if (!run.run_op()) break;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  Rng rng{0};
  rng.bytes = data + 1;
  rng.size = size - 1;
  if (data[0] % 2 == 0)
    run_cache(rng);
  else
    run_engine(rng);
  return 0;
}
