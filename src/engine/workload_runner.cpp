// Runs one workload case under one admission policy through the public API
// (cache, engine, scheduler) and measures it (docs/semantics.md S10).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "engine/workloads.hpp"

namespace fd {

namespace {

using ull = unsigned long long;

void check(fd_status s, const char *during) {
  if (s != FD_OK) {
    throw Error(s == FD_ERR_INVARIANT ? FD_ERR_INVARIANT : s,
                format("workload: %s failed: %s", during, fd_last_error_message()));
  }
}

struct CacheDel {
  void operator()(fd_cache *c) const { fd_cache_destroy(c); }
};
struct EngineDel {
  void operator()(fd_engine *e) const { fd_engine_destroy(e); }
};
struct SchedDel {
  void operator()(fd_scheduler *s) const { fd_scheduler_destroy(s); }
};
struct SnapDel {
  void operator()(fd_snapshot *s) const { fd_snapshot_destroy(s); }
};
struct DecisionDel {
  void operator()(fd_decision *d) const { fd_decision_destroy(d); }
};

// FNV-1a over the deterministic trajectory.
struct Hash {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= (x >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  void event(uint64_t it, uint64_t code, uint64_t value) {
    add(it);
    add(code);
    add(value);
  }
};
enum Event : uint64_t {
  kArrive = 1,
  kAdmit,
  kReject,
  kRow,
  kBlock,
  kFinish,
  kCancel,
  kForcedCancel,
  kBackpressure,
  kAbort,
  kEvict,
  kDeadlock,
  kPrefixMiss
};

struct Tracked {
  const PlannedRequest *plan = nullptr;
  bool arrived = false, admitted = false, done = false, completed = false;
  bool use_prefix = false;
  uint64_t admitted_at = 0, finished_at = 0;
  uint32_t generated = 0;
  uint32_t wait_steps = 0, skip_count = 0, service_wait = 0;
};

uint32_t ceil_div32(uint64_t a, uint64_t b) {
  return static_cast<uint32_t>((a + b - 1) / b);
}

class Runner {
 public:
  Runner(const WorkloadCase &c, int32_t policy, uint64_t seed, uint32_t threads)
      : c_(c), policy_(policy), rng_state_(seed ^ 0x5bd1e995u) {
    fd_cache_config cc;
    fd_cache_config_init(&cc);
    cc.num_layers = c.layers;
    cc.num_kv_heads = c.kv_heads;
    cc.head_dim = c.head_dim;
    cc.block_size = c.block_size;
    cc.max_blocks = c.max_blocks;
    cc.prefix_cache_capacity_blocks = c.prefix_capacity;
    cc.dtype = c.dtype;
    fd_cache *cache = nullptr;
    check(fd_cache_create(&cc, &cache), "creating the cache");
    cache_.reset(cache);
    fd_engine_config ec;
    fd_engine_config_init(&ec);
    ec.num_q_heads = c.q_heads;
    ec.cpu_threads = threads;
    fd_engine *engine = nullptr;
    check(fd_engine_create(cache, &ec, &engine), "creating the engine");
    engine_.reset(engine);
    fd_scheduler_config sc;
    fd_scheduler_config_init(&sc);
    sc.max_active_requests = c.max_active;
    sc.max_batch_requests = c.max_batch;
    sc.reserve_blocks = c.reserve;
    fd_scheduler *sch = nullptr;
    check(fd_scheduler_create(&sc, &sch), "creating the scheduler");
    scheduler_.reset(sch);
    esize_ = dtype_size(c.dtype);
    for (const PlannedRequest &p : c.requests) requests_[p.id].plan = &p;
    for (const auto &p : c.prefixes) {
      std::vector<unsigned char> blocks =
          random_tensor(size_t{c.layers} * p.second * c.kv_heads * c.block_size * c.head_dim);
      check(fd_engine_register_prefix(engine, p.first.c_str(), blocks.data(), blocks.data(),
                                      p.second, nullptr),
            "registering a prefix");
      registered_.insert(p.first);
    }
  }

