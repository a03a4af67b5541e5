// Paged KV cache: construction, request lifecycle and metadata export
// (docs/semantics.md S4). Transactions, prefixes, metrics and the validator live in
// cache_transactions.cpp, cache_prefixes.cpp, cache_metrics.cpp and
// cache_validator.cpp.
#include "cache/paged_cache.hpp"

#include <algorithm>
#include <unordered_set>
#include <vector>

#include "core/arg_checks.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace fd {

namespace {

unsigned long long ull(uint64_t v) {
  return static_cast<unsigned long long>(v);
}

}  // namespace

PagedCache::PagedCache(const fd_cache_config &resolved)
    : storage_(make_kv_storage(resolve_kv_geometry(resolved), resolved.device)), s_(resolved) {
  // The scales (checked) are copied; the config keeps no caller pointer, so
  // fd_cache_get_config reports NULL scales (fd_cache_get_kv_scales reads
  // them).
  const uint32_t layers = resolved.num_layers;
  std::vector<float> ones(layers, 1.f);
  storage_->set_scales(resolved.k_scales != nullptr ? resolved.k_scales : ones.data(),
                       resolved.v_scales != nullptr ? resolved.v_scales : ones.data(), layers);
  s_.config.k_scales = nullptr;
  s_.config.v_scales = nullptr;
}

size_t PagedCache::element_size() const {
  return dtype_size(s_.config.dtype);
}

size_t PagedCache::input_element_size() const {
  return dtype_size(cache_input_dtype(s_.config));
}

void PagedCache::require_no_open_transaction(const char *operation) const {
  if (s_.open_tx)
    fail(FD_ERR_INVALID_STATE, "cannot %s while transaction %llu is open", operation,
         ull(s_.open_tx->id));
}

void PagedCache::set_kv_scales(const float *k_scales, const float *v_scales) {
  require_non_null(k_scales, "k_scales");
  require_non_null(v_scales, "v_scales");
  if (!dtype_is_fp8(s_.config.dtype))
    fail(FD_ERR_INVALID_STATE, "the cache's dtype %s is not FP8: it has no scales to set",
         dtype_name(s_.config.dtype));
  require_no_open_transaction("set K/V scales");
  const uint32_t layers = s_.config.num_layers;
  check_kv_scales(k_scales, layers, "k_scales");
  check_kv_scales(v_scales, layers, "v_scales");
  storage_->set_scales(k_scales, v_scales, layers);
}

void PagedCache::kv_scales(float *k_scales, float *v_scales) const {
  for (uint32_t l = 0; l < s_.config.num_layers; ++l) {
    if (k_scales != nullptr) k_scales[l] = storage_->k_scale(l);
    if (v_scales != nullptr) v_scales[l] = storage_->v_scale(l);
  }
}

const Request &PagedCache::active_request(uint64_t id) const {
  const Request *r = s_.requests.find(id);
  if (r == nullptr) fail(FD_ERR_NOT_FOUND, "unknown request %llu", ull(id));
  if (!r->active())
    fail(FD_ERR_INVALID_STATE, "request %llu is %s, not active", ull(id),
         request_state_name(r->state));
  return *r;
}

void PagedCache::check_id_list(const uint64_t *ids, uint32_t count, bool require_unique) const {
  require_non_null(ids, "request_ids");
  require_aligned(ids, alignof(uint64_t), "request_ids");
  if (count == 0) fail(FD_ERR_INVALID_ARGUMENT, "count must be > 0");
  // One hash lookup per id; the callers read the records from here. (The
  // records are not const objects: const queries only write their
  // id_check_mark scratch, begin writes them for real.)
  id_records_.resize(count);
  for (uint32_t i = 0; i < count; ++i)
    id_records_[i] = const_cast<Request *>(s_.requests.find(ids[i]));
  if (require_unique) check_unique(ids, count);
}

void PagedCache::check_unique(const uint64_t *ids, uint32_t count) const {
  // Known ids are marked in their records: O(count), no allocation. The
  // first repeated index is the one reported either way.
  const uint64_t mark = ++id_check_mark_;
  bool all_known = true;
  for (uint32_t i = 0; i < count && all_known; ++i) {
    Request *r = id_records_[i];
    if (r == nullptr) {
      all_known = false;
    } else {
      if (r->id_check_mark == mark)
        fail(FD_ERR_INVALID_ARGUMENT, "request_ids[%u] = %llu is a duplicate", i, ull(ids[i]));
      r->id_check_mark = mark;
    }
  }
  if (all_known) return;
  // Unknown ids have no record to mark (and the call fails later anyway):
  // check the whole list with a set.
  std::unordered_set<uint64_t> seen;
  seen.reserve(count);
  for (uint32_t i = 0; i < count; ++i)
    if (!seen.insert(ids[i]).second)
      fail(FD_ERR_INVALID_ARGUMENT, "request_ids[%u] = %llu is a duplicate", i, ull(ids[i]));
}

