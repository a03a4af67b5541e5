// The definition behind the public opaque handle fd_cache. Internal code
// (the engine, tools) may include this to reach the PagedCache of a handle.
#pragma once

#include "cache/paged_cache.hpp"

struct fd_cache {
  explicit fd_cache(const fd_cache_config &resolved) : cache(resolved) {}
  fd::PagedCache cache;
};
