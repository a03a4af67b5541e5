// The paged KV cache (docs/semantics.md S4-S7): block allocator, requests, at most
// one open transaction, shared prefixes and the K/V storage behind its seam.
//
// Every operation validates everything first and mutates only afterwards, so
// a thrown fd::Error leaves the cache unchanged (except for the failure
// counters that the spec names). Externally synchronised: no locking here and
// no state shared between caches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/block_allocator.hpp"
#include "cache/kv_storage.hpp"
#include "cache/prefix_registry.hpp"
#include "cache/request_table.hpp"
#include "cache/transaction.hpp"
#include "flashdec.h"

namespace fd {

struct TransactionCounters {
  uint64_t begin_count = 0;
  uint64_t commit_count = 0;
  uint64_t abort_count = 0;
  uint64_t layer_write_count = 0;
  uint64_t rollback_block_count = 0;
  uint64_t failure_count = 0;
};

// Everything that the invariants of S7 talk about, in one place so the
// validator (and the internal test hook) can see it.
struct CacheState {
  explicit CacheState(const fd_cache_config &c)
      : config(c), allocator(c.max_blocks), prefixes(c.prefix_cache_capacity_blocks) {}

  fd_cache_config config;  // resolved, full size
  BlockAllocator allocator;
  RequestTable requests;
  PrefixRegistry prefixes;
  std::unique_ptr<OpenTransaction> open_tx;  // null when none is open
  TransactionHistory history;
  TransactionCounters tx_counters;
  uint64_t next_tx_id = 1;
  uint64_t state_version = 0;
};

// Defaults of fd_cache_config_init.
fd_cache_config default_cache_config();

// Checks and resolves a caller's config (struct_size, defaults, ranges).
fd_cache_config resolve_cache_config(const fd_cache_config *config);

// The least struct_size of fd_cache_config a caller may pass (in or out):
// through max_blocks; the tail takes defaults.
constexpr size_t kMinCacheConfigSize = offsetof(fd_cache_config, max_blocks) + sizeof(uint32_t);

class PagedCache {
 public:
  explicit PagedCache(const fd_cache_config &resolved);

  const fd_cache_config &config() const { return s_.config; }
  uint64_t state_version() const { return s_.state_version; }

  // Requests (S4.3-S4.5).
  void add_request(uint64_t id);
  void finish_request(uint64_t id) { close_request(id, FD_REQUEST_FINISHED); }
  void cancel_request(uint64_t id) { close_request(id, FD_REQUEST_CANCELLED); }
  int32_t request_state(uint64_t id) const;
  // Internal (no C API): undoes add_request, and the attach_prefix that may
  // have followed it, for a request that has done nothing else (no private
  // block, not in a transaction): its record is erased as if it had never
  // been added, and an attached prefix loses the reference and the hit that
  // the attach counted. Only the state version moves on (and the prefix's
  // LRU stamp stays as the attach touched it). The engine uses it to take
  // back the admissions of a decision that failed half way. Never fails:
  // returns false, changing nothing, for a request outside that description.
  bool discard_new_request(uint64_t id) noexcept;
  // New blocks growing each listed request by token_counts[i] tokens (NULL:
  // one each) needs: fd_cache_blocks_needed(_multi), begin's own count.
  uint32_t blocks_needed(const uint64_t *ids, uint32_t count,
                         const uint32_t *token_counts = nullptr) const;
  uint32_t free_blocks() const { return s_.allocator.free_blocks(); }

  // FP8 scales (fd_cache_set_kv_scales / fd_cache_get_kv_scales).
  void set_kv_scales(const float *k_scales, const float *v_scales);
  void kv_scales(float *k_scales, float *v_scales) const;
  uint32_t max_blocks_per_seq(const uint64_t *ids, uint32_t count) const;
  void export_tables(const uint64_t *ids, uint32_t count, uint32_t table_stride,
                     int32_t *block_tables, int32_t *seq_lens) const;
  // export_tables in two halves, for exports that stage in between:
  // check_export validates everything (the ids, the destinations' alignment,
  // and the stride when tables are wanted, i.e. block_tables is not NULL);
  // fill_export then writes the rows of the ids it checked, as long as the
  // cache has not been used in between.
  void check_export(const uint64_t *ids, uint32_t count, uint32_t table_stride,
                    const int32_t *block_tables, const int32_t *seq_lens) const;
  void fill_export(uint32_t count, uint32_t table_stride, int32_t *block_tables,
                   int32_t *seq_lens) const;
  LayerStorage layer_storage(uint32_t layer) const;
  void append(const uint64_t *ids, uint32_t count, const void *k, const void *v, fd_stream stream);
  // Shortens committed requests (S5.3): validates everything, then sets the
  // lengths and releases the blocks past each new end.
  void truncate(const uint64_t *ids, const int32_t *seq_lens, uint32_t count);