void PagedCache::check_records_active(const uint64_t *ids, uint32_t count) const {
  for (uint32_t i = 0; i < count; ++i) {
    const Request *r = id_records_[i];
    if (r == nullptr || !r->active()) active_request(ids[i]);  // throws the precise error
  }
}

void PagedCache::check_active_ids(const uint64_t *ids, uint32_t count, bool require_unique) const {
  check_id_list(ids, count, require_unique);
  check_records_active(ids, count);
}

void PagedCache::add_request(uint64_t id) {
  require_no_open_transaction("add a request");
  const Request *r = s_.requests.find(id);
  if (r != nullptr) {
    if (r->active()) return;  // adding an active id again is a no-op
    fail(FD_ERR_INVALID_STATE, "request %llu is %s; terminal states are permanent", ull(id),
         request_state_name(r->state));
  }
  s_.requests.add(id);
  ++s_.state_version;
}

bool PagedCache::discard_new_request(uint64_t id) noexcept {
  Request *r = s_.requests.find(id);
  if (r == nullptr || !r->active() || r->in_transaction || r->blocks.size() != r->prefix_blocks ||
      r->seq_len != static_cast<int32_t>(r->prefix_blocks * s_.config.block_size)) {
    return false;
  }
  if (!r->prefix_id.empty()) {
    Prefix *p = s_.prefixes.find(r->prefix_id);  // a std::map lookup: allocates nothing
    if (p == nullptr || p->ref_count == 0) return false;
    --p->ref_count;
    --s_.prefixes.counters.hit_count;
  }
  s_.requests.erase_active(id);
  ++s_.state_version;
  return true;
}

void PagedCache::release_blocks(const std::vector<int32_t> &blocks, size_t first) {
  // In logical order, each to the front: the last one is reused first.
  for (size_t i = first; i < blocks.size(); ++i) s_.allocator.release(blocks[i]);
}

void PagedCache::truncate(const uint64_t *ids, const int32_t *seq_lens, uint32_t count) {
  check_id_list(ids, count, true);  // fills id_records_
  require_non_null(seq_lens, "seq_lens");
  require_aligned(seq_lens, alignof(int32_t), "seq_lens");
  require_no_open_transaction("truncate requests");
  check_records_active(ids, count);
  const uint64_t block_size = s_.config.block_size;
  bool changed = false;
  for (uint32_t i = 0; i < count; ++i) {
    const Request &r = *id_records_[i];
    if (seq_lens[i] < 0 || seq_lens[i] > r.seq_len)
      fail(FD_ERR_INVALID_ARGUMENT,
           "seq_lens[%u] = %d is outside [0, %d] (request %llu's seq_len: truncate only shortens)",
           i, seq_lens[i], r.seq_len, ull(ids[i]));
    const uint64_t prefix_tokens = uint64_t{r.prefix_blocks} * block_size;
    if (static_cast<uint64_t>(seq_lens[i]) < prefix_tokens)
      fail(FD_ERR_INVALID_ARGUMENT,
           "seq_lens[%u] = %d would cut into the attached prefix \"%s\" of request %llu (its "
           "first %llu tokens)",
           i, seq_lens[i], r.prefix_id.c_str(), ull(ids[i]), ull(prefix_tokens));
    changed = changed || seq_lens[i] != r.seq_len;
  }
  // Nothing below can fail (releasing pushes onto the allocator's reserved
  // list; shrinking a block list does not allocate).
  for (uint32_t i = 0; i < count; ++i) {
    Request &r = *id_records_[i];
    const size_t keep =
        static_cast<size_t>((static_cast<uint64_t>(seq_lens[i]) + block_size - 1) / block_size);
    release_blocks(r.blocks, keep);  // private blocks only: keep >= prefix_blocks
    r.blocks.resize(keep);
    r.seq_len = seq_lens[i];
  }
  if (changed) ++s_.state_version;
}

