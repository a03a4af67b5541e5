// Internal test hook (not public): lets unit tests reach and corrupt a cache's
// state to prove that each invariant check of fd_cache_validate fires, and
// swap its K/V storage for a double (e.g. one whose copies fail).
// Production code must not use it.
#pragma once

#include "cache/cache_handle.hpp"

namespace fd {

inline CacheState &cache_state_for_test(fd_cache *cache) {
  return cache->cache.state_for_test();
}

// The cache's storage; a test may wrap it in a double that delegates to it.
inline std::unique_ptr<KvStorage> &cache_storage_for_test(fd_cache *cache) {
  return cache->cache.storage_for_test();
}

}  // namespace fd
