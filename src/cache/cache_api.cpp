// The C API of the paged KV cache, transactions and shared prefixes. Each
// function checks its pointers, runs inside fd::guard, computes into locals
// and writes out-pointers only on success.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "cache/cache_handle.hpp"
#include "core/arg_checks.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"

namespace {

using fd::require_non_null;

const fd::PagedCache &cache_of(const fd_cache *cache) {
  require_non_null(cache, "cache");
  return cache->cache;
}

fd::PagedCache &cache_of(fd_cache *cache) {
  require_non_null(cache, "cache");
  return cache->cache;
}

}  // namespace

extern "C" {

FD_API void fd_cache_config_init(fd_cache_config *config) {
  if (config != nullptr) *config = fd::default_cache_config();
}

FD_API fd_status fd_cache_set_kv_scales(fd_cache *cache, const float *k_scales,
                                        const float *v_scales) {
  return fd::guard([&] {
    cache_of(cache).set_kv_scales(k_scales, v_scales);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_get_kv_scales(const fd_cache *cache, float *k_scales, float *v_scales) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    fd::require_aligned(k_scales, alignof(float), "k_scales");
    fd::require_aligned(v_scales, alignof(float), "v_scales");
    c.kv_scales(k_scales, v_scales);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_create(const fd_cache_config *config, fd_cache **out) {
  return fd::guard([&] {
    require_non_null(out, "out");
    const fd_cache_config resolved = fd::resolve_cache_config(config);
    std::unique_ptr<fd_cache> cache(new fd_cache(resolved));
    *out = cache.release();
    return FD_OK;
  });
}

FD_API void fd_cache_destroy(fd_cache *cache) {
  delete cache;
}

FD_API fd_status fd_cache_get_config(const fd_cache *cache, fd_cache_config *config) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    fd::write_versioned<fd::kMinCacheConfigSize>(config, c.config(), "config");
    return FD_OK;
  });
}

FD_API fd_status fd_cache_add_request(fd_cache *cache, uint64_t request_id) {
  return fd::guard([&] {
    cache_of(cache).add_request(request_id);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_finish_request(fd_cache *cache, uint64_t request_id) {
  return fd::guard([&] {
    cache_of(cache).finish_request(request_id);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_cancel_request(fd_cache *cache, uint64_t request_id) {
  return fd::guard([&] {
    cache_of(cache).cancel_request(request_id);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_request_state(const fd_cache *cache, uint64_t request_id,
                                        int32_t *state) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    require_non_null(state, "state");
    *state = c.request_state(request_id);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_blocks_needed(const fd_cache *cache, const uint64_t *request_ids,
                                        uint32_t count, uint32_t *needed, uint32_t *free_blocks) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    require_non_null(needed, "needed");
    const uint32_t n = c.blocks_needed(request_ids, count);
    *needed = n;
    if (free_blocks != nullptr) *free_blocks = c.free_blocks();
    return FD_OK;
  });
}

FD_API fd_status fd_cache_blocks_needed_multi(const fd_cache *cache, const uint64_t *request_ids,
                                              const uint32_t *token_counts, uint32_t count,
                                              uint32_t *needed, uint32_t *free_blocks) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    require_non_null(needed, "needed");
    const uint32_t n = c.blocks_needed(request_ids, count, token_counts);
    *needed = n;
    if (free_blocks != nullptr) *free_blocks = c.free_blocks();
    return FD_OK;
  });
}

FD_API fd_status fd_cache_max_blocks_per_seq(const fd_cache *cache, const uint64_t *request_ids,
                                             uint32_t count, uint32_t *max_blocks_per_seq) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    require_non_null(max_blocks_per_seq, "max_blocks_per_seq");
    *max_blocks_per_seq = c.max_blocks_per_seq(request_ids, count);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_export(const fd_cache *cache, const uint64_t *request_ids, uint32_t count,
                                 uint32_t table_stride, int32_t *block_tables, int32_t *seq_lens) {
  return fd::guard([&] {
    cache_of(cache).export_tables(request_ids, count, table_stride, block_tables, seq_lens);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_state_version(const fd_cache *cache, uint64_t *version) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    require_non_null(version, "version");
    *version = c.state_version();
    return FD_OK;
  });
}

FD_API fd_status fd_cache_layer_storage(fd_cache *cache, uint32_t layer, void **k, void **v,
                                        int64_t strides[4]) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    require_non_null(k, "k");
    require_non_null(v, "v");
    require_non_null(strides, "strides");
    fd::require_aligned(strides, alignof(int64_t), "strides");
    const fd::LayerStorage s = c.layer_storage(layer);
    *k = s.k;
    *v = s.v;
    std::copy(s.strides, s.strides + 4, strides);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_append(fd_cache *cache, const uint64_t *request_ids, uint32_t count,
                                 const void *k, const void *v, fd_stream stream) {
  return fd::guard([&] {
    cache_of(cache).append(request_ids, count, k, v, stream);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_truncate(fd_cache *cache, const uint64_t *request_ids,
                                   const int32_t *seq_lens, uint32_t count) {
  return fd::guard([&] {
    cache_of(cache).truncate(request_ids, seq_lens, count);
    return FD_OK;
  });
}

FD_API fd_status fd_cache_metrics_get(const fd_cache *cache, fd_cache_metrics *metrics) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    constexpr size_t kMin = offsetof(fd_cache_metrics, max_blocks) + sizeof(uint64_t);
    fd::require_versioned<kMin>(metrics, "metrics");
    fd::write_versioned<kMin>(metrics, c.metrics(), "metrics");
    return FD_OK;
  });
}

FD_API fd_status fd_cache_validate(const fd_cache *cache) {
  return fd::guard([&] {
    const std::string violation = cache_of(cache).find_invariant_violation();
    if (!violation.empty()) fd::fail(FD_ERR_INVARIANT, "invariant violated: %s", violation.c_str());
    return FD_OK;
  });
}

/* Transactions ------------------------------------------------------------ */

FD_API fd_status fd_tx_begin(fd_cache *cache, const uint64_t *request_ids, uint32_t count,
                             fd_tx *tx) {
  return fd::guard([&] {
    fd::PagedCache &c = cache_of(cache);
    require_non_null(tx, "tx");
    *tx = c.begin(request_ids, count);
    return FD_OK;
  });
}

FD_API fd_status fd_tx_begin_multi(fd_cache *cache, const uint64_t *request_ids,
                                   const uint32_t *token_counts, uint32_t count, fd_tx *tx) {
  return fd::guard([&] {
    fd::PagedCache &c = cache_of(cache);
    require_non_null(tx, "tx");
    require_non_null(token_counts, "token_counts");
    *tx = c.begin(request_ids, count, token_counts);
    return FD_OK;
  });
}

FD_API fd_status fd_tx_write_layer(fd_cache *cache, fd_tx tx, uint32_t layer, const void *k,
                                   const void *v, fd_stream stream) {
  return fd::guard([&] {
    cache_of(cache).write_layer(tx, layer, k, v, stream);
    return FD_OK;
  });
}

FD_API fd_status fd_tx_write_layer_rope(fd_cache *cache, fd_tx tx, uint32_t layer, const void *q,
                                        uint32_t num_q_heads, const void *k, const void *v,
                                        uint32_t rotary_dim, float rope_base, void *q_out,
                                        fd_stream stream) {
  return fd::guard([&] {
    cache_of(cache).write_layer_rope(tx, layer, q, num_q_heads, k, v, rotary_dim, rope_base, q_out,
                                     stream);
    return FD_OK;
  });
}

FD_API fd_status fd_tx_commit(fd_cache *cache, fd_tx tx) {
  return fd::guard([&] {
    cache_of(cache).commit(tx);
    return FD_OK;
  });
}

FD_API fd_status fd_tx_commit_keep(fd_cache *cache, fd_tx tx, const uint32_t *keep_counts,
                                   uint32_t count) {
  return fd::guard([&] {
    cache_of(cache).commit_keep(tx, keep_counts, count);
    return FD_OK;
  });
}

FD_API fd_status fd_tx_abort(fd_cache *cache, fd_tx tx) {
  return fd::guard([&] {
    cache_of(cache).abort(tx);
    return FD_OK;
  });
}

FD_API fd_status fd_tx_get_info(const fd_cache *cache, fd_tx tx, fd_tx_info *info) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    constexpr size_t kMin = offsetof(fd_tx_info, batch) + sizeof(uint32_t);
    fd::require_versioned<kMin>(info, "info");
    const fd::OpenTransaction &t = c.open_transaction(tx);
    fd_tx_info full;
    std::memset(&full, 0, sizeof full);
    full.batch = static_cast<uint32_t>(t.rows.size());
    full.next_layer = t.next_layer;
    full.state = FD_TX_OPEN;
    full.max_blocks_per_seq = c.tx_max_blocks_per_seq(t);
    full.new_block_count = static_cast<uint32_t>(t.new_blocks.size());
    full.token_count = static_cast<uint32_t>(t.locations.size());
    fd::write_versioned<kMin>(info, full, "info");
    return FD_OK;
  });
}

FD_API fd_status fd_tx_get_rows(const fd_cache *cache, fd_tx tx, uint32_t capacity,
                                uint64_t *request_ids, int32_t *positions, int32_t *block_ids,
                                int32_t *offsets, int32_t *effective_seq_lens) {
  return fd::guard([&] {
    const fd::OpenTransaction &t = cache_of(cache).open_transaction(tx);
    fd::require_aligned(request_ids, alignof(uint64_t), "request_ids");
    fd::require_aligned(positions, alignof(int32_t), "positions");
    fd::require_aligned(block_ids, alignof(int32_t), "block_ids");
    fd::require_aligned(offsets, alignof(int32_t), "offsets");
    fd::require_aligned(effective_seq_lens, alignof(int32_t), "effective_seq_lens");
    const bool any = request_ids || positions || block_ids || offsets || effective_seq_lens;
    if (any && capacity < t.rows.size())
      fd::fail(FD_ERR_INVALID_ARGUMENT, "capacity %u is smaller than the transaction's %zu rows",
               capacity, t.rows.size());
    for (size_t i = 0; i < t.rows.size(); ++i) {
      const fd::TxRow &row = t.rows[i];
      if (request_ids) request_ids[i] = row.request_id;
      if (positions) positions[i] = row.position;
      if (block_ids) block_ids[i] = row.block;
      if (offsets) offsets[i] = row.offset;
      if (effective_seq_lens)
        effective_seq_lens[i] = row.position + static_cast<int32_t>(row.token_count);
    }
    return FD_OK;
  });
}

FD_API fd_status fd_tx_get_tokens(const fd_cache *cache, fd_tx tx, uint32_t capacity,
                                  int32_t *positions, int32_t *block_ids, int32_t *offsets) {
  return fd::guard([&] {
    const fd::OpenTransaction &t = cache_of(cache).open_transaction(tx);
    fd::require_aligned(positions, alignof(int32_t), "positions");
    fd::require_aligned(block_ids, alignof(int32_t), "block_ids");
    fd::require_aligned(offsets, alignof(int32_t), "offsets");
    const size_t tokens = t.locations.size();
    if ((positions || block_ids || offsets) && capacity < tokens)
      fd::fail(FD_ERR_INVALID_ARGUMENT,
               "capacity %u is smaller than the transaction's %zu tokens (token_count)", capacity,
               tokens);
    for (size_t i = 0; i < tokens; ++i) {
      if (positions) positions[i] = t.positions[i];
      if (block_ids) block_ids[i] = t.locations[i].block;
      if (offsets) offsets[i] = t.locations[i].offset;
    }
    return FD_OK;
  });
}

FD_API fd_status fd_tx_block_tables(const fd_cache *cache, fd_tx tx, uint32_t table_stride,
                                    int32_t *block_tables) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    require_non_null(block_tables, "block_tables");
    const fd::OpenTransaction &t = c.open_transaction(tx);
    fd::require_aligned(block_tables, alignof(int32_t), "block_tables");
    c.tx_block_tables(t, table_stride, block_tables);
    return FD_OK;
  });
}