  WorkloadRun run(fd_workload_progress_fn progress, void *user, uint64_t base, uint64_t total) {
    auto &r = out_.report;
    r.struct_size = sizeof r;
    r.kind = c_.kind;
    r.policy = policy_;
    r.max_blocks = c_.max_blocks;
    std::snprintf(r.case_name, sizeof r.case_name, "%s", c_.name.c_str());
    r.requests_submitted = c_.requests.size();
    double used_sum = 0;
    uint32_t stalls_in_row = 0;
    uint64_t it = 0;
    for (; it < c_.max_iterations; ++it) {
      arrivals(it);
      scripted_cancellations(it);
      const auto t0 = std::chrono::steady_clock::now();
      const StepOutcome o =
          policy_ == FD_POLICY_LIFETIME ? lifetime_iteration(it) : baseline_iteration(it);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (o == StepOutcome::kRan) {
        latencies_.push_back(us);
        step_time_us_ += us;
        r.executed_steps += 1;
        stalls_in_row = 0;
      } else if (o == StepOutcome::kStalled) {
        r.stalled_steps += 1;
        stalls_in_row += 1;
      }
      check(fd_engine_validate(engine_.get()), "validating the engine");
      const fd_cache_metrics cm = cache_metrics();
      used_sum += static_cast<double>(cm.used_blocks);
      r.peak_used_blocks = std::max<uint64_t>(r.peak_used_blocks, cm.used_blocks);
      r.peak_saved_prefix_blocks =
          std::max<uint64_t>(r.peak_saved_prefix_blocks, cm.saved_prefix_blocks);
      record(it, o == StepOutcome::kRan ? us : 0.0, cm);
      if (progress != nullptr && it % 16 == 0) progress(user, base + it, total);
      if (policy_ == FD_POLICY_GREEDY && stalls_in_row >= c_.deadlock_after) {
        r.deadlocks = 1;
        hash_.event(it, kDeadlock, 0);
        ++it;
        break;
      }
      if (policy_ == FD_POLICY_UNSCHEDULED && stalls_in_row >= c_.deadlock_after) {
        forced_cancel(it, /*youngest=*/true);
        stalls_in_row = 0;
      }
      if (all_done()) {
        ++it;
        break;
      }
    }
    r.steps = it;
    if (policy_ == FD_POLICY_LIFETIME) cleanup_prefixes(it);
    summarise(used_sum);
    r.trajectory_hash = hash_.h;
    return std::move(out_);
  }

 private:
  enum class StepOutcome { kIdle, kRan, kStalled, kAborted };

  fd_cache_metrics cache_metrics() const {
    fd_cache_metrics m;
    std::memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    check(fd_cache_metrics_get(cache_.get(), &m), "reading cache metrics");
    return m;
  }

  std::vector<unsigned char> random_tensor(size_t n) {
    std::vector<unsigned char> bytes(n * esize_);
    for (size_t i = 0; i < n; ++i) {
      rng_state_ = rng_state_ * 6364136223846793005ull + 1442695040888963407ull;
      const float x = static_cast<float>((rng_state_ >> 40) & 0xffff) / 32768.f - 1.f;
      store_from_f32(bytes.data(), i, c_.dtype, x);
    }
    return bytes;
  }

