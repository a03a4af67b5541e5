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

uint64_t PagedCache::check_token_counts(const uint64_t *ids, const uint32_t *token_counts,
                                        uint32_t count) const {
  // Every row's new length, and the tokens of the whole transaction, must be
  // int32 (positions, lengths and the layer writes' token count are).
  const uint64_t block_size = s_.config.block_size;
  uint64_t tokens = 0, needed = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const Request &r = *id_records_[i];
    const uint64_t k = token_counts ? token_counts[i] : 1;
    const uint64_t end = static_cast<uint64_t>(r.seq_len) + k;
    if (end > static_cast<uint64_t>(INT32_MAX))
      fail(FD_ERR_INVALID_ARGUMENT,
           "token_counts[%u] = %llu: request %llu's seq_len %d + %llu exceeds INT32_MAX", i, ull(k),
           ull(ids[i]), r.seq_len, ull(k));
    tokens += k;
    needed += (end + block_size - 1) / block_size - r.blocks.size();
  }
  if (tokens > static_cast<uint64_t>(INT32_MAX))
    fail(FD_ERR_INVALID_ARGUMENT, "token_counts sum to %llu tokens, more than INT32_MAX",
         ull(tokens));
  return needed;
}

void PagedCache::check_token_count_entries(const uint32_t *token_counts, uint32_t count) {
  if (token_counts == nullptr) return;
  require_aligned(token_counts, alignof(uint32_t), "token_counts");
  for (uint32_t i = 0; i < count; ++i)
    if (token_counts[i] == 0)
      fail(FD_ERR_INVALID_ARGUMENT, "token_counts[%u] is 0: each row appends at least one token",
           i);
}

fd_tx PagedCache::begin(const uint64_t *ids, uint32_t count, const uint32_t *token_counts) {
  check_id_list(ids, count, true);  // fills id_records_
  check_token_count_entries(token_counts, count);
  require_no_open_transaction("begin a transaction");
  check_records_active(ids, count);
  const uint64_t needed = check_token_counts(ids, token_counts, count);
  if (needed > s_.allocator.free_blocks()) {
    // The only counters a failed begin moves (S5).
    s_.allocator.record_capacity_failure();
    ++s_.tx_counters.failure_count;
    fail(FD_ERR_OUT_OF_BLOCKS, "transaction needs %llu new blocks, only %u are free", ull(needed),
         s_.allocator.free_blocks());
  }

  // Build the whole transaction (and reserve device staging) before touching
  // the allocator, in the previous transaction's object (its vectors keep
  // their capacity).
  const uint32_t block_size = s_.config.block_size;
  if (!spare_tx_) spare_tx_ = std::make_unique<OpenTransaction>();
  OpenTransaction &t = *spare_tx_;
  t.rows.resize(count);
  uint32_t tokens = 0, blocks = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Request &r = *id_records_[i];
    TxRow &row = t.rows[i];
    row.request_id = ids[i];
    row.request = &r;
    row.position = r.seq_len;
    row.offset = static_cast<int32_t>(static_cast<uint32_t>(r.seq_len) % block_size);
    row.token_count = token_counts ? token_counts[i] : 1;
    row.first_token = tokens;
    const uint64_t end = static_cast<uint64_t>(r.seq_len) + row.token_count;
    row.table_size = static_cast<uint32_t>((end + block_size - 1) / block_size);
    row.new_block_count = row.table_size - static_cast<uint32_t>(r.blocks.size());
    row.first_new_block = blocks;
    tokens += row.token_count;  // checked: fits int32
    blocks += row.new_block_count;
  }
  t.new_blocks.reserve(blocks);
  t.locations.resize(tokens);
  t.positions.resize(tokens);
  storage_->reserve_rows(tokens);
  // What commit and abort would allocate, reserved now, so that neither can
  // fail for memory once the transaction is open (a caller that must undo
  // its writes can always abort). Block lists grow geometrically, not one
  // entry at a time, so a growing row rarely reallocates.
  s_.history.reserve_next(count);
  for (const TxRow &row : t.rows) {
    std::vector<int32_t> &list = row.request->blocks;
    if (row.table_size > list.capacity())
      list.reserve(std::max<size_t>({8, 2 * list.size(), row.table_size}));
  }

  // Nothing below can fail.
  for (TxRow &row : t.rows) {
    for (uint32_t b = 0; b < row.new_block_count; ++b)
      t.new_blocks.push_back(s_.allocator.allocate());  // capacity reserved above
    for (uint32_t j = 0; j < row.token_count; ++j) {
      const uint32_t pos = static_cast<uint32_t>(row.position) + j;
      t.locations[row.first_token + j] = RowLocation{tx_row_block(t, row, pos / block_size),
                                                     static_cast<int32_t>(pos % block_size)};
      t.positions[row.first_token + j] = static_cast<int32_t>(pos);
    }
    row.block = t.locations[row.first_token].block;
    row.request->in_transaction = true;
  }
  storage_->stage_rows(t.locations.data(), t.positions.data(), tokens);
  ++s_.state_version;
  t.id = s_.next_tx_id++;
  t.cache_version = s_.state_version;
  ++s_.tx_counters.begin_count;
  s_.open_tx = std::move(spare_tx_);
  return fd_tx{t.id, t.cache_version};
}

