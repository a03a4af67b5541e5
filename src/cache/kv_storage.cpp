#include "cache/kv_storage.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "core/arg_checks.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "ops/rope.hpp"

namespace fd {

size_t KvGeometry::block_elements() const {
  return static_cast<size_t>(num_kv_heads) * block_size * head_dim;
}

size_t KvGeometry::layer_elements() const {
  return block_elements() * num_blocks;
}

size_t KvGeometry::total_elements() const {
  return layer_elements() * num_layers;
}

void KvGeometry::packed_strides(int64_t out[4]) const {
  const int64_t bs = block_size, d = head_dim;
  out[0] = static_cast<int64_t>(block_elements());  // block
  out[1] = bs * d;                                  // head
  out[2] = dim_major() ? 1 : d;                     // token
  out[3] = dim_major() ? bs : 1;                    // dim
}

bool KvGeometry::block_packed() const {
  int64_t p[4];
  packed_strides(p);
  return stride_head == p[1] && stride_token == p[2] && stride_dim == p[3];
}

void check_geometry_size(const KvGeometry &g) {
  // Every product below is checked, so block_elements() etc. are exact later.
  size_t n = g.element_size();
  const uint32_t factors[] = {g.num_kv_heads, g.block_size, g.head_dim, g.num_blocks, g.num_layers};
  for (uint32_t f : factors) {
    if (__builtin_mul_overflow(n, static_cast<size_t>(f), &n) || n > static_cast<size_t>(INT64_MAX))
      fail(FD_ERR_INVALID_ARGUMENT,
           "cache size overflows: num_layers=%u * max_blocks=%u * num_kv_heads=%u * "
           "block_size=%u * head_dim=%u elements of %zu bytes does not fit in memory",
           g.num_layers, g.num_blocks, g.num_kv_heads, g.block_size, g.head_dim, g.element_size());
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

void check_kv_scales(const float *scales, uint32_t n, const char *name) {
  require_aligned(scales, alignof(float), name);
  for (uint32_t i = 0; i < n; ++i)
    if (!std::isfinite(scales[i]) || scales[i] <= 0.f)
      fail(FD_ERR_INVALID_ARGUMENT, "%s[%u] = %g: a scale must be finite and > 0", name, i,
           static_cast<double>(scales[i]));
}

void KvStorage::set_scales(const float *k_scales, const float *v_scales, uint32_t num_layers) {
  std::vector<float> k(k_scales, k_scales + num_layers), v(v_scales, v_scales + num_layers);
  k_scales_.swap(k);
  v_scales_.swap(v);
}

namespace {

// input_dtype, reserved1 and the scales of a config (S1.1): an FP8 cache
// takes f16, bf16 or (CPU) f32 and may give scales; any other takes its own
// dtype and no scales. Returns the resolved input dtype.
int32_t resolve_input_dtype(const fd_cache_config &c) {
  if (c.reserved1 != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "config.reserved1 must be 0, got %u", c.reserved1);
  const bool fp8 = dtype_is_fp8(c.dtype);
  const int32_t input = cache_input_dtype(c);
  if (fp8) {
    if (!dtype_valid(input))
      fail(FD_ERR_INVALID_ARGUMENT,
           "config.input_dtype %d: an FP8 cache (dtype %s) takes K and V in f16 or bf16 (or f32 "
           "on the CPU); -1 would mean its own storage type",
           static_cast<int>(c.input_dtype), dtype_name(c.dtype));
    check_kv_scales(c.k_scales, c.k_scales != nullptr ? c.num_layers : 0, "config.k_scales");
    check_kv_scales(c.v_scales, c.v_scales != nullptr ? c.num_layers : 0, "config.v_scales");
  } else {
    if (input != c.dtype)
      fail(FD_ERR_INVALID_ARGUMENT,
           "config.input_dtype %d must be -1 or the cache's dtype %s: only FP8 caches convert "
           "on write",
           static_cast<int>(c.input_dtype), dtype_name(c.dtype));
    const char *given = c.k_scales != nullptr   ? "config.k_scales"
                        : c.v_scales != nullptr ? "config.v_scales"
                                                : nullptr;
    if (given != nullptr)
      fail(FD_ERR_INVALID_ARGUMENT,
           "%s must be NULL: only FP8 caches have scales (this cache's dtype is %s)", given,
           dtype_name(c.dtype));
  }
  if (c.device.type == FD_DEVICE_CUDA && fp8 && input == FD_DTYPE_F32)
    fail(FD_ERR_UNSUPPORTED,
         "config.input_dtype f32 is served by the CPU backend only: an FP8 CUDA cache takes f16 "
         "or bf16");
  return input;
}

}  // namespace

KvGeometry resolve_kv_geometry(const fd_cache_config &c) {
  KvGeometry g;
  g.num_layers = c.num_layers;
  g.num_blocks = c.max_blocks;
  g.num_kv_heads = c.num_kv_heads;
  g.block_size = c.block_size;
  g.head_dim = c.head_dim;
  g.dtype = c.dtype;
  g.layout = c.layout;
  g.element_bytes = dtype_size(c.dtype);
  check_geometry_size(g);

  if (c.reserved0 != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "config.reserved0 must be 0, got %u", c.reserved0);
  if ((c.k_storage == nullptr) != (c.v_storage == nullptr))
    fail(FD_ERR_INVALID_ARGUMENT,
         "config.k_storage and config.v_storage must both be set (external storage) or both be "
         "NULL (owned storage)");
  // The caller's storage is an array of the cache's dtype.
  require_aligned(c.k_storage, g.element_size(), "config.k_storage");
  require_aligned(c.v_storage, g.element_size(), "config.v_storage");
  const bool external = c.k_storage != nullptr;
  if (!external) {
    const int64_t given[5] = {c.stride_layer, c.stride_block, c.stride_head, c.stride_token,
                              c.stride_dim};
    const char *names[5] = {"stride_layer", "stride_block", "stride_head", "stride_token",
                            "stride_dim"};
    for (int i = 0; i < 5; ++i)
      if (given[i] != 0)
        fail(FD_ERR_INVALID_ARGUMENT,
             "config.%s is %lld, but strides need external storage (k_storage is NULL)", names[i],
             static_cast<long long>(given[i]));
  }

  // One layer: packed (owned storage, or external storage without strides)
  // or the caller's strides.
  PagedKvRequest layer = paged_kv_request(c, c.dtype, c.max_blocks);
  layer.packed_what = layer.span_what =
      external ? "config.k_storage/v_storage (the external storage its strides address, close to "
                 "or more than INT64_MAX bytes)"
               : "config: one layer of K or V (max_blocks x num_kv_heads x block_size x head_dim "
                 "elements)";
  static_cast<PagedKv &>(g) = resolve_paged_kv(layer, "config.");

  // The layers: stride_layer, and the largest element offset any (layer,
  // block, head, token, dim) reaches must fit, in bytes, in int64. (Owned
  // storage fits: check_geometry_size.)
  if (c.stride_layer < 0)
    fail(FD_ERR_INVALID_ARGUMENT, "config.stride_layer must be >= 0, got %lld",
         static_cast<long long>(c.stride_layer));
  bool overflow = false;
  if (c.stride_layer == 0) {
    overflow |= __builtin_mul_overflow(int64_t{g.num_blocks}, g.stride_block, &g.stride_layer);
  } else {
    g.stride_layer = c.stride_layer;
  }
  int64_t last_layer = 0, span = 0, bytes = 0;
  overflow |= __builtin_mul_overflow(int64_t{g.num_layers} - 1, g.stride_layer, &last_layer);
  overflow |= __builtin_add_overflow(last_layer, g.span_elements, &span);
  overflow |= __builtin_mul_overflow(span, static_cast<int64_t>(g.element_size()), &bytes);
  if (overflow)
    fail(FD_ERR_INVALID_ARGUMENT, "external storage strides address more than INT64_MAX bytes");
  g.ext_k = c.k_storage;
  g.ext_v = c.v_storage;
  g.input_dtype = resolve_input_dtype(c);
  check_rope_style(c.rope_style, "config.rope_style");
  if (c.reserved2 != 0)
    fail(FD_ERR_INVALID_ARGUMENT, "config.reserved2 must be 0, got %u", c.reserved2);
  g.rope_style = c.rope_style;
  return g;
}

std::unique_ptr<KvStorage> make_kv_storage(const KvGeometry &geometry, const fd_device &device) {
  if (device.type == FD_DEVICE_CUDA) return backend::make_cuda_kv_storage(geometry, device.ordinal);
  return make_cpu_kv_storage(geometry);
}

}  // namespace fd
