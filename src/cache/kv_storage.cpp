#include "cache/kv_storage.hpp"

#include <cstdint>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace fd {

size_t KvGeometry::element_size() const {
  return dtype_size(dtype);
}

size_t KvGeometry::block_elements() const {
  return static_cast<size_t>(num_kv_heads) * block_size * head_dim;
}

size_t KvGeometry::layer_elements() const {
  return block_elements() * max_blocks;
}

size_t KvGeometry::total_elements() const {
  return layer_elements() * num_layers;
}

void KvGeometry::strides(int64_t out[4]) const {
  const int64_t bs = block_size, d = head_dim;
  out[0] = static_cast<int64_t>(block_elements());  // block
  out[1] = bs * d;                                  // head
  if (layout == FD_LAYOUT_DIM_MAJOR) {
    out[2] = 1;   // token
    out[3] = bs;  // dim
  } else {
    out[2] = d;
    out[3] = 1;
  }
}

void check_geometry_size(const KvGeometry &g) {
  // Every product below is checked, so block_elements() etc. are exact later.
  size_t n = g.element_size();
  const uint32_t factors[] = {g.num_kv_heads, g.block_size, g.head_dim, g.max_blocks, g.num_layers};
  for (uint32_t f : factors) {
    if (__builtin_mul_overflow(n, static_cast<size_t>(f), &n) || n > static_cast<size_t>(INT64_MAX))
      fail(FD_ERR_INVALID_ARGUMENT,
           "cache size overflows: num_layers=%u * max_blocks=%u * num_kv_heads=%u * "
           "block_size=%u * head_dim=%u elements of %zu bytes does not fit in memory",
           g.num_layers, g.max_blocks, g.num_kv_heads, g.block_size, g.head_dim, g.element_size());
  }
}

std::unique_ptr<KvStorage> make_kv_storage(const KvGeometry &geometry, const fd_device &device) {
  if (device.type == FD_DEVICE_CUDA) return make_cuda_kv_storage(geometry, device.ordinal);
  return make_cpu_kv_storage(geometry);
}

}  // namespace fd
