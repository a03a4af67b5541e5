#include "engine/scheduler.hpp"

#include <algorithm>
#include <climits>

#include "core/error.hpp"
#include "core/versioned.hpp"

namespace fd {

void validate_scheduler_config(const SchedulerConfig &c) {
  if (c.max_active_requests < 1) {
    fail(FD_ERR_INVALID_ARGUMENT, "max_active_requests must be >= 1, got 0");
  }
  if (c.max_batch_requests < 1 || c.max_batch_requests > c.max_active_requests) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "max_batch_requests must be in [1, max_active_requests = %u], got %u",
         c.max_active_requests, c.max_batch_requests);
  }
  if (c.aging_threshold_steps < 1) {
    fail(FD_ERR_INVALID_ARGUMENT, "aging_threshold_steps must be >= 1, got 0");
  }
}

void validate_spec(const RequestSpec &s, uint32_t block_size) {
  const unsigned long long id = s.id;
  if (s.max_new_tokens < 1) {
    fail(FD_ERR_INVALID_ARGUMENT, "request %llu: max_new_tokens must be >= 1, got 0", id);
  }
  if (uint64_t{s.initial_context_tokens} + s.max_new_tokens > uint64_t{INT32_MAX}) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "request %llu: initial_context_tokens + max_new_tokens = %llu exceeds INT32_MAX", id,
         static_cast<unsigned long long>(uint64_t{s.initial_context_tokens} + s.max_new_tokens));
  }
  if (s.prefix_id.empty() && s.prefix_blocks != 0) {
    fail(FD_ERR_INVALID_ARGUMENT, "request %llu: prefix_blocks is %u but prefix_id is not set", id,
         s.prefix_blocks);
  }
  if (!s.prefix_id.empty()) {
    if (s.prefix_blocks == 0) {
      fail(FD_ERR_INVALID_ARGUMENT, "request %llu: prefix '%s' needs prefix_blocks > 0", id,
           s.prefix_id.c_str());
    }
    if (uint64_t{s.prefix_blocks} * block_size != s.initial_context_tokens) {
      fail(FD_ERR_INVALID_ARGUMENT,
           "request %llu: prefix '%s' of %u blocks must cover the whole initial context: "
           "initial_context_tokens must be %llu, got %u",
           id, s.prefix_id.c_str(), s.prefix_blocks,
           static_cast<unsigned long long>(uint64_t{s.prefix_blocks} * block_size),
           s.initial_context_tokens);
    }
  }
}

fd_request_spec read_request_spec(const fd_request_spec *spec) {
  fd_request_spec defaults;
  fd_request_spec_init(&defaults);
  return read_versioned<sizeof(fd_request_spec)>(spec, defaults, "spec");
}

RequestSpec spec_from_public(const fd_request_spec *spec, uint32_t block_size) {
  const fd_request_spec in = read_request_spec(spec);
  RequestSpec s;
  s.id = in.id;
  s.submission_order = in.submission_order;
  s.initial_context_tokens = in.initial_context_tokens;
  s.max_new_tokens = in.max_new_tokens;
  s.prefix_blocks = in.prefix_blocks;
  if (in.prefix_id != nullptr) s.prefix_id = in.prefix_id;
  validate_spec(s, block_size);
  return s;
}

namespace {
void check_unique(const Snapshot &snap, const RequestSpec &spec) {
  if (snap.ids.count(spec.id) != 0) {
    fail(FD_ERR_ALREADY_EXISTS, "request id %llu is already in the snapshot",
         static_cast<unsigned long long>(spec.id));
  }
  if (snap.orders.count(spec.submission_order) != 0) {
    fail(FD_ERR_ALREADY_EXISTS, "submission_order %llu (request %llu) is already in the snapshot",
         static_cast<unsigned long long>(spec.submission_order),
         static_cast<unsigned long long>(spec.id));
  }
}

// Inserts the id and order into the indexes and runs `push`; if anything
// throws (out of memory), the indexes are restored so nothing changed.
template <class Push>
void index_entry(Snapshot &snap, const RequestSpec &spec, Push push) {
  snap.ids.insert(spec.id);
  try {
    snap.orders.insert(spec.submission_order);
    try {
      push();
    } catch (...) {
      snap.orders.erase(spec.submission_order);
      throw;
    }
  } catch (...) {
    snap.ids.erase(spec.id);
    throw;
  }
}
}  // namespace