void PagedCache::close_request(uint64_t id, int32_t terminal_state) {
  require_no_open_transaction(terminal_state == FD_REQUEST_FINISHED ? "finish a request"
                                                                    : "cancel a request");
  active_request(id);
  Request &r = *s_.requests.find(id);
  release_blocks(r.blocks, r.prefix_blocks);  // private blocks only
  if (!r.prefix_id.empty()) {
    Prefix *p = s_.prefixes.find(r.prefix_id);
    if (p != nullptr) {
      --p->ref_count;
      s_.prefixes.touch(*p);  // closing an attached request is an LRU touch
    }
  }
  s_.requests.close(r, terminal_state);
  ++s_.state_version;
}

int32_t PagedCache::request_state(uint64_t id) const {
  const Request *r = s_.requests.find(id);
  return r == nullptr ? FD_REQUEST_UNKNOWN : r->state;
}

uint32_t PagedCache::blocks_needed(const uint64_t *ids, uint32_t count,
                                   const uint32_t *token_counts) const {
  check_active_ids(ids, count, true);  // fills id_records_
  check_token_count_entries(token_counts, count);
  const uint64_t needed = check_token_counts(ids, token_counts, count);
  return static_cast<uint32_t>(std::min<uint64_t>(needed, UINT32_MAX));
}

uint32_t PagedCache::max_blocks_per_seq(const uint64_t *ids, uint32_t count) const {
  check_active_ids(ids, count, false);
  size_t most = 0;
  for (uint32_t i = 0; i < count; ++i) most = std::max(most, id_records_[i]->blocks.size());
  return static_cast<uint32_t>(most);
}

void PagedCache::check_export(const uint64_t *ids, uint32_t count, uint32_t table_stride,
                              const int32_t *block_tables, const int32_t *seq_lens) const {
  check_active_ids(ids, count, false);
  require_aligned(block_tables, alignof(int32_t), "block_tables");
  require_aligned(seq_lens, alignof(int32_t), "seq_lens");
  if (block_tables == nullptr) return;
  for (uint32_t i = 0; i < count; ++i) {
    const size_t n = id_records_[i]->blocks.size();
    if (n > table_stride)
      fail(FD_ERR_INVALID_ARGUMENT,
           "request %llu owns %zu blocks, more than table_stride %u (nothing written)", ull(ids[i]),
           n, table_stride);
  }
}

void PagedCache::fill_export(uint32_t count, uint32_t table_stride, int32_t *block_tables,
                             int32_t *seq_lens) const {
  for (uint32_t i = 0; i < count; ++i) {
    const Request &r = *id_records_[i];
    if (block_tables != nullptr) {
      int32_t *row = block_tables + static_cast<size_t>(i) * table_stride;
      std::copy(r.blocks.begin(), r.blocks.end(), row);
      std::fill(row + r.blocks.size(), row + table_stride, -1);
    }
    if (seq_lens != nullptr) seq_lens[i] = r.seq_len;
  }
}

void PagedCache::export_tables(const uint64_t *ids, uint32_t count, uint32_t table_stride,
                               int32_t *block_tables, int32_t *seq_lens) const {
  check_export(ids, count, table_stride, block_tables, seq_lens);
  fill_export(count, table_stride, block_tables, seq_lens);
}

LayerStorage PagedCache::layer_storage(uint32_t layer) const {
  if (layer >= s_.config.num_layers)
    fail(FD_ERR_INVALID_ARGUMENT, "layer %u out of range (num_layers = %u)", layer,
         s_.config.num_layers);
  return storage_->layer(layer);
}

void PagedCache::append(const uint64_t *ids, uint32_t count, const void *k, const void *v,
                        fd_stream stream) {
  // Everything that could make the layer write or the commit fail is checked
  // before begin, so a failing append changes nothing (S5.1).
  require_non_null(ids, "request_ids");
  require_non_null(k, "k");
  require_non_null(v, "v");
  require_aligned(k, input_element_size(), "k");
  require_aligned(v, input_element_size(), "v");
  if (s_.config.num_layers != 1)
    fail(FD_ERR_INVALID_STATE,
         "legacy append needs a cache with num_layers == 1, this cache has %u layers; use "
         "fd_tx_begin / fd_tx_write_layer / fd_tx_commit",
         s_.config.num_layers);
  const fd_tx tx = begin(ids, count);
  try {
    write_layer(tx, 0, k, v, stream);
    commit(tx);
  } catch (...) {
    // Only the storage (a device error) or memory can still fail here. The
    // caller never saw this transaction, so it must not stay open and block
    // the cache: roll it back (the seq_lens and the free list are restored;
    // the begin and abort counters show the attempt).
    try {
      abort(tx);
    } catch (...) {
    }
    throw;
  }
}

}  // namespace fd
