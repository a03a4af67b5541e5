#include "cache/kv_storage.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "core/arg_checks.hpp"
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

void KvStorage::export_tables(size_t table_ints, size_t len_ints, int32_t *tables, int32_t *lens,
                              fd_stream, ExportFill fill) {
  // Host destinations: fill scratch first so that a throwing fill writes
  // nothing, then copy. The scratch is kept for the next export.
  export_scratch_.resize(table_ints + len_ints);
  int32_t *t = export_scratch_.data(), *l = t + table_ints;
  fill(t, l);
  if (tables != nullptr) std::copy(t, t + table_ints, tables);
  if (lens != nullptr) std::copy(l, l + len_ints, lens);
}

void resolve_external_storage(const fd_cache_config &c, KvGeometry &g) {
  if (c.reserved0 != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "config.reserved0 must be 0, got %u", c.reserved0);
  const int64_t given[5] = {c.stride_layer, c.stride_block, c.stride_head, c.stride_token,
                            c.stride_dim};
  const char *names[5] = {"stride_layer", "stride_block", "stride_head", "stride_token",
                          "stride_dim"};
  if ((c.k_storage == nullptr) != (c.v_storage == nullptr))
    fail(FD_ERR_INVALID_ARGUMENT,
         "config.k_storage and config.v_storage must both be set (external storage) or both be "
         "NULL (owned storage)");
  // The caller's storage is an array of the cache's dtype.
  require_aligned(c.k_storage, g.element_size(), "config.k_storage");
  require_aligned(c.v_storage, g.element_size(), "config.v_storage");
  if (c.k_storage == nullptr) {
    for (int i = 0; i < 5; ++i)
      if (given[i] != 0)
        fail(FD_ERR_INVALID_ARGUMENT,
             "config.%s is %lld, but strides need external storage (k_storage is NULL)", names[i],
             static_cast<long long>(given[i]));
    return;
  }
  int64_t s[5];
  const bool packed = given[1] == 0 && given[2] == 0 && given[3] == 0 && given[4] == 0;
  if (packed) {
    g.strides(s + 1);
  } else {
    for (int i = 1; i < 5; ++i) {
      if (given[i] <= 0)
        fail(FD_ERR_INVALID_ARGUMENT,
             "config.%s must be > 0 when any block/head/token/dim stride is set, got %lld",
             names[i], static_cast<long long>(given[i]));
      s[i] = given[i];
    }
    const bool dim_major = g.layout == FD_LAYOUT_DIM_MAJOR;
    const int contiguous = dim_major ? 3 : 4;
    if (s[contiguous] != 1)
      fail(FD_ERR_INVALID_ARGUMENT, "config.%s must be 1 for the %s layout, got %lld",
           names[contiguous], dim_major ? "dim-major" : "token-major",
           static_cast<long long>(s[contiguous]));
  }
  if (given[0] < 0)
    fail(FD_ERR_INVALID_ARGUMENT, "config.stride_layer must be >= 0, got %lld",
         static_cast<long long>(given[0]));
  // Largest element offset any (layer, block, head, token, dim) reaches must
  // fit, in bytes, in int64.
  bool overflow = false;
  if (given[0] == 0) {
    overflow |= __builtin_mul_overflow(int64_t{g.max_blocks}, s[1], &s[0]);
  } else {
    s[0] = given[0];
  }
  const int64_t counts[5] = {g.num_layers, g.max_blocks, g.num_kv_heads, g.block_size, g.head_dim};
  int64_t span = 1;
  for (int i = 0; i < 5; ++i) {
    int64_t term = 0;
    overflow |= __builtin_mul_overflow(counts[i] - 1, s[i], &term);
    overflow |= __builtin_add_overflow(span, term, &span);
  }
  int64_t bytes = 0;
  overflow |= __builtin_mul_overflow(span, static_cast<int64_t>(g.element_size()), &bytes);
  if (overflow)
    fail(FD_ERR_INVALID_ARGUMENT, "external storage strides address more than INT64_MAX bytes");
  g.ext_k = c.k_storage;
  g.ext_v = c.v_storage;
  for (int i = 0; i < 5; ++i) g.ext_strides[i] = s[i];
}

std::unique_ptr<KvStorage> make_kv_storage(const KvGeometry &geometry, const fd_device &device) {
  if (device.type == FD_DEVICE_CUDA) return backend::make_cuda_kv_storage(geometry, device.ordinal);
  return make_cpu_kv_storage(geometry);
}

}  // namespace fd