  void arrivals(uint64_t it) {
    for (const PlannedRequest &p : c_.requests) {
      if (p.arrival != it) continue;
      Tracked &t = requests_[p.id];
      t.arrived = true;
      hash_.event(it, kArrive, p.id);
      if (policy_ == FD_POLICY_LIFETIME) {
        fd_request_spec s;
        fd_request_spec_init(&s);
        s.id = p.id;
        s.submission_order = p.id;
        s.initial_context_tokens = p.context;
        s.max_new_tokens = p.new_tokens;
        if (!p.prefix.empty() && registered_.count(p.prefix) != 0) {
          s.prefix_id = p.prefix.c_str();
          t.use_prefix = true;
          out_.report.prefix_hits += 1;
        } else if (!p.prefix.empty()) {
          out_.report.prefix_misses += 1;  // served with a private copy of its context
          hash_.event(it, kPrefixMiss, p.id);
        }
        check(fd_engine_submit_request(engine_.get(), &s), "submitting a request");
      } else {
        check(fd_engine_add_request(engine_.get(), p.id), "adding a request");
        queue_.push_back(p.id);
      }
    }
  }

  void scripted_cancellations(uint64_t it) {
    for (const PlannedRequest &p : c_.requests) {
      if (p.cancel_at < 0 || static_cast<uint64_t>(p.cancel_at) != it) continue;
      Tracked &t = requests_[p.id];
      if (!t.arrived || t.done) continue;
      check(fd_engine_cancel(engine_.get(), p.id), "cancelling a request");
      mark_done(t, it, false);
      out_.report.user_cancellations += 1;
      hash_.event(it, kCancel, p.id);
    }
  }

  void mark_done(Tracked &t, uint64_t it, bool completed) {
    t.done = true;
    t.completed = completed;
    t.finished_at = it;
    queue_.erase(std::remove(queue_.begin(), queue_.end(), t.plan->id), queue_.end());
    active_.erase(std::remove(active_.begin(), active_.end(), t.plan->id), active_.end());
  }

  bool all_done() const {
    for (const auto &e : requests_) {
      if (!e.second.done) return false;
    }
    return true;
  }

  void prefill_context(Tracked &t) {
    if (t.use_prefix) return;  // the context is the shared prefix
    // The whole context in one transaction (fd_engine_prefill_request_tokens:
    // [layers, tokens, kv_heads, head_dim]), drawn token by token as before.
    const uint32_t tokens = t.plan->context;
    if (tokens == 0) return;
    const size_t token_bytes = size_t{c_.kv_heads} * c_.head_dim * esize_;
    const size_t layer_bytes = token_bytes * tokens;
    std::vector<unsigned char> k_all(layer_bytes * c_.layers), v_all(k_all.size());
    for (uint32_t i = 0; i < tokens; ++i) {
      const std::vector<unsigned char> k =
          random_tensor(size_t{c_.layers} * c_.kv_heads * c_.head_dim);
      const std::vector<unsigned char> v =
          random_tensor(size_t{c_.layers} * c_.kv_heads * c_.head_dim);
      for (uint32_t l = 0; l < c_.layers; ++l) {
        std::memcpy(&k_all[l * layer_bytes + i * token_bytes], &k[l * token_bytes], token_bytes);
        std::memcpy(&v_all[l * layer_bytes + i * token_bytes], &v[l * token_bytes], token_bytes);
      }
    }
    check(fd_engine_prefill_request_tokens(engine_.get(), t.plan->id, tokens, k_all.data(),
                                           v_all.data()),
          "prefilling a context");
  }