  // Transactions (S5). `token_counts` NULL: one token per row (fd_tx_begin).
  fd_tx begin(const uint64_t *ids, uint32_t count, const uint32_t *token_counts = nullptr);
  void write_layer(fd_tx tx, uint32_t layer, const void *k, const void *v, fd_stream stream);
  void write_layer_rope(fd_tx tx, uint32_t layer, const void *q, uint32_t num_q_heads,
                        const void *k, const void *v, uint32_t rotary_dim, float rope_base,
                        void *q_out, fd_stream stream);
  void commit(fd_tx tx) { commit_keep(tx, nullptr, 0, false); }
  // Keeps the first keep_counts[i] new tokens of row i (every token when
  // `partial` is false: keep_counts and count are then ignored).
  void commit_keep(fd_tx tx, const uint32_t *keep_counts, uint32_t count, bool partial = true);
  void abort(fd_tx tx);
  // The open transaction `tx` names; throws the precise handle error otherwise.
  const OpenTransaction &open_transaction(fd_tx tx) const;
  uint32_t tx_max_blocks_per_seq(const OpenTransaction &t) const;
  // The physical block of a row's logical block `index` (committed or new).
  int32_t tx_row_block(const OpenTransaction &t, const TxRow &row, size_t index) const;
  void tx_block_tables(const OpenTransaction &t, uint32_t table_stride,
                       int32_t *block_tables) const;

  // Shared prefixes (S6).
  void register_prefix(const char *id, const void *k_blocks, const void *v_blocks,
                       uint32_t num_blocks, fd_stream stream);
  void attach_prefix(uint64_t request_id, const char *prefix_id);
  void evict_prefix(const char *prefix_id);
  const Prefix &prefix_info(const char *prefix_id) const;

  // Observability (S7).
  fd_cache_metrics metrics() const;
  // Empty when every invariant holds, else the first violation in words.
  std::string find_invariant_violation() const;

  // Internal test hooks (see cache/cache_test_hook.hpp).
  CacheState &state_for_test() { return s_; }
  std::unique_ptr<KvStorage> &storage_for_test() { return storage_; }

  // The K/V storage (device-side exports and fault queries use it).
  KvStorage &storage() const { return *storage_; }

 private:
  void close_request(uint64_t id, int32_t terminal_state);
  void require_no_open_transaction(const char *operation) const;
  // Looks up an id that must be active (NOT_FOUND / INVALID_STATE otherwise).
  const Request &active_request(uint64_t id) const;
  // Checks a list of ids: non-NULL and aligned, count > 0, optionally
  // unique. Leaves the record of ids[i] (null when unknown) in
  // id_records_[i].
  void check_id_list(const uint64_t *ids, uint32_t count, bool require_unique) const;
  // Throws the first duplicate of ids[0..count) (id_records_ filled).
  void check_unique(const uint64_t *ids, uint32_t count) const;
  // Throws NOT_FOUND / INVALID_STATE for the first id of the last checked
  // list that is not active.
  void check_records_active(const uint64_t *ids, uint32_t count) const;
  // As check_id_list, and every id is active.
  void check_active_ids(const uint64_t *ids, uint32_t count, bool require_unique) const;
  OpenTransaction &mutable_transaction(fd_tx tx);
  // A non-NULL token_counts list: aligned, every entry >= 1.
  static void check_token_count_entries(const uint32_t *token_counts, uint32_t count);
  // begin's checks of the rows' new lengths (within int32, the whole step
  // too) and its block need; id_records_ holds the rows' records.
  uint64_t check_token_counts(const uint64_t *ids, const uint32_t *token_counts,
                              uint32_t count) const;
  // Checks a layer write's layer and data pointers (non-NULL, aligned); a
  // failure counts in transaction_failure_count.
  void check_layer_write(const OpenTransaction &t, uint32_t layer, const void *k, const void *v);
  void write_rows(OpenTransaction &t, uint32_t layer, const void *q, uint32_t num_q_heads,
                  const void *k, const void *v, uint32_t rotary_dim, float rope_base, void *q_out,
                  fd_stream stream);
  // Ends the open transaction as `state` (its rows leave it, the history
  // records it in the slot that begin reserved); the caller has done the
  // rest. Never fails.
  void end_transaction(int32_t state) noexcept;
  void release_blocks(const std::vector<int32_t> &blocks, size_t first);
  std::string prefix_key(const char *prefix_id) const;
  // The resident prefix `key` (NOT_FOUND otherwise).
  const Prefix &resident_prefix(const std::string &key) const;
  // The physical blocks a registration of `num_blocks` blocks gets once
  // `victims` are evicted (in that order), without changing anything.
  void plan_prefix_blocks(const std::vector<std::string> &victims, uint32_t num_blocks,
                          std::vector<int32_t> *blocks) const;

  // Bytes of one element of the cache's dtype (stored K/V: prefix blocks)
  // and of its input_dtype (the alignment layer writes' K, V, Q need).
  size_t element_size() const;
  size_t input_element_size() const;

  // The storage is made first: a device that cannot hold it refuses the
  // cache before the host bookkeeping of max_blocks blocks is built.
  std::unique_ptr<KvStorage> storage_;
  CacheState s_;

  // Scratch reused across calls so that large batches cost one hash lookup
  // per id and no allocation in steady state. Nothing observable: the cache
  // is used by one thread at a time, const queries included.
  mutable std::vector<Request *> id_records_;  // records of the last checked id list
  mutable uint64_t id_check_mark_ = 0;         // Request::id_check_mark of that list
  // A terminal transaction's object, kept for the next begin (its vectors
  // keep their capacity); null while it is the open one.
  std::unique_ptr<OpenTransaction> spare_tx_;
};

}  // namespace fd