void Snapshot::add_waiting(const RequestSpec &spec, uint32_t wait_steps, uint32_t skip_count) {
  validate_spec(spec, block_size);
  check_unique(*this, spec);
  WaitingEntry entry{spec, wait_steps, skip_count};
  index_entry(*this, spec, [&] { waiting.push_back(std::move(entry)); });
}

void Snapshot::add_active(const RequestSpec &spec, int32_t seq_len, uint32_t physical,
                          uint32_t shared, uint32_t committed, uint32_t service_wait) {
  validate_spec(spec, block_size);
  check_unique(*this, spec);
  const unsigned long long id = spec.id;
  const uint64_t total = uint64_t{spec.initial_context_tokens} + spec.max_new_tokens;
  if (seq_len < 0 || static_cast<uint64_t>(seq_len) >= total) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "active request %llu: seq_len must be in [0, %llu) (context + new tokens), got %d", id,
         static_cast<unsigned long long>(total), seq_len);
  }
  const uint32_t want_physical = ceil_div(static_cast<uint64_t>(seq_len), block_size);
  if (physical != want_physical) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "active request %llu: physical_blocks must be ceil(seq_len / block_size) = %u, got %u", id,
         want_physical, physical);
  }
  if (shared != spec.prefix_blocks) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "active request %llu: shared_blocks must equal prefix_blocks = %u, got %u", id,
         spec.prefix_blocks, shared);
  }
  if (!spec.prefix_id.empty() && physical < shared) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "active request %llu: seq_len %d does not cover its %u shared prefix blocks", id, seq_len,
         shared);
  }
  const uint32_t want_committed = private_commitment(spec, block_size);
  if (committed != want_committed) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "active request %llu: committed_blocks must be lifetime - shared = %u, got %u", id,
         want_committed, committed);
  }
  ActiveEntry entry{spec, seq_len, physical, shared, committed, service_wait};
  index_entry(*this, spec, [&] { active.push_back(std::move(entry)); });
}

void Snapshot::validate_pool() const {
  uint64_t held = resident_prefix_blocks;
  for (const ActiveEntry &a : active) held += a.physical_blocks - a.shared_blocks;
  const uint64_t used = uint64_t{max_blocks} - free_blocks;
  if (held != used) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "snapshot is inconsistent: resident prefix blocks + active private blocks = %llu, but "
         "max_blocks - free_blocks = %llu",
         static_cast<unsigned long long>(held), static_cast<unsigned long long>(used));
  }
}

std::string snapshot_difference(const Snapshot &a, const Snapshot &b) {
  auto num = [](const char *what, uint64_t x, uint64_t y) {
    return format("%s %llu differs from %llu", what, static_cast<unsigned long long>(x),
                  static_cast<unsigned long long>(y));
  };
  if (a.version != b.version) return num("version", a.version, b.version);
  if (a.block_size != b.block_size) return num("block_size", a.block_size, b.block_size);
  if (a.max_blocks != b.max_blocks) return num("max_blocks", a.max_blocks, b.max_blocks);
  if (a.free_blocks != b.free_blocks) return num("free_blocks", a.free_blocks, b.free_blocks);
  if (a.resident_prefix_blocks != b.resident_prefix_blocks) {
    return num("resident_prefix_blocks", a.resident_prefix_blocks, b.resident_prefix_blocks);
  }
  if (a.step != b.step) return num("step", a.step, b.step);
  if (a.waiting.size() != b.waiting.size()) {
    return num("waiting count", a.waiting.size(), b.waiting.size());
  }
  if (a.active.size() != b.active.size()) {
    return num("active count", a.active.size(), b.active.size());
  }
  for (size_t i = 0; i < a.waiting.size(); ++i) {
    if (!(a.waiting[i] == b.waiting[i])) {
      return format("waiting entry %zu (request %llu) differs from request %llu's entry", i,
                    static_cast<unsigned long long>(a.waiting[i].spec.id),
                    static_cast<unsigned long long>(b.waiting[i].spec.id));
    }
  }
  for (size_t i = 0; i < a.active.size(); ++i) {
    if (!(a.active[i] == b.active[i])) {
      return format("active entry %zu (request %llu) differs from request %llu's entry", i,
                    static_cast<unsigned long long>(a.active[i].spec.id),
                    static_cast<unsigned long long>(b.active[i].spec.id));
    }
  }
  return std::string();
}

