/* The driver of the cache model test, shared by tests/test_cache_model.cpp
 * (seeded random runs) and tests/fuzz/fuzz_api.cpp (the same operations, with
 * every random choice read from the fuzzer's input): an Episode creates one
 * cache with a random configuration, issues a random mix of valid and invalid
 * calls to it and, in lockstep, to the model in cache_model.hpp, and checks
 * every observable result after each operation (see test_cache_model.cpp for
 * the list of checks). */
#ifndef FD_TESTS_MODEL_CACHE_DRIVER_HPP
#define FD_TESTS_MODEL_CACHE_DRIVER_HPP

#include <algorithm>
#include <cinttypes>
#include <cstddef>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashdec.h"
#include "cache_model.hpp"
#include "kv_shadow.hpp"

namespace fdmodel {

/* ------------------------------------------------------------------------ */
/* Random numbers (splitmix64, so a seed reproduces a run exactly), or, with
 * `bytes` set, every draw read from a byte string (the fuzzer's input): one
 * byte per draw, repeated over the 64 bits so that it decides both the high
 * bits (chance, weighted choices) and the low ones (below); 0 once the string
 * is used up (exhausted() then says so). */
struct Rng {
  uint64_t state;
  const uint8_t *bytes = nullptr;
  size_t size = 0, pos = 0;
  bool exhausted() const { return bytes != nullptr && pos >= size; }
  uint64_t next() {
    if (bytes != nullptr) return pos < size ? bytes[pos++] * 0x0101010101010101ull : 0;
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  uint32_t below32(uint64_t n) { return static_cast<uint32_t>(below(n)); }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  template <class T>
  const T &pick(const std::vector<T> &v) {
    return v[below(v.size())];
  }
};

/* ------------------------------------------------------------------------ */
/* Statistics: statuses by operation kind. */
enum OpKind {
  kOpAdd,
  kOpFinish,
  kOpCancel,
  kOpBegin,
  kOpWrite,
  kOpWriteRope,
  kOpCommit,
  kOpAbort,
  kOpAppend,
  kOpRegister,
  kOpAttach,
  kOpEvict,
  kOpTxQuery,
  kOpCacheQuery,
  kOpCommitKeep,
  kOpTruncate,
  kOpKinds
};
inline constexpr const char *kOpNames[kOpKinds] = {
    "add",    "finish",   "cancel", "begin", "write",   "rope",  "commit", "abort",
    "append", "register", "attach", "evict", "txquery", "query", "keep",   "truncate"};
constexpr int kStatusSlots = 13;
inline constexpr const char *kStatusShort[kStatusSlots] = {
    "OK",    "ARG", "OOB", "NF",  "STATE",  "STALE", "UNSUP",
    "NODEV", "DEV", "OOM", "INT", "EXISTS", "INV"};

struct Stats {
  uint64_t n[kOpKinds][kStatusSlots] = {};
  uint64_t ops = 0, episodes = 0, storage_checks = 0;
  /* Rare paths: model events summed over caches, and handle kinds used. */
  uint64_t multi_block_releases = 0, lru_evictions = 0, history_drops = 0;
  uint64_t handles[7] = {};  // by HandleKind
  void add(OpKind k, fd_status s) {
    const int i = static_cast<int>(s);
    ++n[k][i >= 0 && i < kStatusSlots ? i : kStatusSlots - 1];
  }
  std::string line() const {
    std::string out = " events{multi_block_releases:" + dec(multi_block_releases) +
                      ",lru_evictions:" + dec(lru_evictions) +
                      ",history_drops:" + dec(history_drops) + "} handles{";
    static const char *const kKinds[7] = {"open",           "stale_open", "committed",   "aborted",
                                          "stale_finished", "dropped",    "never_issued"};
    for (int i = 0; i < 7; ++i)
      out += std::string(i ? "," : "") + kKinds[i] + ":" + dec(handles[i]);
    out += "}";
    for (int k = 0; k < kOpKinds; ++k) {
      out += " ";
      out += kOpNames[k];
      out += "{";
      bool first = true;
      for (int s = 0; s < kStatusSlots; ++s) {
        if (n[k][s] == 0) continue;
        if (!first) out += ",";
        first = false;
        out += std::string(kStatusShort[s]) + ":" + dec(n[k][s]);
      }
      out += "}";
    }
    return out;
  }
};

inline std::string status_name(fd_status s) {
  return fd_status_string(s);
}

inline std::string ids_str(const std::vector<uint64_t> &ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + dec(ids[i]);
  return s + "]";
}
template <class T>
inline std::string vec_str(const std::vector<T> &v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}
inline std::string tx_str(fd_tx t) {
  return "{id " + dec(t.id) + ", version " + dec(t.cache_version) + "}";
}

/* ------------------------------------------------------------------------ */
/* One cache instance with a random configuration, driven for a number of
 * operations. */
class Episode {
 public:
  Episode(uint64_t seed, uint64_t episode, Rng &rng, Stats &stats, bool trace)
      : seed_(seed), episode_(episode), rng_(rng), stats_(stats), trace_(trace) {}
  ~Episode() {
    if (model_) {
      stats_.multi_block_releases += m().events().multi_block_releases;
      stats_.lru_evictions += m().events().lru_evictions;
      stats_.history_drops += m().events().history_drops;
    }
    fd_cache_destroy(cache_);
  }
  Episode(const Episode &) = delete;
  Episode &operator=(const Episode &) = delete;

  bool setup() {
    fd_cache_config c;
    fd_cache_config_init(&c);
    c.num_layers = rng_.chance(0.45) ? 1 : 2 + rng_.below32(3);
    c.num_kv_heads = 1 + rng_.below32(3);
    static const uint32_t kDims[] = {1, 2, 3, 4, 6, 8};
    c.head_dim = kDims[rng_.below(6)];
    c.block_size = 1 + rng_.below32(8);
    /* Mostly tiny pools, so capacity pressure is constant; sometimes a wider
     * one with more requests and bigger batches. */
    const bool wide = rng_.chance(0.15);
    c.max_blocks = wide ? 17 + rng_.below32(48) : 2 + rng_.below32(15);
    c.prefix_cache_capacity_blocks = rng_.chance(0.3) ? 0 : 1 + rng_.below32(c.max_blocks);
    static const int32_t kTypes[] = {FD_DTYPE_F32, FD_DTYPE_F16, FD_DTYPE_BF16};
    c.dtype = kTypes[rng_.below(3)];
    c.layout = rng_.chance(0.5) ? FD_LAYOUT_TOKEN_MAJOR : FD_LAYOUT_DIM_MAJOR;
    max_active_ = wide ? 8 + rng_.below32(9) : 2 + rng_.below32(7);
    max_batch_ = wide ? 8 : 5;
    config_desc_ = "layers " + dec(c.num_layers) + ", kv_heads " + dec(c.num_kv_heads) +
                   ", head_dim " + dec(c.head_dim) + ", block_size " + dec(c.block_size) +
                   ", max_blocks " + dec(c.max_blocks) + ", prefix_capacity " +
                   dec(c.prefix_cache_capacity_blocks) + ", dtype " + std::to_string(c.dtype) +
                   ", layout " + std::to_string(c.layout);
    desc_ = "fd_cache_create(" + config_desc_ + ")";
    const fd_status s = fd_cache_create(&c, &cache_);
    if (s != FD_OK)
      return mismatch("expected FD_OK, got " + status_name(s) + ": " + fd_last_error_message());
    fd_cache_config got;
    std::memset(&got, 0, sizeof got);
    got.struct_size = sizeof got;
    if (fd_cache_get_config(cache_, &got) != FD_OK || std::memcmp(&got, &c, sizeof c) != 0)
      return mismatch("fd_cache_get_config does not return the configuration given to create");
    model_.emplace(c);
    shadow_.emplace(c);
    if (fd_cache_state_version(cache_, &version_) != FD_OK)
      return mismatch("fd_cache_state_version failed");
    ++stats_.episodes;
    return verify();
  }

  /* Runs `count` operations; false on the first disagreement. */
  bool run(uint64_t count) {
    for (uint64_t i = 0; i < count; ++i)
      if (!run_op()) return false;
    return check_storage();
  }

  /* One operation and the checks after it (the whole K/V storage every 97
   * operations); false on a disagreement. */
  bool run_op() {
    ++op_index_;
    ++stats_.ops;
    expect_version_ = VersionChange::kSame;
    if (!step()) return false;
    if (trace_)
      std::printf("  [%" PRIu64 "] %s -> %s\n", op_index_, desc_.c_str(), last_status_.c_str());
    recent_.push_back(desc_ + " -> " + last_status_);
    if (recent_.size() > 24) recent_.pop_front();
    if (!verify()) return false;
    return op_index_ % 97 != 0 || check_storage();
  }

  /* Compares the whole K/V storage with the shadow copy. */
  bool check_storage() {
    ++stats_.storage_checks;
    const std::string d = shadow_->compare(cache_);
    if (!d.empty()) return mismatch("stored data differs: " + d);
    return true;
  }

  /* Also issues calls with arguments outside the contract the test keeps to:
   * NULL handles, misaligned arrays, too-small outputs, huge counts (see
   * op_abuse). Off by default: the seeded test's choices stay as they were. */
  void set_abuse(bool on) { abuse_ = on; }

  const std::string &failure() const { return failure_; }

 private:
  enum class Outcome { kMismatch, kFailedAsExpected, kSucceeded };

  const CacheModel &m() const { return *model_; }
  CacheModel &m() { return *model_; }
  uint32_t L() const { return m().config().num_layers; }
  uint32_t H() const { return m().config().num_kv_heads; }
  uint32_t D() const { return m().config().head_dim; }
  uint32_t T() const { return m().config().block_size; }
  int32_t dtype() const { return m().config().dtype; }

  bool mismatch(const std::string &what) {
    if (!failure_.empty()) return false;
    failure_ = "cache model mismatch: seed " + dec(seed_) + ", episode " + dec(episode_) +
               ", operation " + dec(op_index_) + "\n  cache: " + config_desc_ +
               "\n  call: " + desc_ + "\n  " + what + "\n  last operations (oldest first):";
    for (const std::string &r : recent_) failure_ += "\n    " + r;
    return false;
  }