  // Runs one step over `rows`; returns kRan, kStalled (backpressure) or
  // kAborted (injected failure).
  StepOutcome run_step(uint64_t it, const std::vector<uint64_t> &rows) {
    fd_engine_step st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    check(fd_engine_begin_step(engine_.get(), rows.data(), static_cast<uint32_t>(rows.size()), &st),
          "beginning a step");
    if (st.outcome == FD_STEP_BACKPRESSURE) {
      out_.report.backpressure_steps += 1;
      hash_.event(it, kBackpressure, st.needed_blocks);
      return StepOutcome::kStalled;
    }
    std::vector<int32_t> blocks(rows.size());
    check(fd_tx_get_rows(cache_.get(), st.tx, static_cast<uint32_t>(rows.size()), nullptr, nullptr,
                         blocks.data(), nullptr, nullptr),
          "reading the step's rows");
    for (size_t i = 0; i < rows.size(); ++i) {
      hash_.event(it, kRow, rows[i]);
      hash_.event(it, kBlock, static_cast<uint64_t>(blocks[i]));
    }
    const size_t b = rows.size();
    std::vector<unsigned char> out(b * c_.q_heads * c_.head_dim * esize_);
    for (uint32_t l = 0; l < c_.layers; ++l) {
      std::vector<unsigned char> q = random_tensor(b * c_.q_heads * c_.head_dim);
      std::vector<unsigned char> k = random_tensor(b * c_.kv_heads * c_.head_dim);
      std::vector<unsigned char> v = random_tensor(b * c_.kv_heads * c_.head_dim);
      const bool inject =
          c_.inject_failure_at >= 0 && static_cast<uint64_t>(c_.inject_failure_at) == it && l == 1;
      const uint32_t layer = inject ? l + 1 : l;  // the wrong layer: the step aborts
      const fd_status s = fd_engine_step_layer(engine_.get(), st.tx, layer, q.data(), k.data(),
                                               v.data(), out.data(), nullptr);
      if (inject) {
        if (s == FD_OK) throw Error(FD_ERR_INVARIANT, "workload: injected failure did not fail");
        out_.report.aborted_steps += 1;
        hash_.event(it, kAbort, 0);
        return StepOutcome::kAborted;
      }
      check(s, "running a layer");
    }
    check(fd_engine_commit_step(engine_.get(), st.tx), "committing a step");
    return StepOutcome::kRan;
  }

  // After a committed step: count tokens and finish complete requests.
  void after_step(uint64_t it, const std::vector<uint64_t> &rows) {
    for (uint64_t id : rows) {
      Tracked &t = requests_[id];
      t.generated += 1;
      out_.report.generated_tokens += 1;
      if (t.generated == t.plan->new_tokens) {
        if (policy_ != FD_POLICY_LIFETIME) {
          check(fd_engine_finish(engine_.get(), id), "finishing a request");
        }
        mark_done(t, it, true);
        hash_.event(it, kFinish, id);
      }
    }
  }

  // --- lifetime policy: snapshot, plan, apply, prefill, step ---
  StepOutcome lifetime_iteration(uint64_t it) {
    std::vector<fd_request_fairness> fair;
    for (const auto &e : requests_) {
      const Tracked &t = e.second;
      if (!t.arrived || t.done) continue;
      fair.push_back({e.first, t.wait_steps, t.skip_count, t.service_wait, 0});
    }
    fd_snapshot *snap_raw = nullptr;
    check(fd_engine_snapshot(engine_.get(), it, fair.data(), static_cast<uint32_t>(fair.size()),
                             &snap_raw),
          "taking a snapshot");
    std::unique_ptr<fd_snapshot, SnapDel> snap(snap_raw);
    fd_decision *d_raw = nullptr;
    check(fd_scheduler_plan(scheduler_.get(), snap.get(), &d_raw), "planning");
    std::unique_ptr<fd_decision, DecisionDel> d(d_raw);
    check(fd_engine_apply_decision(engine_.get(), scheduler_.get(), d.get()), "applying");
    const auto ids = [&](int32_t list) {
      uint32_t n = 0;
      check(fd_decision_ids(d.get(), list, nullptr, 0, &n), "reading a decision");
      std::vector<uint64_t> v(n);
      if (n != 0) check(fd_decision_ids(d.get(), list, v.data(), n, &n), "reading a decision");
      return v;
    };
    for (uint64_t id : ids(FD_DECISION_REJECTED)) {
      mark_done(requests_[id], it, false);
      out_.report.rejected_requests += 1;
      hash_.event(it, kReject, id);
    }
    for (uint64_t id : ids(FD_DECISION_ADMIT)) {
      Tracked &t = requests_[id];
      t.admitted = true;
      t.admitted_at = it;
      hash_.event(it, kAdmit, id);
      prefill_context(t);
    }
    for (uint64_t id : ids(FD_DECISION_WAITING)) {
      requests_[id].wait_steps += 1;
      requests_[id].skip_count += 1;
    }
    const std::vector<uint64_t> rows = ids(FD_DECISION_RUNNABLE);
    if (rows.empty()) return StepOutcome::kIdle;
    const StepOutcome o = run_step(it, rows);
    if (o == StepOutcome::kRan) {
      for (uint64_t id : rows) requests_[id].service_wait = 0;
      for (uint64_t id : ids(FD_DECISION_DEFERRED)) bump_service(requests_[id]);
      after_step(it, rows);
    } else {
      for (auto &e : requests_) {
        if (e.second.admitted && !e.second.done) bump_service(e.second);
      }
    }
    return o;
  }

