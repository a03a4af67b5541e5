// Internal test hook (not public): lets unit tests reach and corrupt a cache's
// state to prove that each invariant check of fd_cache_validate fires.
// Production code must not use it.
#pragma once

#include "cache/cache_handle.hpp"

namespace fd {

inline CacheState &cache_state_for_test(fd_cache *cache) {
  return cache->cache.state_for_test();
}

}  // namespace fd