  /* Compares a status with the model's faults and applies the reported
   * fault's counter effects. */
  Outcome settle(OpKind kind, fd_status s, const std::vector<Fault> &faults) {
    stats_.add(kind, s);
    last_status_ = status_name(s);
    if (faults.empty()) {
      if (s == FD_OK) return Outcome::kSucceeded;
      mismatch("expected FD_OK, got " + status_name(s) + ": \"" + fd_last_error_message() + "\"");
      return Outcome::kMismatch;
    }
    std::string expected;
    for (const Fault &f : faults)
      expected += "\n    " + status_name(f.status) +
                  (f.must_contain.empty() ? "" : " with \"" + f.must_contain + "\"");
    if (s == FD_OK) {
      mismatch("expected a failure, one of:" + expected + "\n  got FD_OK");
      return Outcome::kMismatch;
    }
    const std::string msg = fd_last_error_message();
    last_status_ += " (" + msg + ")";
    const Fault *chosen = nullptr;
    for (const Fault &f : faults) {
      if (f.status != s || msg.empty() || msg.find(f.must_contain) == std::string::npos) continue;
      if (chosen == nullptr) chosen = &f;
      if (!f.key.empty() && msg.find(f.key) != std::string::npos) {
        chosen = &f;
        break;
      }
    }
    if (chosen == nullptr) {
      mismatch("expected one of:" + expected + "\n  got " + status_name(s) + ": \"" + msg + "\"");
      return Outcome::kMismatch;
    }
    m().apply_effects(chosen->effects);
    return Outcome::kFailedAsExpected;
  }

  /* ---------------------------------------------------------------------- */
  /* Choosing arguments. */
  uint64_t new_id() { return next_request_id_++; }
  uint64_t unknown_id() { return 9000000000ull + rng_.below(1000); }
  uint64_t pick_active() {
    const std::vector<uint64_t> a = m().active_ids();
    return a.empty() ? new_id() : rng_.pick(a);
  }
  uint64_t pick_terminal() { return terminal_.empty() ? unknown_id() : rng_.pick(terminal_); }
  /* A random id that makes a call invalid: unknown, terminal or fresh. */
  uint64_t pick_bad_id() {
    switch (rng_.below(3)) {
      case 0: return unknown_id();
      case 1: return pick_terminal();
      default: return terminal_.empty() ? unknown_id() : pick_terminal();
    }
  }
  std::vector<uint64_t> pick_active_batch() {
    std::vector<uint64_t> a = m().active_ids();
    for (size_t i = a.size(); i > 1; --i) std::swap(a[i - 1], a[rng_.below(i)]);
    const size_t n = a.empty() ? 0 : 1 + rng_.below(std::min<size_t>(a.size(), max_batch_));
    a.resize(n);
    return a;
  }
  std::string prefix_name(uint64_t k) {
    std::string s = "sys_";
    s += static_cast<char>('a' + k % 26);
    if (k >= 26) s += static_cast<char>('a' + (k / 26) % 26);
    return s;
  }
  std::string pick_prefix_id() {
    if (!m().prefixes().empty() && rng_.chance(0.6)) {
      auto it = m().prefixes().begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng_.below(m().prefixes().size())));
      return it->first;
    }
    return prefix_name(rng_.below(8));
  }
  fd_tx current_handle() const { return fd_tx{m().tx()->id, m().tx()->version}; }
  /* Counts the kind of handle a transaction call uses. */
  void note_handle(fd_tx h) { ++stats_.handles[static_cast<int>(m().classify(h))]; }
  /* A handle that does not name the open transaction in a valid way. */
  fd_tx pick_bad_handle() {
    const uint64_t next = m().next_tx_id();
    switch (rng_.below(6)) {
      case 0:  // an issued handle: committed, aborted, or dropped from history
      case 1:
        if (!issued_.empty()) return rng_.pick(issued_);
        break;
      case 2:  // stale: right id, wrong version
        if (m().tx()) return fd_tx{m().tx()->id, m().tx()->version + 1 + rng_.below(3)};
        if (!issued_.empty()) {
          fd_tx t = rng_.pick(issued_);
          t.cache_version ^= 1 + rng_.below(4);
          return t;
        }
        break;
      case 3: return fd_tx{next + rng_.below(3), version_};  // never issued
      case 4: return fd_tx{0, 0};
      default: break;
    }
    if (!issued_.empty() && m().history().size() == kHistoryLimit) {
      /* Dropped from the bounded history. */
      const uint64_t oldest = m().history().front().id;
      if (oldest > 1) return fd_tx{1 + rng_.below(oldest - 1), version_};
    }
    return fd_tx{next + 10, 1};
  }

  /* K/V of `rows` rows, [rows, H, D], distinct exact values. */
  Buffer make_kv(size_t rows, uint64_t tag) const {
    Buffer b(dtype(), std::max<size_t>(rows, 1) * H() * D());
    for (size_t r = 0; r < rows; ++r)
      for (uint32_t h = 0; h < H(); ++h)
        for (uint32_t d = 0; d < D(); ++d) b.set((r * H() + h) * D() + d, test_value(tag, r, h, d));
    return b;
  }

  /* ---------------------------------------------------------------------- */
  /* Operation choice. */
  bool step() { return m().tx() ? step_in_transaction() : step_idle(); }

  bool step_idle() {
    const size_t active = m().active_ids().size();
    const bool full = m().free_list().empty();
    const bool enabled = m().prefixes_enabled();
    const double w[] = {
        active < max_active_ ? 10.0 : 0.5,  // 0 add new
        1.0,                                // 1 add existing (active or terminal)
        3.0 + (full ? 5.0 : 0.0),           // 2 finish
        2.0 + (full ? 4.0 : 0.0),           // 3 cancel
        1.0,                                // 4 finish/cancel of a bad id
        active > 0 ? 18.0 : 0.0,            // 5 begin
        2.0,                                // 6 invalid begin
        L() == 1 ? 12.0 : 0.5,              // 7 append
        1.0,                                // 8 invalid append
        enabled ? 3.0 : 0.3,                // 9 register
        enabled ? 5.0 : 0.3,                // 10 attach
        enabled ? 1.5 : 0.2,                // 11 evict
        2.0,                                // 12 old handles
        2.0,                                // 13 cache queries
        abuse_ ? 3.0 : 0.0,                 // 14 arguments outside the contract
        active > 0 ? 4.0 : 0.0,             // 15 truncate
    };
    switch (choose(w, sizeof w / sizeof w[0])) {
      case 0: return op_add(new_id());
      case 1:
        return op_add(rng_.chance(0.5) || terminal_.empty() ? pick_active() : pick_terminal());
      case 2: return op_close(pick_active(), true);
      case 3: return op_close(pick_active(), false);
      case 4: return op_close(pick_bad_id(), rng_.chance(0.5));
      case 5: {
        const std::vector<uint64_t> ids = pick_active_batch();
        if (rng_.chance(0.5)) return op_begin(ids, false);
        const std::vector<uint32_t> counts = pick_counts(ids.size());
        return op_begin(ids, false, &counts);
      }
      case 6: return op_begin_invalid();
      case 7: return op_append(pick_active_batch(), false);
      case 8: return op_append_invalid();
      case 9: return op_register_random();
      case 10: return op_attach_random();
      case 11: return op_evict_random();
      case 12: return op_handle_random(pick_bad_handle());
      case 14: return op_abuse();
      case 15: return op_truncate_random();
      default: return op_query();
    }
  }

  /* Token counts of a multi-token begin: 1 .. 2 * block_size + 1 each, so
   * that rows cross zero, one or two block boundaries. */
  std::vector<uint32_t> pick_counts(size_t n) {
    std::vector<uint32_t> k(n);
    for (uint32_t &x : k) x = 1 + rng_.below32(2 * T() + 1);
    return k;
  }

  bool step_in_transaction() {
    const OpenTx &t = *m().tx();
    const bool all_written = t.next_layer == L();
    const double w[] = {
        all_written ? 0.0 : 40.0,  // 0 write the next layer
        3.0,                       // 1 invalid write
        all_written ? 20.0 : 1.0,  // 2 commit (early when not all written)
        4.0,                       // 3 abort
        3.0,                       // 4 view queries
        3.0,                       // 5 forbidden mutation
        2.0,                       // 6 bad handles
        1.0,                       // 7 cache queries
        abuse_ ? 3.0 : 0.0,        // 8 arguments outside the contract
    };
    switch (choose(w, sizeof w / sizeof w[0])) {
      case 0:
        return rng_.chance(0.3) && D() >= 2 ? op_write_rope(current_handle(), t.next_layer, 0)
                                            : op_write(current_handle(), t.next_layer, 0);
      case 1: return op_write_invalid();
      case 2: return rng_.chance(0.5) ? op_commit(current_handle()) : op_commit_keep_random(false);
      case 3: return rng_.chance(0.8) ? op_abort(current_handle()) : op_commit_keep_random(true);
      case 4: return op_view(current_handle());
      case 5: return op_forbidden();
      case 6: return op_handle_random(pick_bad_handle());
      case 8: return op_abuse();
      default: return op_query();
    }
  }

