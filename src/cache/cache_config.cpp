// Checking and resolving fd_cache_config (semantics.md S4.1).
#include <climits>
#include <cstddef>
#include <cstring>

#include "cache/kv_storage.hpp"
#include "cache/paged_cache.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

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
  return c;
}

namespace {

// The geometry fields are the least a caller must pass; the tail (prefix
// capacity, dtype, layout, device) takes defaults when an older, smaller
// struct omits it.
constexpr size_t kMinConfigSize = offsetof(fd_cache_config, max_blocks) + sizeof(uint32_t);

// End offsets of fd_cache_config's fields, in order.
constexpr size_t kConfigFieldEnds[] = {
    offsetof(fd_cache_config, struct_size) + 4,
    offsetof(fd_cache_config, num_layers) + 4,
    offsetof(fd_cache_config, num_kv_heads) + 4,
    offsetof(fd_cache_config, head_dim) + 4,
    offsetof(fd_cache_config, block_size) + 4,
    offsetof(fd_cache_config, max_blocks) + 4,
    offsetof(fd_cache_config, prefix_cache_capacity_blocks) + 4,
    offsetof(fd_cache_config, dtype) + 4,
    offsetof(fd_cache_config, layout) + 4,
    offsetof(fd_cache_config, device) + sizeof(fd_device),
    offsetof(fd_cache_config, reserved0) + 4,
    offsetof(fd_cache_config, k_storage) + sizeof(void *),
    offsetof(fd_cache_config, v_storage) + sizeof(void *),
    offsetof(fd_cache_config, stride_layer) + 8,
    offsetof(fd_cache_config, stride_block) + 8,
    offsetof(fd_cache_config, stride_head) + 8,
    offsetof(fd_cache_config, stride_token) + 8,
    offsetof(fd_cache_config, stride_dim) + 8,
};
static_assert(offsetof(fd_cache_config, stride_dim) + 8 == sizeof(fd_cache_config),
              "kConfigFieldEnds must list every field of fd_cache_config");

void require_positive(uint32_t value, const char *name) {
  if (value == 0) fail(FD_ERR_INVALID_ARGUMENT, "config.%s must be > 0", name);
}

}  // namespace

size_t cache_config_fitting_bytes(uint32_t struct_size) {
  size_t bytes = 0;
  for (size_t end : kConfigFieldEnds)
    if (end <= struct_size) bytes = end;
  return bytes;
}

fd_cache_config resolve_cache_config(const fd_cache_config *config) {
  require_non_null(config, "config");
  if (config->struct_size < kMinConfigSize)
    fail(FD_ERR_INVALID_ARGUMENT,
         "config.struct_size %u is too small (at least %zu, through max_blocks)",
         config->struct_size, kMinConfigSize);
  if (config->struct_size > sizeof(fd_cache_config))
    fail(FD_ERR_INVALID_ARGUMENT,
         "config.struct_size %u is larger than this library's fd_cache_config (%zu): the "
         "caller was built against a newer header",
         config->struct_size, sizeof(fd_cache_config));
  fd_cache_config c = default_cache_config();
  // Copy whole fields only: up to the last field that fits entirely.
  std::memcpy(&c, config, cache_config_fitting_bytes(config->struct_size));
  c.struct_size = sizeof c;

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
  if (!dtype_valid(c.dtype))
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
  KvGeometry g{c.num_layers, c.max_blocks, c.num_kv_heads, c.head_dim,
               c.block_size, c.dtype,      c.layout};
  check_geometry_size(g);
  resolve_external_storage(c, g);
  return c;
}

}  // namespace fd
