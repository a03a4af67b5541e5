// Multi-layer token transactions of the paged cache (docs/semantics.md S5).
#include <algorithm>
#include <utility>

#include "cache/paged_cache.hpp"
#include "core/arg_checks.hpp"
#include "core/error.hpp"
#include "ops/rope.hpp"

namespace fd {

namespace {
unsigned long long ull(uint64_t v) {
  return static_cast<unsigned long long>(v);
}
}  // namespace

fd_tx PagedCache::begin(const uint64_t *ids, uint32_t count) {
  check_id_list(ids, count, true);  // fills id_records_
  require_no_open_transaction("begin a transaction");
  check_records_active(ids, count);

  const int32_t block_size = static_cast<int32_t>(s_.config.block_size);
  uint32_t needed = 0;
  for (uint32_t i = 0; i < count; ++i)
    if (id_records_[i]->seq_len % block_size == 0) ++needed;
  if (needed > s_.allocator.free_blocks()) {
    // The only counters a failed begin moves (S5).
    s_.allocator.record_capacity_failure();
    ++s_.tx_counters.failure_count;
    fail(FD_ERR_OUT_OF_BLOCKS, "transaction needs %u new blocks, only %u are free", needed,
         s_.allocator.free_blocks());
  }

  // Build the whole transaction (and reserve device staging) before touching
  // the allocator, in the previous transaction's object (its vectors keep
  // their capacity).
  if (!spare_tx_) spare_tx_ = std::make_unique<OpenTransaction>();
  OpenTransaction &t = *spare_tx_;
  t.rows.resize(count);
  t.new_blocks.reserve(needed);
  t.locations.resize(count);
  t.positions.resize(count);
  storage_->reserve_rows(count);
  for (uint32_t i = 0; i < count; ++i) {
    Request &r = *id_records_[i];
    TxRow &row = t.rows[i];
    row.request_id = ids[i];
    row.request = &r;
    row.position = r.seq_len;
    row.offset = r.seq_len % block_size;
    row.new_block = row.offset == 0;
    row.table_size = static_cast<uint32_t>(r.blocks.size()) + (row.new_block ? 1u : 0u);
    row.block = row.new_block ? 0 : r.blocks.back();
  }
  // What commit and abort would allocate, reserved now, so that neither can
  // fail for memory once the transaction is open (a caller that must undo
  // its writes can always abort). Block lists grow geometrically, not one
  // entry at a time, so a growing row rarely reallocates.
  s_.history.reserve_next(count);
  for (const TxRow &row : t.rows) {
    std::vector<int32_t> &blocks = row.request->blocks;
    if (row.new_block && blocks.size() == blocks.capacity())
      blocks.reserve(std::max<size_t>(8, 2 * blocks.size()));
  }

  // Nothing below can fail.
  for (uint32_t i = 0; i < count; ++i) {
    TxRow &row = t.rows[i];
    if (row.new_block) {
      row.block = s_.allocator.allocate();
      t.new_blocks.push_back(row.block);  // capacity reserved above
    }
    row.request->in_transaction = true;
    t.locations[i] = RowLocation{row.block, row.offset};
    t.positions[i] = row.position;
  }
  storage_->stage_rows(t.locations.data(), t.positions.data(), count);
  ++s_.state_version;
  t.id = s_.next_tx_id++;
  t.cache_version = s_.state_version;
  ++s_.tx_counters.begin_count;
  s_.open_tx = std::move(spare_tx_);
  return fd_tx{t.id, t.cache_version};
}

const OpenTransaction &PagedCache::open_transaction(fd_tx tx) const {
  if (s_.open_tx && s_.open_tx->id == tx.id) {
    if (s_.open_tx->cache_version == tx.cache_version) return *s_.open_tx;
    fail(FD_ERR_STALE_HANDLE,
         "stale transaction handle: transaction %llu began at cache version %llu, the handle "
         "says %llu",
         ull(tx.id), ull(s_.open_tx->cache_version), ull(tx.cache_version));
  }
  if (const TerminalTransaction *e = s_.history.find(tx.id)) {
    if (e->cache_version != tx.cache_version)
      fail(FD_ERR_STALE_HANDLE,
           "stale transaction handle: transaction %llu began at cache version %llu, the "
           "handle says %llu",
           ull(tx.id), ull(e->cache_version), ull(tx.cache_version));
    fail(FD_ERR_INVALID_STATE, "transaction %llu is already %s", ull(tx.id),
         tx_state_name(e->state));
  }
  fail(FD_ERR_NOT_FOUND,
       "unknown transaction %llu (never begun in this cache, or older than the last %zu "
       "terminal transactions)",
       ull(tx.id), s_.history.limit());
}

OpenTransaction &PagedCache::mutable_transaction(fd_tx tx) {
  open_transaction(tx);  // throws the precise handle error
  return *s_.open_tx;
}

void PagedCache::check_layer_write(const OpenTransaction &t, uint32_t layer, const void *k,
                                   const void *v) {
  try {
    if (layer != t.next_layer || layer >= s_.config.num_layers) {
      if (t.next_layer == s_.config.num_layers)
        fail(FD_ERR_INVALID_ARGUMENT,
             "transaction %llu has written all %u layers (commit it), got layer %u", ull(t.id),
             s_.config.num_layers, layer);
      fail(FD_ERR_INVALID_ARGUMENT, "transaction requires layer %u, got layer %u", t.next_layer,
           layer);
    }
    require_non_null(k, "k");
    require_non_null(v, "v");
    require_aligned(k, element_size(), "k");
    require_aligned(v, element_size(), "v");
  } catch (const Error &) {
    ++s_.tx_counters.failure_count;
    throw;
  }
}

void PagedCache::write_rows(OpenTransaction &t, uint32_t layer, const void *q, uint32_t num_q_heads,
                            const void *k, const void *v, uint32_t rotary_dim, float rope_base,
                            void *q_out, fd_stream stream) {
  // Locations and positions come from the cache's own copy made at begin.
  // A storage failure (e.g. a device launch error) is a failed layer write
  // too: counted, and the transaction stays where it was (S5).
  try {
    if (q == nullptr)
      storage_->write_layer(layer, t.locations.data(), t.locations.size(), k, v, stream);
    else
      storage_->write_layer_rope(layer, t.locations.data(), t.positions.data(), t.locations.size(),
                                 q, num_q_heads, k, v, rotary_dim, rope_base, q_out, stream);
  } catch (...) {
    ++s_.tx_counters.failure_count;
    throw;
  }
  ++t.next_layer;
  ++s_.tx_counters.layer_write_count;
}

void PagedCache::write_layer(fd_tx tx, uint32_t layer, const void *k, const void *v,
                             fd_stream stream) {
  OpenTransaction &t = mutable_transaction(tx);
  check_layer_write(t, layer, k, v);
  try {
    storage_->check_write(t.rows.size(), nullptr, 0, k, v, nullptr);
  } catch (const Error &) {
    ++s_.tx_counters.failure_count;
    throw;
  }
  write_rows(t, layer, nullptr, 0, k, v, 0, 0.f, nullptr, stream);
}

void PagedCache::write_layer_rope(fd_tx tx, uint32_t layer, const void *q, uint32_t num_q_heads,
                                  const void *k, const void *v, uint32_t rotary_dim,
                                  float rope_base, void *q_out, fd_stream stream) {
  OpenTransaction &t = mutable_transaction(tx);
  check_layer_write(t, layer, k, v);
  try {
    require_non_null(q, "q");
    require_non_null(q_out, "q_out");
    require_aligned(q, element_size(), "q");
    require_aligned(q_out, element_size(), "q_out");
    const uint32_t kv_heads = s_.config.num_kv_heads;
    if (num_q_heads == 0 || num_q_heads % kv_heads != 0)
      fail(FD_ERR_INVALID_ARGUMENT,
           "num_q_heads %u must be a positive multiple of the cache's num_kv_heads %u", num_q_heads,
           kv_heads);
    check_rope_args(s_.config.head_dim, rotary_dim, rope_base);
    storage_->check_write(t.rows.size(), q, num_q_heads, k, v, q_out);
  } catch (const Error &) {
    ++s_.tx_counters.failure_count;
    throw;
  }
  write_rows(t, layer, q, num_q_heads, k, v, rotary_dim, rope_base, q_out, stream);
}

void PagedCache::end_transaction(int32_t state) noexcept {
  OpenTransaction &t = *s_.open_tx;
  for (const TxRow &row : t.rows) row.request->in_transaction = false;
  s_.history.record(t.id, t.cache_version, state, t.rows);  // slot reserved by the caller
  // Drop the full state (S5) but keep the emptied object and its vectors'
  // capacity as scratch for the next begin.
  t.rows.clear();
  t.new_blocks.clear();
  t.locations.clear();
  t.positions.clear();
  t.id = 0;
  t.cache_version = 0;
  t.next_layer = 0;
  spare_tx_ = std::move(s_.open_tx);
  ++s_.state_version;
}

void PagedCache::commit(fd_tx tx) {
  OpenTransaction &t = mutable_transaction(tx);
  if (t.next_layer != s_.config.num_layers)
    fail(FD_ERR_INVALID_STATE,
         "transaction %llu has written %u of %u layers; commit needs every layer", ull(t.id),
         t.next_layer, s_.config.num_layers);
  // begin reserved the history slot and the block lists' room: nothing here
  // allocates.
  for (const TxRow &row : t.rows) {
    Request &r = *row.request;
    if (row.new_block) r.blocks.push_back(row.block);
    ++r.seq_len;
  }
  end_transaction(FD_TX_COMMITTED);
  ++s_.tx_counters.commit_count;
}

void PagedCache::abort(fd_tx tx) {
  OpenTransaction &t = mutable_transaction(tx);
  s_.allocator.rollback(t.new_blocks);  // the history slot was reserved by begin
  s_.tx_counters.rollback_block_count += t.new_blocks.size();
  end_transaction(FD_TX_ABORTED);
  ++s_.tx_counters.abort_count;
}

uint32_t PagedCache::tx_max_blocks_per_seq(const OpenTransaction &t) const {
  uint32_t most = 0;
  for (const TxRow &row : t.rows) most = std::max(most, row.table_size);
  return most;
}

void PagedCache::tx_block_tables(const OpenTransaction &t, uint32_t table_stride,
                                 int32_t *block_tables) const {
  require_non_null(block_tables, "block_tables");
  for (const TxRow &row : t.rows)
    if (row.table_size > table_stride)
      fail(FD_ERR_INVALID_ARGUMENT,
           "request %llu has %u blocks in this transaction, more than table_stride %u "
           "(nothing written)",
           ull(row.request_id), row.table_size, table_stride);
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const TxRow &row = t.rows[i];
    const std::vector<int32_t> &blocks = row.request->blocks;
    int32_t *out = block_tables + i * table_stride;
    std::copy(blocks.begin(), blocks.end(), out);
    if (row.new_block) out[blocks.size()] = row.block;
    std::fill(out + row.table_size, out + table_stride, -1);
  }
}

}  // namespace fd