/* Shared prefixes ----------------------------------------------------------- */

FD_API fd_status fd_prefix_register(fd_cache *cache, const char *prefix_id, const void *k_blocks,
                                    const void *v_blocks, uint32_t num_blocks, fd_stream stream) {
  return fd::guard([&] {
    cache_of(cache).register_prefix(prefix_id, k_blocks, v_blocks, num_blocks, stream);
    return FD_OK;
  });
}

FD_API fd_status fd_prefix_attach(fd_cache *cache, uint64_t request_id, const char *prefix_id) {
  return fd::guard([&] {
    cache_of(cache).attach_prefix(request_id, prefix_id);
    return FD_OK;
  });
}

FD_API fd_status fd_prefix_evict(fd_cache *cache, const char *prefix_id) {
  return fd::guard([&] {
    cache_of(cache).evict_prefix(prefix_id);
    return FD_OK;
  });
}

FD_API fd_status fd_prefix_get_info(const fd_cache *cache, const char *prefix_id,
                                    fd_prefix_info *info) {
  return fd::guard([&] {
    const fd::PagedCache &c = cache_of(cache);
    constexpr size_t kMin = offsetof(fd_prefix_info, num_blocks) + sizeof(uint32_t);
    fd::require_versioned<kMin>(info, "info");
    const fd::Prefix &p = c.prefix_info(prefix_id);
    fd_prefix_info full;
    std::memset(&full, 0, sizeof full);
    full.num_blocks = static_cast<uint32_t>(p.blocks.size());
    full.ref_count = p.ref_count;
    full.last_use = p.last_use;
    full.first_block = p.blocks.front();
    fd::write_versioned<kMin>(info, full, "info");
    return FD_OK;
  });
}

}  // extern "C"
