// The one internal view of paged K/V memory: element type, layout, extents
// and resolved element strides of one layer's K (V has the same geometry).
// Decode, append and the cache's storage all describe their K/V this way, and
// resolve_paged_kv() is the one place where packed-layout defaults are filled
// in and caller strides are checked.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashdec.h"

namespace fd {

struct PagedKv {
  int32_t dtype = FD_DTYPE_BF16;           // fd_dtype of the stored elements
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;  // fd_kv_layout
  uint32_t num_blocks = 0;
  uint32_t num_kv_heads = 0;
  uint32_t block_size = 0;
  uint32_t head_dim = 0;
  // Element strides of (block, kv head, token, dim); never 0 once resolved.
  int64_t stride_block = 0;
  int64_t stride_head = 0;
  int64_t stride_token = 0;
  int64_t stride_dim = 0;
  // Elements one layer's K (or V) spans: largest offset + 1. Exact and far
  // from overflow (checked), so backends index with plain int64 arithmetic.
  int64_t span_elements = 0;
  // Bytes of one element (dtype_size(dtype)) and of the span.
  size_t element_bytes = 0;
  int64_t span_bytes = 0;

  bool dim_major() const { return layout == FD_LAYOUT_DIM_MAJOR; }
  // Element offset of (block, head, token, dim).
  int64_t offset(int64_t block, int64_t head, int64_t token, int64_t dim) const {
    return block * stride_block + head * stride_head + token * stride_token + dim * stride_dim;
  }
};

// What a caller gives: extents, layout, dtype and the four strides (all zero
// for packed storage of the layout). `prefix` names the fields in messages
// ("params->" for a params struct, "config." for fd_cache_config).
struct PagedKvRequest {
  int32_t dtype = FD_DTYPE_BF16;
  int32_t layout = FD_LAYOUT_TOKEN_MAJOR;
  uint32_t num_blocks = 0;
  uint32_t num_kv_heads = 0;
  uint32_t block_size = 0;
  uint32_t head_dim = 0;
  int64_t strides[4] = {0, 0, 0, 0};  // block, head, token, dim
  // Subjects of the "<subject> is too large to address" messages (static
  // strings, so that resolving formats nothing unless it fails): the packed
  // per-block products, and the span (its elements and its bytes).
  const char *packed_what = "k_cache/v_cache ([num_blocks, num_kv_heads, block_size, head_dim])";
  const char *span_what = "k_cache/v_cache (the elements its sizes and strides address)";
};

// Checks and resolves a request: dtype and layout valid (FD_ERR_INVALID_ARGUMENT
// naming `<prefix>dtype` / `<prefix>layout`), every extent > 0, strides all
// zero (packed: token-major [blocks, heads, block_size, head_dim], dim-major
// [blocks, heads, head_dim, block_size]) or all > 0 with the layout's
// contiguous axis at stride 1, and the span's elements and bytes within
// kMaxOpElements (core/arg_checks.hpp; request.packed_what / span_what name
// them). Messages name the fields with `prefix` ("params->stride_dim must be
// 1 ..."). Callers may check the same fields earlier with their own names;
// the resolver's checks then never fire, but it trusts nothing.
PagedKv resolve_paged_kv(const PagedKvRequest &request, const char *prefix);

// The request a public struct describes: fd_decode_params, fd_kv_append_params
// and fd_cache_config name the view's fields alike (layout, num_kv_heads,
// block_size, head_dim, stride_block/head/token/dim); the element type and
// the block count are passed because their field names differ (kv_dtype or
// dtype; num_blocks or max_blocks).
template <class Params>
PagedKvRequest paged_kv_request(const Params &p, int32_t dtype, uint32_t num_blocks) {
  PagedKvRequest r;
  r.dtype = dtype;
  r.layout = p.layout;
  r.num_blocks = num_blocks;
  r.num_kv_heads = p.num_kv_heads;
  r.block_size = p.block_size;
  r.head_dim = p.head_dim;
  r.strides[0] = p.stride_block;
  r.strides[1] = p.stride_head;
  r.strides[2] = p.stride_token;
  r.strides[3] = p.stride_dim;
  return r;
}

}  // namespace fd
