/* An independent, executable model of FlashDec's paged KV cache, written from
 * docs/semantics.md S4-S7 and include/flashdec.h only (not from src/cache). The
 * model test (tests/test_cache_model.cpp) runs the same random operations on
 * the library and on this model and compares every observable result.
 *
 * The model is deliberately naive: plain containers, no performance tricks, so
 * that it is easy to check against the spec by reading it.
 *
 * Failing calls are described as a list of Faults: every fault that applies
 * to the call, each with the status it maps to and the counters the spec says
 * it moves. When several faults apply at once the spec does not fix which one
 * is reported, so the test accepts any of them, but then demands exactly that
 * fault's counter effects ("a failing call changes nothing observable" except
 * for the counters the spec names).
 *
 * Readings of the spec where it leaves a choice open are collected in
 * namespace `reading` below; each one says why it was chosen. */
#ifndef FD_TESTS_MODEL_CACHE_MODEL_HPP
#define FD_TESTS_MODEL_CACHE_MODEL_HPP

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flashdec.h"

namespace fdmodel {

namespace reading {
/* R1 (S4.2, multi-block release order). "Blocks released by finish/cancel/
 * prefix eviction go back to the front, so the next allocation reuses the most
 * recently released block first." The spec does not say in which order the
 * blocks of ONE request (or prefix) are released. The model releases them one
 * at a time in logical order (block 0 first), each pushed to the front, so the
 * request's LAST logical block ends up at the front of the free list:
 *   owned [5, 6, 7], free [1, 2]  ->  free [7, 6, 5, 1, 2].
 * A register that evicts several prefixes releases them in LRU order, each
 * prefix by the same rule. (An abort is different: S5 says its blocks return
 * "in their previous order", i.e. the exact free list from before begin.) */
constexpr bool kReleaseLastBlockFirst = true;

/* R2 (S4.2, rollback and freshness). A rolled-back allocation restores the
 * free-list order, but the allocation happened (the header says "rollback
 * undoes nothing here" for allocation_count): the block is no longer fresh, so
 * its next allocation is a reuse. */
constexpr bool kRollbackKeepsAllocatedMark = true;

/* R3 (S5 / S7, which failures count in transaction_failure_count). S5 names
 * the counter only for a begin (or legacy append) refused for capacity, and
 * for a failed layer write. Everywhere else "a failing call changes nothing
 * observable". The model therefore counts: begin/append refused for
 * capacity, and every failed layer write that names the live open
 * transaction. Begins refused for bad ids or an open transaction, failed
 * commit/abort/view calls, and calls with a stale, finished or unknown handle
 * (there is no transaction they could have failed in) do not count. This is
 * the documented rule since issue 11 (flashdec.h, fd_cache_metrics::
 * transaction_failure_count; tests/test_tx_failure_count.cpp). */
constexpr bool kEveryFailedBeginCounts = false;
constexpr bool kBadHandleWriteCounts = false;

/* R4 (S6, register with n > capacity). S6 names capacity_failure_count and
 * prefix_capacity_failure_count only for "insufficient evictable prefix
 * capacity"; "n > capacity: error" names no counter, so (a failing call
 * changes nothing observable) it moves none. */
constexpr bool kTooLargePrefixCounts = false;

/* R5 (S5.1, legacy append). "begin + write layer 0 + commit in one call": a
 * successful append is a full transaction. It takes the next transaction id,
 * counts one begin, one layer write and one commit, and enters the terminal
 * history as committed. */
constexpr bool kAppendIsTransaction = true;

/* R6 (S6, LRU). "LRU order is touched by attach and by the close of an
 * attached request." A newly registered prefix is the most recently used one
 * (otherwise a just-registered prefix could be the first to be evicted by the
 * next registration). */
constexpr bool kRegisterTouchesLru = true;

/* R7 (S7, physical_data_tokens). "Tokens stored in used blocks (shared prefix
 * tokens counted once)": committed tokens only. The token being written by an
 * open transaction is not stored data until commit (it is invisible). */
constexpr bool kPendingTokensAreData = false;
}  // namespace reading

constexpr uint32_t kHistoryLimit = 256;

/* Counter side effects of a fault. */
enum Effect : uint32_t {
  kNoEffect = 0,
  kCapacityFailure = 1u << 0,
  kTxFailure = 1u << 1,
  kPrefixCapacityFailure = 1u << 2,
  kPrefixMiss = 1u << 3,
};

/* One reason a call must fail. `must_contain`: text the error message must
 * contain (may be empty: any non-empty message). `key`: text that identifies
 * this fault among several with the same status (e.g. the offending id), used
 * only to decide which fault the library reported. */
struct Fault {
  fd_status status;
  std::string must_contain;
  std::string key;
  uint32_t effects;
};

/* What a successful call must do to the state version. */
enum class VersionChange { kSame, kGrows, kMayGrow };

struct Request {
  int32_t state = FD_REQUEST_ACTIVE;
  int32_t seq_len = 0;          // committed length
  std::vector<int32_t> blocks;  // committed logical -> physical
  std::string prefix;           // attached prefix id, empty if none
};

struct Prefix {
  std::vector<int32_t> blocks;
  uint32_t refs = 0;
  uint64_t last_use = 0;
};

struct OpenTx {
  uint64_t id = 0;
  uint64_t version = 0;  // filled in from the handle begin returned
  std::vector<uint64_t> ids;
  std::vector<uint32_t> counts;                      // per row: new tokens k (1 for fd_tx_begin)
  std::vector<int32_t> first_pos;                    // per row: committed seq_len at begin
  std::vector<std::vector<int32_t>> row_new_blocks;  // per row, logical order
  /* Per new token, rows packed in order (the layer writes' order). */
  std::vector<int32_t> positions, block_ids, offsets;
  std::vector<int32_t> new_blocks;  // in allocation order
  uint32_t next_layer = 0;
  size_t tokens() const { return positions.size(); }
  /* Index of row r's first token. */
  size_t first_token(size_t r) const {
    size_t n = 0;
    for (size_t i = 0; i < r; ++i) n += counts[i];
    return n;
  }
};

struct HistoryEntry {
  uint64_t id = 0;
  uint64_t version = 0;
  bool version_known = true;  // false for legacy appends (no handle exists)
  int32_t state = FD_TX_COMMITTED;
};

/* Counters that only move; everything else is derived from the state. */
struct Counters {
  uint64_t allocation = 0, fresh = 0, reuse = 0, freed = 0, capacity_failures = 0;
  uint64_t tx_begin = 0, tx_commit = 0, tx_abort = 0, layer_writes = 0, rollback_blocks = 0,
           tx_failures = 0;
  uint64_t prefix_registrations = 0, prefix_hits = 0, prefix_misses = 0, prefix_evictions = 0,
           prefix_capacity_failures = 0;
};

/* Rare paths the test wants to see exercised (not library counters). */
struct Events {
  uint64_t multi_block_releases = 0;  // one release of >= 2 blocks (order matters, R1)
  uint64_t lru_evictions = 0;         // prefixes evicted by a registration
  uint64_t history_drops = 0;         // terminal transactions pushed out of the history
};

/* How a transaction handle relates to the cache. */
enum class HandleKind {
  kOpen,
  kStaleOpen,
  kCommitted,
  kAborted,
  kStaleHistory,
  kDropped,
  kNeverIssued
};

inline std::string dec(uint64_t v) {
  return std::to_string(v);
}

/* Bytes per element of each fd_dtype; 0 for an unknown one (as the
 * library's fd::dtype_size: no element size is assumed). */
inline size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case FD_DTYPE_F32: return 4;
    case FD_DTYPE_F16:
    case FD_DTYPE_BF16: return 2;
    default: return 0;
  }
}

