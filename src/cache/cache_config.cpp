// Checking and resolving fd_cache_config (docs/semantics.md S4.1).
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "cache/block_allocator.hpp"
#include "cache/kv_storage.hpp"
#include "cache/paged_cache.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/versioned.hpp"

namespace fd {

fd_cache_config default_cache_config() {
  fd_cache_config c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.num_layers = 1;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.block_size = 16;
  c.max_blocks = 1024;
  c.prefix_cache_capacity_blocks = 0;
  c.dtype = FD_DTYPE_F16;
  c.layout = FD_LAYOUT_TOKEN_MAJOR;
  c.device.type = FD_DEVICE_CPU;
  c.device.ordinal = 0;
  c.input_dtype = -1;
  return c;
}

namespace {

void require_positive(uint32_t value, const char *name) {
  if (value == 0) fail(FD_ERR_INVALID_ARGUMENT, "config.%s must be > 0", name);
}

// Bytes of physical memory of this machine (sysconf), at most PTRDIFF_MAX
// (no allocation can be larger); PTRDIFF_MAX when the system does not say.
uint64_t host_memory_limit() {
  const uint64_t most = static_cast<uint64_t>(PTRDIFF_MAX);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t bytes = 0;
  if (pages <= 0 || page <= 0 ||
      __builtin_mul_overflow(static_cast<uint64_t>(pages), static_cast<uint64_t>(page), &bytes))
    return most;
  return bytes < most ? bytes : most;
}

// Refuses, before anything is allocated, a cache whose host memory cannot
// exist on this machine: the per-block bookkeeping the cache builds at
// creation (BlockAllocator::kBytesPerBlock per block) plus, for a CPU cache
// with owned storage, K and V themselves. A device refuses its own storage
// when the storage is made (before the host bookkeeping is built).
void check_cache_fits(const fd_cache_config &c, const KvGeometry &g) {
  // K (and V) bytes fit int64 (check_geometry_size), so both fit uint64;
  // with the bookkeeping the sum saturates.
  const uint64_t kv_bytes = static_cast<uint64_t>(g.total_elements()) * g.element_size();
  const uint64_t bookkeeping = uint64_t{c.max_blocks} * BlockAllocator::kBytesPerBlock;
  const bool host_storage = c.device.type == FD_DEVICE_CPU && c.k_storage == nullptr;
  uint64_t host = bookkeeping;
  if (host_storage && __builtin_add_overflow(host, 2 * kv_bytes, &host)) host = UINT64_MAX;
  const uint64_t limit = host_memory_limit();
  if (host <= limit) return;
  const std::string storage = host_storage ? format("K and V storage of %llu bytes each and ",
                                                    static_cast<unsigned long long>(kv_bytes))
                                           : std::string();
  fail(FD_ERR_OUT_OF_MEMORY,
       "cannot allocate the cache: it needs %llu bytes of host memory (%s%llu bytes of block "
       "bookkeeping for max_blocks %u), more than this machine's physical memory (%llu bytes); "
       "nothing was allocated",
       static_cast<unsigned long long>(host), storage.c_str(),
       static_cast<unsigned long long>(bookkeeping), c.max_blocks,
       static_cast<unsigned long long>(limit));
}

}  // namespace

fd_cache_config resolve_cache_config(const fd_cache_config *config) {
  // struct_size policy of core/versioned.hpp: older, smaller structs get the
  // defaults for their missing tail (whole fields only); newer, larger ones
  // are refused.
  const fd_cache_config c =
      read_versioned<kMinCacheConfigSize>(config, default_cache_config(), "config");

  require_positive(c.num_layers, "num_layers");
  require_positive(c.num_kv_heads, "num_kv_heads");
  require_positive(c.head_dim, "head_dim");
  require_positive(c.block_size, "block_size");
  require_positive(c.max_blocks, "max_blocks");
  // Block ids and seq_lens are int32 in the ABI.
  if (c.max_blocks > static_cast<uint32_t>(INT32_MAX))
    fail(FD_ERR_INVALID_ARGUMENT, "config.max_blocks %u exceeds INT32_MAX (block ids are int32)",
         c.max_blocks);
  if (static_cast<uint64_t>(c.max_blocks) * c.block_size > static_cast<uint64_t>(INT32_MAX))
    fail(FD_ERR_INVALID_ARGUMENT,
         "config.max_blocks %u * block_size %u exceeds INT32_MAX (seq_lens are int32)",
         c.max_blocks, c.block_size);
  if (c.prefix_cache_capacity_blocks > c.max_blocks)
    fail(FD_ERR_INVALID_ARGUMENT, "config.prefix_cache_capacity_blocks %u exceeds max_blocks %u",
         c.prefix_cache_capacity_blocks, c.max_blocks);
  if (!kv_dtype_valid(c.dtype))
    fail(FD_ERR_INVALID_ARGUMENT, "config.dtype %d is not an fd_dtype", c.dtype);
  if (c.layout != FD_LAYOUT_TOKEN_MAJOR && c.layout != FD_LAYOUT_DIM_MAJOR)
    fail(FD_ERR_INVALID_ARGUMENT, "config.layout %d is not an fd_kv_layout", c.layout);
  if (c.device.type == FD_DEVICE_CPU) {
    if (c.device.ordinal != 0)
      fail(FD_ERR_INVALID_ARGUMENT, "config.device.ordinal must be 0 for a CPU device, got %d",
           c.device.ordinal);
  } else if (c.device.type == FD_DEVICE_CUDA) {
    if (c.device.ordinal < 0)
      fail(FD_ERR_INVALID_ARGUMENT, "config.device.ordinal must be >= 0, got %d", c.device.ordinal);
  } else {
    fail(FD_ERR_INVALID_ARGUMENT, "config.device.type %d is not an fd_device_type", c.device.type);
  }
  check_cache_fits(c, resolve_kv_geometry(c));
  return c;
}

}  // namespace fd
