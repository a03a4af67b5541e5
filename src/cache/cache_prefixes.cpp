// Shared prefix blocks of the paged cache (docs/semantics.md S6).
#include <algorithm>
#include <cassert>
#include <utility>

#include "cache/paged_cache.hpp"
#include "core/arg_checks.hpp"
#include "core/error.hpp"

namespace fd {

namespace {
unsigned long long ull(uint64_t v) {
  return static_cast<unsigned long long>(v);
}
}  // namespace

std::string PagedCache::prefix_key(const char *prefix_id) const {
  require_non_null(prefix_id, "prefix_id");
  if (prefix_id[0] == '\0') fail(FD_ERR_INVALID_ARGUMENT, "prefix_id must not be empty");
  return std::string(prefix_id);
}

void PagedCache::register_prefix(const char *id, const void *k_blocks, const void *v_blocks,
                                 uint32_t num_blocks, fd_stream stream) {
  std::string key = prefix_key(id);
  require_non_null(k_blocks, "k_blocks");
  require_non_null(v_blocks, "v_blocks");
  require_aligned(k_blocks, element_size(), "k_blocks");
  require_aligned(v_blocks, element_size(), "v_blocks");
  if (num_blocks == 0) fail(FD_ERR_INVALID_ARGUMENT, "num_blocks must be > 0");
  PrefixRegistry &reg = s_.prefixes;
  if (!reg.enabled())
    fail(FD_ERR_UNSUPPORTED,
         "shared prefixes are disabled in this cache (prefix_cache_capacity_blocks = 0)");
  require_no_open_transaction("register a prefix");
  if (reg.find(key) != nullptr)
    fail(FD_ERR_ALREADY_EXISTS, "prefix \"%s\" is already registered", key.c_str());
  if (num_blocks > reg.capacity())
    fail(FD_ERR_OUT_OF_BLOCKS,
         "prefix \"%s\" has %u blocks, more than prefix_cache_capacity_blocks %u", key.c_str(),
         num_blocks, reg.capacity());

  // need = max(0, resident + n - capacity, n - free), covered by evicting
  // unreferenced prefixes in LRU order, decided before any eviction.
  const int64_t n = num_blocks;
  const int64_t resident = static_cast<int64_t>(reg.resident_blocks());
  const int64_t need = std::max<int64_t>(
      {0, resident + n - reg.capacity(), n - static_cast<int64_t>(s_.allocator.free_blocks())});
  std::vector<std::string> victims;
  if (!reg.pick_victims(static_cast<uint64_t>(need), &victims)) {
    s_.allocator.record_capacity_failure();
    ++reg.counters.capacity_failure_count;
    fail(FD_ERR_OUT_OF_BLOCKS,
         "insufficient evictable prefix capacity: prefix \"%s\" needs %lld more blocks than "
         "are available, and unreferenced prefixes cannot free that many",
         key.c_str(), static_cast<long long>(need));
  }

  // All or nothing: the copy is the only step that can fail after the
  // checks (a device copy error), so it goes first, into the blocks that the
  // evictions and allocations below will produce; the registry, the free
  // list and every counter change only once it has succeeded.
  PrefixRegistry::Node node = PrefixRegistry::make_node(key, num_blocks);
  std::vector<int32_t> &blocks = node.mapped().blocks;
  plan_prefix_blocks(victims, num_blocks, &blocks);
  storage_->copy_blocks_in(blocks.data(), blocks.size(), k_blocks, v_blocks, stream);

  // Nothing below can fail (no allocation: the node's blocks are reserved).
  for (const std::string &victim : victims) {
    release_blocks(reg.remove(victim), 0);
    ++reg.counters.eviction_count;
  }
  for (uint32_t i = 0; i < num_blocks; ++i) {
    const int32_t block = s_.allocator.allocate();
    assert(block == blocks[i] && "plan_prefix_blocks must predict the allocation");
    (void)block;
  }
  reg.insert(std::move(node));
  ++reg.counters.registration_count;
  ++s_.state_version;
}

void PagedCache::plan_prefix_blocks(const std::vector<std::string> &victims, uint32_t num_blocks,
                                    std::vector<int32_t> *blocks) const {
  // Evicting releases each victim's blocks in logical order to the front of
  // the free list (release_blocks), so afterwards the front holds the
  // released blocks last-released first, then the current free list.
  std::vector<int32_t> released;
  for (const std::string &victim : victims) {
    const std::vector<int32_t> &b = s_.prefixes.find(victim)->blocks;
    released.insert(released.end(), b.begin(), b.end());
  }
  blocks->clear();
  for (size_t i = 0; i < num_blocks; ++i)
    blocks->push_back(i < released.size() ? released[released.size() - 1 - i]
                                          : s_.allocator.peek(i - released.size()));
}

void PagedCache::attach_prefix(uint64_t request_id, const char *prefix_id) {
  std::string key = prefix_key(prefix_id);
  require_no_open_transaction("attach a prefix");
  active_request(request_id);
  Request &r = *s_.requests.find(request_id);
  if (!r.prefix_id.empty())
    fail(FD_ERR_INVALID_STATE, "request %llu already has prefix \"%s\" attached", ull(request_id),
         r.prefix_id.c_str());
  if (r.seq_len != 0 || !r.blocks.empty())
    fail(FD_ERR_INVALID_STATE,
         "request %llu is not empty (seq_len %d); attach needs an empty "
         "request",
         ull(request_id), r.seq_len);
  Prefix *p = s_.prefixes.find(key);
  if (p == nullptr) {
    ++s_.prefixes.counters.miss_count;
    fail(FD_ERR_NOT_FOUND, "unknown prefix \"%s\"%s", key.c_str(),
         s_.prefixes.enabled() ? "" : " (shared prefixes are disabled in this cache)");
  }
  std::vector<int32_t> blocks = p->blocks;  // allocates before any change
  r.blocks = std::move(blocks);
  r.prefix_id = std::move(key);
  r.prefix_blocks = static_cast<uint32_t>(r.blocks.size());
  r.seq_len = static_cast<int32_t>(r.prefix_blocks * s_.config.block_size);
  ++p->ref_count;
  s_.prefixes.touch(*p);
  ++s_.prefixes.counters.hit_count;
  ++s_.state_version;
}

void PagedCache::evict_prefix(const char *prefix_id) {
  const std::string key = prefix_key(prefix_id);
  require_no_open_transaction("evict a prefix");
  const Prefix &p = resident_prefix(key);
  if (p.ref_count != 0)
    fail(FD_ERR_INVALID_STATE, "prefix \"%s\" is attached to %u active requests", key.c_str(),
         p.ref_count);
  release_blocks(s_.prefixes.remove(key), 0);
  ++s_.prefixes.counters.eviction_count;
  ++s_.state_version;
}

const Prefix &PagedCache::prefix_info(const char *prefix_id) const {
  // A read: allowed while a transaction is open (S5 refuses the prefix
  // mutations; the header lists no invalid-state status for get_info).
  return resident_prefix(prefix_key(prefix_id));
}

const Prefix &PagedCache::resident_prefix(const std::string &key) const {
  const Prefix *p = s_.prefixes.find(key);
  if (p == nullptr)
    fail(FD_ERR_NOT_FOUND, "unknown prefix \"%s\"%s", key.c_str(),
         s_.prefixes.enabled() ? "" : " (shared prefixes are disabled in this cache)");
  return *p;
}

}  // namespace fd
