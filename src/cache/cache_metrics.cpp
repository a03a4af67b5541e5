// Metrics of the paged cache (docs/semantics.md S7).
#include <cstring>

#include "cache/paged_cache.hpp"
#include "core/dtype.hpp"

namespace fd {

fd_cache_metrics PagedCache::metrics() const {
  fd_cache_metrics m;
  std::memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  const fd_cache_config &c = s_.config;
  const uint64_t bs = c.block_size;

  m.max_blocks = c.max_blocks;
  m.free_blocks = s_.allocator.free_blocks();
  m.used_blocks = m.max_blocks - m.free_blocks;
  m.block_utilization = static_cast<double>(m.used_blocks) / static_cast<double>(m.max_blocks);

  // Shared prefix tokens are stored once: count resident prefixes' tokens and
  // each active request's private (tail) tokens. Tokens of an open
  // transaction are not committed and not counted.
  const uint64_t resident_blocks = s_.prefixes.resident_blocks();
  uint64_t private_tokens = 0;
  for (const auto &kv : s_.requests.all()) {
    const Request &r = kv.second;
    if (!r.active()) continue;
    m.active_tokens += static_cast<uint64_t>(r.seq_len);
    private_tokens += static_cast<uint64_t>(r.seq_len) - uint64_t{r.prefix_blocks} * bs;
  }
  m.physical_data_tokens = resident_blocks * bs + private_tokens;
  m.reserved_tokens = m.used_blocks * bs;
  m.internal_fragmentation_tokens = m.reserved_tokens - m.physical_data_tokens;
  m.internal_fragmentation_ratio = m.reserved_tokens == 0
                                       ? 0.0
                                       : static_cast<double>(m.internal_fragmentation_tokens) /
                                             static_cast<double>(m.reserved_tokens);

  const AllocatorCounters &a = s_.allocator.counters();
  m.allocation_count = a.allocation_count;
  m.fresh_allocation_count = a.fresh_allocation_count;
  m.reuse_count = a.reuse_count;
  m.free_count = a.free_count;
  m.capacity_failure_count = a.capacity_failure_count;

  m.active_request_count = s_.requests.active_count();
  m.finished_request_count = s_.requests.finished_count();
  m.cancelled_request_count = s_.requests.cancelled_count();

  const TransactionCounters &t = s_.tx_counters;
  m.transaction_begin_count = t.begin_count;
  m.transaction_commit_count = t.commit_count;
  m.transaction_abort_count = t.abort_count;
  m.open_transaction_count = s_.open_tx ? 1 : 0;
  m.pending_request_count = s_.open_tx ? s_.open_tx->rows.size() : 0;
  m.reserved_transaction_blocks = s_.open_tx ? s_.open_tx->new_blocks.size() : 0;
  m.transaction_layer_write_count = t.layer_write_count;
  m.transaction_rollback_block_count = t.rollback_block_count;
  m.transaction_failure_count = t.failure_count;
  m.retained_transaction_state_count = s_.open_tx ? 1 : 0;
  m.terminal_transaction_history_count = s_.history.size();
  m.terminal_transaction_history_limit = s_.history.limit();

  m.bytes_per_block =
      uint64_t{c.num_layers} * 2 * c.num_kv_heads * bs * c.head_dim * dtype_size(c.dtype);
  m.allocated_kv_bytes = m.used_blocks * m.bytes_per_block;
  m.reserved_transaction_bytes = m.reserved_transaction_blocks * m.bytes_per_block;

  m.prefix_cache_capacity_blocks = c.prefix_cache_capacity_blocks;
  m.resident_prefix_count = s_.prefixes.all().size();
  m.resident_prefix_blocks = resident_blocks;
  for (const auto &kv : s_.prefixes.all()) {
    const Prefix &p = kv.second;
    const uint64_t n = p.blocks.size();
    m.active_prefix_references += p.ref_count;
    if (p.ref_count > 0) {
      m.shared_prefix_blocks += n;
      m.saved_prefix_blocks += (p.ref_count - 1) * n;
    }
  }
  m.saved_prefix_bytes = m.saved_prefix_blocks * m.bytes_per_block;
  const PrefixCounters &pc = s_.prefixes.counters;
  m.prefix_registration_count = pc.registration_count;
  m.prefix_hit_count = pc.hit_count;
  m.prefix_miss_count = pc.miss_count;
  const uint64_t lookups = pc.hit_count + pc.miss_count;
  m.prefix_hit_ratio =
      lookups == 0 ? 0.0 : static_cast<double>(pc.hit_count) / static_cast<double>(lookups);
  m.prefix_eviction_count = pc.eviction_count;
  m.prefix_capacity_failure_count = pc.capacity_failure_count;
  m.state_version = s_.state_version;
  return m;
}

}  // namespace fd