  size_t choose(const double *w, size_t n) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += w[i];
    double x = static_cast<double>(rng_.next() >> 11) * 0x1.0p-53 * total;
    for (size_t i = 0; i < n; ++i) {
      if (x < w[i]) return i;
      x -= w[i];
    }
    while (n > 1 && w[n - 1] <= 0.0) --n;  // rounding: the last choice that has a weight
    return n - 1;
  }

  /* ---------------------------------------------------------------------- */
  /* Requests. */
  bool op_add(uint64_t id) {
    desc_ = "fd_cache_add_request(" + dec(id) + ")";
    const std::vector<Fault> f = m().faults_add(id);
    const Outcome o = settle(kOpAdd, fd_cache_add_request(cache_, id), f);
    if (o == Outcome::kSucceeded) expect_version_ = m().apply_add(id);
    return o != Outcome::kMismatch;
  }

  bool op_close(uint64_t id, bool finish) {
    desc_ = std::string(finish ? "fd_cache_finish_request(" : "fd_cache_cancel_request(") +
            dec(id) + ")";
    const std::vector<Fault> f = m().faults_close(id);
    const fd_status s =
        finish ? fd_cache_finish_request(cache_, id) : fd_cache_cancel_request(cache_, id);
    const Outcome o = settle(finish ? kOpFinish : kOpCancel, s, f);
    if (o == Outcome::kSucceeded) {
      expect_version_ = m().apply_close(id, finish);
      terminal_.push_back(id);
    }
    return o != Outcome::kMismatch;
  }

  /* ---------------------------------------------------------------------- */
  /* Transactions. */
  /* `counts`: NULL for fd_tx_begin, else fd_tx_begin_multi's token counts
   * (one per id). */
  bool op_begin(const std::vector<uint64_t> &ids, bool null_ids,
                const std::vector<uint32_t> *counts = nullptr) {
    desc_ = std::string(counts ? "fd_tx_begin_multi(" : "fd_tx_begin(") +
            (null_ids ? std::string("NULL") : ids_str(ids)) +
            (counts ? ", token_counts " + vec_str(*counts) : std::string()) + ", count " +
            dec(ids.size()) + ")";
    std::vector<Fault> f;
    if (null_ids) {
      f.push_back({FD_ERR_INVALID_ARGUMENT, "", "",
                   reading::kEveryFailedBeginCounts ? kTxFailure : kNoEffect});
    } else {
      f = m().faults_begin(ids, counts ? *counts : std::vector<uint32_t>{});
    }
    const uint64_t dummy = 0;
    const uint32_t dummy_count = 1;
    fd_tx tx{0xdeadbeefull, 0xfeedull};
    const uint64_t *id_ptr = null_ids ? nullptr : (ids.empty() ? &dummy : ids.data());
    const fd_status s =
        counts ? fd_tx_begin_multi(cache_, id_ptr, counts->empty() ? &dummy_count : counts->data(),
                                   static_cast<uint32_t>(ids.size()), &tx)
               : fd_tx_begin(cache_, id_ptr, static_cast<uint32_t>(ids.size()), &tx);
    const Outcome o = settle(kOpBegin, s, f);
    if (o == Outcome::kMismatch) return false;
    if (o == Outcome::kFailedAsExpected) {
      if (tx.id != 0xdeadbeefull || tx.cache_version != 0xfeedull)
        return mismatch("failed begin wrote its out-pointer");
      return true;
    }
    const uint64_t expected_id = m().next_tx_id();
    m().apply_begin(ids, counts ? *counts : std::vector<uint32_t>{});
    expect_version_ = m().begin_version_change();
    if (tx.id != expected_id)
      return mismatch("begin returned transaction id " + dec(tx.id) + ", expected " +
                      dec(expected_id));
    uint64_t now = 0;
    fd_cache_state_version(cache_, &now);
    if (tx.cache_version != now)
      return mismatch("handle cache_version " + dec(tx.cache_version) +
                      " != state version right after begin " + dec(now));
    m().set_tx_version(tx.cache_version);
    issued_.push_back(tx);
    return true;
  }

  bool op_begin_invalid() {
    switch (rng_.below(6)) {
      case 0: return op_begin({}, false);
      case 4: {  // a row of zero tokens
        std::vector<uint64_t> ids = pick_active_batch();
        if (ids.empty()) ids.push_back(pick_active());
        std::vector<uint32_t> counts = pick_counts(ids.size());
        counts[rng_.below(counts.size())] = 0;
        return op_begin(ids, false, &counts);
      }
      case 1: return op_begin({pick_active()}, true);
      case 2: {
        std::vector<uint64_t> ids = pick_active_batch();
        if (ids.empty()) ids.push_back(new_id());
        ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(rng_.below(ids.size() + 1)),
                   ids[rng_.below(ids.size())]);
        return op_begin(ids, false);
      }
      default: {
        std::vector<uint64_t> ids = pick_active_batch();
        ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(rng_.below(ids.size() + 1)),
                   pick_bad_id());
        return op_begin(ids, false);
      }
    }
  }

  /* Plain layer write. `bad`: 0 valid arguments, 1 NULL k, 2 NULL v. */
  bool op_write(fd_tx h, uint32_t layer, int bad) {
    const bool open = m().classify(h) == HandleKind::kOpen;
    const size_t rows = open ? m().tx()->tokens() : 16;
    const uint64_t tag = ++tag_;
    Buffer k = make_kv(rows, tag), v = make_kv(rows, tag + 7777);
    desc_ = "fd_tx_write_layer(" + tx_str(h) + ", layer " + dec(layer) + ", k " +
            (bad == 1 ? "NULL" : "ok") + ", v " + (bad == 2 ? "NULL" : "ok") + ")";
    note_handle(h);
    const std::vector<Fault> f = m().faults_write(h, layer, bad != 0);
    const fd_status s = fd_tx_write_layer(cache_, h, layer, bad == 1 ? nullptr : k.data(),
                                          bad == 2 ? nullptr : v.data(), nullptr);
    const Outcome o = settle(kOpWrite, s, f);
    if (o != Outcome::kSucceeded) return o != Outcome::kMismatch;
    record_rows(layer, k, v, nullptr);
    m().apply_write();
    return true;
  }

  struct RopeArgs {
    uint32_t group = 1, rotary_dim = 2;
    float base = 10000.0f;
    bool null_q = false, null_q_out = false, null_k = false, in_place = false;
    uint32_t heads_override = 0;  // non-zero: pass this num_q_heads
    bool zero_heads = false;
  };

  /* RoPE layer write. `bad`: 0 valid, else one invalid argument. */
  bool op_write_rope(fd_tx h, uint32_t layer, int bad) {
    RopeArgs a;
    a.group = 1 + rng_.below32(3);
    a.rotary_dim = 2 * (1 + rng_.below32(std::max<uint32_t>(D() / 2, 1)));
    static const float kBases[] = {10000.0f, 500.0f, 1000000.0f, 1.5f};
    a.base = kBases[rng_.below(4)];
    a.in_place = rng_.chance(0.5);
    std::string what = "ok";
    switch (bad) {
      case 0: break;
      case 1:
        a.rotary_dim = rng_.chance(0.5) ? 0 : (D() % 2 == 1 ? D() : D() + 1);
        what = "rotary_dim";
        break;
      case 2:
        a.rotary_dim = D() + 2 - (D() % 2);
        what = "rotary_dim > head_dim";
        break;
      case 3: {
        static const float kBadBases[] = {0.0f, -2.0f, std::numeric_limits<float>::quiet_NaN(),
                                          std::numeric_limits<float>::infinity()};
        a.base = kBadBases[rng_.below(4)];
        what = "base";
        break;
      }
      case 4:
        if (H() > 1)
          a.heads_override = H() * a.group + 1;
        else
          a.zero_heads = true;
        what = "num_q_heads";
        break;
      case 5:
        a.null_q = true;
        what = "q NULL";
        break;
      case 6:
        a.null_q_out = true;
        a.in_place = false;
        what = "q_out NULL";
        break;
      default:
        a.null_k = true;
        what = "k NULL";
        break;
    }
    const uint32_t hq = a.zero_heads ? 0 : (a.heads_override ? a.heads_override : H() * a.group);
    const bool open = m().classify(h) == HandleKind::kOpen;
    const size_t rows = open ? m().tx()->tokens() : 16;
    const uint64_t tag = ++tag_;
    Buffer k = make_kv(rows, tag), v = make_kv(rows, tag + 7777);
    Buffer q(dtype(), std::max<size_t>(rows, 1) * std::max<uint32_t>(hq, 1) * D());
    for (size_t i = 0; i < q.size(); ++i) q.set(i, test_value(tag + 3333, i, 0, 0));
    const Buffer q_in = q;
    Buffer q_out(dtype(), q.size());
    for (size_t i = 0; i < q_out.size(); ++i) q_out.set(i, 77.0f);  // sentinel
    const Buffer q_out_before = q_out;
    void *out_ptr = a.null_q_out ? nullptr : (a.in_place ? q.data() : q_out.data());
    desc_ = "fd_tx_write_layer_rope(" + tx_str(h) + ", layer " + dec(layer) + ", num_q_heads " +
            dec(hq) + ", rotary_dim " + dec(a.rotary_dim) + ", base " + std::to_string(a.base) +
            (a.in_place ? ", in place" : "") + ", args " + what + ")";
    note_handle(h);
    const std::vector<Fault> f = m().faults_write(h, layer, bad != 0);
    const fd_status s = fd_tx_write_layer_rope(cache_, h, layer, a.null_q ? nullptr : q.data(), hq,
                                               a.null_k ? nullptr : k.data(), v.data(),
                                               a.rotary_dim, a.base, out_ptr, nullptr);
    const Outcome o = settle(kOpWriteRope, s, f);
    if (o == Outcome::kMismatch) return false;
    if (o == Outcome::kFailedAsExpected) {
      if (q.bytes != q_in.bytes) return mismatch("failed rope write changed q (in place)");
      if (q_out.bytes != q_out_before.bytes) return mismatch("failed rope write wrote q_out");
      return true;
    }
    /* Expected rotated Q. */
    const OpenTx &t = *m().tx();
    const Buffer &got_q = a.in_place ? q : q_out;
    std::vector<float> x(D());
    for (size_t r = 0; r < rows; ++r)
      for (uint32_t hh = 0; hh < hq; ++hh) {
        const size_t base = (r * hq + hh) * D();
        for (uint32_t d = 0; d < D(); ++d) x[d] = q_in.get(base + d);
        rope_reference(x.data(), a.rotary_dim, t.positions[r], a.base);
        for (uint32_t d = 0; d < D(); ++d) {
          const float g = got_q.get(base + d);
          if (!(std::fabs(g - x[d]) <= rope_tolerance(x[d])))
            return mismatch("rotated q[row " + dec(r) + ", head " + dec(hh) + ", dim " + dec(d) +
                            "] = " + std::to_string(g) + ", expected " + std::to_string(x[d]) +
                            " (position " + std::to_string(t.positions[r]) + ")");
        }
      }
    record_rows(layer, k, v, &a);
    m().apply_write();
    return true;
  }

  /* Shadow of a successful layer write: token r (packed in row order) goes
   * to the model's (block, offset) of that token. */
  void record_rows(uint32_t layer, const Buffer &k, const Buffer &v, const RopeArgs *rope) {
    const OpenTx &t = *m().tx();
    std::vector<float> x(D());
    for (size_t r = 0; r < t.tokens(); ++r)
      for (uint32_t h = 0; h < H(); ++h) {
        const size_t base = (r * H() + h) * D();
        for (uint32_t d = 0; d < D(); ++d) x[d] = k.get(base + d);
        if (rope != nullptr) rope_reference(x.data(), rope->rotary_dim, t.positions[r], rope->base);
        for (uint32_t d = 0; d < D(); ++d) {
          shadow_->set(0, layer, t.block_ids[r], h, t.offsets[r], d, x[d], rope != nullptr);
          shadow_->set(1, layer, t.block_ids[r], h, t.offsets[r], d, v.get(base + d), false);
        }
      }
  }

  bool op_write_invalid() {
    const OpenTx &t = *m().tx();
    switch (rng_.below(5)) {
      case 0: {  // wrong layer
        uint32_t layer = rng_.below32(L() + 1);
        if (layer == t.next_layer && t.next_layer < L()) layer = (layer + 1) % (L() + 1);
        return rng_.chance(0.5) || D() < 2 ? op_write(current_handle(), layer, 0)
                                           : op_write_rope(current_handle(), layer, 0);
      }
      case 1: return op_write(current_handle(), t.next_layer, rng_.chance(0.5) ? 1 : 2);
      case 2:
        if (D() >= 2) return op_write_rope(current_handle(), t.next_layer, 1 + rng_.below32(7));
        return op_write(current_handle(), t.next_layer, 1);
      default: {  // stale handle
        fd_tx h = current_handle();
        h.cache_version += 1 + rng_.below(5);
        return op_write(h, t.next_layer, 0);
      }
    }
  }

  bool op_commit(fd_tx h) {
    desc_ = "fd_tx_commit(" + tx_str(h) + ")";
    note_handle(h);
    const std::vector<Fault> f = m().faults_commit(h);
    const Outcome o = settle(kOpCommit, fd_tx_commit(cache_, h), f);
    if (o == Outcome::kSucceeded) expect_version_ = m().apply_commit();
    return o != Outcome::kMismatch;
  }

  bool op_abort(fd_tx h) {
    desc_ = "fd_tx_abort(" + tx_str(h) + ")";
    note_handle(h);
    const std::vector<Fault> f = m().faults_abort(h);
    const Outcome o = settle(kOpAbort, fd_tx_abort(cache_, h), f);
    if (o == Outcome::kSucceeded) expect_version_ = m().apply_abort();
    return o != Outcome::kMismatch;
  }

  /* fd_tx_commit_keep with valid keeps (0 .. k per row, often all or none),
   * or, with `invalid`, a keep above its row's count or a wrong count. */
  bool op_commit_keep(fd_tx h, const std::vector<uint32_t> &keep) {
    desc_ = "fd_tx_commit_keep(" + tx_str(h) + ", keep " + vec_str(keep) + ")";
    note_handle(h);
    const std::vector<Fault> f = m().faults_commit_keep(h, keep);
    const uint32_t dummy = 0;
    const Outcome o = settle(kOpCommitKeep,
                             fd_tx_commit_keep(cache_, h, keep.empty() ? &dummy : keep.data(),
                                               static_cast<uint32_t>(keep.size())),
                             f);
    if (o == Outcome::kSucceeded) expect_version_ = m().apply_commit_keep(keep);
    return o != Outcome::kMismatch;
  }

  bool op_commit_keep_random(bool invalid) {
    const OpenTx &t = *m().tx();
    std::vector<uint32_t> keep(t.counts.size());
    for (size_t i = 0; i < keep.size(); ++i) {
      switch (rng_.below(4)) {
        case 0: keep[i] = 0; break;
        case 1: keep[i] = t.counts[i]; break;
        default: keep[i] = rng_.below32(t.counts[i] + 1);
      }
    }
    if (invalid) {
      if (rng_.chance(0.5)) {
        const size_t i = rng_.below(keep.size());
        keep[i] = t.counts[i] + 1 + rng_.below32(3);
      } else if (rng_.chance(0.5)) {
        keep.push_back(1);
      } else {
        keep.pop_back();
      }
    }
    return op_commit_keep(current_handle(), keep);
  }

  bool op_truncate(const std::vector<uint64_t> &ids, const std::vector<int32_t> &lens) {
    desc_ = "fd_cache_truncate(" + ids_str(ids) + ", seq_lens " + vec_str(lens) + ")";
    const std::vector<Fault> f = m().faults_truncate(ids, lens);
    const uint64_t dummy = 0;
    const int32_t dummy_len = 0;
    const Outcome o = settle(kOpTruncate,
                             fd_cache_truncate(cache_, ids.empty() ? &dummy : ids.data(),
                                               lens.empty() ? &dummy_len : lens.data(),
                                               static_cast<uint32_t>(ids.size())),
                             f);
    if (o == Outcome::kSucceeded) expect_version_ = m().apply_truncate(ids, lens);
    return o != Outcome::kMismatch;
  }

  /* Mostly valid truncations (random new lengths at or above the prefix,
   * sometimes the current ones); sometimes one invalid entry. */
  bool op_truncate_random() {
    std::vector<uint64_t> ids = pick_active_batch();
    std::vector<int32_t> lens;
    for (uint64_t id : ids) {
      const Request &r = m().requests().at(id);
      const int32_t floor = static_cast<int32_t>(m().prefix_blocks_of(r) * T());
      lens.push_back(rng_.chance(0.2) ? r.seq_len
                                      : floor + static_cast<int32_t>(
                                                    rng_.below(uint64_t(r.seq_len - floor) + 1)));
    }
    if (rng_.chance(0.25)) {
      switch (rng_.below(5)) {
        case 0:  // longer than the request
          if (!ids.empty()) lens[rng_.below(ids.size())] += 1 + rng_.below32(3);
          break;
        case 1:  // negative
          if (!ids.empty()) lens[rng_.below(ids.size())] = -1 - rng_.below32(3);
          break;
        case 2: {  // into the prefix (when one is attached), else an unknown id
          bool done = false;
          for (size_t i = 0; i < ids.size() && !done; ++i) {
            const Request &r = m().requests().at(ids[i]);
            if (!r.prefix.empty()) {
              lens[i] = static_cast<int32_t>(rng_.below(m().prefix_blocks_of(r) * T()));
              done = true;
            }
          }
          if (!done) {
            ids.push_back(unknown_id());
            lens.push_back(0);
          }
          break;
        }
        case 3:  // a bad id
          ids.push_back(pick_bad_id());
          lens.push_back(0);
          break;
        default:  // a duplicate (or an empty list)
          if (!ids.empty()) {
            ids.push_back(ids.front());
            lens.push_back(lens.front());
          } else {
            return op_truncate({}, {});
          }
      }
    }
    return op_truncate(ids, lens);
  }

  /* Any transaction call on a (usually bad) handle. */
  bool op_handle_random(fd_tx h) {
    const uint32_t layer = m().tx() ? m().tx()->next_layer : rng_.below32(L());
    switch (rng_.below(6)) {
      case 0: return op_write(h, layer, 0);
      case 1: return D() >= 2 ? op_write_rope(h, layer, 0) : op_write(h, layer, 0);
      case 2: return op_commit(h);
      case 3: return op_abort(h);
      default: return op_view(h);
    }
  }

  /* get_info / get_rows / block_tables, with valid or too small sizes. */
  bool op_view(fd_tx h) {
    const bool open = m().classify(h) == HandleKind::kOpen;
    const uint32_t batch = open ? static_cast<uint32_t>(m().tx()->ids.size()) : 4;
    note_handle(h);
    std::vector<Fault> f = m().handle_faults(h, true, kNoEffect);
    switch (rng_.below(4)) {
      case 3: {  // per-token view, sometimes with a capacity one too small
        const uint32_t tokens = open ? static_cast<uint32_t>(m().tx()->tokens()) : 4;
        const uint32_t cap = rng_.chance(0.3) ? tokens - 1 : tokens + rng_.below32(2);
        if (open && cap < tokens) f.push_back({FD_ERR_INVALID_ARGUMENT, "capacity", "", kNoEffect});
        desc_ = "fd_tx_get_tokens(" + tx_str(h) + ", capacity " + dec(cap) + ")";
        const size_t n = size_t{tokens} + 2;
        std::vector<int32_t> pos(n, -7), blk(n, -7), off(n, -7);
        const Outcome o = settle(
            kOpTxQuery, fd_tx_get_tokens(cache_, h, cap, pos.data(), blk.data(), off.data()), f);
        if (o == Outcome::kFailedAsExpected) {
          for (size_t i = 0; i < n; ++i)
            if (pos[i] != -7 || blk[i] != -7 || off[i] != -7)
              return mismatch("failed fd_tx_get_tokens wrote its outputs");
          return true;
        }
        return o == Outcome::kMismatch ? false : check_tx_view(h);
      }
      case 0: {
        desc_ = "fd_tx_get_info(" + tx_str(h) + ")";
        fd_tx_info info;
        std::memset(&info, 0xab, sizeof info);
        info.struct_size = sizeof info;
        fd_tx_info before = info;
        const Outcome o = settle(kOpTxQuery, fd_tx_get_info(cache_, h, &info), f);
        if (o == Outcome::kFailedAsExpected && std::memcmp(&info, &before, sizeof info) != 0)
          return mismatch("failed fd_tx_get_info wrote its output");
        return o == Outcome::kMismatch ? false
                                       : (o == Outcome::kSucceeded ? check_tx_view(h) : true);
      }
      case 1: {
        const uint32_t cap = rng_.chance(0.3) && batch > 0 ? batch - 1 : batch + rng_.below32(2);
        if (open && cap < batch) f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});
        desc_ = "fd_tx_get_rows(" + tx_str(h) + ", capacity " + dec(cap) + ")";
        const size_t n = std::max<uint32_t>(cap, 1);
        std::vector<uint64_t> ids(n, 0xabababab);
        std::vector<int32_t> pos(n, -7), blk(n, -7), off(n, -7), eff(n, -7);
        const Outcome o = settle(kOpTxQuery,
                                 fd_tx_get_rows(cache_, h, cap, ids.data(), pos.data(), blk.data(),
                                                off.data(), eff.data()),
                                 f);
        if (o == Outcome::kFailedAsExpected) {
          for (size_t i = 0; i < n; ++i)
            if (ids[i] != 0xabababab || pos[i] != -7 || blk[i] != -7 || off[i] != -7 ||
                eff[i] != -7)
              return mismatch("failed fd_tx_get_rows wrote its outputs");
          return true;
        }
        return o == Outcome::kMismatch ? false : check_tx_view(h);
      }
      default: {
        const uint32_t need = open ? tx_table_width() : 1;
        const uint32_t stride = rng_.chance(0.3) && need > 0 ? need - 1 : need + rng_.below32(2);
        if (open && stride < need) f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});
        desc_ = "fd_tx_block_tables(" + tx_str(h) + ", stride " + dec(stride) + ")";
        std::vector<int32_t> tab(
            size_t{std::max<uint32_t>(batch, 1)} * std::max<uint32_t>(stride, 1), -9);
        const Outcome o = settle(kOpTxQuery, fd_tx_block_tables(cache_, h, stride, tab.data()), f);
        if (o == Outcome::kFailedAsExpected) {
          for (int32_t x : tab)
            if (x != -9) return mismatch("failed fd_tx_block_tables wrote its output");
          return true;
        }
        return o == Outcome::kMismatch ? false : check_tx_view(h);
      }
    }
  }

  /* Largest row of the open transaction's tables (new blocks included). */
  uint32_t tx_table_width() const {
    const OpenTx &t = *m().tx();
    uint32_t w = 0;
    for (size_t r = 0; r < t.ids.size(); ++r) {
      const size_t n = m().requests().at(t.ids[r]).blocks.size() + t.row_new_blocks[r].size();
      w = std::max(w, static_cast<uint32_t>(n));
    }
    return w;
  }

  /* ---------------------------------------------------------------------- */
  /* Legacy append. */
  bool op_append(const std::vector<uint64_t> &ids, bool null_data) {
    const uint64_t tag = ++tag_;
    Buffer k = make_kv(ids.size(), tag), v = make_kv(ids.size(), tag + 7777);
    const uint64_t dummy = 0;
    desc_ = "fd_cache_append(" + ids_str(ids) + ", count " + dec(ids.size()) +
            (null_data ? ", k NULL" : "") + ")";
    const std::vector<Fault> f = m().faults_append(ids, null_data);
    const fd_status s = fd_cache_append(cache_, ids.empty() ? &dummy : ids.data(),
                                        static_cast<uint32_t>(ids.size()),
                                        null_data ? nullptr : k.data(), v.data(), nullptr);
    const Outcome o = settle(kOpAppend, s, f);
    if (o != Outcome::kSucceeded) return o != Outcome::kMismatch;
    const std::vector<std::pair<int32_t, int32_t>> where = m().apply_append(ids);
    expect_version_ = VersionChange::kGrows;
    for (size_t r = 0; r < ids.size(); ++r)
      for (uint32_t h = 0; h < H(); ++h)
        for (uint32_t d = 0; d < D(); ++d) {
          const size_t i = (r * H() + h) * D() + d;
          shadow_->set(0, 0, where[r].first, h, where[r].second, d, k.get(i), false);
          shadow_->set(1, 0, where[r].first, h, where[r].second, d, v.get(i), false);
        }
    return true;
  }

  bool op_append_invalid() {
    switch (rng_.below(4)) {
      case 0: return op_append({}, false);
      case 1: return op_append(pick_active_batch(), true);
      case 2: {
        std::vector<uint64_t> ids = pick_active_batch();
        if (ids.empty()) ids.push_back(new_id());
        ids.push_back(ids.front());
        return op_append(ids, false);
      }
      default: {
        std::vector<uint64_t> ids = pick_active_batch();
        ids.push_back(pick_bad_id());
        return op_append(ids, false);
      }
    }
  }

  /* ---------------------------------------------------------------------- */
  /* Shared prefixes. */
  bool op_register(const char *id, uint32_t n, bool null_data) {
    const uint64_t tag = ++tag_;
    const size_t per_block = size_t{H()} * T() * D();
    const size_t nb = std::max<uint32_t>(n, 1);
    Buffer k(dtype(), size_t{L()} * nb * per_block), v(dtype(), size_t{L()} * nb * per_block);
    const bool dim_major = m().config().layout == FD_LAYOUT_DIM_MAJOR;
    /* Element (layer, block j, head, token, dim) of the input. */
    auto at = [&](uint32_t l, uint32_t j, uint32_t h, uint32_t t, uint32_t d) {
      const size_t hb = (size_t{l} * nb + j) * H() + h;
      return dim_major ? (hb * D() + d) * T() + t : (hb * T() + t) * D() + d;
    };
    for (uint32_t l = 0; l < L(); ++l)
      for (uint32_t j = 0; j < nb; ++j)
        for (uint32_t h = 0; h < H(); ++h)
          for (uint32_t t = 0; t < T(); ++t)
            for (uint32_t d = 0; d < D(); ++d) {
              k.set(at(l, j, h, t, d), test_value(tag, l * 64 + j, h, t * 16 + d));
              v.set(at(l, j, h, t, d), test_value(tag + 7777, l * 64 + j, h, t * 16 + d));
            }
    desc_ = std::string("fd_prefix_register(") + (id ? "\"" + std::string(id) + "\"" : "NULL") +
            ", num_blocks " + dec(n) + (null_data ? ", k NULL" : "") + ")";
    const std::string sid = id ? id : "";
    const std::vector<Fault> f = m().faults_register(sid, n, null_data || id == nullptr);
    const fd_status s =
        fd_prefix_register(cache_, id, null_data ? nullptr : k.data(), v.data(), n, nullptr);
    const Outcome o = settle(kOpRegister, s, f);
    if (o != Outcome::kSucceeded) return o != Outcome::kMismatch;
    const std::vector<int32_t> blocks = m().apply_register(sid, n);
    expect_version_ = VersionChange::kGrows;
    for (uint32_t l = 0; l < L(); ++l)
      for (uint32_t j = 0; j < n; ++j)
        for (uint32_t h = 0; h < H(); ++h)
          for (uint32_t t = 0; t < T(); ++t)
            for (uint32_t d = 0; d < D(); ++d) {
              const size_t i = at(l, j, h, t, d);
              shadow_->set(0, l, blocks[j], h, static_cast<int32_t>(t), d, k.get(i), false);
              shadow_->set(1, l, blocks[j], h, static_cast<int32_t>(t), d, v.get(i), false);
            }
    return true;
  }

  bool op_register_random() {
    const uint32_t cap = m().config().prefix_cache_capacity_blocks;
    const std::string id = pick_prefix_id();
    switch (rng_.below(12)) {
      case 0: return op_register(nullptr, 1, false);
      case 1: return op_register("", 1, false);
      case 2: return op_register(id.c_str(), 0, false);
      case 3: return op_register(id.c_str(), 1, true);
      case 4: return op_register(id.c_str(), cap + 1 + rng_.below32(2), false);
      default: {
        const uint32_t n = 1 + rng_.below32(std::min<uint32_t>(std::max<uint32_t>(cap, 1), 4));
        return op_register(id.c_str(), n, false);
      }
    }
  }

  bool op_attach(uint64_t req, const char *pid) {
    desc_ = "fd_prefix_attach(" + dec(req) + ", " +
            (pid ? "\"" + std::string(pid) + "\"" : std::string("NULL")) + ")";
    const std::string sid = pid ? pid : "";
    const std::vector<Fault> f = m().faults_attach(req, sid);
    const Outcome o = settle(kOpAttach, fd_prefix_attach(cache_, req, pid), f);
    if (o == Outcome::kSucceeded) expect_version_ = m().apply_attach(req, sid);
    return o != Outcome::kMismatch;
  }

  bool op_attach_random() {
    std::vector<uint64_t> empty;
    for (uint64_t id : m().active_ids()) {
      const Request &r = m().requests().at(id);
      if (r.seq_len == 0 && r.prefix.empty()) empty.push_back(id);
    }
    const std::string pid = pick_prefix_id();
    switch (rng_.below(10)) {
      case 0: return op_attach(pick_active(), pid.c_str());  // often not empty
      case 1: return op_attach(pick_bad_id(), pid.c_str());
      case 2: return op_attach(empty.empty() ? new_id() : rng_.pick(empty), "");
      case 3: return op_attach(empty.empty() ? new_id() : rng_.pick(empty), nullptr);
      default: {
        if (empty.empty()) return op_add(new_id());  // make an empty request to attach next
        return op_attach(rng_.pick(empty), pid.c_str());
      }
    }
  }

  bool op_evict(const char *pid) {
    desc_ = std::string("fd_prefix_evict(") +
            (pid ? "\"" + std::string(pid) + "\"" : std::string("NULL")) + ")";
    const std::string sid = pid ? pid : "";
    const std::vector<Fault> f = m().faults_evict(sid);
    const Outcome o = settle(kOpEvict, fd_prefix_evict(cache_, pid), f);
    if (o == Outcome::kSucceeded) expect_version_ = m().apply_evict(sid);
    return o != Outcome::kMismatch;
  }

  bool op_evict_random() {
    const std::string pid = pick_prefix_id();
    switch (rng_.below(8)) {
      case 0: return op_evict(nullptr);
      case 1: return op_evict("");
      default: return op_evict(pid.c_str());
    }
  }

  /* Every mutation is refused while a transaction is open (S5). */
  bool op_forbidden() {
    const std::string pid = pick_prefix_id();
    switch (rng_.below(9)) {
      case 0: return op_add(rng_.chance(0.5) ? new_id() : pick_active());
      case 1: return op_close(pick_active(), true);
      case 2: return op_close(pick_active(), false);
      case 3: return op_append(pick_active_batch(), false);
      case 4: return op_register(pid.c_str(), 1, false);
      case 5: return op_attach(pick_active(), pid.c_str());
      case 6: return op_evict(pid.c_str());
      case 7:
        if (rng_.chance(0.5)) return op_truncate_random();
        return op_begin(pick_active_batch(), false);
      default: return op_begin(pick_active_batch(), false);
    }
  }

  /* ---------------------------------------------------------------------- */
  /* Queries with invalid arguments (valid ones run after every operation). */
  bool op_query() {
    switch (rng_.below(7)) {
      case 0: {  // export including an unknown or terminal id
        std::vector<uint64_t> ids = pick_active_batch();
        const uint64_t bad = pick_bad_id();
        ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(rng_.below(ids.size() + 1)), bad);
        std::vector<Fault> f;
        for (uint64_t id : ids) {
          if (m().find(id) == nullptr)
            f.push_back({FD_ERR_NOT_FOUND, dec(id), dec(id), kNoEffect});
          else if (!m().is_active(id))
            f.push_back({FD_ERR_INVALID_STATE, dec(id), dec(id), kNoEffect});
        }
        return query_export(ids, 64, f);
      }
      case 1: {  // export with a stride one too small
        std::vector<uint64_t> ids = pick_active_batch();
        uint32_t w = 0;
        for (uint64_t id : ids)
          w = std::max(w, static_cast<uint32_t>(m().requests().at(id).blocks.size()));
        if (w == 0) return query_export({}, 4, {{FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect}});
        return query_export(ids, w - 1, {{FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect}});
      }
      case 2: {  // blocks_needed
        std::vector<uint64_t> ids = pick_active_batch();
        std::vector<Fault> f;
        if (rng_.chance(0.5)) {
          const uint64_t bad = rng_.chance(0.3) && !ids.empty() ? ids.front() : pick_bad_id();
          if (m().find(bad) == nullptr)
            f.push_back({FD_ERR_NOT_FOUND, dec(bad), dec(bad), kNoEffect});
          else if (!m().is_active(bad))
            f.push_back({FD_ERR_INVALID_STATE, dec(bad), dec(bad), kNoEffect});
          else
            f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});  // duplicate
          ids.push_back(bad);
        }
        if (ids.empty()) f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});
        desc_ = "fd_cache_blocks_needed(" + ids_str(ids) + ")";
        const uint64_t dummy = 0;
        uint32_t needed = 12345, freeb = 12345;
        const bool skip_free = rng_.chance(0.3);  // free_blocks may be NULL
        const Outcome o = settle(kOpCacheQuery,
                                 fd_cache_blocks_needed(cache_, ids.empty() ? &dummy : ids.data(),
                                                        static_cast<uint32_t>(ids.size()), &needed,
                                                        skip_free ? nullptr : &freeb),
                                 f);
        if (o == Outcome::kMismatch) return false;
        if (o == Outcome::kFailedAsExpected)
          return needed == 12345 && freeb == 12345 ? true
                                                   : mismatch("failed call wrote its outputs");
        if (skip_free) freeb = static_cast<uint32_t>(m().free_list().size());
        if (freeb != m().free_list().size())
          return mismatch("free_blocks " + dec(freeb) + ", expected " +
                          dec(m().free_list().size()));
        /* Rows of an open transaction already hold their new block; the spec
         * gives no rule for them, so `needed` is checked only when idle. */
        if (!m().tx() && needed != m().blocks_needed(ids))
          return mismatch("needed " + dec(needed) + ", expected " + dec(m().blocks_needed(ids)));
        return true;
      }
      case 3: {  // request_state of an arbitrary id
        const uint64_t id = rng_.chance(0.5) ? pick_bad_id() : pick_active();
        desc_ = "fd_cache_request_state(" + dec(id) + ")";
        int32_t st = -1;
        const Outcome o = settle(kOpCacheQuery, fd_cache_request_state(cache_, id, &st), {});
        if (o == Outcome::kMismatch) return false;
        return st == m().request_state(id)
                   ? true
                   : mismatch("state " + std::to_string(st) + ", expected " +
                              std::to_string(m().request_state(id)));
      }
      case 4: {  // prefix info of a prefix that is not resident
        std::string pid = prefix_name(rng_.below(8));
        desc_ = "fd_prefix_get_info(\"" + pid + "\")";
        std::vector<Fault> f;
        if (m().prefixes().count(pid) == 0) f.push_back({FD_ERR_NOT_FOUND, "", "", kNoEffect});
        fd_prefix_info info;
        std::memset(&info, 0xcd, sizeof info);
        info.struct_size = sizeof info;
        const fd_prefix_info before = info;
        const Outcome o = settle(kOpCacheQuery, fd_prefix_get_info(cache_, pid.c_str(), &info), f);
        if (o == Outcome::kFailedAsExpected && std::memcmp(&info, &before, sizeof info) != 0)
          return mismatch("failed fd_prefix_get_info wrote its output");
        return o != Outcome::kMismatch;
      }
      case 5: {  // layer storage out of range
        const uint32_t layer = L() + rng_.below32(3);
        desc_ = "fd_cache_layer_storage(layer " + dec(layer) + ")";
        void *k = &tag_, *v = &tag_;
        int64_t st[4] = {-1, -1, -1, -1};
        const Outcome o = settle(kOpCacheQuery, fd_cache_layer_storage(cache_, layer, &k, &v, st),
                                 {{FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect}});
        if (o == Outcome::kFailedAsExpected && (k != &tag_ || v != &tag_ || st[0] != -1))
          return mismatch("failed fd_cache_layer_storage wrote its outputs");
        return o != Outcome::kMismatch;
      }
      default: {  // max_blocks_per_seq with a bad id
        std::vector<uint64_t> ids = pick_active_batch();
        const uint64_t bad = pick_bad_id();
        ids.push_back(bad);
        std::vector<Fault> f;
        if (m().find(bad) == nullptr)
          f.push_back({FD_ERR_NOT_FOUND, dec(bad), dec(bad), kNoEffect});
        else
          f.push_back({FD_ERR_INVALID_STATE, dec(bad), dec(bad), kNoEffect});
        desc_ = "fd_cache_max_blocks_per_seq(" + ids_str(ids) + ")";
        uint32_t w = 4242;
        const Outcome o = settle(
            kOpCacheQuery,
            fd_cache_max_blocks_per_seq(cache_, ids.data(), static_cast<uint32_t>(ids.size()), &w),
            f);
        if (o == Outcome::kFailedAsExpected && w != 4242)
          return mismatch("failed fd_cache_max_blocks_per_seq wrote its output");
        return o != Outcome::kMismatch;
      }
    }
  }

  bool query_export(const std::vector<uint64_t> &ids, uint32_t stride,
                    const std::vector<Fault> &f) {
    std::vector<Fault> faults = f;
    if (ids.empty()) faults.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});
    desc_ = "fd_cache_export(" + ids_str(ids) + ", stride " + dec(stride) + ")";
    const size_t rows = std::max<size_t>(ids.size(), 1);
    std::vector<int32_t> tab(rows * std::max<uint32_t>(stride, 1), -5), lens(rows, -5);
    const uint64_t dummy = 0;
    const Outcome o =
        settle(kOpCacheQuery,
               fd_cache_export(cache_, ids.empty() ? &dummy : ids.data(),
                               static_cast<uint32_t>(ids.size()), stride, tab.data(), lens.data()),
               faults);
    if (o == Outcome::kFailedAsExpected) {
      for (int32_t x : tab)
        if (x != -5) return mismatch("failed fd_cache_export wrote block_tables");
      for (int32_t x : lens)
        if (x != -5) return mismatch("failed fd_cache_export wrote seq_lens");
    }
    return o != Outcome::kMismatch;
  }

  /* ---------------------------------------------------------------------- */
  /* Arguments outside the contract the other operations keep to (set_abuse).
   * Each must fail cleanly (or succeed as documented) and change nothing the
   * model does not expect; ASan/UBSan catch reads past the small buffers. */
  bool op_abuse() {
    switch (rng_.below(7)) {
      case 0: return abuse_null();
      case 1: return abuse_small_outputs();
      case 2: return abuse_huge_prefix();
      case 3: return abuse_huge_layer();
      case 4: return abuse_struct_size();
      case 5: return abuse_status_string();
      default: return abuse_misaligned();
    }
  }

  Outcome settle_arg(fd_status s) {
    return settle(kOpCacheQuery, s, {{FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect}});
  }

  /* NULL cache handles and NULL out-pointers. */
  bool abuse_null() {
    const uint64_t id = rng_.chance(0.5) ? pick_active() : pick_bad_id();
    const fd_tx h = m().tx() ? current_handle() : pick_bad_handle();
    const uint64_t one = id;
    fd_status s = FD_OK;
    switch (rng_.below(13)) {
      case 0:
        desc_ = "fd_cache_add_request(NULL)";
        s = fd_cache_add_request(nullptr, id);
        break;
      case 1:
        desc_ = "fd_cache_finish_request(NULL)";
        s = fd_cache_finish_request(nullptr, id);
        break;
      case 2:
        desc_ = "fd_cache_cancel_request(NULL)";
        s = fd_cache_cancel_request(nullptr, id);
        break;
      case 3: {
        desc_ = "fd_tx_begin(NULL cache)";
        fd_tx t{1, 1};
        s = fd_tx_begin(nullptr, &one, 1, &t);
        break;
      }
      case 4:
        desc_ = "fd_tx_commit(NULL)";
        s = fd_tx_commit(nullptr, h);
        break;
      case 5:
        desc_ = "fd_tx_abort(NULL)";
        s = fd_tx_abort(nullptr, h);
        break;
      case 6:
        desc_ = "fd_cache_validate(NULL)";
        s = fd_cache_validate(nullptr);
        break;
      case 7:
        desc_ = "fd_prefix_evict(NULL cache)";
        s = fd_prefix_evict(nullptr, "sys_a");
        break;
      case 8:
        desc_ = "fd_cache_state_version(version NULL)";
        s = fd_cache_state_version(cache_, nullptr);
        break;
      case 9:
        desc_ = "fd_cache_request_state(state NULL)";
        s = fd_cache_request_state(cache_, id, nullptr);
        break;
      case 10:
        desc_ = "fd_cache_metrics_get(metrics NULL)";
        s = fd_cache_metrics_get(cache_, nullptr);
        break;
      case 11: {
        desc_ = "fd_tx_get_info(info NULL)";
        s = fd_tx_get_info(cache_, h, nullptr);
        /* A bad handle may be reported first. */
        std::vector<Fault> f = m().handle_faults(h, true, kNoEffect);
        f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});
        return settle(kOpTxQuery, s, f) != Outcome::kMismatch;
      }
      default: {
        /* A begin that would be valid but for its NULL out-pointer. */
        const std::vector<uint64_t> ids = pick_active_batch();
        desc_ = "fd_tx_begin(" + ids_str(ids) + ", out NULL)";
        std::vector<Fault> f = ids.empty() ? std::vector<Fault>{} : m().faults_begin(ids);
        f.push_back({FD_ERR_INVALID_ARGUMENT, "", "",
                     reading::kEveryFailedBeginCounts ? kTxFailure : kNoEffect});
        const uint64_t dummy = 0;
        s = fd_tx_begin(cache_, ids.empty() ? &dummy : ids.data(),
                        static_cast<uint32_t>(ids.size()), nullptr);
        return settle(kOpBegin, s, f) != Outcome::kMismatch;
      }
    }
    return settle_arg(s) != Outcome::kMismatch;
  }

  /* Output arrays one entry too small for the open transaction. */
  bool abuse_small_outputs() {
    if (!m().tx() || m().tx()->ids.empty()) return op_query();
    const uint32_t batch = static_cast<uint32_t>(m().tx()->ids.size());
    std::vector<int32_t> pos(batch, -3);
    desc_ = "fd_tx_get_rows(capacity " + dec(batch - 1) + " < batch " + dec(batch) + ")";
    const Outcome o = settle_arg(fd_tx_get_rows(cache_, current_handle(), batch - 1, nullptr,
                                                pos.data(), nullptr, nullptr, nullptr));
    if (o == Outcome::kFailedAsExpected && pos != std::vector<int32_t>(batch, -3))
      return mismatch("failed fd_tx_get_rows wrote positions");
    return o != Outcome::kMismatch;
  }

  /* A prefix of a huge block count, with data for one block: it must be
   * refused before anything is read. */
  bool abuse_huge_prefix() {
    static const uint32_t kHuge[] = {0x7fffffffu, 0x80000000u, 0xffffffffu, 1u << 20};
    const uint32_t n = kHuge[rng_.below(4)];
    const std::string id = pick_prefix_id();
    Buffer k(dtype(), size_t{L()} * H() * T() * D()), v = k;
    desc_ = "fd_prefix_register(\"" + id + "\", num_blocks " + dec(n) + ", data for 1 block)";
    const Outcome o =
        settle(kOpRegister, fd_prefix_register(cache_, id.c_str(), k.data(), v.data(), n, nullptr),
               m().faults_register(id, n, false));
    if (o == Outcome::kSucceeded) return mismatch("a prefix larger than the pool was registered");
    return o != Outcome::kMismatch;
  }

  /* Layers far out of range. */
  bool abuse_huge_layer() {
    static const uint32_t kHuge[] = {0xffffffffu, 0x80000000u, 0x7fffffffu, 256};
    const uint32_t layer = kHuge[rng_.below(4)];
    if (m().tx()) return op_write(current_handle(), layer, 0);
    desc_ = "fd_cache_layer_storage(layer " + dec(layer) + ")";
    void *k = &tag_, *v = &tag_;
    int64_t st[4] = {-1, -1, -1, -1};
    const Outcome o = settle_arg(fd_cache_layer_storage(cache_, layer, &k, &v, st));
    if (o == Outcome::kFailedAsExpected && (k != &tag_ || v != &tag_ || st[0] != -1))
      return mismatch("failed fd_cache_layer_storage wrote its outputs");
    return o != Outcome::kMismatch;
  }

  /* Versioned structs: too small is refused; the minimum is filled and
   * nothing past struct_size is written. */
  bool abuse_struct_size() {
    const uint32_t min_size = offsetof(fd_cache_metrics, max_blocks) + sizeof(uint64_t);
    const uint32_t size = rng_.below32(min_size + 1);
    fd_cache_metrics got;
    std::memset(&got, 0xab, sizeof got);
    got.struct_size = size;
    fd_cache_metrics before = got;
    desc_ = "fd_cache_metrics_get(struct_size " + dec(size) + ")";
    const fd_status s = fd_cache_metrics_get(cache_, &got);
    if (size < min_size) {
      const Outcome o = settle_arg(s);
      if (o == Outcome::kFailedAsExpected && std::memcmp(&got, &before, sizeof got) != 0)
        return mismatch("refused fd_cache_metrics_get wrote its output");
      return o != Outcome::kMismatch;
    }
    const Outcome o = settle(kOpCacheQuery, s, {});
    if (o != Outcome::kSucceeded) return o != Outcome::kMismatch;
    if (got.max_blocks != m().config().max_blocks)
      return mismatch("metrics.max_blocks " + dec(got.max_blocks));
    before.max_blocks = got.max_blocks;
    before.reserved0 = got.reserved0;
    if (std::memcmp(&got, &before, sizeof got) != 0)
      return mismatch("fd_cache_metrics_get wrote past struct_size " + dec(size));
    return true;
  }

  bool abuse_status_string() {
    /* Any value, known or not (issue 11, bug 4). */
    const int32_t v = static_cast<int32_t>(rng_.next());
    desc_ = "fd_status_string(" + std::to_string(v) + ")";
    last_status_ = "-";
    const char *str = fd_status_string(static_cast<fd_status>(v));
    if (str == nullptr || str[0] == '\0') return mismatch("fd_status_string returned NULL or \"\"");
    return true;
  }

  /* Arrays at odd addresses: FD_ERR_INVALID_ARGUMENT, nothing changes (bug 1
   * of issue 11). */
  bool abuse_misaligned() {
    /* One byte past an aligned base: misaligned for every element size > 1. */
    std::vector<unsigned char> raw(4096 + 16);
    unsigned char *odd = raw.data() + 1;
    if (m().tx()) {
      const fd_tx h = current_handle();
      const uint32_t layer = m().tx()->next_layer;
      Buffer k = make_kv(m().tx()->tokens(), ++tag_), v = k;
      if (k.bytes.size() + 1 > raw.size()) return op_query();
      std::memcpy(odd, k.data(), k.bytes.size());
      desc_ = "fd_tx_write_layer(k misaligned)";
      return settle(kOpWrite, fd_tx_write_layer(cache_, h, layer, odd, v.data(), nullptr),
                    m().faults_write(h, layer, true)) != Outcome::kMismatch;
    }
    /* Active, unique ids: the alignment is the only fault. */
    std::vector<uint64_t> ids = pick_active_batch();
    if (ids.empty()) return op_query();
    std::memcpy(odd, ids.data(), ids.size() * sizeof(uint64_t));
    const uint32_t n = static_cast<uint32_t>(ids.size());
    switch (rng_.below(4)) {
      case 0: {
        desc_ = "fd_cache_blocks_needed(request_ids misaligned)";
        uint32_t needed = 0;
        return settle_arg(fd_cache_blocks_needed(cache_, reinterpret_cast<const uint64_t *>(odd), n,
                                                 &needed, nullptr)) != Outcome::kMismatch;
      }
      case 1: {
        desc_ = "fd_cache_export(block_tables misaligned)";
        std::vector<int32_t> lens(n);
        return settle_arg(fd_cache_export(cache_, ids.data(), n, 64,
                                          reinterpret_cast<int32_t *>(raw.data() + 2049),
                                          lens.data())) != Outcome::kMismatch;
      }
      case 2: {
        if (L() != 1) return op_query();
        Buffer k = make_kv(ids.size(), ++tag_), v = k;
        if (k.bytes.size() + 1 > raw.size()) return op_query();
        std::memcpy(odd, k.data(), k.bytes.size());
        desc_ = "fd_cache_append(" + ids_str(ids) + ", k misaligned)";
        return settle(kOpAppend, fd_cache_append(cache_, ids.data(), n, odd, v.data(), nullptr),
                      m().faults_append(ids, true)) != Outcome::kMismatch;
      }
      default: {
        const std::string id = pick_prefix_id();
        Buffer k(dtype(), size_t{L()} * H() * T() * D()), v = k;
        if (k.bytes.size() + 1 > raw.size()) return op_query();
        desc_ = "fd_prefix_register(\"" + id + "\", k_blocks misaligned)";
        return settle(kOpRegister,
                      fd_prefix_register(cache_, id.c_str(), odd, v.data(), 1, nullptr),
                      m().faults_register(id, 1, true)) != Outcome::kMismatch;
      }
    }
  }

  /* ---------------------------------------------------------------------- */
  /* Verification of the whole observable state after an operation. */
  bool verify() {
    const fd_status s = fd_cache_validate(cache_);
    if (s != FD_OK)
      return mismatch("fd_cache_validate after the call: " + status_name(s) + ": " +
                      fd_last_error_message());
    if (!check_version() || !check_metrics() || !check_requests() || !check_prefixes())
      return false;
    if (m().tx() && !check_tx_view(current_handle())) return false;
    return true;
  }

  bool check_version() {
    uint64_t v = 0;
    if (fd_cache_state_version(cache_, &v) != FD_OK)
      return mismatch("fd_cache_state_version failed");
    const char *rule = nullptr;
    if (expect_version_ == VersionChange::kSame && v != version_) rule = "stay the same";
    if (expect_version_ == VersionChange::kGrows && v <= version_) rule = "grow";
    if (expect_version_ == VersionChange::kMayGrow && v < version_) rule = "not shrink";
    if (rule != nullptr)
      return mismatch("state_version went from " + dec(version_) + " to " + dec(v) +
                      "; expected it to " + rule);
    version_ = v;
    return true;
  }

  bool check_metrics() {
    fd_cache_metrics got;
    std::memset(&got, 0, sizeof got);
    got.struct_size = sizeof got;
    const fd_status s = fd_cache_metrics_get(cache_, &got);
    if (s != FD_OK) return mismatch("fd_cache_metrics_get failed: " + status_name(s));
    const fd_cache_metrics want = m().expected_metrics();
#define FD_MODEL_FIELD(name) \
  if (got.name != want.name) \
    return mismatch("metrics." #name " = " + dec(got.name) + ", expected " + dec(want.name));
#define FD_MODEL_REAL(name)                                                             \
  if (std::fabs(got.name - want.name) > 1e-9)                                           \
    return mismatch("metrics." #name " = " + std::to_string(got.name) + ", expected " + \
                    std::to_string(want.name));
    FD_MODEL_FIELD(reserved0)
    FD_MODEL_FIELD(max_blocks)
    FD_MODEL_FIELD(used_blocks)
    FD_MODEL_FIELD(free_blocks)
    FD_MODEL_REAL(block_utilization)
    FD_MODEL_FIELD(active_tokens)
    FD_MODEL_FIELD(physical_data_tokens)
    FD_MODEL_FIELD(reserved_tokens)
    FD_MODEL_FIELD(internal_fragmentation_tokens)
    FD_MODEL_REAL(internal_fragmentation_ratio)
    FD_MODEL_FIELD(allocation_count)
    FD_MODEL_FIELD(fresh_allocation_count)
    FD_MODEL_FIELD(reuse_count)
    FD_MODEL_FIELD(free_count)
    FD_MODEL_FIELD(capacity_failure_count)
    FD_MODEL_FIELD(active_request_count)
    FD_MODEL_FIELD(finished_request_count)
    FD_MODEL_FIELD(cancelled_request_count)
    FD_MODEL_FIELD(transaction_begin_count)
    FD_MODEL_FIELD(transaction_commit_count)
    FD_MODEL_FIELD(transaction_abort_count)
    FD_MODEL_FIELD(open_transaction_count)
    FD_MODEL_FIELD(pending_request_count)
    FD_MODEL_FIELD(reserved_transaction_blocks)
    FD_MODEL_FIELD(transaction_layer_write_count)
    FD_MODEL_FIELD(transaction_rollback_block_count)
    FD_MODEL_FIELD(transaction_failure_count)
    FD_MODEL_FIELD(retained_transaction_state_count)
    FD_MODEL_FIELD(terminal_transaction_history_count)
    FD_MODEL_FIELD(terminal_transaction_history_limit)
    FD_MODEL_FIELD(bytes_per_block)
    FD_MODEL_FIELD(allocated_kv_bytes)
    FD_MODEL_FIELD(reserved_transaction_bytes)
    FD_MODEL_FIELD(prefix_cache_capacity_blocks)
    FD_MODEL_FIELD(resident_prefix_count)
    FD_MODEL_FIELD(resident_prefix_blocks)
    FD_MODEL_FIELD(active_prefix_references)
    FD_MODEL_FIELD(shared_prefix_blocks)
    FD_MODEL_FIELD(saved_prefix_blocks)
    FD_MODEL_FIELD(saved_prefix_bytes)
    FD_MODEL_FIELD(prefix_registration_count)
    FD_MODEL_FIELD(prefix_hit_count)
    FD_MODEL_FIELD(prefix_miss_count)
    FD_MODEL_REAL(prefix_hit_ratio)
    FD_MODEL_FIELD(prefix_eviction_count)
    FD_MODEL_FIELD(prefix_capacity_failure_count)
#undef FD_MODEL_FIELD
#undef FD_MODEL_REAL
    if (got.state_version != version_)
      return mismatch("metrics.state_version = " + dec(got.state_version) +
                      ", fd_cache_state_version = " + dec(version_));
    return true;
  }

  bool check_requests() {
    const std::vector<uint64_t> active = m().active_ids();
    if (!active.empty()) {
      uint32_t width = 0;
      for (uint64_t id : active)
        width = std::max(width, static_cast<uint32_t>(m().requests().at(id).blocks.size()));
      uint32_t got_width = 7777;
      fd_status s = fd_cache_max_blocks_per_seq(cache_, active.data(),
                                                static_cast<uint32_t>(active.size()), &got_width);
      if (s != FD_OK || got_width != width)
        return mismatch("fd_cache_max_blocks_per_seq(all active) = " + status_name(s) + ", " +
                        dec(got_width) + "; expected " + dec(width));
      const uint32_t stride = width + rng_.below32(2);
      std::vector<int32_t> tab(active.size() * std::max<uint32_t>(stride, 1), -5),
          lens(active.size(), -5);
      s = fd_cache_export(cache_, active.data(), static_cast<uint32_t>(active.size()), stride,
                          stride == 0 ? nullptr : tab.data(), lens.data());
      /* Either output may be NULL: the other is still written. */
      std::vector<int32_t> lens2(active.size(), -4);
      const fd_status s2 =
          fd_cache_export(cache_, active.data(), static_cast<uint32_t>(active.size()), stride,
                          nullptr, lens2.data());
      if (s2 != FD_OK || lens2 != lens)
        return mismatch("fd_cache_export(block_tables NULL) = " + status_name(s2) + ", seq_lens " +
                        vec_str(lens2) + " vs " + vec_str(lens));
      if (s != FD_OK)
        return mismatch("fd_cache_export(all active, stride " + dec(stride) +
                        ") failed: " + status_name(s) + ": " + fd_last_error_message());
      for (size_t r = 0; r < active.size(); ++r) {
        const Request &q = m().requests().at(active[r]);
        std::vector<int32_t> want = q.blocks,
                             got(tab.begin() + static_cast<std::ptrdiff_t>(r * stride),
                                 tab.begin() + static_cast<std::ptrdiff_t>((r + 1) * stride));
        want.resize(stride, -1);
        if (stride > 0 && got != want)
          return mismatch(
              "request " + dec(active[r]) + " block table " + vec_str(got) + ", expected " +
              vec_str(want) + " (free list " +
              vec_str(std::vector<int32_t>(m().free_list().begin(), m().free_list().end())) + ")");
        if (lens[r] != q.seq_len)
          return mismatch("request " + dec(active[r]) + " seq_len " + std::to_string(lens[r]) +
                          ", expected " + std::to_string(q.seq_len));
      }
    }
    /* States: every active id plus a few others. */
    std::vector<uint64_t> probe = active;
    for (int i = 0; i < 3; ++i) probe.push_back(pick_bad_id());
    for (uint64_t id : probe) {
      int32_t st = -1;
      if (fd_cache_request_state(cache_, id, &st) != FD_OK || st != m().request_state(id))
        return mismatch("request_state(" + dec(id) + ") = " + std::to_string(st) + ", expected " +
                        std::to_string(m().request_state(id)));
    }
    return true;
  }

  bool check_prefixes() {
    std::vector<std::pair<uint64_t, std::string>> model_order;  // (model last_use, id)
    std::vector<std::pair<uint64_t, std::string>> lib_order;
    for (const auto &kv : m().prefixes()) {
      fd_prefix_info info;
      std::memset(&info, 0xcd, sizeof info);
      info.struct_size = sizeof info;
      const fd_status s = fd_prefix_get_info(cache_, kv.first.c_str(), &info);
      if (s != FD_OK)
        return mismatch("fd_prefix_get_info(\"" + kv.first + "\") = " + status_name(s) +
                        "; the prefix should be resident");
      const Prefix &p = kv.second;
      if (info.num_blocks != p.blocks.size() || info.ref_count != p.refs ||
          info.first_block != p.blocks.front() || info.reserved0 != 0 || info.reserved1 != 0)
        return mismatch("prefix \"" + kv.first + "\": num_blocks " + dec(info.num_blocks) +
                        ", ref_count " + dec(info.ref_count) + ", first_block " +
                        std::to_string(info.first_block) + "; expected " + dec(p.blocks.size()) +
                        ", " + dec(p.refs) + ", " + std::to_string(p.blocks.front()) + " (blocks " +
                        vec_str(p.blocks) + ")");
      model_order.emplace_back(p.last_use, kv.first);
      lib_order.emplace_back(info.last_use, kv.first);
    }
    std::sort(model_order.begin(), model_order.end());
    std::sort(lib_order.begin(), lib_order.end());
    for (size_t i = 0; i < model_order.size(); ++i) {
      const bool tie = i + 1 < lib_order.size() && lib_order[i].first == lib_order[i + 1].first;
      if (model_order[i].second != lib_order[i].second || tie) {
        std::string a, b;
        for (auto &x : model_order) a += " " + x.second;
        for (auto &x : lib_order) b += " " + x.second + "@" + dec(x.first);
        return mismatch("prefix LRU order (least recent first) is" + b + "; expected" + a);
      }
    }
    return true;
  }

  /* Compares all three views of the open transaction `h` with the model. */
  bool check_tx_view(fd_tx h) {
    const OpenTx &t = *m().tx();
    const uint32_t batch = static_cast<uint32_t>(t.ids.size());
    fd_tx_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    fd_status s = fd_tx_get_info(cache_, h, &info);
    if (s != FD_OK) return mismatch("fd_tx_get_info(open) failed: " + status_name(s));
    const uint32_t width = tx_table_width();
    if (info.batch != batch || info.next_layer != t.next_layer || info.state != FD_TX_OPEN ||
        info.max_blocks_per_seq != width || info.new_block_count != t.new_blocks.size() ||
        info.token_count != t.tokens())
      return mismatch("fd_tx_info {batch " + dec(info.batch) + ", next_layer " +
                      dec(info.next_layer) + ", state " + std::to_string(info.state) +
                      ", max_blocks_per_seq " + dec(info.max_blocks_per_seq) +
                      ", new_block_count " + dec(info.new_block_count) + "}; expected {" +
                      dec(batch) + ", " + dec(t.next_layer) + ", 0, " + dec(width) + ", " +
                      dec(t.new_blocks.size()) + "}");
    std::vector<uint64_t> ids(batch);
    std::vector<int32_t> pos(batch), blk(batch), off(batch), eff(batch);
    s = fd_tx_get_rows(cache_, h, batch, ids.data(), pos.data(), blk.data(), off.data(),
                       eff.data());
    if (s != FD_OK) return mismatch("fd_tx_get_rows(open) failed: " + status_name(s));
    /* Per row: the first new token's position, block and offset. */
    std::vector<int32_t> want_eff, want_blk, want_off;
    for (size_t r = 0; r < batch; ++r) {
      want_eff.push_back(t.first_pos[r] + static_cast<int32_t>(t.counts[r]));
      want_blk.push_back(t.block_ids[t.first_token(r)]);
      want_off.push_back(t.offsets[t.first_token(r)]);
    }
    if (ids != t.ids || pos != t.first_pos || blk != want_blk || off != want_off || eff != want_eff)
      return mismatch("tx rows: ids " + ids_str(ids) + " positions " + vec_str(pos) + " blocks " +
                      vec_str(blk) + " offsets " + vec_str(off) + " effective " + vec_str(eff) +
                      "; expected " + ids_str(t.ids) + " " + vec_str(t.first_pos) + " " +
                      vec_str(want_blk) + " " + vec_str(want_off) + " " + vec_str(want_eff));
    /* Per token, packed in row order. */
    const size_t tokens = t.tokens();
    std::vector<int32_t> tpos(tokens + 1, -3), tblk(tokens + 1, -3), toff(tokens + 1, -3);
    s = fd_tx_get_tokens(cache_, h, static_cast<uint32_t>(tokens + rng_.below(2)), tpos.data(),
                         tblk.data(), toff.data());
    if (s != FD_OK) return mismatch("fd_tx_get_tokens(open) failed: " + status_name(s));
    if (tpos[tokens] != -3 || tblk[tokens] != -3 || toff[tokens] != -3)
      return mismatch("fd_tx_get_tokens wrote past token_count");
    tpos.pop_back(), tblk.pop_back(), toff.pop_back();
    if (tpos != t.positions || tblk != t.block_ids || toff != t.offsets)
      return mismatch("tx tokens: positions " + vec_str(tpos) + " blocks " + vec_str(tblk) +
                      " offsets " + vec_str(toff) + "; expected " + vec_str(t.positions) + " " +
                      vec_str(t.block_ids) + " " + vec_str(t.offsets));
    /* Every output may be NULL to skip it. */
    {
      const uint64_t mask = rng_.next();
      std::vector<int32_t> pos2(batch, -3);
      s = fd_tx_get_rows(cache_, h, batch, nullptr, (mask & 1) ? pos2.data() : nullptr, nullptr,
                         nullptr, nullptr);
      if (s != FD_OK || ((mask & 1) && pos2 != t.first_pos))
        return mismatch("fd_tx_get_rows with NULL outputs: " + status_name(s) + ", positions " +
                        vec_str(pos2));
    }
    const uint32_t stride = width + rng_.below32(2);
    std::vector<int32_t> tab(size_t{batch} * std::max<uint32_t>(stride, 1), -9);
    s = fd_tx_block_tables(cache_, h, stride, tab.data());
    if (s != FD_OK) return mismatch("fd_tx_block_tables(open) failed: " + status_name(s));
    for (size_t r = 0; r < batch; ++r) {
      std::vector<int32_t> want = m().requests().at(t.ids[r]).blocks;
      want.insert(want.end(), t.row_new_blocks[r].begin(), t.row_new_blocks[r].end());
      want.resize(stride, -1);
      std::vector<int32_t> got(tab.begin() + static_cast<std::ptrdiff_t>(r * stride),
                               tab.begin() + static_cast<std::ptrdiff_t>((r + 1) * stride));
      if (got != want)
        return mismatch("tx block table of row " + dec(r) + " = " + vec_str(got) + ", expected " +
                        vec_str(want));
    }
    return true;
  }

  uint64_t seed_, episode_;
  Rng &rng_;
  Stats &stats_;
  bool trace_;
  fd_cache *cache_ = nullptr;
  std::optional<CacheModel> model_;
  std::optional<KvShadow> shadow_;
  std::string config_desc_, desc_, last_status_, failure_;
  std::deque<std::string> recent_;
  VersionChange expect_version_ = VersionChange::kSame;
  uint64_t version_ = 0, op_index_ = 0, tag_ = 0, next_request_id_ = 1000001;
  uint32_t max_active_ = 4;
  size_t max_batch_ = 5;
  std::vector<uint64_t> terminal_;
  std::vector<fd_tx> issued_;
  bool abuse_ = false;
};

}  // namespace fdmodel

#endif  // FD_TESTS_MODEL_CACHE_DRIVER_HPP
