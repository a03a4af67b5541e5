// resolve_paged_kv: the one place where a paged K/V description (extents,
// layout, dtype and caller strides) is checked and resolved into a PagedKv.
// Decode (fd_decode_params), append (fd_kv_append_params) and the cache's
// storage (fd_cache_config, per layer) all go through it.
#include "attention/paged_kv.hpp"

#include "core/arg_checks.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace fd {
namespace {

constexpr const char *kStrideNames[4] = {"stride_block", "stride_head", "stride_token",
                                         "stride_dim"};

void require_positive(uint32_t value, const char *prefix, const char *name) {
  if (value == 0) fail(FD_ERR_INVALID_ARGUMENT, "%s%s must be > 0", prefix, name);
}

}  // namespace

PagedKv resolve_paged_kv(const PagedKvRequest &r, const char *prefix) {
  if (!kv_dtype_valid(r.dtype))
    fail(FD_ERR_INVALID_ARGUMENT,
         "%sdtype %d is not an fd_dtype (f32 = 0, f16 = 1, bf16 = 2, fp8_e4m3 = 3, fp8_e5m2 = 4)",
         prefix, static_cast<int>(r.dtype));
  if (r.layout != FD_LAYOUT_TOKEN_MAJOR && r.layout != FD_LAYOUT_DIM_MAJOR)
    fail(FD_ERR_INVALID_ARGUMENT,
         "%slayout %d is not an fd_kv_layout (token-major = 0, dim-major = 1)", prefix,
         static_cast<int>(r.layout));
  require_positive(r.num_kv_heads, prefix, "num_kv_heads");
  require_positive(r.head_dim, prefix, "head_dim");
  require_positive(r.block_size, prefix, "block_size");
  require_positive(r.num_blocks, prefix, "num_blocks");

  PagedKv kv;
  kv.dtype = r.dtype;
  kv.layout = r.layout;
  kv.num_blocks = r.num_blocks;
  kv.num_kv_heads = r.num_kv_heads;
  kv.block_size = r.block_size;
  kv.head_dim = r.head_dim;
  kv.element_bytes = dtype_size(r.dtype);
  const bool dim_major = kv.dim_major();

  const int64_t *given = r.strides;
  int64_t s[4];
  if (given[0] == 0 && given[1] == 0 && given[2] == 0 && given[3] == 0) {
    // Packed: [blocks, heads, block_size, head_dim] (token-major) or
    // [blocks, heads, head_dim, block_size] (dim-major).
    const uint64_t per_head = checked_extent_mul(r.block_size, r.head_dim, r.packed_what);
    const uint64_t per_block = checked_extent_mul(per_head, r.num_kv_heads, r.packed_what);
    s[0] = static_cast<int64_t>(per_block);
    s[1] = static_cast<int64_t>(per_head);
    s[2] = dim_major ? 1 : int64_t{r.head_dim};
    s[3] = dim_major ? int64_t{r.block_size} : 1;
  } else {
    for (int i = 0; i < 4; ++i) {
      if (given[i] <= 0)
        fail(FD_ERR_INVALID_ARGUMENT,
             "%s%s must be > 0 when strides are given (give all four, or all zero for packed "
             "storage), got %lld",
             prefix, kStrideNames[i], static_cast<long long>(given[i]));
      s[i] = given[i];
    }
    const int contiguous = dim_major ? 2 : 3;  // token (dim-major) or dim (token-major)
    if (s[contiguous] != 1)
      fail(FD_ERR_INVALID_ARGUMENT, "%s%s must be 1 for the %s layout, got %lld", prefix,
           kStrideNames[contiguous], dim_major ? "dim-major" : "token-major",
           static_cast<long long>(s[contiguous]));
  }
  kv.stride_block = s[0];
  kv.stride_head = s[1];
  kv.stride_token = s[2];
  kv.stride_dim = s[3];

  // Largest offset + 1, then bytes: every term below kMaxOpElements, so
  // backends index with plain int64 arithmetic. (Packed, this is exactly
  // num_blocks * per_block.)
  const uint64_t counts[4] = {r.num_blocks, r.num_kv_heads, r.block_size, r.head_dim};
  uint64_t span = 1;
  for (int i = 0; i < 4; ++i)
    span = checked_extent_add(
        span, checked_extent_mul(counts[i] - 1, static_cast<uint64_t>(s[i]), r.span_what),
        r.span_what);
  kv.span_elements = static_cast<int64_t>(span);
  kv.span_bytes = static_cast<int64_t>(checked_extent_mul(span, kv.element_bytes, r.span_what));
  return kv;
}

}  // namespace fd