int32_t PagedCache::tx_row_block(const OpenTransaction &t, const TxRow &row, size_t index) const {
  const std::vector<int32_t> &committed = row.request->blocks;
  if (index < committed.size()) return committed[index];
  return t.new_blocks[row.first_new_block + (index - committed.size())];
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
    require_aligned(k, input_element_size(), "k");
    require_aligned(v, input_element_size(), "v");
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
    storage_->check_write(t.locations.size(), nullptr, 0, k, v, nullptr);
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
    require_aligned(q, input_element_size(), "q");
    require_aligned(q_out, input_element_size(), "q_out");
    const uint32_t kv_heads = s_.config.num_kv_heads;
    if (num_q_heads == 0 || num_q_heads % kv_heads != 0)
      fail(FD_ERR_INVALID_ARGUMENT,
           "num_q_heads %u must be a positive multiple of the cache's num_kv_heads %u", num_q_heads,
           kv_heads);
    check_rope_args(s_.config.head_dim, rotary_dim, rope_base);
    storage_->check_write(t.locations.size(), q, num_q_heads, k, v, q_out);
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

void PagedCache::commit_keep(fd_tx tx, const uint32_t *keep_counts, uint32_t count, bool partial) {
  OpenTransaction &t = mutable_transaction(tx);
  if (partial) {
    require_non_null(keep_counts, "keep_counts");
    require_aligned(keep_counts, alignof(uint32_t), "keep_counts");
    if (count != t.rows.size())
      fail(FD_ERR_INVALID_ARGUMENT, "count %u must equal transaction %llu's batch of %zu rows",
           count, ull(t.id), t.rows.size());
    for (uint32_t i = 0; i < count; ++i)
      if (keep_counts[i] > t.rows[i].token_count)
        fail(FD_ERR_INVALID_ARGUMENT,
             "keep_counts[%u] = %u is more than the %u tokens row %u (request %llu) appended", i,
             keep_counts[i], t.rows[i].token_count, i, ull(t.rows[i].request_id));
  }
  if (t.next_layer != s_.config.num_layers)
    fail(FD_ERR_INVALID_STATE,
         "transaction %llu has written %u of %u layers; commit needs every layer", ull(t.id),
         t.next_layer, s_.config.num_layers);
  // begin reserved the history slot and the block lists' room: nothing here
  // allocates. New blocks that hold no kept token go back to the free list
  // as an abort returns them: the later rows' first, so that together they
  // lie at the front in their previous order.
  const uint32_t block_size = s_.config.block_size;
  uint64_t dropped = 0;
  for (size_t i = t.rows.size(); i > 0; --i) {
    const TxRow &row = t.rows[i - 1];
    Request &r = *row.request;
    const uint32_t keep = partial ? keep_counts[i - 1] : row.token_count;
    const uint32_t new_len = static_cast<uint32_t>(r.seq_len) + keep;
    const uint32_t kept_blocks =
        (new_len + block_size - 1) / block_size - static_cast<uint32_t>(r.blocks.size());
    const int32_t *mine = t.new_blocks.data() + row.first_new_block;
    r.blocks.insert(r.blocks.end(), mine, mine + kept_blocks);  // within the reserved capacity
    s_.allocator.rollback(mine + kept_blocks, row.new_block_count - kept_blocks);
    dropped += row.new_block_count - kept_blocks;
    r.seq_len = static_cast<int32_t>(new_len);
  }
  s_.tx_counters.rollback_block_count += dropped;
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
    const int32_t *mine = t.new_blocks.data() + row.first_new_block;
    std::copy(mine, mine + row.new_block_count, out + blocks.size());
    std::fill(out + row.table_size, out + table_stride, -1);
  }
}

}  // namespace fd