  void bump_service(Tracked &t) {
    t.service_wait += 1;
    out_.report.max_service_wait_steps =
        std::max<uint64_t>(out_.report.max_service_wait_steps, t.service_wait);
  }

  // --- baselines: FIFO admission while the context fits the free blocks ---
  StepOutcome baseline_iteration(uint64_t it) {
    uint32_t free_blocks = static_cast<uint32_t>(cache_metrics().free_blocks);
    while (!queue_.empty()) {
      Tracked &t = requests_[queue_.front()];
      const uint32_t lifetime =
          ceil_div32(uint64_t{t.plan->context} + t.plan->new_tokens, c_.block_size);
      if (lifetime > c_.max_blocks) {  // can never fit the whole pool
        check(fd_engine_cancel(engine_.get(), t.plan->id), "rejecting a request");
        out_.report.rejected_requests += 1;
        hash_.event(it, kReject, t.plan->id);
        mark_done(t, it, false);
        continue;
      }
      const uint32_t need = ceil_div32(t.plan->context, c_.block_size);
      if (active_.size() >= c_.max_active || need > free_blocks) break;
      check(fd_engine_admit(engine_.get(), t.plan->id), "admitting a request");
      prefill_context(t);
      free_blocks -= need;
      t.admitted = true;
      t.admitted_at = it;
      hash_.event(it, kAdmit, t.plan->id);
      active_.push_back(t.plan->id);
      queue_.erase(queue_.begin());
    }
    if (active_.empty()) return StepOutcome::kIdle;
    const size_t n = std::min<size_t>(active_.size(), c_.max_batch);
    const std::vector<uint64_t> rows(active_.begin(), active_.begin() + static_cast<long>(n));
    const StepOutcome o = run_step(it, rows);
    if (o == StepOutcome::kRan) {
      for (uint64_t id : rows) requests_[id].service_wait = 0;
      for (size_t i = n; i < active_.size(); ++i) bump_service(requests_[active_[i]]);
      after_step(it, rows);
    } else {
      for (uint64_t id : active_) bump_service(requests_[id]);
      if (o == StepOutcome::kStalled && policy_ == FD_POLICY_CANCEL_ON_BACKPRESSURE) {
        forced_cancel(it, /*youngest=*/false);
      }
    }
    return o;
  }

  void forced_cancel(uint64_t it, bool youngest) {
    if (active_.empty()) return;
    const uint64_t id = youngest ? active_.back() : active_.front();
    check(fd_engine_cancel(engine_.get(), id), "cancelling on backpressure");
    mark_done(requests_[id], it, false);
    out_.report.forced_cancellations += 1;
    hash_.event(it, kForcedCancel, id);
  }

  void cleanup_prefixes(uint64_t it) {
    if (!all_done()) return;
    for (const std::string &p : registered_) {
      check(fd_engine_evict_prefix(engine_.get(), p.c_str()), "evicting a prefix");
      hash_.event(it, kEvict, p.size());
    }
    check(fd_engine_validate(engine_.get()), "validating the engine");
  }