class CacheModel {
 public:
  explicit CacheModel(const fd_cache_config &cfg) : cfg_(cfg), ever_allocated_(cfg.max_blocks) {
    for (uint32_t b = 0; b < cfg.max_blocks; ++b) free_.push_back(static_cast<int32_t>(b));
  }

  /* ---------------- read access ---------------- */
  const fd_cache_config &config() const { return cfg_; }
  uint32_t bs() const { return cfg_.block_size; }
  bool prefixes_enabled() const { return cfg_.prefix_cache_capacity_blocks > 0; }
  const std::optional<OpenTx> &tx() const { return tx_; }
  const std::deque<int32_t> &free_list() const { return free_; }
  const std::map<uint64_t, Request> &requests() const { return requests_; }
  const std::map<std::string, Prefix> &prefixes() const { return prefixes_; }
  const std::deque<HistoryEntry> &history() const { return history_; }
  const Counters &counters() const { return c_; }
  const Events &events() const { return ev_; }
  uint64_t next_tx_id() const { return next_tx_id_; }

  const Request *find(uint64_t id) const {
    auto it = requests_.find(id);
    return it == requests_.end() ? nullptr : &it->second;
  }
  bool is_active(uint64_t id) const {
    const Request *r = find(id);
    return r != nullptr && r->state == FD_REQUEST_ACTIVE;
  }
  std::vector<uint64_t> active_ids() const {
    std::vector<uint64_t> out;
    for (const auto &kv : requests_)
      if (kv.second.state == FD_REQUEST_ACTIVE) out.push_back(kv.first);
    return out;
  }
  int32_t request_state(uint64_t id) const {
    const Request *r = find(id);
    return r == nullptr ? FD_REQUEST_UNKNOWN : r->state;
  }
  uint32_t prefix_blocks_of(const Request &r) const {
    if (r.prefix.empty()) return 0;
    return static_cast<uint32_t>(prefixes_.at(r.prefix).blocks.size());
  }
  /* Blocks needed to grow every listed (active) request by one token. */
  uint32_t blocks_needed(const std::vector<uint64_t> &ids) const {
    uint32_t n = 0;
    for (uint64_t id : ids)
      if (requests_.at(id).seq_len % static_cast<int32_t>(bs()) == 0) ++n;
    return n;
  }
  /* Blocks needed to grow request ids[i] by counts[i] tokens (S4.4): every
   * logical block the new tokens reach past the committed ones. */
  uint64_t blocks_needed(const std::vector<uint64_t> &ids,
                         const std::vector<uint32_t> &counts) const {
    uint64_t n = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t seq = static_cast<uint64_t>(requests_.at(ids[i]).seq_len);
      n += (seq + counts[i] + bs() - 1) / bs() - (seq + bs() - 1) / bs();
    }
    return n;
  }

  /* ---------------- transaction handles ---------------- */
  const HistoryEntry *history_entry(uint64_t id) const {
    for (const HistoryEntry &h : history_)
      if (h.id == id) return &h;
    return nullptr;
  }
  HandleKind classify(fd_tx h) const {
    if (tx_ && h.id == tx_->id)
      return h.cache_version == tx_->version ? HandleKind::kOpen : HandleKind::kStaleOpen;
    if (const HistoryEntry *e = history_entry(h.id)) {
      if (e->version_known && e->version != h.cache_version) return HandleKind::kStaleHistory;
      return e->state == FD_TX_COMMITTED ? HandleKind::kCommitted : HandleKind::kAborted;
    }
    if (h.id >= 1 && h.id < next_tx_id_) return HandleKind::kDropped;
    return HandleKind::kNeverIssued;
  }
  /* Faults of a handle that does not name the open transaction. `view`: the
   * call only reads the transaction (get_info / get_rows / block_tables). */
  std::vector<Fault> handle_faults(fd_tx h, bool view, uint32_t effects) const {
    switch (classify(h)) {
      case HandleKind::kOpen: return {};
      case HandleKind::kStaleOpen: return {{FD_ERR_STALE_HANDLE, "", "", effects}};
      case HandleKind::kCommitted:
        return {{FD_ERR_INVALID_STATE, view ? "committed" : "already committed", "", effects}};
      case HandleKind::kAborted:
        return {{FD_ERR_INVALID_STATE, view ? "aborted" : "already aborted", "", effects}};
      case HandleKind::kStaleHistory:
        /* S5: "A handle whose id or version does not match is stale", also
         * when the transaction with that id is finished. */
        return {{FD_ERR_STALE_HANDLE, "", "", effects}};
      case HandleKind::kDropped: return {{FD_ERR_NOT_FOUND, "unknown transaction", "", effects}};
      case HandleKind::kNeverIssued: return {{FD_ERR_NOT_FOUND, "", "", effects}};
    }
    return {};
  }

  /* ---------------- add / finish / cancel ---------------- */
  std::vector<Fault> faults_add(uint64_t id) const {
    std::vector<Fault> f;
    if (tx_) f.push_back({FD_ERR_INVALID_STATE, "", "", kNoEffect});
    const Request *r = find(id);
    if (r != nullptr && r->state != FD_REQUEST_ACTIVE)
      f.push_back({FD_ERR_INVALID_STATE, dec(id), dec(id), kNoEffect});
    return f;
  }
  VersionChange apply_add(uint64_t id) {
    if (find(id) != nullptr) return VersionChange::kSame;  // active: no-op
    requests_[id] = Request{};
    return VersionChange::kMayGrow;
  }

  std::vector<Fault> faults_close(uint64_t id) const {
    std::vector<Fault> f;
    if (tx_) f.push_back({FD_ERR_INVALID_STATE, "", "", kNoEffect});
    const Request *r = find(id);
    if (r == nullptr)
      f.push_back({FD_ERR_NOT_FOUND, dec(id), dec(id), kNoEffect});
    else if (r->state != FD_REQUEST_ACTIVE)
      f.push_back({FD_ERR_INVALID_STATE, dec(id), dec(id), kNoEffect});
    return f;
  }
  VersionChange apply_close(uint64_t id, bool finished) {
    Request &r = requests_.at(id);
    const size_t shared = prefix_blocks_of(r);
    std::vector<int32_t> released(r.blocks.begin() + static_cast<std::ptrdiff_t>(shared),
                                  r.blocks.end());
    release(released);
    const bool changed = !released.empty() || !r.prefix.empty();
    if (!r.prefix.empty()) {
      Prefix &p = prefixes_.at(r.prefix);
      --p.refs;
      p.last_use = ++lru_clock_;  // the close of an attached request touches the LRU
    }
    r.blocks.clear();
    r.prefix.clear();
    r.seq_len = 0;
    r.state = finished ? FD_REQUEST_FINISHED : FD_REQUEST_CANCELLED;
    return changed ? VersionChange::kGrows : VersionChange::kMayGrow;
  }

  /* ---------------- begin / legacy append ---------------- */
  /* Faults shared by begin and append: ids, states, open transaction, then
   * capacity (only when everything else is valid: capacity is computed from
   * the rows' seq_lens). */
  /* `counts`: per-row token counts (empty: one token each). */
  std::vector<Fault> faults_rows(const std::vector<uint64_t> &ids,
                                 const std::vector<uint32_t> &counts = {}) const {
    const uint32_t fx = reading::kEveryFailedBeginCounts ? kTxFailure : kNoEffect;
    std::vector<Fault> f;
    if (ids.empty()) f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", fx});
    for (size_t i = 0; i < counts.size(); ++i)  // S5: each row appends at least one token
      if (counts[i] == 0)
        f.push_back({FD_ERR_INVALID_ARGUMENT, "token_counts[" + dec(i) + "] is 0",
                     "token_counts[" + dec(i) + "]", fx});
    std::vector<uint64_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size(); ++i)  // the message names the duplicate id
      if (sorted[i] == sorted[i - 1])
        f.push_back({FD_ERR_INVALID_ARGUMENT, dec(sorted[i]), dec(sorted[i]), fx});
    if (tx_) f.push_back({FD_ERR_INVALID_STATE, "", "", fx});
    for (uint64_t id : ids) {
      const Request *r = find(id);
      if (r == nullptr)
        f.push_back({FD_ERR_NOT_FOUND, dec(id), dec(id), fx});
      else if (r->state != FD_REQUEST_ACTIVE)
        f.push_back({FD_ERR_INVALID_STATE, dec(id), dec(id), fx});
    }
    if (f.empty()) {
      const std::vector<uint32_t> k =
          counts.empty() ? std::vector<uint32_t>(ids.size(), 1) : counts;
      if (blocks_needed(ids, k) > free_.size())
        f.push_back({FD_ERR_OUT_OF_BLOCKS, "", "", kCapacityFailure | kTxFailure});
    }
    return f;
  }
  std::vector<Fault> faults_begin(const std::vector<uint64_t> &ids,
                                  const std::vector<uint32_t> &counts = {}) const {
    return faults_rows(ids, counts);
  }

  /* Opens the transaction (`counts` empty: one token per row); the caller
   * then records the handle's version. Row i's tokens take positions
   * seq_len .. seq_len + k - 1; each logical block past the committed ones
   * is a new block from the front of the free list, row by row. */
  const OpenTx &apply_begin(const std::vector<uint64_t> &ids,
                            const std::vector<uint32_t> &counts = {}) {
    OpenTx t;
    t.id = next_tx_id_++;
    t.ids = ids;
    t.counts = counts.empty() ? std::vector<uint32_t>(ids.size(), 1) : counts;
    for (size_t i = 0; i < ids.size(); ++i) {
      const Request &r = requests_.at(ids[i]);
      t.first_pos.push_back(r.seq_len);
      std::vector<int32_t> table = r.blocks, mine;
      for (uint32_t j = 0; j < t.counts[i]; ++j) {
        const int32_t pos = r.seq_len + static_cast<int32_t>(j);
        const size_t index = static_cast<size_t>(pos) / bs();
        if (index == table.size()) {
          table.push_back(allocate());
          mine.push_back(table.back());
          t.new_blocks.push_back(table.back());
        }
        t.positions.push_back(pos);
        t.offsets.push_back(pos % static_cast<int32_t>(bs()));
        t.block_ids.push_back(table[index]);
      }
      t.row_new_blocks.push_back(mine);
    }
    ++c_.tx_begin;
    tx_ = t;
    return *tx_;
  }
  VersionChange begin_version_change() const {
    return tx_->new_blocks.empty() ? VersionChange::kMayGrow : VersionChange::kGrows;
  }
  void set_tx_version(uint64_t v) { tx_->version = v; }

  std::vector<Fault> faults_append(const std::vector<uint64_t> &ids, bool null_data) const {
    const uint32_t fx = reading::kEveryFailedBeginCounts ? kTxFailure : kNoEffect;
    std::vector<Fault> f;
    if (cfg_.num_layers != 1) {
      /* S5.1: "for caches with num_layers == 1"; the status is not fixed. */
      for (fd_status s : {FD_ERR_INVALID_STATE, FD_ERR_UNSUPPORTED, FD_ERR_INVALID_ARGUMENT})
        f.push_back({s, "", "", fx});
    }
    if (null_data) f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", fx});
    std::vector<Fault> rows = faults_rows(ids);
    if (!f.empty()) {  // capacity is checked last, only for an otherwise valid call
      rows.erase(std::remove_if(rows.begin(), rows.end(),
                                [](const Fault &x) { return x.status == FD_ERR_OUT_OF_BLOCKS; }),
                 rows.end());
    }
    f.insert(f.end(), rows.begin(), rows.end());
    return f;
  }
  /* Returns the (block, offset) of each row's new token for the data shadow. */
  std::vector<std::pair<int32_t, int32_t>> apply_append(const std::vector<uint64_t> &ids) {
    apply_begin(ids);
    std::vector<std::pair<int32_t, int32_t>> where;
    for (size_t i = 0; i < ids.size(); ++i) where.emplace_back(tx_->block_ids[i], tx_->offsets[i]);
    ++c_.layer_writes;
    tx_->next_layer = 1;
    publish(FD_TX_COMMITTED, /*version_known=*/false, reading::kAppendIsTransaction);
    if (!reading::kAppendIsTransaction) {
      --next_tx_id_;
      --c_.tx_begin;
      --c_.layer_writes;
      --c_.tx_commit;
    }
    return where;
  }

  /* ---------------- layer writes ---------------- */
  /* `bad_args`: the caller passes a NULL tensor or an invalid RoPE argument. */
  std::vector<Fault> faults_write(fd_tx h, uint32_t layer, bool bad_args) const {
    std::vector<Fault> f =
        handle_faults(h, false, reading::kBadHandleWriteCounts ? kTxFailure : kNoEffect);
    if (!f.empty()) return f;
    if (tx_->next_layer >= cfg_.num_layers) {
      /* Every layer is written: any further write is a wrong layer. */
      f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kTxFailure});
    } else if (layer != tx_->next_layer) {
      f.push_back(
          {FD_ERR_INVALID_ARGUMENT,
           "transaction requires layer " + dec(tx_->next_layer) + ", got layer " + dec(layer), "",
           kTxFailure});
    }
    if (bad_args) f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kTxFailure});
    return f;
  }
  void apply_write() {
    ++tx_->next_layer;
    ++c_.layer_writes;
  }

  /* ---------------- commit / abort ---------------- */
  std::vector<Fault> faults_commit(fd_tx h) const {
    std::vector<Fault> f = handle_faults(h, false, kNoEffect);
    if (f.empty() && tx_->next_layer != cfg_.num_layers)
      f.push_back({FD_ERR_INVALID_STATE, "", "", kNoEffect});
    return f;
  }
  VersionChange apply_commit() {
    publish(FD_TX_COMMITTED, true, true);
    return VersionChange::kGrows;
  }

  /* ---------------- keep-a_i commit (S5.2) ---------------- */
  std::vector<Fault> faults_commit_keep(fd_tx h, const std::vector<uint32_t> &keep) const {
    std::vector<Fault> f = handle_faults(h, false, kNoEffect);
    if (!f.empty()) return f;
    if (keep.size() != tx_->ids.size())
      f.push_back({FD_ERR_INVALID_ARGUMENT, "count", "", kNoEffect});
    for (size_t i = 0; i < keep.size() && i < tx_->counts.size(); ++i)
      if (keep[i] > tx_->counts[i])
        f.push_back({FD_ERR_INVALID_ARGUMENT, "keep_counts[" + dec(i) + "]",
                     "keep_counts[" + dec(i) + "]", kNoEffect});
    if (tx_->next_layer != cfg_.num_layers) f.push_back({FD_ERR_INVALID_STATE, "", "", kNoEffect});
    return f;
  }
  /* Row i keeps the new blocks its first keep[i] tokens reach; every other
   * new block goes back to the front of the free list, all together in
   * allocation order (the abort rule), counted as rolled back. */
  VersionChange apply_commit_keep(const std::vector<uint32_t> &keep) {
    const OpenTx t = *tx_;
    std::vector<int32_t> dropped;
    for (size_t i = 0; i < t.ids.size(); ++i) {
      Request &r = requests_.at(t.ids[i]);
      const uint64_t len = static_cast<uint64_t>(r.seq_len) + keep[i];
      const size_t kept = static_cast<size_t>((len + bs() - 1) / bs()) - r.blocks.size();
      const std::vector<int32_t> &mine = t.row_new_blocks[i];
      r.blocks.insert(r.blocks.end(), mine.begin(), mine.begin() + static_cast<long>(kept));
      dropped.insert(dropped.end(), mine.begin() + static_cast<long>(kept), mine.end());
      r.seq_len = static_cast<int32_t>(len);
    }
    free_.insert(free_.begin(), dropped.begin(), dropped.end());
    c_.rollback_blocks += dropped.size();
    ++c_.tx_commit;
    push_history({t.id, t.version, true, FD_TX_COMMITTED});
    tx_.reset();
    return VersionChange::kGrows;
  }

  /* ---------------- truncate (S5.3) ---------------- */
  std::vector<Fault> faults_truncate(const std::vector<uint64_t> &ids,
                                     const std::vector<int32_t> &lens) const {
    std::vector<Fault> f;
    if (ids.empty()) f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});
    std::vector<uint64_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size(); ++i)
      if (sorted[i] == sorted[i - 1])
        f.push_back({FD_ERR_INVALID_ARGUMENT, dec(sorted[i]), dec(sorted[i]), kNoEffect});
    if (tx_) f.push_back({FD_ERR_INVALID_STATE, "", "", kNoEffect});
    for (size_t i = 0; i < ids.size(); ++i) {
      const Request *r = find(ids[i]);
      if (r == nullptr) {
        f.push_back({FD_ERR_NOT_FOUND, dec(ids[i]), dec(ids[i]), kNoEffect});
      } else if (r->state != FD_REQUEST_ACTIVE) {
        f.push_back({FD_ERR_INVALID_STATE, dec(ids[i]), dec(ids[i]), kNoEffect});
      } else if (lens[i] < 0 || lens[i] > r->seq_len) {
        f.push_back({FD_ERR_INVALID_ARGUMENT, "seq_lens[" + dec(i) + "]",
                     "seq_lens[" + dec(i) + "]", kNoEffect});
      } else if (static_cast<uint64_t>(lens[i]) < uint64_t{prefix_blocks_of(*r)} * bs()) {
        f.push_back({FD_ERR_INVALID_ARGUMENT, "would cut into the attached prefix",
                     "seq_lens[" + dec(i) + "]", kNoEffect});
      }
    }
    return f;
  }
  /* Each request keeps its first ceil(len / block_size) blocks; the rest are
   * released as finish releases them (reading R1), row by row. */
  VersionChange apply_truncate(const std::vector<uint64_t> &ids, const std::vector<int32_t> &lens) {
    bool changed = false;
    for (size_t i = 0; i < ids.size(); ++i) {
      Request &r = requests_.at(ids[i]);
      const size_t keep = (static_cast<size_t>(lens[i]) + bs() - 1) / bs();
      release(std::vector<int32_t>(r.blocks.begin() + static_cast<long>(keep), r.blocks.end()));
      r.blocks.resize(keep);
      changed = changed || r.seq_len != lens[i];
      r.seq_len = lens[i];
    }
    return changed ? VersionChange::kGrows : VersionChange::kSame;
  }
  std::vector<Fault> faults_abort(fd_tx h) const { return handle_faults(h, false, kNoEffect); }
  VersionChange apply_abort() {
    const OpenTx t = *tx_;
    /* Exact previous order: nothing else touched the free list since begin. */
    free_.insert(free_.begin(), t.new_blocks.begin(), t.new_blocks.end());
    if (!reading::kRollbackKeepsAllocatedMark)
      for (int32_t b : t.new_blocks) ever_allocated_[static_cast<size_t>(b)] = false;
    c_.rollback_blocks += t.new_blocks.size();
    ++c_.tx_abort;
    push_history({t.id, t.version, true, FD_TX_ABORTED});
    tx_.reset();
    return t.new_blocks.empty() ? VersionChange::kMayGrow : VersionChange::kGrows;
  }

  /* ---------------- shared prefixes ---------------- */
  std::vector<Fault> faults_register(const std::string &id, uint32_t n, bool null_data) const {
    std::vector<Fault> f;
    const uint32_t cap = cfg_.prefix_cache_capacity_blocks;
    if (cap == 0) f.push_back({FD_ERR_UNSUPPORTED, "", "", kNoEffect});
    if (id.empty() || n == 0 || null_data)
      f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});
    if (tx_) f.push_back({FD_ERR_INVALID_STATE, "", "", kNoEffect});
    if (prefixes_.count(id) != 0) f.push_back({FD_ERR_ALREADY_EXISTS, id, id, kNoEffect});
    if (!f.empty()) return f;
    if (n > cap) {
      f.push_back({FD_ERR_OUT_OF_BLOCKS, "", "",
                   reading::kTooLargePrefixCounts ? (kCapacityFailure | kPrefixCapacityFailure)
                                                  : kNoEffect});
      return f;
    }
    if (evictable_blocks() < register_need(n))
      f.push_back({FD_ERR_OUT_OF_BLOCKS, "insufficient evictable prefix capacity", "",
                   kCapacityFailure | kPrefixCapacityFailure});
    return f;
  }
  /* Returns the new prefix's blocks. */
  std::vector<int32_t> apply_register(const std::string &id, uint32_t n) {
    uint64_t need = register_need(n), evicted = 0;
    while (evicted < need) {
      const std::string victim = lru_inactive();
      ++ev_.lru_evictions;
      evicted += prefixes_.at(victim).blocks.size();
      evict(victim);
    }
    Prefix p;
    for (uint32_t i = 0; i < n; ++i) p.blocks.push_back(allocate());
    p.last_use = reading::kRegisterTouchesLru ? ++lru_clock_ : 0;
    ++c_.prefix_registrations;
    prefixes_[id] = p;
    return p.blocks;
  }

  std::vector<Fault> faults_attach(uint64_t req, const std::string &pid) const {
    std::vector<Fault> f;
    if (!prefixes_enabled()) {
      /* The spec fixes UNSUPPORTED only for register; an attach on a cache
       * without prefixes may also report the (necessarily) unknown prefix. */
      f.push_back({FD_ERR_UNSUPPORTED, "", "", kNoEffect});
    }
    if (pid.empty()) f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});
    if (tx_) f.push_back({FD_ERR_INVALID_STATE, "", "", kNoEffect});
    const Request *r = find(req);
    if (r == nullptr) {
      f.push_back({FD_ERR_NOT_FOUND, dec(req), dec(req), kNoEffect});
    } else if (r->state != FD_REQUEST_ACTIVE) {
      f.push_back({FD_ERR_INVALID_STATE, dec(req), dec(req), kNoEffect});
    } else if (r->seq_len != 0 || !r->blocks.empty() || !r->prefix.empty()) {
      f.push_back({FD_ERR_INVALID_STATE, "", "", kNoEffect});
    }
    if (!pid.empty() && prefixes_.count(pid) == 0)
      f.push_back({FD_ERR_NOT_FOUND, pid, pid, kPrefixMiss});
    return f;
  }
  VersionChange apply_attach(uint64_t req, const std::string &pid) {
    Request &r = requests_.at(req);
    Prefix &p = prefixes_.at(pid);
    r.blocks = p.blocks;
    r.seq_len = static_cast<int32_t>(p.blocks.size() * bs());
    r.prefix = pid;
    ++p.refs;
    p.last_use = ++lru_clock_;
    ++c_.prefix_hits;
    return VersionChange::kGrows;
  }

  std::vector<Fault> faults_evict(const std::string &pid) const {
    std::vector<Fault> f;
    if (!prefixes_enabled()) f.push_back({FD_ERR_UNSUPPORTED, "", "", kNoEffect});
    if (pid.empty()) f.push_back({FD_ERR_INVALID_ARGUMENT, "", "", kNoEffect});
    if (tx_) f.push_back({FD_ERR_INVALID_STATE, "", "", kNoEffect});
    auto it = prefixes_.find(pid);
    if (!pid.empty() && it == prefixes_.end())
      f.push_back({FD_ERR_NOT_FOUND, pid, pid, kNoEffect});
    else if (it != prefixes_.end() && it->second.refs > 0)
      f.push_back({FD_ERR_INVALID_STATE, pid, pid, kNoEffect});
    return f;
  }
  VersionChange apply_evict(const std::string &pid) {
    evict(pid);
    return VersionChange::kGrows;
  }

  /* ---------------- failures ---------------- */
  void apply_effects(uint32_t effects) {
    if (effects & kCapacityFailure) ++c_.capacity_failures;
    if (effects & kTxFailure) ++c_.tx_failures;
    if (effects & kPrefixCapacityFailure) ++c_.prefix_capacity_failures;
    if (effects & kPrefixMiss) ++c_.prefix_misses;
  }

  /* ---------------- metrics ---------------- */
  /* Every field of fd_cache_metrics except state_version (checked apart). */
  fd_cache_metrics expected_metrics() const {
    fd_cache_metrics m{};
    m.struct_size = sizeof m;
    const uint64_t max_blocks = cfg_.max_blocks, used = max_blocks - free_.size(), b = bs();
    m.max_blocks = max_blocks;
    m.used_blocks = used;
    m.free_blocks = free_.size();
    m.block_utilization = static_cast<double>(used) / static_cast<double>(max_blocks);
    uint64_t data = 0;
    for (const auto &kv : prefixes_) data += kv.second.blocks.size() * b;
    for (const auto &kv : requests_) {
      const Request &r = kv.second;
      if (r.state != FD_REQUEST_ACTIVE) continue;
      m.active_tokens += static_cast<uint64_t>(r.seq_len);
      data += static_cast<uint64_t>(r.seq_len) - prefix_blocks_of(r) * b;
    }
    if (tx_ && reading::kPendingTokensAreData) data += tx_->ids.size();
    m.physical_data_tokens = data;
    m.reserved_tokens = used * b;
    m.internal_fragmentation_tokens = m.reserved_tokens - data;
    m.internal_fragmentation_ratio = m.reserved_tokens == 0
                                         ? 0.0
                                         : static_cast<double>(m.internal_fragmentation_tokens) /
                                               static_cast<double>(m.reserved_tokens);
    m.allocation_count = c_.allocation;
    m.fresh_allocation_count = c_.fresh;
    m.reuse_count = c_.reuse;
    m.free_count = c_.freed;
    m.capacity_failure_count = c_.capacity_failures;
    for (const auto &kv : requests_) {
      if (kv.second.state == FD_REQUEST_ACTIVE) ++m.active_request_count;
      if (kv.second.state == FD_REQUEST_FINISHED) ++m.finished_request_count;
      if (kv.second.state == FD_REQUEST_CANCELLED) ++m.cancelled_request_count;
    }
    m.transaction_begin_count = c_.tx_begin;
    m.transaction_commit_count = c_.tx_commit;
    m.transaction_abort_count = c_.tx_abort;
    m.open_transaction_count = tx_ ? 1 : 0;
    m.pending_request_count = tx_ ? tx_->ids.size() : 0;
    m.reserved_transaction_blocks = tx_ ? tx_->new_blocks.size() : 0;
    m.transaction_layer_write_count = c_.layer_writes;
    m.transaction_rollback_block_count = c_.rollback_blocks;
    m.transaction_failure_count = c_.tx_failures;
    m.retained_transaction_state_count = tx_ ? 1 : 0;
    m.terminal_transaction_history_count = history_.size();
    m.terminal_transaction_history_limit = kHistoryLimit;
    m.bytes_per_block = uint64_t{cfg_.num_layers} * 2 * cfg_.num_kv_heads * cfg_.block_size *
                        cfg_.head_dim * dtype_size(cfg_.dtype);
    m.allocated_kv_bytes = used * m.bytes_per_block;
    m.reserved_transaction_bytes = m.reserved_transaction_blocks * m.bytes_per_block;
    m.prefix_cache_capacity_blocks = cfg_.prefix_cache_capacity_blocks;
    for (const auto &kv : prefixes_) {
      const Prefix &p = kv.second;
      ++m.resident_prefix_count;
      m.resident_prefix_blocks += p.blocks.size();
      m.active_prefix_references += p.refs;
      if (p.refs > 0) m.shared_prefix_blocks += p.blocks.size();
      if (p.refs > 1) m.saved_prefix_blocks += (p.refs - 1) * p.blocks.size();
    }
    m.saved_prefix_bytes = m.saved_prefix_blocks * m.bytes_per_block;
    m.prefix_registration_count = c_.prefix_registrations;
    m.prefix_hit_count = c_.prefix_hits;
    m.prefix_miss_count = c_.prefix_misses;
    const uint64_t lookups = c_.prefix_hits + c_.prefix_misses;
    m.prefix_hit_ratio =
        lookups == 0 ? 0.0 : static_cast<double>(c_.prefix_hits) / static_cast<double>(lookups);
    m.prefix_eviction_count = c_.prefix_evictions;
    m.prefix_capacity_failure_count = c_.prefix_capacity_failures;
    return m;
  }

 private:
  int32_t allocate() {
    const int32_t b = free_.front();
    free_.pop_front();
    ++c_.allocation;
    if (ever_allocated_[static_cast<size_t>(b)]) {
      ++c_.reuse;
    } else {
      ++c_.fresh;
      ever_allocated_[static_cast<size_t>(b)] = true;
    }
    return b;
  }
  /* Reading R1. */
  void release(const std::vector<int32_t> &blocks) {
    if (reading::kReleaseLastBlockFirst) {
      for (int32_t b : blocks) free_.push_front(b);
    } else {
      free_.insert(free_.begin(), blocks.begin(), blocks.end());
    }
    c_.freed += blocks.size();
    if (blocks.size() >= 2) ++ev_.multi_block_releases;
  }
  void evict(const std::string &pid) {
    release(prefixes_.at(pid).blocks);
    prefixes_.erase(pid);
    ++c_.prefix_evictions;
  }
  uint64_t register_need(uint32_t n) const {
    const int64_t cap = cfg_.prefix_cache_capacity_blocks;
    const int64_t over_cap = static_cast<int64_t>(resident_blocks()) + n - cap;
    const int64_t over_free = static_cast<int64_t>(n) - static_cast<int64_t>(free_.size());
    return static_cast<uint64_t>(std::max<int64_t>({0, over_cap, over_free}));
  }
  uint64_t resident_blocks() const {
    uint64_t n = 0;
    for (const auto &kv : prefixes_) n += kv.second.blocks.size();
    return n;
  }
  uint64_t evictable_blocks() const {
    uint64_t n = 0;
    for (const auto &kv : prefixes_)
      if (kv.second.refs == 0) n += kv.second.blocks.size();
    return n;
  }
  std::string lru_inactive() const {
    std::string best;
    uint64_t best_use = UINT64_MAX;
    for (const auto &kv : prefixes_)
      if (kv.second.refs == 0 && kv.second.last_use < best_use) {
        best = kv.first;
        best_use = kv.second.last_use;
      }
    return best;
  }
  /* Commit (or the commit half of an append): publish every row. */
  void publish(int32_t state, bool version_known, bool record) {
    const OpenTx t = *tx_;
    for (size_t i = 0; i < t.ids.size(); ++i) {
      Request &r = requests_.at(t.ids[i]);
      r.blocks.insert(r.blocks.end(), t.row_new_blocks[i].begin(), t.row_new_blocks[i].end());
      r.seq_len += static_cast<int32_t>(t.counts[i]);
    }
    ++c_.tx_commit;
    if (record) push_history({t.id, t.version, version_known, state});
    tx_.reset();
  }
  void push_history(const HistoryEntry &e) {
    if (history_.size() == kHistoryLimit) {
      history_.pop_front();
      ++ev_.history_drops;
    }
    history_.push_back(e);
  }

  fd_cache_config cfg_;
  std::deque<int32_t> free_;
  std::vector<bool> ever_allocated_;
  std::map<uint64_t, Request> requests_;
  std::map<std::string, Prefix> prefixes_;
  std::optional<OpenTx> tx_;
  std::deque<HistoryEntry> history_;
  uint64_t next_tx_id_ = 1;
  uint64_t lru_clock_ = 0;
  Counters c_;
  Events ev_;
};

}  // namespace fdmodel

#endif  // FD_TESTS_MODEL_CACHE_MODEL_HPP