namespace {

struct RunCandidate {
  uint32_t service_wait;
  uint64_t order;
  uint64_t id;
  int32_t seq_len;  // at the step (admitted: initial context)
};

}  // namespace

Decision plan(const SchedulerConfig &config, std::shared_ptr<const Snapshot> snapshot_ptr) {
  validate_scheduler_config(config);
  const Snapshot &snap = *snapshot_ptr;
  const uint32_t bs = snap.block_size;
  snap.validate_pool();

  // 1. Schedulable pool and what is already committed.
  if (config.reserve_blocks >= snap.max_blocks) {
    fail(FD_ERR_INVALID_ARGUMENT, "reserve_blocks %u must be below max_blocks %u",
         config.reserve_blocks, snap.max_blocks);
  }
  const uint64_t schedulable = uint64_t{snap.max_blocks} - config.reserve_blocks;
  if (snap.resident_prefix_blocks > schedulable) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "resident prefix blocks %u exceed the schedulable blocks %llu (max - reserve)",
         snap.resident_prefix_blocks, static_cast<unsigned long long>(schedulable));
  }
  uint64_t committed_before = snap.resident_prefix_blocks;
  for (const ActiveEntry &a : snap.active) committed_before += a.committed_blocks;
  if (committed_before > schedulable) {
    fail(FD_ERR_INVALID_ARGUMENT,
         "committed blocks %llu (resident + active commitments) exceed the schedulable blocks "
         "%llu",
         static_cast<unsigned long long>(committed_before),
         static_cast<unsigned long long>(schedulable));
  }
  if (snap.active.size() > config.max_active_requests) {
    fail(FD_ERR_INVALID_ARGUMENT, "%zu active requests exceed max_active_requests %u",
         snap.active.size(), config.max_active_requests);
  }

  Decision d;
  d.config = config;
  d.free_before = snap.free_blocks;
  d.schedulable = static_cast<uint32_t>(schedulable);
  d.committed_before = static_cast<uint32_t>(committed_before);
  bool r_exceeds = false, r_drain = false, r_active_limit = false, r_deferred = false;

  // 2. Waiting requests in submission order; reject those that can never fit.
  std::vector<const WaitingEntry *> queue;
  queue.reserve(snap.waiting.size());
  for (const WaitingEntry &w : snap.waiting) queue.push_back(&w);
  std::sort(queue.begin(), queue.end(), [](const WaitingEntry *a, const WaitingEntry *b) {
    return a->spec.submission_order < b->spec.submission_order;
  });
  const uint64_t capacity_for_private = schedulable - snap.resident_prefix_blocks;
  std::vector<const WaitingEntry *> eligible;
  eligible.reserve(queue.size());
  for (const WaitingEntry *w : queue) {
    if (private_commitment(w->spec, bs) > capacity_for_private) {
      d.rejected.push_back(w->spec.id);
      r_exceeds = true;
    } else {
      eligible.push_back(w);
    }
  }

  // 3. Room left.
  uint64_t remaining = schedulable - committed_before;
  uint64_t slots = config.max_active_requests - snap.active.size();
  std::vector<const WaitingEntry *> admitted;
  std::vector<bool> taken(eligible.size(), false);

  auto admit = [&](size_t i) {
    admitted.push_back(eligible[i]);
    taken[i] = true;
    remaining -= private_commitment(eligible[i]->spec, bs);
    slots -= 1;
  };

  // 4. Aging barrier: the oldest eligible request that waited too long goes
  // first, or nothing is admitted until it fits.
  bool drain = false;
  for (size_t i = 0; i < eligible.size(); ++i) {
    if (eligible[i]->wait_steps < config.aging_threshold_steps) continue;
    if (slots == 0 || private_commitment(eligible[i]->spec, bs) > remaining) {
      drain = true;
      d.has_drain = true;
      d.drain_for_request_id = eligible[i]->spec.id;
      r_drain = true;
    } else {
      admit(i);
    }
    break;
  }

  // 5. FIFO walk; a request that does not fit is skipped so a smaller later
  // one may go.
  if (!drain) {
    for (size_t i = 0; i < eligible.size(); ++i) {
      if (taken[i]) continue;
      if (slots == 0) {
        r_active_limit = true;
        break;
      }
      if (private_commitment(eligible[i]->spec, bs) <= remaining) {
        admit(i);
      } else {
        r_deferred = true;
      }
    }
  }
  for (size_t i = 0; i < eligible.size(); ++i) {
    if (!taken[i]) d.waiting.push_back(eligible[i]->spec.id);
  }

  // 6. Runnable rows: longest service wait first, then submission order.
  std::vector<RunCandidate> candidates;
  candidates.reserve(snap.active.size() + admitted.size());
  for (const ActiveEntry &a : snap.active) {
    candidates.push_back({a.service_wait_steps, a.spec.submission_order, a.spec.id, a.seq_len});
  }
  for (const WaitingEntry *w : admitted) {
    d.admit.push_back(w->spec.id);
    candidates.push_back({0u, w->spec.submission_order, w->spec.id,
                          static_cast<int32_t>(w->spec.initial_context_tokens)});
  }
  std::sort(candidates.begin(), candidates.end(), [](const RunCandidate &a, const RunCandidate &b) {
    if (a.service_wait != b.service_wait) return a.service_wait > b.service_wait;
    return a.order < b.order;
  });
  uint64_t needed = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (i < config.max_batch_requests) {
      d.runnable.push_back(candidates[i].id);
      if (candidates[i].seq_len % static_cast<int32_t>(bs) == 0) needed += 1;
    } else {
      d.deferred.push_back(candidates[i].id);
    }
  }

  // 7. Physical blocks this step allocates, and the guarantees.
  for (const WaitingEntry *w : admitted) needed += private_context_blocks(w->spec, bs);
  const uint64_t committed_after = schedulable - remaining;
  if (committed_after > schedulable || needed > snap.free_blocks) {
    fail(FD_ERR_INTERNAL,
         "scheduler broke its guarantees: committed_after %llu (schedulable %llu), needed %llu "
         "(free %u)",
         static_cast<unsigned long long>(committed_after),
         static_cast<unsigned long long>(schedulable), static_cast<unsigned long long>(needed),
         snap.free_blocks);
  }
  d.committed_after = static_cast<uint32_t>(committed_after);
  d.needed_physical_now = static_cast<uint32_t>(needed);

  // 8. Reasons in their fixed order.
  if (r_exceeds) d.reasons.push_back(FD_REASON_REQUEST_EXCEEDS_CAPACITY);
  if (r_drain) d.reasons.push_back(FD_REASON_AGING_DRAIN);
  if (r_active_limit) d.reasons.push_back(FD_REASON_ACTIVE_LIMIT);
  if (r_deferred) d.reasons.push_back(FD_REASON_CAPACITY_DEFERRED);
  if (!d.admit.empty()) d.reasons.push_back(FD_REASON_ADMITTED);
  if (!d.deferred.empty()) d.reasons.push_back(FD_REASON_BATCH_LIMIT);
  if (d.runnable.empty()) d.reasons.push_back(FD_REASON_IDLE);
  d.snapshot = std::move(snapshot_ptr);
  return d;
}

std::string decision_outcome_difference(const Decision &a, const Decision &b) {
  struct List {
    const char *name;
    const std::vector<uint64_t> &x, &y;
  };
  const List lists[] = {{"admit", a.admit, b.admit},
                        {"runnable", a.runnable, b.runnable},
                        {"deferred", a.deferred, b.deferred},
                        {"waiting", a.waiting, b.waiting},
                        {"rejected", a.rejected, b.rejected}};
  for (const List &l : lists) {
    if (l.x != l.y) return format("%s ids differ", l.name);
  }
  if (a.committed_before != b.committed_before) return "committed_blocks_before differs";
  if (a.committed_after != b.committed_after) return "committed_blocks_after differs";
  if (a.needed_physical_now != b.needed_physical_now) return "needed_physical_blocks_now differs";
  if (a.free_before != b.free_before) return "free_blocks_before differs";
  if (a.schedulable != b.schedulable) return "schedulable_blocks differs";
  if (a.has_drain != b.has_drain || a.drain_for_request_id != b.drain_for_request_id) {
    return "drain_for_request_id differs";
  }
  if (a.reasons != b.reasons) return "reasons differ";
  return std::string();
}

}  // namespace fd