  void record(uint64_t it, double us, const fd_cache_metrics &cm) {
    fd_engine_metrics m;
    std::memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    check(fd_engine_metrics_get(engine_.get(), &m), "reading engine metrics");
    fd_workload_trace_point p;
    p.step = it;
    p.latency_us = us;
    p.used_blocks = static_cast<uint32_t>(cm.used_blocks);
    p.committed_blocks =
        m.scheduler_managed ? static_cast<uint32_t>(m.committed_blocks) : p.used_blocks;
    p.active = static_cast<uint32_t>(m.active_request_count);
    p.waiting = static_cast<uint32_t>(m.waiting_request_count);
    out_.trace.push_back(p);
  }

  void summarise(double used_sum) {
    fd_workload_report &r = out_.report;
    const double iterations = static_cast<double>(std::max<uint64_t>(r.steps, 1));
    r.mean_used_blocks = used_sum / iterations;
    std::vector<double> sorted = latencies_;
    std::sort(sorted.begin(), sorted.end());
    auto rank = [&](double p) {
      if (sorted.empty()) return 0.0;
      const size_t k =
          static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
      return sorted[std::max<size_t>(k, 1) - 1];
    };
    r.step_latency_p50_us = rank(50);
    r.step_latency_p90_us = rank(90);
    r.step_latency_p99_us = rank(99);
    r.tokens_per_second =
        step_time_us_ > 0 ? static_cast<double>(r.generated_tokens) / (step_time_us_ * 1e-6) : 0;
    double wait_sum = 0, admitted = 0, rate_sum = 0, rate_sq = 0, completed = 0;
    for (const auto &e : requests_) {
      const Tracked &t = e.second;
      if (t.admitted) {
        const uint64_t w = t.admitted_at - t.plan->arrival;
        wait_sum += static_cast<double>(w);
        admitted += 1;
        r.max_admission_wait_steps = std::max<uint64_t>(r.max_admission_wait_steps, w);
      }
      if (t.completed) {
        r.requests_completed += 1;
        r.useful_tokens += t.plan->new_tokens;
        const double rate = static_cast<double>(t.plan->new_tokens) /
                            static_cast<double>(t.finished_at - t.plan->arrival + 1);
        rate_sum += rate;
        rate_sq += rate * rate;
        completed += 1;
      }
    }
    r.mean_admission_wait_steps = admitted > 0 ? wait_sum / admitted : 0;
    r.completion_rate = r.requests_submitted > 0 ? static_cast<double>(r.requests_completed) /
                                                       static_cast<double>(r.requests_submitted)
                                                 : 0;
    r.fairness = completed > 0 && rate_sq > 0 ? rate_sum * rate_sum / (completed * rate_sq) : 0;
  }

  const WorkloadCase &c_;
  int32_t policy_;
  uint64_t rng_state_;
  size_t esize_ = 4;
  std::unique_ptr<fd_cache, CacheDel> cache_;
  std::unique_ptr<fd_engine, EngineDel> engine_;
  std::unique_ptr<fd_scheduler, SchedDel> scheduler_;
  std::map<uint64_t, Tracked> requests_;
  std::vector<uint64_t> queue_, active_;  // baselines: FIFO queue, admission order
  std::set<std::string> registered_;
  std::vector<double> latencies_;
  double step_time_us_ = 0;
  Hash hash_;
  WorkloadRun out_;
};

}  // namespace

WorkloadRun run_workload(const WorkloadCase &c, int32_t policy, uint64_t seed, uint32_t cpu_threads,
                         fd_workload_progress_fn progress, void *user, uint64_t progress_base,
                         uint64_t progress_total) {
  Runner runner(c, policy, seed, cpu_threads);
  WorkloadRun run = runner.run(progress, user, progress_base, progress_total);
  run.report.seed = seed;
  return run;
}

}  // namespace fd
